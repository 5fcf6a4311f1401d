"""Canary audits of one run: an empirical ε lower bound to hold against the accountant's ε.

One-run auditing (Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023): m canaries, each included with probability 1/2, scored from what is released;
the bound is computed by :mod:`fedhype.eval.canary_bound`.

* :func:`white_box_audit` — gradient-space "Dirac" canaries (the paper's white-box setting).
  Canary i is a record whose per-example gradient is ``s_i·G·e_{j_i}``: norm G along one
  coordinate j_i of the client's parameters θ_i ∪ ψ_i, random sign s_i. The production mechanism
  runs unchanged — :class:`~fedhype.privacy.dp_step.LocalDPSession` (torch.func per-example
  gradients, ``clip_and_sum``, Gaussian noise from the client generator, Adam steps) on the
  client's real records plus the included canaries, each Poisson-sampled with the run's q, for
  the run's σ, C and number of steps. The auditor sees every released noised gradient (what the
  accountant composes) and scores canary i by ``s_i · Σ_t g_t[j_i]``. G defaults to 1000·C: a
  correct mechanism clips it to C (the worst case the accountant assumes), a mechanism that does
  not clip exposes it.
* the black-box (input-space) audit is :mod:`fedhype.eval.canary_blackbox`.

``breakage`` (white-box, tests and demonstrations only) runs a deliberately wrong mechanism
while the claim stays the accountant's ε of the correct one: ``"noise"`` (σ = 0) or
``"clipping"`` (clipping norm 10⁶·C with the noise still σ·C) — the audit must flag both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.nn import functional as F

from fedhype.errors import ValidationError
from fedhype.eval.canary_bound import GUESS_IN, GUESS_OUT, audit_from_scores
from fedhype.models.config import ModelConfig
from fedhype.models.cvae import init_local_encoder, to_model_space
from fedhype.models.losses import make_per_example_loss
from fedhype.privacy.accountant import epsilon
from fedhype.privacy.dp_step import DPConfig, LocalDPSession, poisson_batch
from fedhype.privacy.ledger import PrivacyLedger

BREAKAGES = ("noise", "clipping")
#: Canary gradient norm as a multiple of C (clipped to C by a correct mechanism).
CANARY_NORM = 1000.0
_NO_CLIP = 1e6


@dataclasses.dataclass(frozen=True)
class MechanismPhase:
    """``steps`` DP-SGD steps with noise multiplier σ, Poisson rate q and clipping norm C."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    clip_norm: float

    def __post_init__(self) -> None:
        if not (self.noise_multiplier >= 0 and 0 < self.sample_rate <= 1 and self.steps >= 1 and self.clip_norm > 0):
            raise ValidationError(f"mechanism phase needs σ ≥ 0, q ∈ (0, 1], steps ≥ 1, C > 0; got {self}")


def phases_from_ledger(ledger: PrivacyLedger, client: str) -> list[MechanismPhase]:
    """``client``'s Gaussian mechanism events in recording order, consecutive equal (σ, q, C) merged.

    An integer-domain (Skellam) release of a Flower run with secure aggregation is not a Gaussian
    step and is left out; ``fedhype audit --release`` audits the release itself
    (:mod:`fedhype.eval.canary_release`).

    Raises:
        ValidationError: the client has no costly event in the ledger.
    """
    out: list[MechanismPhase] = []
    for e in ledger.events:
        if e.client != client or e.steps == 0 or e.sample_rate == 0 or e.discrete:
            continue
        if out and (out[-1].noise_multiplier, out[-1].sample_rate, out[-1].clip_norm) == (
                e.noise_multiplier, e.sample_rate, e.clip_norm):
            out[-1] = dataclasses.replace(out[-1], steps=out[-1].steps + e.steps)
        else:
            out.append(MechanismPhase(e.noise_multiplier, e.sample_rate, e.steps, e.clip_norm))
    if not out:
        raise ValidationError(f"client {client!r} has no mechanism events in the ledger; nothing to audit")
    return out


