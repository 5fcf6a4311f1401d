"""The in-process federation engine: rounds of client DP steps and server aggregation.

``train(...)`` drives FedHypeVAE: per round, sample clients (public randomness), check the
privacy budget *before* spending (write-ahead ledger), let each sampled client run its local
DP-SGD steps from θ_i = h_Φ(c_i), hand the server only PrivatizedUpdates, aggregate, then commit
a checkpoint. An interrupted run resumes from its last commit; with a seed the resumed run is
identical to an uninterrupted one and the ledger counts each step once, without a seed the
interrupted round's spend stays in the ledger and the rerun is charged again.

The round logic is :func:`run_federation`, shared by every deployment: it reaches the clients
only through a :class:`~fedhype.federated.transport.ClientTransport` — in process for
``train`` (:class:`~fedhype.federated.transport.InProcessTransport`), one Flower SuperNode per
client for :mod:`fedhype.federated.flower` — which hands out RoundTasks and returns PrivatizedUpdates.
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from fedhype.data.partition import Partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import BudgetExceededError, MinRecordsError, ValidationError
from fedhype.federated.baselines import make_server, training_partition
from fedhype.federated.class_stats import client_space, run_class_stats_stage
from fedhype.federated.client import Client
from fedhype.federated.config import TrainConfig
from fedhype.federated.rundir import RunDir, save_model
from fedhype.federated.server import Server
from fedhype.federated.transport import ClientTransport, InProcessTransport, RoundTask
from fedhype.io import atomic_write_json, load_tensors, read_json, atomic_save_tensors
from fedhype.privacy.accountant import check_delta
from fedhype.privacy.dp_step import RELEASE_SENSITIVITY, DPConfig
from fedhype.privacy.events import DP_SGD as MECHANISM
from fedhype.privacy.events import dp_sgd_events
from fedhype.privacy.ledger import PrivacyLedger, charge, pending_charges
from fedhype.privacy.plan import check_max_epsilon, plan_noise

#: public outputs of the statistics release kept for the model's metadata (the clients' DP class counts)
RELEASE_FILE = "release.json"
#: the server state right after the release (under ckpt/): a run interrupted before its first commit
#: resumes from it instead of releasing — and being charged for — the statistics again
RELEASE_STATE = "release-state.safetensors"


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


def check_client_sizes(partition: Partition, cfg: TrainConfig) -> None:
    """Refuse a client below ``cfg.min_records`` training records or with δ ≥ 1/n_i (public sizes).

    Raises:
        MinRecordsError: the first client below ``cfg.min_records`` (its name, size and the minimum as fields).
        ValidationError: δ ≥ 1/n_i, naming the client.
    """
    for c in partition.clients:
        n = len(c.train)
        if n < cfg.min_records:
            raise MinRecordsError(f"client {c.name!r} has {n} training records (< min_records={cfg.min_records}); "
                                  "re-partition with fewer clients", stage="train", minimum=cfg.min_records,
                                  clients=[(c.name, n, len(c.train) + len(c.val) + len(c.test))],
                                  n_clients=len(partition.clients))
        if not cfg.no_dp:
            check_delta(cfg.delta, n, where=f"client {c.name!r}")


def check_plan(partition: Partition, cfg: TrainConfig, dim: int, n_classes: int):
    """Every refusal that needs only public values, before a run writes anything.

    Client sizes (``min_records``, δ < 1/n_i), the model, secure aggregation's (m, t), the privacy
    plan (σ calibrated to the target) and ``max_epsilon`` against the planned run. ``partition`` is
    the one the engine trains on (:func:`fedhype.federated.baselines.training_partition`).

    Returns:
        ``(model_config, distributed_noise_or_None, plan_privacy(cfg, sizes))``.

    Raises:
        ValidationError: a bad size, δ, model or (m, t). BudgetExceededError: the plan exceeds ``max_epsilon``.
    """
    check_client_sizes(partition, cfg)
    sizes = [len(c.train) for c in partition.clients]
    mcfg = cfg.model_config(dim, n_classes)
    distributed = cfg.distributed_noise(len(sizes))
    if distributed is not None and not mcfg.class_bias:
        raise ValidationError("--secure-aggregation aggregates the statistics release; this model releases none "
                              "(model.class_bias = false)")
    privacy = plan_privacy(cfg, sizes)
    if not cfg.no_dp:
        check_max_epsilon(privacy["plan"], cfg.delta, privacy["noise_multiplier"], cfg.max_epsilon,
                          prefix=privacy["prefix"])
    return mcfg, distributed, privacy


def build_client(store: EmbeddingStore, partition: Partition, index: int, state_dir: str | Path,
                 seed: int | None) -> Client:
    """Client ``index`` of ``partition`` with its training rows of ``store`` — in this process, or on
    the client's own machine (:mod:`fedhype.federated.flower.node`)."""
    c = partition.clients[index]
    tr = partition.client_store(store, c.id, "train")
    return Client(str(c.id), index, tr.embeddings, tr.labels, Path(state_dir), seed)


