"""The in-process federation engine: rounds of client DP steps and server aggregation.

``train(...)`` drives FedHypeVAE: per round, sample clients (public randomness), check the
privacy budget *before* spending (write-ahead ledger), let each sampled client run its local
DP-SGD steps from θ_i = h_Φ(c_i), hand the server only PrivatizedUpdates, aggregate, then commit
a checkpoint. An interrupted run resumes from its last commit; with a seed the resumed run is
identical to an uninterrupted one and the ledger counts each step once, without a seed the
interrupted round's spend stays in the ledger and the rerun is charged again.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from fedhype.data.partition import Partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import BudgetExceededError, ValidationError
from fedhype.federated.client import Client
from fedhype.federated.config import TrainConfig
from fedhype.federated.diagnostics import round_diagnostics
from fedhype.federated.rundir import RunDir, save_model
from fedhype.federated.server import Server
from fedhype.io import atomic_write_json, load_tensors, read_json, atomic_save_tensors
from fedhype.privacy.accountant import calibrate_noise_plan, check_delta, epsilon
from fedhype.privacy.dp_step import DPConfig
from fedhype.privacy.ledger import LedgerEvent, PrivacyLedger

MECHANISM = "dp-sgd"


def plan_privacy(cfg: TrainConfig, sizes: list[int]) -> dict[str, Any]:
    """σ and per-client (q_i, steps_i) for the plan actually run (all rounds, all participations).

    With a target ε, σ is the smallest common noise multiplier such that every client's
    Opacus-PRV ε at δ after ``rounds × K_i`` steps is ≤ target (the worst client binds).
    """
    plan = [(cfg.sample_rate(n), cfg.rounds * cfg.steps_per_round(n)) for n in sizes]
    if cfg.no_dp:
        return {"noise_multiplier": None, "plan": plan, "calibrated": False}
    if cfg.noise_multiplier is not None:
        return {"noise_multiplier": float(cfg.noise_multiplier), "plan": plan, "calibrated": False}
    sigma = calibrate_noise_plan(cfg.epsilon, cfg.delta, plan)
    return {"noise_multiplier": float(sigma), "plan": plan, "calibrated": True}


def _build_clients(store: EmbeddingStore, partition: Partition, run: RunDir, cfg: TrainConfig):
    clients, val = [], []
    for i, c in enumerate(partition.clients):
        tr = partition.client_store(store, c.id, "train")
        va = partition.client_store(store, c.id, "val")
        if len(tr) < cfg.min_records:
            raise ValidationError(f"client {c.name!r} has {len(tr)} training records (< min_records={cfg.min_records}); "
                                  "re-partition with fewer clients")
        if not cfg.no_dp:
            check_delta(cfg.delta, len(tr), where=f"client {c.name!r}")
        clients.append(Client(str(c.id), i, tr.embeddings, tr.labels, run.client_dir(c.id), cfg.seed))
        val.append((va.embeddings, va.labels))
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
        ValidationError: bad config, too-small client, δ ≥ 1/n_i, or an existing run without ``resume``.
        BudgetExceededError: the plan or the next round would exceed ``cfg.max_epsilon``.
        ArtifactError: mismatched partition/store or corrupt checkpoint.
    """
    partition.check_store(store)
    run = RunDir(out)
    sizes = [len(c.train) for c in partition.clients]
    mcfg = cfg.model_config(store.dim, store.n_classes)
    privacy = plan_privacy(cfg, sizes)
    resolved = {"train": cfg.to_dict(), "model": mcfg.to_dict(), "privacy_plan": privacy,
                "store": {"digest": store.digest(), "n": len(store), "dim": store.dim, "encoder": store.meta.get("encoder")},
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
            raise ValidationError(f"--resume: the configuration differs from the one in {run.config}; "
                                  "resume with the same settings or start a new run")
    else:
        done = 0
    sigma = privacy["noise_multiplier"]
    if cfg.max_epsilon is not None and not cfg.no_dp:
        worst_plan = max(epsilon([(sigma, q, s)], cfg.delta) for q, s in privacy["plan"])
        if worst_plan > cfg.max_epsilon:
            raise BudgetExceededError(
                f"the planned run would reach ε = {worst_plan:.4g} > --max-epsilon {cfg.max_epsilon} (δ = {cfg.delta}); "
                "nothing was trained", epsilon=worst_plan, limit=cfg.max_epsilon)
    atomic_write_json(run.config, resolved)

    clients, val = _build_clients(store, partition, run, cfg)
    gen = torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else 0)
    server = Server(mcfg, len(clients), gen, lr_server=cfg.lr_server, lr_hyper=cfg.lr_hyper, lr_code=cfg.lr_code)
    ledger = PrivacyLedger.load(run.ledger) if (done > 0 or run.ledger.exists()) else PrivacyLedger(
        cfg.delta, meta={"run": str(run.root), "method": cfg.method})
    metrics: list[dict] = read_json(run.metrics, "metrics") if (done > 0 and run.metrics.exists()) else []
    metrics = [m for m in metrics if m["round"] < done]
    if done > 0:
        server.load_state_tensors(load_tensors(run.server_ckpt(done), what="server checkpoint"))
    dp = DPConfig(sigma, cfg.clip_norm, enabled=not cfg.no_dp)
    weights = [float(n) for n in sizes]  # public client sizes
    ran = 0
    for r in range(done, cfg.rounds):
        if stop_after is not None and ran >= stop_after:
            break
        t0 = time.perf_counter()
        k = max(1, round(cfg.participation * len(clients)))
        chosen = sorted(torch.randperm(len(clients), generator=gen)[:k].tolist()) if k < len(clients) else list(range(len(clients)))
        if not cfg.no_dp:
            planned = [LedgerEvent(client=clients[i].id, round=r, mechanism=MECHANISM, noise_multiplier=sigma,
                                   sample_rate=cfg.sample_rate(clients[i].n), steps=cfg.steps_per_round(clients[i].n),
                                   clip_norm=cfg.clip_norm) for i in chosen]
            planned = [e for e in planned if not (cfg.seed is not None and _already(ledger, e))]
            if cfg.max_epsilon is not None:
                over = ledger.would_exceed(planned, cfg.max_epsilon)
                if over:
                    worst = max(over.values())
                    raise BudgetExceededError(
                        f"round {r + 1} would take client(s) {sorted(over)} to ε = {worst:.4g} > --max-epsilon "
                        f"{cfg.max_epsilon}; stopped before spending (completed rounds: {r})", epsilon=worst, limit=cfg.max_epsilon)
            for e in planned:  # write-ahead: recorded before the data is touched
                ledger.record(e if not _already(ledger, e) else _rerun(e))
            ledger.save(run.ledger)
        for i in chosen:
            c = clients[i]
            upd = c.run_round(r, server.theta_for(i), mcfg, dp, batch_size=cfg.batch_size,
                              steps=cfg.steps_per_round(c.n), lr=cfg.lr_local)
            server.accept(i, weights[i], upd)
        for i in set(range(len(clients))) - set(chosen):  # carry private state forward unchanged
            _carry_state(clients[i], r)
        agg = server.aggregate()
        atomic_save_tensors(run.server_ckpt(r + 1), server.state_tensors())
        eps = _epsilons(ledger, cfg)
        m = {"round": r, "participants": [clients[i].id for i in chosen], "seconds": time.perf_counter() - t0,
             "epsilon": max(eps.values()) if eps else None, "epsilon_per_client": eps, "lipschitz": agg.get("lipschitz")}
        if diagnostics:
            m["diagnostics_not_dp"] = round_diagnostics(server, clients, val, r + 1, mcfg)
        metrics.append(m)
        atomic_write_json(run.metrics, metrics)
        _write_model(run, server, clients, sizes, cfg, ledger, partition)
        run.commit(r + 1)
        for c in clients:
            c.drop_state_before(r + 1)
        ran += 1
        if progress:
            progress(m)
    eps = _epsilons(ledger, cfg)
    return {"run_dir": str(run.root), "epsilon": (max(eps.values()) if eps else None) if not cfg.no_dp else None,
            "delta": cfg.delta, "rounds": run.committed_round(), "rounds_planned": cfg.rounds,
            "clients": [c.id for c in clients], "noise_multiplier": sigma, "private": not cfg.no_dp,
            "epsilon_per_client": eps, "clip_norm": cfg.clip_norm, "seed": cfg.seed,
            "seed_secure": cfg.seed is None, "traffic": server.hnet.traffic(), "complete": run.committed_round() >= cfg.rounds}