def claimed_epsilon(phases: list[MechanismPhase], delta: float) -> float:
    """The accountant's (PRV) ε of ``phases`` at δ — what a correct mechanism is allowed to leak."""
    return epsilon([(p.noise_multiplier, p.sample_rate, p.steps) for p in phases], delta)


def run_mechanism(run_dir: str | Path, client: str | None = None) -> dict:
    """What a white-box audit of ``run_dir`` replays: one client's mechanism and parameters.

    Args:
        run_dir: a ``fedhype train`` run directory or a ``fedhype run`` output folder (its ``run/``).
        client: client id; default the client with the largest ledger ε.

    Returns:
        ``{"client", "client_index", "phases", "delta", "model_cfg", "theta"}`` where ``theta`` is
        θ_i = h_Φ(c_i) from the run's final model (name → float32 tensor).

    Raises:
        ArtifactError: unreadable or tampered run; ValidationError: unknown client or a
            non-private run (nothing to audit against).
    """
    from fedhype.eval.audit_ledger import run_directory
    from fedhype.federated.rundir import RunDir, load_model

    run = RunDir(run_directory(run_dir))
    hnet, codes, meta = load_model(run.model)
    if not meta.get("private"):
        raise ValidationError(f"run {run.root} is non-private (--no-dp): it claims no ε to audit")
    ledger = PrivacyLedger.load(run.ledger)
    client = client if client is not None else ledger.worst()[0]
    if client not in meta["clients"]:
        raise ValidationError(f"unknown client {client!r}; the run's clients are {meta['clients']}")
    idx = meta["clients"].index(client)
    with torch.no_grad():
        theta = {k: v.detach().clone() for k, v in hnet(codes[idx]).items()}
    return {"client": client, "client_index": idx, "phases": phases_from_ledger(ledger, client),
            "delta": ledger.delta, "model_cfg": hnet.cfg, "theta": theta}


class _ObservedSession(LocalDPSession):
    """The production session; every released noised gradient is also handed to ``observe``."""

    def __init__(self, *args, observe: Callable[[dict], None], **kwargs):
        super().__init__(*args, **kwargs)
        self._observe = observe

    def noised_gradient(self, loss_fn, batch, batch_loss=None):
        g = super().noised_gradient(loss_fn, batch, batch_loss)
        self._observe(g)
        return g


def _mechanism_dp(phase: MechanismPhase, breakage: str | None) -> DPConfig:
    if breakage is None:
        return DPConfig(phase.noise_multiplier, phase.clip_norm)
    if breakage == "noise":
        return DPConfig(0.0, phase.clip_norm)
    # no clipping in effect, noise still calibrated to C: std = σ·C
    return DPConfig(phase.noise_multiplier / _NO_CLIP, phase.clip_norm * _NO_CLIP)


def _canary_coordinates(shared: dict, local: dict, m: int, rng: np.random.Generator) -> np.ndarray:
    """m distinct flat coordinates (order: θ then ψ, as the DP step concatenates them).

    Drawn from the weight matrices of the local encoder ψ_i when they hold ≥ m entries, else from
    all parameters. Our choice, for power only (any placement gives a valid bound): there the real
    records' summed clipped gradients are small (measured on digits-domains, 4 steps, σ = 0:
    |Σ_t g_t[j]| ≤ 0.05·C on ψ's weights against up to 17·C on the decoder's output bias), so the
    data barely masks a canary.
    """
    offsets, pool, start = {}, [], 0
    for name, t in [*((f"shared.{k}", v) for k, v in shared.items()), *((f"local.{k}", v) for k, v in local.items())]:
        offsets[name] = (start, t.numel())
        start += t.numel()
    for name, (o, n) in offsets.items():
        if name.startswith("local.w"):
            pool.append(np.arange(o, o + n))
    pool_arr = np.concatenate(pool) if pool else np.empty(0, np.int64)
    if len(pool_arr) < m:
        pool_arr = np.arange(start)
    return rng.choice(pool_arr, m, replace=False)


