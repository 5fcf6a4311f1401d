"""One-run canary audit of the statistics release before round 0, as it ran: per client, or secure aggregation's sum.

The white-box audit of :mod:`fedhype.eval.canary` replays DP-SGD steps. The release is another
mechanism — one vector of class sums, counts and second moments per client, noised once; under
secure aggregation split over m clients (Gaussian shares in process, Skellam integer shares on a
Flower deployment) — so it gets canaries of its own (Steinke, Nasr & Jagielski 2023, one run, m
canaries each included with probability 1/2; the bound is :mod:`fedhype.eval.canary_bound`'s).

**Canaries.** Canary i is a record x_i = e_{j_i} (a unit vector along embedding coordinate j_i, the j_i
distinct, so n ≤ D) with a random label k_i. Its contribution to the release is worst-case: norm 1 =
the sensitivity, and it alone moves the centre's coordinate j_i (weight a_c), the class-sum entry
(k_i, j_i) (weight a) and the second-moment diagonal entry (j_i, j_i) (weight c).

**The mechanism replayed** (the production functions, with the run's σ of each step from the ledger,
its release weights and its (m, t)): the audited client's share of each step on its real records
(``records``, if given) plus the included canaries —
:func:`~fedhype.privacy.centring.privatize_centre` and :func:`~fedhype.privacy.dp_step.privatize_class_sums`
with their Gaussian noise (``distributed`` for a secure-aggregation run), or
:func:`~fedhype.privacy.skellam.privatize_centre_integer` / :func:`~fedhype.privacy.skellam.privatize_class_stats_integer`
for a Skellam release — and, under secure aggregation, the worst case the claim covers: m − t honest
shares summed (:func:`~fedhype.privacy.secure_agg.secure_sum`, :func:`~fedhype.privacy.skellam.integer_secure_sum`),
the other m − t − 1 holding no record the adversary does not know (their data would be subtracted),
the t colluders' shares known and left out. The statistics are replayed uncentred: the centring is a
public transform into vectors of norm ≤ 1, which the canaries already are (tests/privacy/test_centring.py
tests its sensitivity).

**Score.** The auditor knows the real records (white box) and subtracts their exact statistics; canary
i's score is the likelihood-ratio statistic of its coordinates, ``a_c²·ΔC_j/σ_A² + (a²·ΔS_kj + c²·ΔM_jj)/σ_B²``.
The claim is the ledger's ε of the release steps alone (round −1 events: PRV/RDP for Gaussian steps,
the Skellam RDP figure for a Skellam release).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from fedhype.errors import ValidationError
from fedhype.eval.canary_bound import GUESS_IN, GUESS_OUT, audit_from_scores
from fedhype.privacy.ledger import PrivacyLedger

BREAKAGES = ("noise",)


@dataclasses.dataclass(frozen=True)
class ReleaseStep:
    """One step of the release as recorded: ``kind`` ``centre``/``statistics``, σ, and for a Skellam release γ, d."""

    kind: str
    noise_multiplier: float
    noise: str = "gaussian"
    scale: float = 0.0
    record_dim: int = 0


def release_mechanism(run_dir: str | Path, client: str | None = None) -> dict:
    """What a release audit of ``run_dir`` replays.

    Returns:
        ``{"client", "steps": [ReleaseStep], "weights", "distributed" (DistributedNoise or None), "delta", "dim",
        "n_classes", "claimed_epsilon"}`` (the claim: the ledger's ε of the client's round −1 events).

    Raises:
        ArtifactError: unreadable or tampered run. ValidationError: a non-private run, an unknown client, or a
        run without a statistics release.
    """
    from fedhype.eval.audit_ledger import run_directory
    from fedhype.federated.class_stats import MECHANISM
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.rundir import RunDir
    from fedhype.io import read_json
    from fedhype.privacy.centring import MECHANISM as CENTRE

    run = RunDir(run_directory(run_dir))
    conf = read_json(run.config, "run config")
    cfg = TrainConfig(**conf["train"])
    if cfg.no_dp:
        raise ValidationError(f"run {run.root} is non-private (--no-dp): it claims no ε to audit")
    ledger = PrivacyLedger.load(run.ledger)
    client = client if client is not None else ledger.worst()[0]
    if client not in ledger.clients():
        raise ValidationError(f"unknown client {client!r}; the run's ledger has clients {ledger.clients()}")
    events = [e for e in ledger.events if e.client == client and e.round == -1 and e.steps]
    first: dict[str, object] = {}
    for e in events:  # the first release (a rerun after an interruption releases the same mechanism again)
        first.setdefault(e.mechanism, e)
    steps = [ReleaseStep("centre" if m == CENTRE else "statistics", e.noise_multiplier, e.noise, e.scale, e.record_dim)
             for m, e in first.items() if m in (CENTRE, MECHANISM)]
    if not any(s.kind == "statistics" for s in steps):
        raise ValidationError(f"run {run.root} released no class statistics for client {client!r}: nothing to audit "
                              "with --release (audit its DP-SGD steps without it)")
    from fedhype.models.config import ModelConfig

    model = conf["model"]  # the resolved model of the run (fedhype.federated.engine writes it into config.json)
    mcfg = ModelConfig(**{**model, "mmd_bandwidths": tuple(model["mmd_bandwidths"])})
    n_clients = len(conf.get("partition", {}).get("clients", [])) or len(ledger.clients())
    release_only = PrivacyLedger(ledger.delta)
    for e in first.values():
        release_only.record(e)
    return {"client": client, "steps": steps, "weights": cfg.release_weights(mcfg),
            "distributed": cfg.distributed_noise(n_clients), "delta": ledger.delta, "dim": int(conf["store"]["dim"]),
            "n_classes": int(mcfg.n_classes), "claimed_epsilon": release_only.epsilon(client)}


def release_audit(mech: dict, *, records: tuple[torch.Tensor, torch.Tensor] | None = None, n_canaries: int = 300,
                  guess_in: float = GUESS_IN, guess_out: float = GUESS_OUT, confidence: float = 0.95,
                  breakage: str | None = None, seed: int = 0) -> dict:
    """Audit the release ``mech`` (:func:`release_mechanism`) with Dirac record canaries (module docstring).

    Args:
        records: the audited client's real training records (raw embeddings [n, D], labels [n]); None: canaries alone.
        n_canaries: m ≤ D (one embedding coordinate each).
        breakage: ``"noise"`` (σ = 0 in every step, the claim unchanged): the audit must flag it.

    Returns:
        :func:`~fedhype.eval.canary_bound.audit_from_scores` plus ``mode``, ``steps``, ``secure_aggregation``,
        ``breakage``, ``n_real_records`` and ``output_privacy``.
    """
    from fedhype.privacy import skellam
    from fedhype.privacy.centring import CENTRE_WEIGHTS, privatize_centre
    from fedhype.privacy.dp_step import DPConfig, privatize_class_sums
    from fedhype.privacy.secure_agg import secure_sum

    if breakage is not None and breakage not in BREAKAGES:
        raise ValidationError(f"release audit breakage must be one of {BREAKAGES} or None, got {breakage!r}")
    dim, n_classes, weights, noise = mech["dim"], mech["n_classes"], mech["weights"], mech["distributed"]
    if not 1 <= n_canaries <= dim:
        raise ValidationError(f"--n-canaries {n_canaries}: the release audit puts each canary on its own embedding "
                              f"coordinate and the store has D = {dim}; use --n-canaries {dim} or fewer")
    rng = np.random.default_rng(seed)
    included = rng.random(n_canaries) < 0.5
    coords = rng.permutation(dim)[:n_canaries]
    labels = rng.integers(0, n_classes, n_canaries)
    inc = np.flatnonzero(included)
    canary_x = torch.zeros(len(inc), dim)
    canary_x[torch.arange(len(inc)), torch.as_tensor(coords[inc])] = 1.0
    canary_y = torch.as_tensor(labels[inc], dtype=torch.int64)
    if records is None:
        x_real, y_real = torch.empty(0, dim), torch.empty(0, dtype=torch.int64)
    else:
        x_real, y_real = records[0].to(torch.float32), records[1].to(torch.int64)
    x, y = torch.cat([x_real, canary_x]), torch.cat([y_real, canary_y])
    nobody = (torch.empty(0, dim), torch.empty(0, dtype=torch.int64))
    honest = 1 if noise is None else noise.min_contributions
    gens = [torch.Generator().manual_seed(int(rng.integers(2 ** 62))) for _ in range(2 * honest)]
    scores = np.zeros(n_canaries)
    a_c, a, c = CENTRE_WEIGHTS[0], weights.sums, weights.second_moment
    for step in mech["steps"]:
        sigma = 0.0 if breakage == "noise" else float(step.noise_multiplier)
        data = [(x, y)] + [nobody] * (honest - 1)
        g = gens[:honest] if step.kind == "centre" else gens[honest:]
        if step.noise == "skellam":
            lay = skellam.Layout.centre(dim) if step.kind == "centre" else skellam.Layout.statistics(n_classes, dim, weights)
            plan = skellam.SkellamPlan(noise, sigma, int(step.scale), int(step.record_dim), lay.length, step.kind)
            if step.kind == "centre":
                shares = [skellam.privatize_centre_integer(f"c{i}", d[0], plan, g[i]) for i, d in enumerate(data)]
            else:
                shares = [skellam.privatize_class_stats_integer(f"c{i}", d[0], d[1], n_classes, weights, plan, g[i])
                          for i, d in enumerate(data)]
            got = skellam.integer_secure_sum(shares, lay).tensors
        else:
            dp = DPConfig(sigma, 1.0, enabled=True)
            if step.kind == "centre":
                outs = [privatize_centre(f"c{i}", d[0], sigma, g[i], distributed=noise) for i, d in enumerate(data)]
            else:
                outs = [privatize_class_sums(f"c{i}", d[0], d[1], n_classes, dp, g[i], weights, distributed=noise)
                        for i, d in enumerate(data)]
            got = (secure_sum(outs, noise) if noise is not None else outs[0]).tensors
        if step.kind == "centre":
            exact = privatize_centre("exact", x_real, None, gens[0]).tensors
            d_c = (got["sum"].double() - exact["sum"].double()).numpy()
            scores += a_c ** 2 * d_c[coords] / max(sigma, 1e-12) ** 2
        else:
            exact: dict = privatize_class_sums("exact", x_real, y_real, n_classes, DPConfig(None, 1.0, enabled=False),
                                               gens[0], weights).tensors
            d_s = (got["class_sums"].double() - exact["class_sums"].double()).numpy()
            stat = a ** 2 * d_s[labels, coords]
            if c > 0:
                d_m = (got["second_moment"].double() - exact["second_moment"].double()).numpy()
                stat = stat + c ** 2 * d_m[coords, coords]
            scores += stat / max(sigma, 1e-12) ** 2
    claim = float(mech["claimed_epsilon"])
    res = audit_from_scores(scores, included, delta=mech["delta"], claimed_epsilon=claim, confidence=confidence,
                            guess_in=guess_in, guess_out=guess_out, seed=seed)
    n_real = int(x_real.shape[0])
    if breakage is not None and n_real:
        privacy = "NOT DP: a broken mechanism ran on real records (test use only; do not release)"
    elif n_real:
        privacy = (f"DP post-processing of a fresh run of the audited release on {n_real} real records: releasing it "
                   f"costs up to ε = {claim:.4g} (δ = {mech['delta']:g}) again")
    else:
        privacy = "no private records used"
    res.update(mode="white-box (release)", steps=[dataclasses.asdict(s) for s in mech["steps"]],
               secure_aggregation=None if noise is None else {"clients": noise.clients,
                                                               "dropout_tolerance": noise.dropout_tolerance},
               breakage=breakage, n_real_records=n_real, output_privacy=privacy, client=mech["client"])
    return res