def _build_clients(store: EmbeddingStore, partition: Partition, run: RunDir, cfg: TrainConfig):
    check_client_sizes(partition, cfg)
    clients = [build_client(store, partition, i, run.client_dir(c.id), cfg.seed) for i, c in enumerate(partition.clients)]
    val = [(va.embeddings, va.labels) for va in (partition.client_store(store, c.id, "val") for c in partition.clients)]
    return clients, val


def train(store: EmbeddingStore, partition: Partition, cfg: TrainConfig, out: str | Path, *, resume: bool = False,
          progress: Callable[[dict], None] | None = None, diagnostics: bool = True,
          stop_after: int | None = None) -> dict[str, Any]:
    """Train FedHypeVAE and write the run directory ``out``.

    Args:
        store: real embeddings (the clients' records; each client only sees its own rows).
        partition: clients → sample ids (must match ``store``).
        cfg: training configuration.
        out: run directory.
        resume: continue from the last committed round (the config must match).
        progress: called after each round with that round's metrics.
        diagnostics: compute held-out validation diagnostics per round (not covered by DP).
        stop_after: stop after this many rounds in this call (tests of interruption).

    Returns:
        ``{"run_dir", "epsilon", "delta", "rounds", "clients", "noise_multiplier", "private", ...}``.

    Raises:
        ValidationError: bad config, δ ≥ 1/n_i, an existing run without ``resume``, or a run folder another
            process is writing (its writer lock, :meth:`RunDir.writer_lock`).
        MinRecordsError: a client below ``cfg.min_records`` (a ValidationError).
        BudgetExceededError: the plan or the next round would exceed ``cfg.max_epsilon``.
        ArtifactError: mismatched partition/store or corrupt checkpoint.
    """
    partition = training_partition(partition, cfg.method)  # central-cvae: one client with every record
    partition.check_store(store)

    def connect(run: RunDir) -> InProcessTransport:
        clients, val = _build_clients(store, partition, run, cfg)
        return InProcessTransport(clients, val if diagnostics else None)

    return run_federation(partition, cfg, out, store_info=describe_store(store), n_classes=store.n_classes,
                          connect=connect, resume=resume, progress=progress, stop_after=stop_after)


def describe_store(store: EmbeddingStore) -> dict[str, Any]:
    """The store's public description kept in the run's config: digest, size, dim, encoder."""
    return {"digest": store.digest(), "n": len(store), "dim": store.dim, "encoder": store.meta.get("encoder")}