def white_box_audit(phases: list[MechanismPhase], *, delta: float, model_cfg: ModelConfig, theta: dict,
                    records: tuple[torch.Tensor, torch.Tensor] | None = None, n_canaries: int = 1000,
                    canary_norm: float = CANARY_NORM, guess_in: float = GUESS_IN, guess_out: float = GUESS_OUT,
                    confidence: float = 0.95, breakage: str | None = None, seed: int = 0, lr: float = 1e-3,
                    progress: Callable[[int, int], None] | None = None) -> dict:
    """Audit the DP-SGD mechanism of one client with Dirac gradient canaries.

    Args:
        phases: the mechanism as run (e.g. :func:`phases_from_ledger`).
        delta: δ of the claim.
        model_cfg: the model; ``theta``: θ_i^0, the client's generated parameters (name → tensor).
        records: the client's real training records, raw embeddings float32 ``[n, D]`` and int64
            labels ``[n]``; ``None`` runs the canaries alone.
        n_canaries: m (needs m ≤ number of parameters: one coordinate each).
        canary_norm: canary gradient norm G as a multiple of C.
        guess_in / guess_out: fractions of m guessed "in" / "out" (fixed in advance).
        confidence: 1 − β of the bound.
        breakage: ``None``, ``"noise"`` or ``"clipping"`` (see the module docstring).
        seed: seeds the membership pattern, coordinates, signs, sampling and noise.
        progress: ``progress(step, total_steps)`` after each step.

    Returns:
        :func:`~fedhype.eval.canary_bound.audit_from_scores` plus ``mode``, ``phases``, ``steps``,
        ``breakage``, ``canary_norm``, ``n_real_records``, ``n_parameters`` and ``output_privacy``.

    Privacy of the result: with ``records`` the audit is itself a run of the mechanism on the
    client's records, so its output (a few counts) is DP post-processing at the audited
    (σ, q, steps) — it is meant for the data holder, and releasing it spends that ε again; with a
    ``breakage`` it is not DP at all. The audit writes nothing to the run's ledger.
    """
    if breakage is not None and breakage not in BREAKAGES:
        raise ValidationError(f"breakage must be one of {BREAKAGES} or None, got {breakage!r}")
    if not phases:
        raise ValidationError("no mechanism phases to audit")
    if n_canaries < 1:
        raise ValidationError(f"--n-canaries must be ≥ 1, got {n_canaries}")
    if not canary_norm >= 1:
        raise ValidationError(f"canary_norm (a multiple of the clipping norm) must be ≥ 1, got {canary_norm}")
    rng = np.random.default_rng(seed)
    tgen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    noise_gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    shared = {k: v.detach().clone() for k, v in theta.items()}
    local = init_local_encoder(model_cfg, tgen)
    keys = [f"shared.{k}" for k in shared] + [f"local.{k}" for k in local]
    d = sum(v.numel() for v in shared.values()) + sum(v.numel() for v in local.values())
    if n_canaries > d:
        raise ValidationError(f"--n-canaries {n_canaries}: each white-box canary needs its own model coordinate and "
                              f"the model has only {d} parameters; use --n-canaries {d} or fewer")
    included = rng.random(n_canaries) < 0.5
    coords = torch.as_tensor(_canary_coordinates(shared, local, n_canaries, rng), dtype=torch.int64)
    signs = torch.as_tensor(rng.choice([-1.0, 1.0], n_canaries), dtype=torch.float32)
    inc_idx = torch.as_tensor(np.flatnonzero(included), dtype=torch.int64)
    if records is None:
        x_real = torch.empty(0, model_cfg.dim)
        y_real = torch.empty(0, dtype=torch.int64)
    else:
        x_real, y_real = to_model_space(records[0].to(torch.float32)), records[1].to(torch.int64)
    n_real, L, K = int(x_real.shape[0]), model_cfg.latent, model_cfg.n_classes
    scores = torch.zeros(n_canaries, dtype=torch.float64)
    base_loss = make_per_example_loss(model_cfg)

    def observe(g: dict) -> None:
        flat = torch.cat([g[k].reshape(-1) for k in keys])
        scores.add_((signs * flat[coords]).double())

    total, done = sum(p.steps for p in phases), 0
    for phase in phases:
        g_norm = canary_norm * phase.clip_norm

        def loss(params, x, y1h, eps_q, eps_s, is_canary, coord, sign, _g=g_norm):
            flat = torch.cat([params[k].reshape(-1) for k in keys])
            canary = _g * sign * flat.gather(0, coord.reshape(1)).sum()
            return (1.0 - is_canary) * base_loss(params, x, y1h, eps_q, eps_s) + is_canary * canary

        q = phase.sample_rate
        session = _ObservedSession(
            "audit", shared, local, _mechanism_dp(phase, breakage), sample_rate=q,
            expected_batch_size=max(q * (n_real + len(inc_idx)), 1e-12), generator=noise_gen,
            make_optimizer=lambda ps: torch.optim.Adam(ps, lr=lr), observe=observe)
        for _ in range(phase.steps):
            ri = poisson_batch(n_real, q, tgen)
            ci = inc_idx[poisson_batch(len(inc_idx), q, tgen)]
            b, nc = int(ri.numel()) + int(ci.numel()), int(ci.numel())
            x = torch.cat([x_real[ri], torch.zeros(nc, model_cfg.dim)])
            y1h = F.one_hot(torch.cat([y_real[ri], torch.zeros(nc, dtype=torch.int64)]), K).to(torch.float32)
            is_c = torch.cat([torch.zeros(len(ri)), torch.ones(nc)])
            coord = torch.cat([torch.zeros(len(ri), dtype=torch.int64), coords[ci]])
            sign = torch.cat([torch.zeros(len(ri)), signs[ci]])
            batch = (x, y1h, torch.randn(b, L, generator=tgen), torch.randn(b, model_cfg.mmd_samples, L, generator=tgen),
                     is_c, coord, sign)
            session.step(loss, batch)
            done += 1
            if progress:
                progress(done, total)
        shared = {k: v.detach() for k, v in session.shared.items()}
        session.finish()
    claim = claimed_epsilon(phases, delta)
    res = audit_from_scores(scores.numpy(), included, delta=delta, claimed_epsilon=claim, confidence=confidence,
                            guess_in=guess_in, guess_out=guess_out, seed=seed)
    if breakage is not None and n_real:
        privacy = "NOT DP: a broken mechanism ran on real records (test use only; do not release)"
    elif n_real:
        privacy = (f"DP post-processing of a fresh run of the audited mechanism on {n_real} real records: "
                   f"releasing it costs up to ε = {claim:.4g} (δ = {delta:g}) again")
    else:
        privacy = "no private records used"
    res.update(mode="white-box", phases=[dataclasses.asdict(p) for p in phases], steps=total, breakage=breakage,
               canary_norm=canary_norm, n_real_records=n_real, n_parameters=d, output_privacy=privacy)
    return res


def default_model(dim: int, n_classes: int, seed: int = 0, cfg: ModelConfig | None = None) -> tuple[ModelConfig, dict]:
    """A freshly initialised model: ``(cfg, θ)``.

    ``cfg``: the model to build — pass the job's (``fedhype audit`` passes what ``fedhype train`` builds
    with its defaults, :func:`fedhype.cli.audit_cmd.job_model`); None: the bare :class:`ModelConfig`
    defaults (the job's sizes, without any method's preset: the default method's model).
    """
    from fedhype.models.hypernet import HyperNetwork

    cfg = ModelConfig(dim=dim, n_classes=n_classes) if cfg is None else cfg
    hnet = HyperNetwork(cfg, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return cfg, {k: v.detach().clone() for k, v in hnet(torch.zeros(cfg.code_dim)).items()}