def _comparable(conf: dict) -> dict:
    c = {k: v for k, v in conf.items() if k != "privacy_plan"}
    c["train"] = {k: v for k, v in c["train"].items() if k not in ("max_epsilon",)}
    return c


def _already(ledger: PrivacyLedger, e: LedgerEvent) -> bool:
    return any(x.client == e.client and x.round == e.round and x.mechanism == e.mechanism for x in ledger.events)


def _rerun(e: LedgerEvent) -> LedgerEvent:
    return LedgerEvent(client=e.client, round=e.round, mechanism=e.mechanism, noise_multiplier=e.noise_multiplier,
                       sample_rate=e.sample_rate, steps=e.steps, clip_norm=e.clip_norm,
                       note="rerun after an interruption with fresh noise: charged again")


def _epsilons(ledger: PrivacyLedger, cfg: TrainConfig) -> dict[str, float]:
    if cfg.no_dp:
        return {}
    return ledger.epsilons()


def _carry_state(client: Client, r: int) -> None:
    src = client.state_dir / f"state-r{r}.safetensors"
    if src.exists():
        atomic_save_tensors(client.state_dir / f"state-r{r + 1}.safetensors", load_tensors(src))


def _write_model(run: RunDir, server: Server, clients: list[Client], sizes: list[int], cfg: TrainConfig,
                 ledger: PrivacyLedger, partition: Partition) -> None:
    eps = _epsilons(ledger, cfg)
    meta = {"model": server.cfg.to_dict(), "clients": [c.id for c in clients],
            "client_names": [c.name for c in partition.clients], "client_sizes": sizes,
            "class_names": partition.class_names, "epsilon": max(eps.values()) if eps else None,
            "delta": cfg.delta, "private": not cfg.no_dp, "rounds_done": run.committed_round() + 1,
            "method": cfg.method, "run_id": run.root.name, "seed": cfg.seed}
    save_model(run.model, server.hnet, server.codes, meta)