def run_federation(partition: Partition, cfg: TrainConfig, out: str | Path, *, store_info: dict[str, Any],
                   n_classes: int, connect: Callable[[RunDir], ClientTransport], resume: bool = False,
                   progress: Callable[[dict], None] | None = None, stop_after: int | None = None) -> dict[str, Any]:
    """The round logic of every deployment (:func:`train` in process, the Flower ServerApp across machines).

    Resolves and checks the run's configuration, writes it, then asks ``connect(run)`` for the
    transport to the clients and runs the rounds as described in the module docstring; the run
    directory is written here only.

    Args:
        partition: clients → sample ids (public); its sizes are the clients' public n_i.
        cfg, out, resume, progress, stop_after: as for :func:`train`.
        store_info: :func:`describe_store` of the clients' store (public: digest, n, dim, encoder).
        n_classes: K.
        connect: ``connect(run) -> ClientTransport``, called once the run's config is written.

    Returns and raises as :func:`train` (and whatever the transport raises when a client fails:
    the round is then not aggregated and nothing of it is committed).
    """
    run = RunDir(out)
    if run.root.exists() and not run.root.is_dir():
        raise ValidationError(f"--out {run.root} is a file; give a folder for the run")
    with run.writer_lock():  # one training process per run folder
        return _run_federation_locked(run, partition, cfg, store_info=store_info, n_classes=n_classes, connect=connect,
                                      resume=resume, progress=progress, stop_after=stop_after)


