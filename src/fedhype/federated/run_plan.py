"""Step 1 of a run (:mod:`fedhype.federated.engine`): everything decided from public values alone.

Client sizes, the model, σ and σ₀ for the plan actually run (:func:`plan_privacy`, the privacy core's
:func:`fedhype.privacy.plan.plan_noise`), every refusal that needs no record (:func:`check_plan`),
the configuration a run records (:class:`RunPlan`, :func:`resolve_plan`) and the check of a resumed
run against it (:func:`committed_rounds`). Nothing here reads a record or writes a file.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedhype.data.partition import Partition
from fedhype.data.roster import Roster, as_roster
from fedhype.errors import FedhypeWarning, MinRecordsError, ValidationError, counted
from fedhype.federated.config import TrainConfig
from fedhype.federated.rundir import RunDir
from fedhype.io import read_json
from fedhype.models.config import ModelConfig, field_defaults, resolve_code_dim
from fedhype.privacy.accountant import check_delta
from fedhype.privacy.dp_step import RELEASE_SENSITIVITY, DPConfig
from fedhype.privacy.plan import check_max_epsilon, plan_noise


def plan_privacy(cfg: TrainConfig, sizes: list[int]) -> dict[str, Any]:
    """σ and per-client (q_i, steps_i) for the plan actually run (all rounds, all participations).

    The plan ``[(q_i, R·K_i)]`` comes from ``cfg`` (:meth:`TrainConfig.sample_rate`,
    :meth:`TrainConfig.steps_per_round`); σ and σ₀ from the privacy core
    (:func:`fedhype.privacy.plan.plan_noise`). With a target ε, σ is the smallest common noise
    multiplier such that every client's reported ε at δ after the release and ``rounds × K_i`` steps
    is ≤ target (the worst client binds). A statistics-only method (``dp-gaussian``) runs no DP-SGD
    step: the release before round 0 gets the whole target ε (or ``class_stats_noise_multiplier``,
    else ``noise_multiplier``, as its σ₀) and ``noise_multiplier`` is None.

    Returns:
        ``{"noise_multiplier", "plan", "calibrated", "class_stats_noise_multiplier", "prefix"}``.
    """
    plan = [(cfg.sample_rate(n), cfg.rounds_run() * cfg.steps_per_round(n)) for n in sizes]
    if cfg.no_dp:
        return {"noise_multiplier": None, "plan": plan, "calibrated": False, "class_stats_noise_multiplier": None,
                "prefix": []}
    stats = bool(cfg.model_config(1, 1).class_bias)
    noise = plan_noise(plan, cfg.delta, target_epsilon=cfg.epsilon, noise_multiplier=cfg.noise_multiplier,
                       release_share=cfg.class_stats_share if stats else 0.0,
                       release_sigma=cfg.class_stats_noise_multiplier, centre_share=cfg.centre_share,
                       release_only=cfg.statistics_only)
    return {"noise_multiplier": noise["noise_multiplier"], "plan": plan, "calibrated": noise["calibrated"],
            "class_stats_noise_multiplier": noise["class_stats_noise_multiplier"], "prefix": noise["prefix"]}


def planned_epsilon_caps(cfg: TrainConfig, sizes: list[int]) -> list[float] | None:
    """The ε each client's own ledger may reach under this plan: the cap a site SuperNode enforces
    (:mod:`fedhype.federated.flower.node_budget`) and the server prices the rounds left against
    (:func:`fedhype.federated.engine.run_federation`), one function so the two cannot differ.

    Client i's cap is the reported accountant's ε (:func:`fedhype.privacy.accountant.epsilon`, at δ) of the
    release before round 0 (:func:`plan_privacy`'s ``prefix``) followed by its planned DP-SGD steps
    (:func:`fedhype.federated.secure_release.planned_tails`), raised to ``train.max_epsilon`` where that is
    larger (it allows reruns up to it). Under secure aggregation the Skellam release's ε is at most the
    Gaussian prefix's (:mod:`fedhype.federated.secure_release`), so an honest run stays within it.

    Args:
        cfg: the run's configuration, its stage resolved (:meth:`TrainConfig.for_clients`).
        sizes: the clients' public n_i, in roster order.
    Returns:
        one ε per client (floats > 0), or None without DP.
    Raises:
        ValidationError: an invalid plan (as :func:`plan_privacy`).
    """
    from fedhype.federated.secure_release import planned_tails
    from fedhype.privacy.accountant import epsilon

    if cfg.no_dp:
        return None
    prefix = list(plan_privacy(cfg, list(sizes))["prefix"])
    return [max(epsilon(prefix + tail, cfg.delta), cfg.max_epsilon or 0.0) for tail in planned_tails(cfg, sizes)]


def at_least(epsilon: float, decimals: int = 4) -> str:
    """``epsilon`` rounded **up** at ``decimals`` decimals, as text: a ``train.max_epsilon`` advised in a refusal that
    works when given as printed (a helper set the 2.01 that ``:.4g`` had made of 2.010277 and was refused again)."""
    import math

    scale = 10 ** decimals
    # within the ledgers' relative slack of 1e-9 (PrivacyLedger.would_exceed callers) a figure is not rounded up
    return f"{math.ceil(epsilon * scale * (1 - 1e-9)) / scale:.{decimals}f}"


def check_client_sizes(partition: Partition | Roster, cfg: TrainConfig) -> None:
    """Refuse a client below ``cfg.min_records`` training records or with δ ≥ 1/n_i (public sizes).

    Raises:
        MinRecordsError: the first client below ``cfg.min_records`` (its name, size and the minimum as fields).
        ValidationError: δ ≥ 1/n_i, naming the client.
    """
    for c in partition.clients:
        n = c.n_train
        if n < cfg.min_records:
            raise MinRecordsError(f"client {c.name!r} has {n} training records (< min_records={cfg.min_records}); "
                                  + ("give that site more records, or lower min_records" if getattr(partition, "scheme", "") == "site"
                                     else "re-partition with fewer clients"), stage="train", minimum=cfg.min_records,
                                  clients=[(c.name, n, c.n_records)],
                                  n_clients=len(partition.clients))
        if not cfg.no_dp:
            check_delta(cfg.delta, n, where=f"client {c.name!r}")


#: peak training memory per model parameter, in bytes: 12 float32 copies (weights, gradients, optimiser state,
#: generated decoders, per-sample gradients). Measured with `fedhype train --rounds 1 --batch-size 16` on 3 clients:
#: peak RSS grew 1.64 GB from hidden 2,000 to 4,000 (11.4 M → 37.8 M parameters), about 16 copies; 12 keeps the
#: check below the measured cost, so that it refuses only what cannot fit
TRAIN_BYTES_PER_PARAMETER = 12 * 4
#: of those, what every ``local-cvae`` client's own model keeps between its turns (weights, gradients, Adam's two
#: moments); the rest is needed once, for the client that trains
KEPT_BYTES_PER_PARAMETER = 4 * 4


def training_memory(mcfg: ModelConfig, method: str, n_clients: int) -> tuple[int, int]:
    """``(parameters, bytes)``: the run's model, counted on PyTorch's ``meta`` device (no memory), and the memory
    training it needs by :data:`TRAIN_BYTES_PER_PARAMETER` (``local-cvae``: one model per client, each keeping
    :data:`KEPT_BYTES_PER_PARAMETER`, plus the working copies of the one that trains)."""
    import torch

    from fedhype.federated.baselines import federation
    from fedhype.federated.server import Server

    local = federation(method) == "local"  # local-cvae: one server of one client per client
    with torch.device("meta"):
        server = Server(mcfg, 1 if local else n_clients, torch.Generator().manual_seed(0), lr_server=1e-3,
                        lr_hyper=1e-3, lr_code=1e-3)
    one = sum(p.numel() for p in server.hnet.parameters())
    if not local:
        return one, one * TRAIN_BYTES_PER_PARAMETER
    return one * n_clients, one * (n_clients * KEPT_BYTES_PER_PARAMETER + TRAIN_BYTES_PER_PARAMETER - KEPT_BYTES_PER_PARAMETER)


def check_model_memory(mcfg: ModelConfig, method: str, n_clients: int) -> None:
    """Refuse, before anything is written or charged, a model too large to train in the memory available.

    A probe's ``--hidden 20000`` passed every check, charged the release, and was killed by the kernel's
    out-of-memory killer (the folder then held a charged run that no resume could finish: the model size is
    part of the settings a resume keeps); ``--hidden 200000`` failed with the allocator's raw message.

    Raises:
        ValidationError: :func:`training_memory` exceeds the available memory
            (:func:`fedhype.resources.available_memory`; not checked where it is unknown).
    """
    from fedhype.resources import available_memory, format_bytes

    avail = available_memory()
    if avail is None:
        return
    n, need = training_memory(mcfg, method, n_clients)
    if need > avail:
        raise ValidationError(
            _largest_width(mcfg, method, n_clients, n)
            + f"the model has {n:,} parameters (model.hidden = {mcfg.hidden}, model.hyper_hidden = {mcfg.hyper_hidden}, "
            f"model.code_dim = {mcfg.code_dim}{_code_dim_note(mcfg, method, n_clients)}); "
            f"training it needs about {format_bytes(need)} of memory "
            f"(float32 weights, gradients, optimiser state, per-sample gradients) and {format_bytes(avail)} is "
            "available: lower --hidden (model.hidden), model.code_dim or the other widths; nothing was written or "
            "charged")


def _largest_width(mcfg: ModelConfig, method: str, n_clients: int, n: int) -> str:
    """The memory refusal's lead: the width whose return to its default shrinks the model most, where that at least
    halves it (``"model.hidden = 20000 makes the model this large (at its default, 128, it would have 1,234 parameters): "``),
    else "".
    A probe's refusal listed every width without saying which one a user had set too large."""
    defaults = field_defaults(ModelConfig)
    heads = _heads_clients(mcfg, method, n_clients)
    best: tuple[int, str, Any] | None = None
    for key in ("hidden", "hyper_hidden", "code_dim"):
        default = resolve_code_dim(defaults[key], heads) if key == "code_dim" else defaults[key]
        if getattr(mcfg, key) == default:
            continue
        smaller = training_memory(replace(mcfg, **{key: default}), method, n_clients)[0]
        if best is None or smaller < best[0]:
            best = (smaller, key, default)
    if best is None or best[0] > n / 2:
        return ""
    smaller, key, default = best
    return (f"model.{key} = {getattr(mcfg, key)} makes the model this large (at its default, {default}"
            f"{' for ' + str(n_clients) + ' clients' if key == 'code_dim' else ''}, it would have {smaller:,} parameters): ")


def _heads_clients(mcfg: ModelConfig, method: str, n_clients: int) -> int | None:
    """The clients ``model.code_dim = "auto"`` counts, as :meth:`TrainConfig.model_config` resolves it: those a server
    holds (local-cvae: one) where the model has client-statistics heads, else None (``"auto"`` then gives 32)."""
    from fedhype.federated.baselines import federation

    if not mcfg.client_heads:
        return None
    return 1 if federation(method) == "local" else n_clients


def _code_dim_note(mcfg: ModelConfig, method: str, n_clients: int) -> str:
    """What a memory refusal says of the code dimension: the client-statistics heads hold (K + L + 1)·D weights per
    code coordinate, and ``"auto"`` gives one per client a server holds (:func:`fedhype.models.config.resolve_code_dim`;
    local-cvae: one)."""
    n_clients = _heads_clients(mcfg, method, n_clients)
    if n_clients is None:
        return ""
    per = (mcfg.n_classes + mcfg.latent + 1) * mcfg.dim
    return f": the client-statistics heads hold {per:,} weights per code dimension; \"auto\" gives one per client, " \
           f"{resolve_code_dim('auto', n_clients)} for {counted(n_clients, 'client')}"


#: disk a run writes per model parameter, in bytes (float32): the server's checkpoint (weights, codes and Adam's
#: two moments; the next round's is written before the last is removed, so two), the model set by the release and
#: the trained model. Measured on the bundled job (1.46 M parameters): a checkpoint is 2.65 × the model's 5.8 MB
RUN_DISK_BYTES_PER_PARAMETER = (2 * 3 + 2) * 4
#: disk each client's own state takes per model parameter (the bundled job: 1.5 MB each for 1.46 M), two kept
#: while the next round's is written
CLIENT_DISK_BYTES_PER_PARAMETER = 2 * 0.3 * 4
#: room left beside the estimate (the ledger, metrics, the report's small files)
DISK_MARGIN = 32 * 2**20


def run_disk(mcfg: ModelConfig, method: str, n_clients: int, second_moment: bool) -> int:
    """Bytes a training run writes into its folder at its peak (:data:`RUN_DISK_BYTES_PER_PARAMETER` per model
    parameter, :data:`CLIENT_DISK_BYTES_PER_PARAMETER` per client, the release's saved outputs: each client's
    class sums, counts, centre and second moments, float32), plus :data:`DISK_MARGIN`."""
    from fedhype.federated.baselines import federation

    params, _ = training_memory(mcfg, method, n_clients)
    one = params / (n_clients if federation(method) == "local" else 1)
    dim, k = int(mcfg.dim), int(mcfg.n_classes)
    release = n_clients * 4 * (k * (dim + 1) + dim + 1 + (dim * dim if second_moment else 0))
    return int(params * RUN_DISK_BYTES_PER_PARAMETER + n_clients * one * CLIENT_DISK_BYTES_PER_PARAMETER
               + release + DISK_MARGIN)


def check_run_disk(out, mcfg: ModelConfig, method: str, n_clients: int, second_moment: bool) -> None:
    """Refuse, before anything is written or charged, a run whose folder's disk cannot hold what it writes.

    A full disk after the release's write-ahead charge and before its outputs were saved made the resume release,
    and pay, again (a probe filled the disk: "No space left on device" with ε in the ledger).

    Raises:
        ValidationError: :func:`run_disk` exceeds the free space of ``out``'s file system
            (:func:`fedhype.resources.free_disk`; not checked where it is unknown).
    """
    from fedhype.resources import format_bytes, free_disk

    free = free_disk(out)
    if free is None:
        return
    need = run_disk(mcfg, method, n_clients, second_moment)
    if need > free:
        raise ValidationError(
            f"the run writes about {format_bytes(need)} into {out} (checkpoints of a model of "
            f"{training_memory(mcfg, method, n_clients)[0]:,} parameters, {n_clients} clients' states and the "
            f"release's outputs) and its disk has {format_bytes(free)} free: free space there or give an --out on "
            "another disk; nothing was written or charged")


def check_plan(partition: Partition | Roster, cfg: TrainConfig, dim: int, n_classes: int,
               recorded: dict | None = None):
    """Every refusal that needs only public values, before a run writes anything.

    Client sizes (``min_records``, δ < 1/n_i), the model, secure aggregation's (m, t), the privacy
    plan (σ calibrated to the target) and ``max_epsilon`` against the planned run. ``partition`` is
    the one the engine trains on (:func:`fedhype.federated.baselines.training_partition`). ``recorded``:
    the ``config.json`` of the run being resumed, if any: its ``"auto"`` sizes are kept
    (:func:`keep_recorded_sizes`) before the model's memory is checked.

    Returns:
        ``(model_config, distributed_noise_or_None, plan_privacy(cfg, sizes))``.

    Raises:
        ValidationError: a bad size, δ, model (a latent size above D) or (m, t). BudgetExceededError: the plan exceeds ``max_epsilon``.
    """
    check_client_sizes(partition, cfg)
    sizes = [c.n_train for c in partition.clients]
    # the records one model is fitted to: every client's together, or (local-cvae) one client's on average
    local = cfg.method_spec.federation == "local"
    # local-cvae: one server of one client per client (its code dimension is one client's)
    mcfg = cfg.model_config(dim, n_classes, n_train=round(sum(sizes) / len(sizes)) if local else sum(sizes),
                            n_clients=1 if local else len(sizes))
    mcfg = keep_recorded_sizes(cfg, mcfg, recorded)  # a resumed run: the sizes it was built with
    if mcfg.client_heads and not local and mcfg.code_dim < len(sizes):
        warnings.warn(f"model.code_dim = {mcfg.code_dim} is below the {len(sizes)} clients: the client-statistics heads "
                      "cannot give every client code its own client's statistics, they are a least-squares fit of them "
                      f"(docs/method.md, decision 23); \"auto\" gives {resolve_code_dim('auto', len(sizes))}"
                      + (" (its most)" if len(sizes) > resolve_code_dim("auto", len(sizes)) else ""), FedhypeWarning,
                      stacklevel=2)
    if mcfg.latent > dim:  # the linear-Gaussian path has rank ≤ D: a larger latent space adds no direction
        raise ValidationError(f"model.latent (--latent) = {mcfg.latent} exceeds the embeddings' dimension D = {dim}: "
                              f"use at most {dim}, or \"auto\"")
    check_model_memory(mcfg, cfg.method, len(sizes))
    distributed = cfg.distributed_noise(len(sizes))
    if distributed is not None and not mcfg.class_bias:
        raise ValidationError("--secure-aggregation aggregates the statistics release; this model releases none "
                              "(model.class_bias = false)")
    if cfg.statistics_only and not mcfg.class_bias:  # an untrained model and no ledger was written (found 2026-12-06)
        raise ValidationError(f"method {cfg.method!r} trains no DP-SGD round: its model is the statistics release, and "
                              "model.class_bias = false releases none, so nothing would be learnt; drop "
                              "model.class_bias = false or choose a method with rounds")
    privacy = plan_privacy(cfg, sizes)
    if not cfg.no_dp:
        # "nothing was trained" was wrong on a resume, whose earlier rounds had spent ε (a probe)
        check_max_epsilon(privacy["plan"], cfg.delta, privacy["noise_multiplier"], cfg.max_epsilon,
                          prefix=privacy["prefix"], after="stopped before spending (nothing was charged by this call)")
    return mcfg, distributed, privacy


@dataclass(frozen=True)
class RunPlan:
    """What a run decides from public values alone, before it writes anything (:func:`resolve_plan`).

    Attributes:
        roster: the public roster of the clients the engine trains (pooled for ``central-cvae``):
            names, training-set sizes, data keys, class names (:class:`~fedhype.data.roster.Roster`).
        cfg: the training configuration.
        model: the run's :class:`ModelConfig` (the method's preset, then the user's overrides).
        distributed: secure aggregation's (m, t) (:class:`~fedhype.privacy.secure_agg.DistributedNoise`), or None.
        privacy: :func:`plan_privacy` of the clients' sizes: σ, σ₀, every client's (q, steps), the
            releases before round 0.
        sizes: the clients' public training-set sizes n_i, in partition order.
        resolved: the configuration the run records (``config.json``) and a resumed run must match.
    """

    roster: Roster
    cfg: TrainConfig
    model: ModelConfig
    distributed: Any
    privacy: dict[str, Any]
    sizes: list[int]
    resolved: dict[str, Any]

    @property
    def noise_multiplier(self) -> float | None:
        """σ of the DP-SGD steps (None without DP, or for a statistics-only method)."""
        return self.privacy["noise_multiplier"]

    def dp_sgd(self) -> DPConfig | None:
        """σ and C of the DP-SGD steps (disabled for ``no_dp``; None for a method that runs none)."""
        cfg = self.cfg
        return DPConfig(self.noise_multiplier, cfg.clip_norm, enabled=not cfg.no_dp) if not cfg.statistics_only else None

    def release_dp(self) -> DPConfig:
        """σ₀ and the unit sensitivity of the statistics release before round 0."""
        return DPConfig(self.privacy["class_stats_noise_multiplier"], RELEASE_SENSITIVITY, enabled=not self.cfg.no_dp)


def resolve_plan(partition: Partition | Roster, cfg: TrainConfig, *, store_info: dict[str, Any], n_classes: int,
                 recorded: dict | None = None) -> RunPlan:
    """Step 1: the run's :class:`RunPlan`, from public values only (nothing is written).

    Args:
        partition: the partition the engine trains on (:func:`fedhype.federated.baselines.training_partition`),
            or its public :class:`~fedhype.data.roster.Roster` (only the roster is kept).
        cfg: the training configuration.
        store_info: :func:`describe_store` of the clients' store (digest, n, dim, encoder).
        n_classes: K.
        recorded: the ``config.json`` of the run being resumed, if any: where both it and ``cfg`` leave
            ``model.latent`` at ``"auto"``, the run keeps the latent size it was started with (a release of
            fedhype whose rule resolves ``"auto"`` otherwise must not stop a paid-for run from resuming).

    Raises:
        as :func:`check_plan`.
    """
    roster = as_roster(partition)
    mcfg, distributed, privacy = check_plan(roster, cfg, store_info["dim"], n_classes, recorded)
    sizes = [c.n_train for c in roster.clients]
    resolved = {"train": cfg.to_dict(), "model": mcfg.to_dict(), "privacy_plan": privacy,
                "store": dict(store_info),
                "partition": {"scheme": roster.scheme, "clients": [c.name for c in roster.clients],
                              "keys": [c.key for c in roster.clients]},
                "class_names": list(roster.class_names),
                "seed_note": "not secure: reproducible noise" if cfg.seed is not None else "noise seeded from OS entropy"}
    return RunPlan(roster, cfg, mcfg, distributed, privacy, sizes, resolved)


def keep_recorded_sizes(cfg: TrainConfig, mcfg: ModelConfig, recorded: dict | None) -> ModelConfig:
    """``mcfg`` with the latent size and code dimension of the run being resumed (``recorded``, its
    ``config.json``) where both that run and ``cfg`` leave ``model.latent`` / ``model.code_dim`` at ``"auto"``;
    ``mcfg`` unchanged otherwise (a new run, or a size either of them gives, which the resume check then
    compares). A run started before a rule of ``"auto"`` changed resumes with the sizes it was built with."""
    if recorded is None:
        return mcfg
    kept_model = recorded.get("model") or {}
    asked = recorded.get("train", {}).get("model") or {}
    sizes = {}
    for key, top in (("latent", mcfg.dim), ("code_dim", None)):
        if cfg.model.get(key, "auto") != "auto" or asked.get(key, "auto") != "auto":
            continue
        kept = kept_model.get(key)
        if isinstance(kept, int) and not isinstance(kept, bool) and kept >= 1 and (top is None or kept <= top):
            sizes[key] = kept
    return replace(mcfg, **sizes) if sizes else mcfg


def recorded_config(run: RunDir, resume: bool) -> dict | None:
    """The ``config.json`` of the run ``resume`` continues (``None`` for a new run or where there is none yet).

    Raises:
        ArtifactError: an unreadable run config."""
    return read_json(run.config, "run config") if resume and run.config.exists() else None


def _refuse_differences(run: RunDir, old: dict, new: dict) -> None:
    """Raise the resume's ValidationError naming where ``new`` differs from the recorded ``old`` config."""
    new = json.loads(json.dumps(new))  # as config.json holds it (tuples as lists)
    if "dp_sgd_min_records" not in (old.get("train") or {}):  # a run from before the stage rule (resolve_stage)
        new = {**new, "train": {k: v for k, v in (new.get("train") or {}).items() if k != "dp_sgd_min_records"}}
    if _comparable(old) != _comparable(new):
        diff = _differences(_comparable(old), _comparable(new))
        # the settings a user gives first (train.*: --method, --epsilon, …) before the model fields they imply
        diff.sort(key=lambda d: not d.startswith("train."))
        if isinstance(old.get("store"), dict) and old["store"].get("sites"):  # a run over sites holds no store: its
            # "store.digest" is the digest of the sites' keys (describe_roster; a helper read it as a digest of records)
            diff = [("store.digest (of the sites' keys, not of any records)" + d[len("store.digest"):])
                    if d.startswith("store.digest:") else d for d in diff]
        hint = ("; the partition's random keys differ: it was drawn again (each `fedhype partition` / "
                "`fedhype.partition(...)` call draws new keys) — resume with the partition the run started with "
                "(`--partition part.json`; in Python `clients.save('part.json')` before fit, then "
                "`fedhype.data.partition.Partition.load('part.json')`)" if any(d.startswith("partition.keys") for d in diff)
                and (old.get("partition") or {}).get("scheme") != "site"
                else "; a site's split differs from the one the run trained on (its folder set up again with "
                "`fedhype site --overwrite`?): resume with the site folders as they were"
                if any(d.startswith("partition.keys") for d in diff) else "")
        raise ValidationError(f"--resume: the configuration differs from the one in {run.config} "
                              f"({'; '.join(diff[:5]) or 'details differ'}){hint}; "
                              "resume with the same settings or start a new run")


def check_resumed_settings(run: RunDir, cfg: TrainConfig, recorded: dict | None) -> None:
    """Refuse a resume whose training settings (``train.*``, ``max_epsilon`` aside) differ from the recorded run's
    before its plan is checked: a probe's ``--resume --rounds 2 --max-epsilon 0.1`` of a finished 1-round run was
    told the 2-round plan "would reach ε = 3.98" — a plan that is not this run's — instead of what differs.

    Raises:
        ValidationError: as :func:`committed_rounds` (naming the differing ``train.*`` keys).
    """
    if recorded is not None and isinstance(recorded.get("train"), dict):
        _refuse_differences(run, {"train": recorded["train"]}, {"train": cfg.to_dict()})


def check_resumed_sites(run: RunDir, recorded: dict | None, sites: list[str] | None) -> None:
    """Refuse resuming a ``--site`` run with other sites than it trained on, naming both lists.

    A probe's ``train --site a --site b --resume`` of a finished run of a, b and c was told first that the run was
    finished, then that the configuration differs in its partition keys "drawn again", with advice for a pooled
    partition that did not apply.

    Raises:
        ValidationError: the recorded run is a site run and ``sites`` (the given sites' names; None for a pooled
            store and partition) are not its sites, or it is not a site run and sites were given.
    """
    part = (recorded or {}).get("partition")
    if not isinstance(part, dict):
        return
    was = [str(c) for c in part.get("clients") or []] if part.get("scheme") == "site" else None
    if was is None and sites is None:
        return
    if was is None:
        raise ValidationError(f"--resume: {run.root} holds a run trained on a pooled store and partition, not on "
                              "--site folders: resume it with its --store and --partition, or start a new run in "
                              "another --out")
    if sites is None:
        raise ValidationError(f"--resume: {run.root} holds a run of the sites {', '.join(was)}: resume it with their "
                              "--site folders, or start a new run in another --out")
    if sorted(sites) != sorted(was):
        missing, extra = [n for n in was if n not in sites], [n for n in sites if n not in was]
        raise ValidationError(f"--resume: {run.root} holds a run of the sites {', '.join(was)}; the --site folders "
                              f"given are {', '.join(sites)}"
                              + (f" (missing: {', '.join(missing)})" if missing else "")
                              + (f" (not in the run: {', '.join(extra)})" if extra else "")
                              + ": resume with the same --site folders, or start a new run in another --out")


def committed_rounds(run: RunDir, plan: RunPlan, resume: bool) -> int:
    """The rounds already committed in ``run`` that this call continues from (0 for a new run).

    Raises:
        ValidationError: ``resume`` without a run in ``run``, a run there without ``resume``, or a
            resumed run whose configuration differs from ``plan``'s (naming the differences).
        ArtifactError: an unreadable checkpoint or run config.
    """
    done = run.committed_round()
    if resume and not run.config.exists():
        raise ValidationError(f"--resume: {run.root} holds no run to resume (check the path); "
                              "drop --resume to start a new run")
    if run.config.exists():
        if not resume:
            raise ValidationError(f"run directory {run.root} already holds a run; pass --resume to continue it "
                                  "or choose another --out")
        _refuse_differences(run, read_json(run.config, "run config"), plan.resolved)
    else:
        # a new run writes its files here: never into a folder that holds files of something else (a site
        # folder, a store), which the Flower ServerApp's run-dir= would otherwise have mixed into
        other = sorted(p.name for p in run.root.iterdir() if p.name not in RUN_FILES_BEFORE_CONFIG) \
            if run.root.is_dir() else []
        if other:
            raise ValidationError(f"run directory {run.root} already holds files that are not a fedhype run "
                                  f"({', '.join(other[:5])}{', …' if len(other) > 5 else ''}); nothing was written: "
                                  "give a new or empty folder")
        done = 0
    return done


#: what a run folder may hold before its config.json is written (the writer lock)
RUN_FILES_BEFORE_CONFIG = {".lock"}


#: a key one of the two configurations does not have (:func:`_differences`)
_ABSENT = object()


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    """``key: old → new`` for every leaf that differs between two JSON-like configs; a key one side does not give is
    shown as such, a ``train.model`` key whose default is a rule with that default, ``"auto"`` (a probe read
    ``train.model.code_dim: None → 32`` for a run started without the key, that is with ``"auto"``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            out += _differences(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{path}.{k}" if path else str(k))
        return out
    return [] if old == new else [f"{path}: {_shown(old, path)} → {_shown(new, path)}"]


def _shown(value: Any, path: str) -> str:
    """A config value as a refusal shows it: ``repr``, or what a key not given means."""
    if value is not _ABSENT:
        return repr(value)
    head, _, key = path.rpartition(".")
    default = field_defaults(ModelConfig).get(key) if head == "train.model" else None
    # only a rule's "auto" is named: another default may be the method preset's, not the field's (dp-cvae's decoder)
    return f"not given (the default, {default!r})" if default == "auto" else "not given"


def _comparable(conf: dict) -> dict:
    c = {k: v for k, v in conf.items() if k != "privacy_plan"}
    c["train"] = {k: v for k, v in c["train"].items() if k not in ("max_epsilon",)}
    # a [model] key given at its default ("auto") asks what leaving it out asks (a probe: a job started with
    # --set model.code_dim=auto was refused on a resume without it, 'auto' → None); the resolved model is compared too
    asked = c["train"].get("model")
    if isinstance(asked, dict):
        defaults = field_defaults(ModelConfig)
        c["train"] = {**c["train"], "model": {k: v for k, v in asked.items()
                                              if not (k in defaults and v == defaults[k] and isinstance(v, str))}}
    return c



def resolve_stage(cfg: TrainConfig, sizes, recorded: dict | None = None) -> TrainConfig:
    """``cfg`` for clients of these public sizes (:meth:`TrainConfig.for_clients`: ``fedhypevae`` without its
    DP-SGD stage below ``train.dp_sgd_min_records``, and without DP). On a resume, as :func:`keep_recorded_sizes` keeps a run's
    latent size, a run recorded before the rule existed (its ``config.json`` has no ``train.dp_sgd_min_records``)
    resumes with the method it began with, and a run that recorded another threshold than this release's default
    resumes with its own where ``cfg`` has the default (a threshold given explicitly and different is the resume's
    refusal to name: :func:`check_resumed_settings`).

    Args:
        cfg: the configuration as given. sizes: the clients' n_i (ints, or name → n_i).
        recorded: the ``config.json`` of the run being resumed, if any."""
    from fedhype.federated import config as _config

    train = (recorded.get("train") or {}) if isinstance(recorded, dict) else None
    if train is not None:
        if "dp_sgd_min_records" not in train:
            return cfg
        kept = train["dp_sgd_min_records"]
        if cfg.dp_sgd_min_records == _config.DEFAULT_DP_SGD_MIN_RECORDS and kept != cfg.dp_sgd_min_records \
                and isinstance(kept, int) and not isinstance(kept, bool) and kept >= 0:
            cfg = replace(cfg, dp_sgd_min_records=kept)
        if cfg.no_dp and train.get("method") == _config.STAGE_METHOD:  # a run without DP begun before decision 25
            return cfg  # resumes with its training stage
    return cfg.for_clients(sizes)


def finished_run(out: "str | Path", cfg: "TrainConfig | None" = None) -> dict | None:
    """``{"rounds", "planned", "epsilon", "delta"}`` of a finished run in ``out`` — every round its recorded
    configuration plans committed (for a statistics-only method, its release), its model written — else None
    (no run there, one to resume, files that the resume itself will report on, or, with ``cfg``, other train
    settings than the recorded ones, ``max_epsilon`` aside: the resume refuses those, naming them)."""
    from fedhype.errors import FedhypeError
    from fedhype.federated.rundir import load_model

    run = RunDir(out)
    if not (run.config.is_file() and run.model.is_file()):
        return None
    try:
        recorded = read_json(run.config, "run config")["train"]
        if cfg is not None:  # the resume's own comparison (max_epsilon aside); a difference is a FedhypeError
            check_resumed_settings(run, cfg, {"train": recorded})
        cfg = TrainConfig(**recorded)
        planned, done = cfg.rounds_run(), run.committed_round()
        if done < planned or (planned == 0 and not run.statistics_released()):
            return None
        meta = load_model(run.model)[2]
    except (FedhypeError, KeyError, TypeError, ValueError):
        return None
    return {"rounds": done, "planned": planned, "epsilon": meta.get("epsilon"), "delta": cfg.delta}
