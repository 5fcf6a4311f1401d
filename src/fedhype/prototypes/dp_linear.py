"""A DP-SGD FedAvg linear classifier on the clients' real embeddings: the downstream reference.

What a federation could train *directly* on its real records with the same privacy machinery
as the generator (issue #7), to read the synthetic-data classifiers against. A multinomial
logistic regression ``p(y | x) = softmax(W x̃ + b)`` on ``x̃ = s · (x/‖x‖₂ − m)`` (L2 normalisation,
a fixed transform; ``s`` = ``feature_scale``; ``m`` the DP mean below, or 0), ``W`` float32
``[K, D]``, ``b`` ``[K]``.

Stage 0, the DP class statistics (``class_stats_share > 0``; the engine's mechanism, see
:mod:`fedhype.federated.class_stats`): every client releases its per-class sums of unit-norm
embeddings and counts once through :func:`fedhype.privacy.dp_step.privatize_class_sums`
(Gaussian mechanism, σ₀, sensitivity √2; ledger event ``"dp-linear-class-stats"``, q = 1, one
step). The server pools them into the mean m and class means μ_k
(:func:`~fedhype.federated.class_stats.aggregate_class_stats`) and starts from the
nearest-class-mean classifier ``W_k = s(μ_k − m)``, ``b_k = −½‖W_k‖²``. Why: the mean of the
embeddings dominates them (norm ≈ 0.87 on the unit sphere for DINOv2-S) and un-centred SGD is
badly conditioned. Measured on the bundled job's validation split (seeds 0 / 1): at ε = 1 the
un-centred, zero-initialised model reached 0.41 / 0.39 accuracy, with stage 0 (half the budget)
0.48 / 0.50; at ε = 8 0.54 → 0.58. Without the stage (share 0): m = 0, W = b = 0.

Training (record-level DP-SGD on every client, Abadi et al. 2016, Alg. 1, averaged by FedAvg,
McMahan et al. 2017, Alg. 1): per round r = 0 … R−1, for every client i

1. a ledger event (mechanism ``"dp-fedavg-linear"``, σ, q_i = B/n_i, steps = K_i, C;
   :func:`fedhype.privacy.events.dp_sgd_events`) is charged *before* the client's records are
   touched (write-ahead, :func:`fedhype.privacy.ledger.charge`);
2. the client runs K_i = ⌈E·n_i/B⌉ local steps from the global (W, b) in a
   :class:`~fedhype.privacy.dp_step.LocalDPSession`: Poisson batch with rate q_i, per-example
   cross-entropy gradients (book-keeping, :mod:`fedhype.privacy.bookkeeping`) clipped jointly over
   (W, b) to L2 norm ≤ C, summed, plus N(0, σ²C²),
   divided by q_i·n_i, one SGD step; :meth:`~fedhype.privacy.dp_step.LocalDPSession.finish`
   returns the :class:`~fedhype.privacy.dp_step.PrivatizedUpdate` Δθ_i;
3. the server sets θ ← θ + Σ_i (n_i / Σ_j n_j) Δθ_i (public client sizes).

σ₀ spends ``class_stats_share`` of the target ε alone; then σ is the smallest common noise
multiplier with every client's Opacus-PRV ε at δ of (σ₀ release) ∘ (R·K_i steps) ≤ the target
(:func:`fedhype.privacy.plan.plan_noise` with the release as prefix); the reported
ε is the accountant's over the ledger's events (what actually ran), worst client. This is a
separate release from the generator's: a client that takes part in both spends both budgets
(sequential composition); the run pipeline reports the two ε side by side, never summed by us.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from fedhype.errors import BudgetExceededError, ValidationError
from fedhype.privacy.accountant import check_delta
from fedhype.privacy.dp_step import (CLASS_STATS_SENSITIVITY, DPConfig, LocalDPSession, PrivatizedUpdate,
                                     poisson_batch, privatize_class_sums)
from fedhype.privacy.events import DP_LINEAR as MECHANISM
from fedhype.privacy.events import DP_LINEAR_RELEASE as STATS_MECHANISM
from fedhype.privacy.events import dp_sgd_events, release_events
from fedhype.privacy.ledger import PrivacyLedger, charge, pending_charges
from fedhype.privacy.plan import check_max_epsilon, plan_noise
from fedhype.privacy.randomness import noise_generator
from fedhype.prototypes.dp_linear_model import DPLinearModel, features as _features
from fedhype.prototypes.inputs import as_features, as_labels
from fedhype.prototypes.training import torch_threads


@dataclass
class DPLinearConfig:
    """Settings of the DP-SGD FedAvg linear classifier.

    Attributes:
        rounds: FedAvg rounds R.
        local_epochs: E; client i runs K_i = ⌈E·n_i/B⌉ DP-SGD steps per round.
        batch_size: expected Poisson batch size B (q_i = min(1, B/n_i)).
        lr: SGD learning rate of the local steps.
        clip_norm: C, per-example clipping norm over (W, b).
        feature_scale: s in x̂ = s·x/‖x‖ (a public constant).
        epsilon: target ε (σ calibrated for the whole plan); None with ``noise_multiplier`` or ``no_dp``.
        delta: δ (must be < 1/n_i for every client).
        noise_multiplier: σ set directly (ε is then whatever the accountant says).
        no_dp: explicit non-private training (no clipping, no noise; marked non-private).
        max_epsilon: refuse (exit 3) a plan whose ε would exceed this.
        seed: reproducible sampling and noise (not secure); None = OS entropy.
        class_stats_share: share of the target ε spent on the DP class statistics (0 = no stage 0);
            with ``noise_multiplier`` set, that σ is used for the statistics too.

    Defaults (plain SGD lr 1, s = 4, C = 1, B = 64, 10 rounds × 1 epoch, half of ε on stage 0)
    were chosen at ε = 1 on the validation split of the bundled job (digits domains, 4 clients of
    750–1,500 records) among lr ∈ {0.2, 0.5, 1, 2, 4, 8}, s ∈ {1, 4, 16}, B ∈ {64, 128, 256},
    share ∈ {0, 0.25, 0.5, 0.75}, SGD with/without momentum and Adam.
    """

    rounds: int = 10
    local_epochs: float = 1.0
    batch_size: int = 64
    lr: float = 1.0
    clip_norm: float = 1.0
    feature_scale: float = 4.0
    epsilon: float | None = 1.0
    delta: float = 1e-4
    noise_multiplier: float | None = None
    no_dp: bool = False
    max_epsilon: float | None = None
    seed: int | None = None
    class_stats_share: float = 0.5

    def __post_init__(self) -> None:
        for name in ("rounds", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValidationError(f"dp_linear.{name} must be an integer ≥ 1, got {v!r}")
        for name in ("local_epochs", "lr", "clip_norm", "feature_scale"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValidationError(f"dp_linear.{name} must be a finite number > 0, got {v!r}")
        if not (isinstance(self.class_stats_share, (int, float)) and 0 <= self.class_stats_share < 1):
            raise ValidationError(f"dp_linear.class_stats_share must be in [0, 1), got {self.class_stats_share!r}")
        if not self.no_dp:
            if self.noise_multiplier is None and (self.epsilon is None or not self.epsilon > 0):
                raise ValidationError("dp_linear: give a target epsilon > 0, a noise_multiplier, or no_dp = true")
            if self.noise_multiplier is not None and not self.noise_multiplier >= 0:
                raise ValidationError(f"dp_linear.noise_multiplier must be ≥ 0, got {self.noise_multiplier}")

    def steps_per_round(self, n: int) -> int:
        return max(1, math.ceil(self.local_epochs * n / self.batch_size))

    def sample_rate(self, n: int) -> float:
        return min(1.0, self.batch_size / n)


def _example_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ONE example (x ``[D]``, y ``[]``): the torch.func reference form."""
    logits = x @ params["shared.weight"].T + params["shared.bias"]
    return F.cross_entropy(logits.unsqueeze(0), y.unsqueeze(0))