def _run_federation_locked(run: RunDir, partition: Partition, cfg: TrainConfig, *, store_info: dict[str, Any],
                           n_classes: int, connect: Callable[[RunDir], ClientTransport], resume: bool,
                           progress: Callable[[dict], None] | None, stop_after: int | None) -> dict[str, Any]:
    """:func:`run_federation`'s body, run while holding the run folder's writer lock."""
    mcfg, distributed, privacy = check_plan(partition, cfg, store_info["dim"], n_classes)
    sizes = [len(c.train) for c in partition.clients]
    resolved = {"train": cfg.to_dict(), "model": mcfg.to_dict(), "privacy_plan": privacy,
                "store": dict(store_info),
                "partition": {"scheme": partition.scheme, "clients": [c.name for c in partition.clients]},
                "seed_note": "not secure: reproducible noise" if cfg.seed is not None else "noise seeded from OS entropy"}
    done = run.committed_round()
    if resume and not run.config.exists():
        raise ValidationError(f"--resume: {run.root} holds no run to resume (check the path); "
                              "drop --resume to start a new run")
    if run.config.exists():
        if not resume:
            raise ValidationError(f"run directory {run.root} already holds a run; pass --resume to continue it "
                                  "or choose another --out")
        old = read_json(run.config, "run config")
        if _comparable(old) != _comparable(resolved):
            diff = _differences(_comparable(old), _comparable(json.loads(json.dumps(resolved))))
            raise ValidationError(f"--resume: the configuration differs from the one in {run.config} "
                                  f"({'; '.join(diff[:5]) or 'details differ'}); "
                                  "resume with the same settings or start a new run")
    else:
        done = 0
    sigma = privacy["noise_multiplier"]
    atomic_write_json(run.config, resolved)

    transport = connect(run)
    clients = transport.clients
    gen = torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else 0)
    server = make_server(mcfg, len(clients), gen, cfg.method,  # local-cvae: one server per client
                         lr_server=cfg.lr_server, lr_hyper=cfg.lr_hyper, lr_code=cfg.lr_code)
    # a private run's ledger is written ahead of round 0, so one missing at done > 0 is an error; a
    # --no-dp run records no releases and has none
    ledger = PrivacyLedger.load(run.ledger) if ((done > 0 and not cfg.no_dp) or run.ledger.exists()) else PrivacyLedger(
        cfg.delta, meta={"run": str(run.root), "method": cfg.method})
    metrics: list[dict] = read_json(run.metrics, "metrics") if (done > 0 and run.metrics.exists()) else []
    metrics = [m for m in metrics if m["round"] < done]
    if done > 0:
        server.load_state_tensors(load_tensors(run.server_ckpt(done), what="server checkpoint"))
    dp = DPConfig(sigma, cfg.clip_norm, enabled=not cfg.no_dp) if not cfg.statistics_only else None
    released = run.checkpoint.exists() and bool(read_json(run.checkpoint, "checkpoint").get("statistics_released"))
    if mcfg.class_bias and not (cfg.statistics_only and released):
        # DP statistics → model space, class bias and covariance (fedhype.federated.class_stats)
        saved = run.root / "ckpt" / RELEASE_STATE
        if done == 0 and saved.exists() and _release_charged(ledger, clients, cfg):
            # interrupted after the release: its public outputs are reused, not released (and charged) again
            server.load_state_tensors(load_tensors(saved, what="released statistics"))
        elif done == 0:
            dp_stats = DPConfig(privacy["class_stats_noise_multiplier"], RELEASE_SENSITIVITY, enabled=not cfg.no_dp)
            counts = run_class_stats_stage(clients, server, mcfg.n_classes, dp_stats, ledger, run.ledger,
                                           seeded=all(transport.replays_noise(i) for i in range(len(clients))),
                                           weights=cfg.release_weights(mcfg),
                                           distributed=distributed, centre_share=cfg.centre_share,
                                           radius=cfg.release_radius, release_centre=cfg.centre_mode())
            # the clients' DP class counts (public DP outputs): a mixture weights its clients per class
            atomic_write_json(run.root / RELEASE_FILE, {"client_class_counts": counts})
            saved.parent.mkdir(parents=True, exist_ok=True)
            atomic_save_tensors(saved, server.state_tensors())  # the model set from the release (public DP outputs)
        for i, c in enumerate(clients):
            c.set_space(client_space(server, i))
    if cfg.statistics_only and not released:  # the model is the release itself: write it, no round
        atomic_write_json(run.metrics, [])
        _write_model(run, server, clients, sizes, cfg, ledger, partition, rounds_done=0)
        run.commit(0, {"statistics_released": True})
    weights = [float(n) for n in sizes]  # public client sizes
    ran = 0
    for r in range(done, cfg.rounds_run()):
        if stop_after is not None and ran >= stop_after:
            break
        t0 = time.perf_counter()
        k = max(1, round(cfg.participation * len(clients)))
        chosen = sorted(torch.randperm(len(clients), generator=gen)[:k].tolist()) if k < len(clients) else list(range(len(clients)))
        if hasattr(transport, "preflight"):  # a corrupt private state fails here, before the ledger is charged
            transport.preflight(r, chosen, mcfg)
        if not cfg.no_dp:
            index = {clients[i].id: i for i in chosen}
            planned = pending_charges(ledger, dp_sgd_events(
                r, [(clients[i].id, cfg.sample_rate(clients[i].n), cfg.steps_per_round(clients[i].n)) for i in chosen],
                sigma, cfg.clip_norm, mechanism=MECHANISM), replays=lambda e: transport.replays_noise(index[e.client]))
            if cfg.max_epsilon is not None:
                over = ledger.would_exceed(planned, cfg.max_epsilon)
                if over:
                    worst = max(over.values())
                    raise BudgetExceededError(
                        f"round {r + 1} would take client(s) {sorted(over)} to ε = {worst:.4g} > --max-epsilon "
                        f"{cfg.max_epsilon}; stopped before spending (completed rounds: {r})", epsilon=worst, limit=cfg.max_epsilon)
            charge(ledger, planned, run.ledger)  # write-ahead: recorded before the data is touched
        tasks = [RoundTask(round=r, index=i, client=clients[i].id, theta=functools.partial(server.theta_for, i), model=mcfg, dp=dp,
                           batch_size=cfg.batch_size, steps=cfg.steps_per_round(clients[i].n), lr=cfg.local_lr(mcfg))
                 for i in chosen]
        for t, upd in zip(tasks, transport.run_round(r, tasks), strict=True):  # PrivatizedUpdates only
            server.accept(t.index, weights[t.index], upd)
        agg = server.aggregate()
        _check_finite(server, r)  # a diverged round is not committed and the next one is not charged
        atomic_save_tensors(run.server_ckpt(r + 1), server.state_tensors())
        eps = _epsilons(ledger, cfg)
        m = {"round": r, "participants": [clients[i].id for i in chosen], "seconds": time.perf_counter() - t0,
             "epsilon": max(eps.values()) if eps else None, "epsilon_per_client": eps, "lipschitz": agg.get("lipschitz")}
        diag = transport.diagnostics(server, r + 1, mcfg)
        if diag is not None:
            m["diagnostics_not_dp"] = diag
        metrics.append(m)
        atomic_write_json(run.metrics, metrics)
        _write_model(run, server, clients, sizes, cfg, ledger, partition)
        run.commit(r + 1)
        transport.after_commit(r + 1)
        ran += 1
        if progress:
            progress(m)
    eps = _epsilons(ledger, cfg)
    return {"run_dir": str(run.root), "epsilon": (max(eps.values()) if eps else None) if not cfg.no_dp else None,
            "delta": cfg.delta, "rounds": run.committed_round(), "rounds_planned": cfg.rounds_run(),
            "clients": [c.id for c in clients], "noise_multiplier": sigma, "private": not cfg.no_dp,
            "class_stats_noise_multiplier": privacy["class_stats_noise_multiplier"],
            "epsilon_per_client": eps, "clip_norm": cfg.clip_norm, "seed": cfg.seed,
            "noise_seeded": cfg.seed is not None, "traffic": server.hnet.traffic(),
            "secure_aggregation": ({"clients": distributed.clients, "dropout_tolerance": distributed.dropout_tolerance,
                                    "min_contributions": distributed.min_contributions}
                                   if distributed is not None else None), "complete": run.committed_round() >= cfg.rounds_run()}


def _release_charged(ledger: PrivacyLedger, clients, cfg: TrainConfig) -> bool:
    """Whether every client's statistics release is in the ledger (or the run is not private)."""
    from fedhype.federated.class_stats import MECHANISM as RELEASE

    if cfg.no_dp:
        return True
    done = {e.client for e in ledger.events if e.mechanism == RELEASE and e.round == -1}
    return all(c.id in done for c in clients)


def _check_finite(server, round_idx: int) -> None:
    """Refuse a round whose aggregate left a non-finite parameter or code (before it is committed).

    Raises:
        FedhypeError: naming the round and the parameters (exit code 1); the round's steps stay in the
            ledger (they ran), nothing of the round is written, and no further round is charged.
    """
    from fedhype.errors import FedhypeError

    named = [(f"hnet.{k}", v) for k, v in server.hnet.named_parameters()] + [("codes", server.codes)]
    bad = [k for k, v in named if not bool(torch.isfinite(v.detach()).all())]
    if bad:
        raise FedhypeError(f"round {round_idx + 1} produced non-finite values in {bad[:5]}{' …' if len(bad) > 5 else ''}: "
                           "the run stopped before committing it (its steps stay in the ledger; no later round was "
                           f"charged); resume from round {round_idx} with a smaller --lr-local or a larger --clip-norm")


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    """``key: old → new`` for every leaf that differs between two JSON-like configs."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            out += _differences(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if old == new else [f"{path}: {old!r} → {new!r}"]


def _comparable(conf: dict) -> dict:
    c = {k: v for k, v in conf.items() if k != "privacy_plan"}
    c["train"] = {k: v for k, v in c["train"].items() if k not in ("max_epsilon",)}
    return c




def _epsilons(ledger: PrivacyLedger, cfg: TrainConfig) -> dict[str, float]:
    if cfg.no_dp:
        return {}
    return ledger.epsilons()


def _write_model(run: RunDir, server: Server, clients: list[Client], sizes: list[int], cfg: TrainConfig,
                 ledger: PrivacyLedger, partition: Partition, rounds_done: int | None = None) -> None:
    eps = _epsilons(ledger, cfg)
    meta = {"model": server.cfg.to_dict(), "clients": [c.id for c in clients],
            "client_names": [c.name for c in partition.clients], "client_sizes": sizes,
            "class_names": partition.class_names, "epsilon": max(eps.values()) if eps else None,
            "delta": cfg.delta, "private": not cfg.no_dp, "rounds_done": run.committed_round() + 1 if rounds_done is None else rounds_done,
            "method": cfg.method, "run_id": run.root.name, "seed": cfg.seed}
    release = run.root / RELEASE_FILE
    if release.exists():
        counts = read_json(release, "release outputs").get("client_class_counts")
        if counts is not None:
            meta["client_class_counts"] = counts  # DP counts [m][K]: per-class weights of a mixture
    save_model(run.model, server.hnet, server.codes, meta)