def _batch_loss(params: dict[str, torch.Tensor], tape, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The same loss for a batch (``[B]``), its one linear op reported to the book-keeping tape."""
    logits = tape.linear("shared.weight", "shared.bias", x, params["shared.weight"], params["shared.bias"])
    return F.cross_entropy(logits, y, reduction="none")


def _sgd(lr: float):
    # LocalDPSession builds an optimiser for the client's local parameters too; a linear model has
    # none, so that one gets an inert placeholder (it never receives a gradient).
    return lambda ps: torch.optim.SGD(ps or [torch.zeros(1, requires_grad=True)], lr=lr)


def _client_generator(seed: int | None, i: int) -> torch.Generator:
    """Client ``i``'s sampling and noise stream (:func:`fedhype.privacy.randomness.noise_generator`)."""
    return noise_generator(seed, 1_000_003, 104_729 * (i + 1))


def fit_dp_fedavg_linear(clients: Mapping[str, tuple[Any, Any]], n_classes: int, cfg: DPLinearConfig | None = None,
                         *, ledger: PrivacyLedger | None = None, ledger_path: str | Path | None = None,
                         on_plan: Callable[[dict[str, list[tuple[float, float, int]]]], None] | None = None,
                         ) -> tuple[DPLinearModel, PrivacyLedger]:
    """Train the DP-SGD FedAvg linear classifier (module docstring) on the clients' records.

    Args:
        clients: client id → ``(X_i [n_i, D] float, y_i [n_i] int in [0, n_classes))`` (real records).
        n_classes: K (public: the store's classes).
        cfg: settings (default :class:`DPLinearConfig`).
        ledger: ledger to append to (its δ must equal ``cfg.delta``); default a new one. Its
            :attr:`~fedhype.privacy.ledger.PrivacyLedger.mirrors` (a site's ledger across runs per client) are
            charged first, write-ahead, by every charge. A ledger an interrupted attempt wrote keeps its charges: this
            attempt's are added by the one rerun rule (:func:`fedhype.privacy.ledger.pending_charges`: charged again,
            unless both attempts drew the same seeded noise).
        ledger_path: where the ledger is saved at every charge, before the mechanism touches the records (write-ahead:
            a run killed half-way has its charges on disk); None keeps it in memory (the caller saves it).
        on_plan: called once the plan is settled — σ₀ and σ calibrated, δ < 1/n_i and ``cfg.max_epsilon``
            checked — and before anything is charged or any record touched, with client id → the accountant
            terms of its whole plan ``[(σ, q, steps), …]`` (the statistics release first; ``[]`` for every
            client without DP); it may refuse by raising (:mod:`fedhype.prototypes.dp_linear_sites`: a site's cap).

    A seeded run (``cfg.seed``) records its events with ``seeded: true`` (its noise can be regenerated from the
    seed: a site's ledger counts it as ε = ∞, :data:`fedhype.privacy.site_ledger.SEEDED_NOTE`); the run's own ε is
    the accountant's either way.

    Returns:
        ``(model, ledger)``; ``model.privacy`` = ``{"private", "epsilon", "delta", "epsilon_per_client",
        "noise_multiplier", "clip_norm", "accountant": "prv", "mechanism", "steps_per_client", "calibrated"}``.

    Raises:
        ValidationError: no clients, bad inputs, δ ≥ 1/n_i, or a ledger with another δ.
        BudgetExceededError: the plan's ε — composed with the charges ``ledger`` already holds, where it holds some (an
            interrupted attempt's) — would exceed ``cfg.max_epsilon`` (nothing is trained or charged).
    """
    # one intra-op thread: the ops are tiny and threads only synchronise (bundled job, ε = 1, loaded
    # 2-core machine: 0.8–2.5 s with one thread, 11.5 s with two; identical results)
    with torch_threads(1):
        return _fit(clients, n_classes, cfg or DPLinearConfig(), ledger, on_plan, ledger_path)


def _fit(clients, n_classes: int, cfg: DPLinearConfig, ledger: PrivacyLedger | None, on_plan=None, ledger_path=None):
    if not clients:
        raise ValidationError("the DP linear classifier needs at least one client")
    raw, dim = {}, None
    for cid, (x, y) in clients.items():
        xt = as_features(x, f"clients[{cid!r}] X")
        yt = torch.as_tensor(as_labels(y, xt.shape[0], f"clients[{cid!r}] y"))
        if dim is not None and xt.shape[1] != dim:
            raise ValidationError(f"clients[{cid!r}] X has {xt.shape[1]} features, other clients have {dim}")
        if yt.min() < 0 or yt.max() >= n_classes:
            raise ValidationError(f"clients[{cid!r}] y has labels outside [0, {n_classes})")
        dim = xt.shape[1]
        raw[str(cid)] = (xt, yt)
    sizes = {c: int(x.shape[0]) for c, (x, _) in raw.items()}
    plan = {c: (cfg.sample_rate(n), cfg.rounds * cfg.steps_per_round(n)) for c, n in sizes.items()}
    private, stats = not cfg.no_dp, cfg.class_stats_share > 0
    sigma = sigma0 = None
    prefix: list = []
    if private:
        for c, n in sizes.items():
            check_delta(cfg.delta, n, where=f"client {c!r}")
        # σ₀ spends class_stats_share of the target alone (an explicit σ is used for both), σ the rest
        noise = plan_noise(list(plan.values()), cfg.delta, target_epsilon=cfg.epsilon,
                           noise_multiplier=cfg.noise_multiplier, release_share=cfg.class_stats_share,
                           release_follows_sigma=True)
        sigma, sigma0, prefix = noise["noise_multiplier"], noise["class_stats_noise_multiplier"], list(noise["prefix"])
        check_max_epsilon(list(plan.values()), cfg.delta, sigma, cfg.max_epsilon, prefix=noise["prefix"],
                          what="the DP linear classifier's plan", flag="max_epsilon", show_delta=False)
    ledger = ledger if ledger is not None else PrivacyLedger(cfg.delta, meta={"mechanism": MECHANISM})
    if ledger.delta != cfg.delta:
        raise ValidationError(f"the ledger's δ = {ledger.delta:g} differs from dp_linear.delta = {cfg.delta:g}")
    if private and cfg.max_epsilon is not None and ledger.events:  # a rerun over an interrupted attempt's charges
        _check_composed_cap(ledger, raw, sizes, cfg, sigma, sigma0, stats)
    if on_plan is not None:
        on_plan({c: ([*prefix, (sigma, q, k)] if private else []) for c, (q, k) in plan.items()})
    if ledger_path is not None and private:  # the plan is accepted: the write-ahead ledger's folder
        Path(ledger_path).parent.mkdir(parents=True, exist_ok=True)
    gens = {c: _client_generator(cfg.seed, i) for i, c in enumerate(raw)}
    center, theta = torch.zeros(dim), {"weight": torch.zeros(n_classes, dim), "bias": torch.zeros(n_classes)}
    if stats:
        center, theta = _class_stats_start(raw, n_classes, cfg, sigma0, ledger, gens, ledger_path)
    data = {c: (_features(x, cfg.feature_scale, center), y) for c, (x, y) in raw.items()}
    dp = DPConfig(sigma, cfg.clip_norm, enabled=private)  # book-keeping per-example clipping (same clipped sums)
    total = float(sum(sizes.values()))
    history = []
    for r in range(cfg.rounds):
        updates = []
        for c, (x, y) in data.items():
            n, q, k = sizes[c], cfg.sample_rate(sizes[c]), cfg.steps_per_round(sizes[c])
            if private:  # write-ahead: recorded before the client's records are touched
                charge(ledger, _pending(ledger, dp_sgd_events(r, [(c, q, k)], sigma, cfg.clip_norm, mechanism=MECHANISM,
                                                              note="DP-SGD FedAvg linear classifier (downstream reference)"),
                                        cfg), ledger_path)
            session = LocalDPSession(c, theta, {}, dp, sample_rate=q, expected_batch_size=q * n, generator=gens[c],
                                     make_optimizer=_sgd(cfg.lr))
            for _ in range(k):
                idx = poisson_batch(n, q, gens[c])
                session.step(_example_loss, (x[idx], y[idx]), batch_loss=_batch_loss)
            updates.append((sizes[c], session.finish()))
        payloads = [(n, _payload(u)) for n, u in updates]
        step = {key: sum((n / total) * d[key] for n, d in payloads) for key in theta}
        theta = {key: theta[key] + step[key] for key in theta}
        history.append({"round": r, "update_norm": float(torch.sqrt(sum((v ** 2).sum() for v in step.values())))})
    per = ledger.epsilons() if private else {}
    privacy = {"private": private, "epsilon": max(per.values()) if per else None, "delta": cfg.delta,
               "epsilon_per_client": per, "noise_multiplier": sigma, "class_stats_noise_multiplier": sigma0,
               "clip_norm": cfg.clip_norm, "accountant": "prv", "mechanism": MECHANISM,
               "calibrated": private and cfg.noise_multiplier is None,
               "target_epsilon": cfg.epsilon if private and cfg.noise_multiplier is None else None,
               "steps_per_client": {c: s for c, (_, s) in plan.items()}, "client_sizes": sizes,
               "noise_seeded": cfg.seed is not None}
    model = DPLinearModel(theta["weight"], theta["bias"], center, cfg.feature_scale, privacy, asdict(cfg), history)
    return model, ledger


def _check_composed_cap(ledger: PrivacyLedger, raw, sizes: dict[str, int], cfg: DPLinearConfig, sigma: float,
                        sigma0: float | None, stats: bool) -> None:
    """Refuse (before anything is charged) a run whose charges, composed with those ``ledger`` already holds (an
    interrupted attempt's), would take a client past ``cfg.max_epsilon``: the plan's own check sees the plan alone.

    Raises:
        BudgetExceededError: naming the clients' composed ε (exit 3).
    """
    planned = []
    if stats and sigma0 is not None:
        planned += release_events(list(raw), [(sigma0, 1.0, 1)], [STATS_MECHANISM], CLASS_STATS_SENSITIVITY)
    for r in range(cfg.rounds):
        planned += dp_sgd_events(r, [(c, cfg.sample_rate(n), cfg.steps_per_round(n)) for c, n in sizes.items()],
                                 sigma, cfg.clip_norm, mechanism=MECHANISM)
    over = ledger.would_exceed(_pending(ledger, planned, cfg), cfg.max_epsilon)
    if over:
        worst = max(over.values())
        raise BudgetExceededError(
            f"the DP linear classifier's run, with the charges an interrupted attempt left in its ledger, would take "
            f"client(s) {sorted(over)} to ε = {worst:.4g} > max_epsilon {cfg.max_epsilon}; stopped before spending "
            "(nothing was charged by this call)", epsilon=worst, limit=cfg.max_epsilon)


def _class_stats_start(raw, n_classes: int, cfg: DPLinearConfig, sigma0: float | None, ledger: PrivacyLedger,
                       gens: dict[str, torch.Generator], ledger_path=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Stage 0 (module docstring): the DP mean m and the nearest-class-mean start (W, b)."""
    from fedhype.federated.class_stats import aggregate_class_stats

    dp0 = DPConfig(sigma0, CLASS_STATS_SENSITIVITY, enabled=sigma0 is not None)
    updates = []
    for c, (x, y) in raw.items():
        if dp0.enabled:  # write-ahead
            charge(ledger, _pending(ledger, release_events(
                [c], [(sigma0, 1.0, 1)], [STATS_MECHANISM], CLASS_STATS_SENSITIVITY,
                ["class sums and counts (DP linear classifier's centring and start)"]), cfg), ledger_path)
        updates.append(privatize_class_sums(c, x, y, n_classes, dp0, gens[c]))
    std = sigma0 * CLASS_STATS_SENSITIVITY if dp0.enabled else 0.0
    pooled = aggregate_class_stats(updates, std)  # type-checks the PrivatizedUpdates
    center = pooled["space_mean"]
    w = cfg.feature_scale * pooled["class_bias"] * pooled["space_scale"]  # s(μ_k − m)
    return center, {"weight": w, "bias": -0.5 * (w ** 2).sum(1)}


def _pending(ledger: PrivacyLedger, events: list, cfg: DPLinearConfig) -> list:
    """What ``events`` charge to ``ledger`` (:func:`fedhype.privacy.ledger.pending_charges`), marked ``seeded`` where
    the noise comes from ``cfg.seed`` (reproducible, not secret): the same seeded noise an interrupted attempt charged
    is not charged again; anything else an earlier attempt charged is (fresh noise, marked as a rerun)."""
    return pending_charges(ledger, events, replays=lambda e: cfg.seed is not None)


def _payload(update: PrivatizedUpdate) -> Mapping[str, torch.Tensor]:
    """Δθ of a client: only a PrivatizedUpdate is accepted (the privacy boundary is a type)."""
    if type(update) is not PrivatizedUpdate:
        raise TypeError(f"FedAvg accepts only PrivatizedUpdate, got {type(update).__name__}")
    return update.tensors


def _resumed_ledger(out: str | Path | None, cfg: DPLinearConfig) -> tuple[PrivacyLedger | None, Path | None]:
    """The ledger a model written to ``out`` is charged to write-ahead, and its path: ``out/ledger.json`` — the one an
    interrupted attempt left there (its charges stay: a helper killed a job during the reference and the rerun
    reported the second attempt's ε alone), else a new one. ``(None, None)`` without ``out`` or without DP.

    Raises:
        ValidationError: ``out/ledger.json`` is another mechanism's, or at another δ (named, with what to do).
        ArtifactError: it is unreadable or was edited.
    """
    if out is None or cfg.no_dp:
        return None, None
    path = Path(out) / "ledger.json"
    if not path.exists():  # (its folder is made once the plan is accepted: a refused plan leaves nothing)
        return None, path
    ledger = PrivacyLedger.load(path)
    if ledger.meta.get("mechanism") != MECHANISM:
        raise ValidationError(f"{path} is not a DP linear reference's ledger (mechanism {ledger.meta.get('mechanism')!r}); "
                              "choose another output folder")
    if ledger.delta != cfg.delta:
        raise ValidationError(f"{path} holds the charges of an interrupted attempt at δ = {ledger.delta:g}, and this one "
                              f"is at δ = {cfg.delta:g}: run it again at δ = {ledger.delta:g} (its charges are then "
                              "composed with this run's), or choose another output folder — the records it used stay "
                              "spent either way")
    return ledger, path


def dp_linear_downstream(store, partition, cfg: DPLinearConfig | None = None, *, out: str | Path | None = None,
                         train_split: str = "train", test_split: str = "test") -> dict[str, Any]:
    """Train on each client's real ``train_split`` records, evaluate on the held-out ``test_split``.

    Args:
        store: the real :class:`~fedhype.data.store.EmbeddingStore` of ``partition``.
        partition: clients (:class:`~fedhype.data.partition.Partition`); client id ``str(c.id)``.
        cfg: settings.
        out: if given, the model and its ledger are saved there, the ledger write-ahead at every charge; a model
            already there with the same settings and client sizes is evaluated again instead of retrained (a rerun of a
            job spends nothing twice), and the charges of an attempt interrupted before its model was written are kept
            (this attempt's are added, charged again unless both drew the same seeded noise).

    Returns:
        ``{"accuracy", "balanced_accuracy", "macro_f1", "per_domain": {name: {"n", metrics}},
        "per_client": {name: {"n", metrics}}, **model.privacy, "rounds", "n_train", "n_test", "seconds"}``
        (metrics: :func:`fedhype.eval.utility.classification_metrics`).

    Raises:
        ArtifactError: ``partition`` was made from another store; and as :func:`fit_dp_fedavg_linear`.
        ValidationError: ``out`` holds a model trained with other settings.
    """
    from fedhype.eval.utility import classification_metrics

    t0 = time.perf_counter()
    partition.check_store(store)
    clients = {}
    for c in partition.clients:
        s = partition.client_store(store, c.id, train_split)
        if len(s):
            clients[str(c.id)] = (s.embeddings, s.labels)
    cfg = cfg or DPLinearConfig()
    existing = None if out is None else Path(out) / "model.safetensors"
    reused = existing is not None and existing.exists()
    if reused:
        model = DPLinearModel.load(out)
        sizes = {c: int(len(x)) for c, (x, _) in clients.items()}
        # the spending cap (train.max_epsilon, which a job may change on a rerun) trained nothing: not compared
        given = {k: v for k, v in json.loads(json.dumps(asdict(cfg))).items() if k != "max_epsilon"}
        if {k: v for k, v in model.config.items() if k != "max_epsilon"} != given \
                or model.privacy.get("client_sizes") != sizes:
            raise ValidationError(f"{out} holds a DP linear classifier trained with other settings or clients; "
                                  "remove it or choose another output folder")
    else:
        ledger, ledger_path = _resumed_ledger(out, cfg)
        model, ledger = fit_dp_fedavg_linear(clients, store.n_classes, cfg, ledger=ledger, ledger_path=ledger_path)
    test = partition.split_store(store, test_split)
    y, pred = test.labels.numpy(), model.predict(test.embeddings)

    def by(groups: np.ndarray, names: list[str]) -> dict[str, dict]:
        return {names[g]: {"n": int((groups == g).sum()), **classification_metrics(y[groups == g], pred[groups == g])}
                for g in sorted(set(groups.tolist()))}

    if out is not None and not reused:
        model.save(out, ledger if model.privacy["private"] else None)
    return {**classification_metrics(y, pred), "per_domain": by(test.domains.numpy(), test.domain_names),
            "per_client": by(partition.client_ids(test_split), [c.name for c in partition.clients]),
            **model.privacy, "rounds": model.config["rounds"], "n_train": sum(len(x) for x, _ in clients.values()),
            "n_test": len(test), "model": None if out is None else str(out), "reused": reused,
            "seconds": time.perf_counter() - t0}
