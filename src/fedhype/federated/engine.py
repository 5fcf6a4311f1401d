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
It is four named steps:

1. :func:`~fedhype.federated.run_plan.resolve_plan` — every decision from public values, before
   anything is written: client sizes, the model, σ and σ₀ for the plan actually run, the refusals
   (:func:`~fedhype.federated.run_plan.check_plan`), and the configuration the run records
   (:class:`~fedhype.federated.run_plan.RunPlan`); :func:`~fedhype.federated.run_plan.committed_rounds`
   checks it against a run being resumed;
2. :func:`open_run` — the run's state (:class:`RunState`): its configuration written, the transport
   to the clients, the server (:class:`~fedhype.federated.server.ServerStrategy`, fresh or from the
   last commit), the privacy ledger (:func:`open_ledger`) and the metrics; then
   :func:`release_statistics` releases the DP statistics before round 0 (or reuses them after an
   interruption);
3. :func:`run_round` — sample the round's clients, charge the ledger ahead of spending
   (:func:`charge_round`), hand the tasks to the transport and aggregate the PrivatizedUpdates;
4. :func:`commit_round` — the server checkpoint, metrics and model on disk, then the commit point.

It returns a :class:`~fedhype.federated.result.TrainResult`. What differs between methods (a baseline, an ablation) is their
:class:`~fedhype.federated.config.Method` entry: its model preset, its federation (which server,
which partition: :mod:`fedhype.federated.baselines`) and whether it trains any round at all.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from fedhype.data.partition import Partition
from fedhype.data.sites import Site
from fedhype.data.store import EmbeddingStore
from fedhype.errors import BudgetExceededError, FedhypeError, ValidationError
from fedhype.federated.baselines import make_server, training_partition
from fedhype.federated.class_stats import RELEASE_NOTE_KEYS, run_class_stats_stage
from fedhype.federated.client import Client
from fedhype.federated.config import TrainConfig
from fedhype.federated.result import TrainResult, without_rounds
from fedhype.federated.rundir import RELEASE_OUTPUTS, RELEASE_STATE, RunDir, backfill_release_means, save_model
# step 1 lives in fedhype.federated.run_plan; its public names are importable from here too
from fedhype.federated.run_plan import (RunPlan, _differences, at_least, planned_epsilon_caps, check_client_sizes, check_plan, check_run_disk,  # noqa: F401
                                        check_resumed_settings, committed_rounds, plan_privacy, recorded_config, resolve_plan,
                                        resolve_stage)
from fedhype.data.roster import as_roster
from fedhype.federated.server import ServerStrategy
from fedhype.federated.transport import (ClientHandle, ClientTransport, InProcessTransport, RoundTask, SupportsPreflight,
                                         void_refused)
from fedhype.io import atomic_write_json, load_tensors, read_json, atomic_save_tensors, sealed
from fedhype.privacy.dp_step import DPConfig
from fedhype.privacy.events import DP_SGD as MECHANISM
from fedhype.privacy.events import dp_sgd_events
from fedhype.privacy.ledger import REFUSALS, PrivacyLedger, charge, pending_charges

if TYPE_CHECKING:
    from fedhype.data.roster import Roster

#: public outputs of the statistics release kept for the model's metadata (the clients' DP class counts)
RELEASE_FILE = "release.json"
#: the server state right after the release (under ckpt/): a run interrupted before its first commit
#: resumes from it instead of releasing — and being charged for — the statistics again


def build_client(store: EmbeddingStore, partition: Partition, index: int, state_dir: str | Path,
                 seed: int | None) -> Client:
    """Client ``index`` of ``partition`` with its training rows of ``store`` — in this process, or on
    the client's own machine (:mod:`fedhype.federated.flower.node`)."""
    c = partition.clients[index]
    tr = partition.client_store(store, c.id, "train")
    return Client(str(c.id), index, tr.embeddings, tr.labels, Path(state_dir), seed)


def _build_clients(store: EmbeddingStore, partition: Partition, run: RunDir, cfg: TrainConfig, val: bool = True):
    """The in-process clients and, with ``val`` (the per-round diagnostics), each client's validation records (else None)."""
    check_client_sizes(partition, cfg)
    clients = [build_client(store, partition, i, run.client_dir(c.id), cfg.seed) for i, c in enumerate(partition.clients)]
    if not val:
        return clients, None
    held = [(va.embeddings, va.labels) for va in (partition.client_store(store, c.id, "val") for c in partition.clients)]
    return clients, held


def train(store: EmbeddingStore, partition: Partition, cfg: TrainConfig, out: str | Path, *, resume: bool = False,
          progress: Callable[[dict], None] | None = None, diagnostics: bool = True,
          stop_after: int | None = None) -> TrainResult:
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
        a :class:`TrainResult` (also a read-only mapping of its fields: ``res["epsilon"]``, ``dict(res)``).

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
        clients, val = _build_clients(store, partition, run, cfg, val=diagnostics)
        return InProcessTransport(clients, val)

    return run_federation(partition, cfg, out, store_info=describe_store(store), n_classes=store.n_classes,
                          connect=connect, resume=resume, progress=progress, stop_after=stop_after)


def train_sites(sites: Sequence[Site], cfg: TrainConfig, out: str | Path, *, classes: Sequence[str] | None = None,
                resume: bool = False, progress: Callable[[dict], None] | None = None, diagnostics: bool = False,
                stop_after: int | None = None) -> TrainResult:
    """Train FedHypeVAE in this process over independent sites, each with its own store and split.

    The simulation of a consortium without a pooled store (:mod:`fedhype.data.sites`): client i reads
    only site i's training records (its labels renumbered to the federation's classes by name);
    the server side (:func:`run_federation`) is given the :class:`~fedhype.data.roster.Roster` built
    from the sites' public cards only, so the run directory holds no record id, label or digest of a
    site's records (``clients/`` holds each client's private optimiser state, as with :func:`train`).

    Args:
        sites: the sites (:class:`~fedhype.data.sites.Site`, from ``fedhype site``), or their folders (read with
            :meth:`Site.load <fedhype.data.sites.Site.load>`); client i is site i.
        classes: the federation's class names (default: the sorted union of the sites' classes).
        diagnostics: the per-round held-out diagnostics of :func:`train` (off by default here: they are
            statistics of the sites' validation records outside the DP path, written to the run).
        cfg, out, resume, progress, stop_after: as for :func:`train`.

    Returns and raises as :func:`train`, and ValidationError for a pooled method (``central-cvae``
    needs every record on one machine), sites with different encoders, or a site class outside ``classes``.
    """
    from fedhype.data.roster import Roster
    from fedhype.federated.baselines import federation
    from fedhype.federated.site_charges import attach_site_ledgers, refuse_site_plans, site_stores

    if federation(cfg.method) == "pooled":
        raise ValidationError(f"method {cfg.method!r} pools every record on one machine; sites keep their records "
                              "(use a pooled store and `fedhype partition` to simulate it)")
    if isinstance(sites, (str, os.PathLike)):
        raise ValidationError(f"train_sites: sites is one path ({sites!r}); give a list of site folders or Site objects")
    # a helper's train_sites(["/data/site-a"], …) failed with "'str' object has no attribute 'store'"
    sites = [Site.load(s) if isinstance(s, (str, os.PathLike)) else s for s in sites]
    if not sites or not all(isinstance(s, Site) for s in sites):
        raise ValidationError("train_sites: sites must be a non-empty list of site folders (from `fedhype site`) or "
                              f"fedhype.data.sites.Site objects, got {[type(s).__name__ for s in sites]}")
    stores = site_stores(sites)  # one client per set of records (two sites of one store are refused)
    roster = Roster.from_cards([s.public_card(st) for s, st in zip(sites, stores)], classes)

    def connect(run: RunDir) -> InProcessTransport:
        check_client_sizes(roster, cfg)
        clients, val = [], []
        for i, (site, st) in enumerate(zip(sites, stores)):
            tr = site.records("train", roster.class_names, st)
            clients.append(Client(str(i), i, tr.embeddings, tr.labels, run.client_dir(str(i)), cfg.seed))
            if diagnostics:  # the validation records only where the per-round diagnostics read them
                va = site.records("val", roster.class_names, st)
                val.append((va.embeddings, va.labels))
        return InProcessTransport(clients, val if diagnostics else None)

    return run_federation(roster, cfg, out, store_info=describe_roster(roster), n_classes=len(roster.class_names),
                          connect=connect, resume=resume, progress=progress, stop_after=stop_after,
                          on_plan=lambda run, plan: refuse_site_plans(plan.cfg, [c.n_train for c in roster.clients],
                                                                      sites, run.run_key(), run.root),
                          on_open=lambda state: attach_site_ledgers(state, sites, state.run.run_key(create=True)))


def describe_roster(roster: "Roster") -> dict[str, Any]:
    """The public description of a federation of sites kept in the run's config (as :func:`describe_store`):
    the digest of the sites' keys, the total of their training records, D, the encoder."""
    return {"digest": roster.key, "n": sum(c.n_train for c in roster.clients), "dim": roster.dim,
            "encoder": (roster.encoder or {}).get("encoder") if isinstance(roster.encoder, dict) else roster.encoder,
            "provenance": roster.encoder, "sites": [c.name for c in roster.clients]}


def describe_store(store: EmbeddingStore) -> dict[str, Any]:
    """The store's description kept in the run's config: digest, size, dim, encoder name and its provenance
    (:func:`fedhype.data.sites.encoder_of`: encoder, weights hash, pooling, preprocessing, D). The digest
    is a function of the real embeddings: the run's config keeps it, a release folder does not
    (:func:`fedhype.pipeline.release.write_release`)."""
    from fedhype.data.sites import encoder_of

    prov = encoder_of(store)
    return {"digest": store.digest(), "n": len(store), "dim": store.dim, "encoder": prov.get("encoder"),
            "provenance": prov}


# ------------------------------------------------------------------------------------------------ step 2: open the run
@dataclass
class RunState:
    """A run being trained: what :func:`open_run` opens and every later step reads and advances.

    Attributes:
        run: the run directory.
        plan: its :class:`RunPlan`.
        transport: the channel to the clients.
        server: the server of the method (:class:`~fedhype.federated.server.ServerStrategy`).
        generator: the public generator (client sampling); the server's own, saved in its checkpoint.
        ledger: the privacy ledger, written ahead of every spend.
        metrics: one dict per committed round.
        done: rounds committed when this call started.
        dp: σ and C of the DP-SGD steps (None for a statistics-only method).
    """

    run: RunDir
    plan: RunPlan
    transport: ClientTransport
    server: ServerStrategy
    generator: torch.Generator
    ledger: PrivacyLedger
    metrics: list[dict]
    done: int
    dp: DPConfig | None

    @property
    def clients(self) -> list[ClientHandle]:
        """The transport's client handles, in partition order."""
        return self.transport.clients


def open_ledger(run: RunDir, cfg: TrainConfig, done: int, refusals: bool = False) -> PrivacyLedger:
    """The run's privacy ledger: the one on disk, or a new empty one (``refusals``: its clients can refuse a request
    before touching their records — a Flower transport —, so the ledger may take void events,
    :attr:`fedhype.privacy.ledger.PrivacyLedger.takes_voids`).

    A private run's ledger is written ahead of round 0, so one missing at ``done > 0`` is an error; a
    ``--no-dp`` run records no releases and has none.

    Raises:
        ArtifactError: a missing (private run with committed rounds), corrupt or tampered ledger.
    """
    if (done > 0 and not cfg.no_dp) or run.ledger.exists():
        return PrivacyLedger.load(run.ledger)
    # the run's folder name only: the ledger is shared in a release, and a path can name a user or a study
    return PrivacyLedger(cfg.delta, meta={"run": run.root.name, "method": cfg.method,
                                          **({REFUSALS: True} if refusals else {})})


def open_run(run: RunDir, plan: RunPlan, done: int, connect: Callable[[RunDir], ClientTransport]) -> RunState:
    """Step 2: write the run's configuration, connect to the clients, and open the server, ledger and metrics.

    The server is built from the public generator (seeded with the run seed, 0 without one) and,
    after ``done`` committed rounds, restored from its checkpoint (generator included).

    Raises:
        ArtifactError: a missing or corrupt ledger, metrics file or server checkpoint.
    """
    cfg = plan.cfg
    atomic_write_json(run.config, sealed(plan.resolved))  # an edit by hand is refused when read (read_json)
    transport = connect(run)
    gen = torch.Generator().manual_seed(cfg.seed if cfg.seed is not None else 0)
    server = make_server(plan.model, len(transport.clients), gen, cfg.method,  # local-cvae: one server per client
                         lr_server=cfg.lr_server, lr_hyper=cfg.lr_hyper, lr_code=cfg.lr_code)
    ledger = open_ledger(run, cfg, done, refusals=bool(getattr(transport, "explicit_refusals", False)))
    metrics: list[dict] = read_json(run.metrics, "metrics") if (done > 0 and run.metrics.exists()) else []
    metrics = [m for m in metrics if m["round"] < done]
    filled = False
    if done > 0:
        server.load_state_tensors(load_tensors(run.server_ckpt(done), what="server checkpoint"))
        if hasattr(server, "hnet"):  # a run trained before the model kept the release's class means
            filled = backfill_release_means(server.hnet, run.root / "ckpt" / RELEASE_STATE)
    state = RunState(run, plan, transport, server, gen, ledger, metrics, done, plan.dp_sgd())
    if filled and run.model.exists():  # its model file gets them too, also when no round is left to run
        _write_model(state, rounds_done=0 if plan.cfg.statistics_only else None)
    return state


def release_statistics(state: RunState) -> None:
    """The DP statistics before round 0 (:func:`fedhype.federated.class_stats.run_class_stats_stage`,
    charged write-ahead there), and each client's model space from them.

    A run interrupted after the release reuses its public outputs (``ckpt/release-state.safetensors``, or the
    clients' updates in ``ckpt/release-outputs.safetensors`` when it stopped during the server's post-processing)
    instead of releasing — and being charged — again; one whose statistics step failed for some clients after
    others' updates arrived reuses those (saved as a partial file) and releases — and is charged for — the missing
    clients' statistics only; a resumed run takes the server's checkpoint.
    A statistics-only method (``dp-gaussian``) writes its model and commits round 0 here.
    """
    run, plan, server, clients = state.run, state.plan, state.server, state.clients
    cfg, mcfg = plan.cfg, plan.model
    released = run.statistics_released()
    if mcfg.class_bias and not (cfg.statistics_only and released):
        # DP statistics → model space, class bias and covariance (fedhype.federated.class_stats)
        saved = run.root / "ckpt" / RELEASE_STATE
        if state.done == 0 and saved.exists() and _release_charged(state.ledger, clients, cfg):
            # interrupted after the release: its public outputs are reused, not released (and charged) again
            server.load_state_tensors(load_tensors(saved, what="released statistics"))
        elif state.done == 0:
            # the clients' updates are saved as they arrive: interrupted during the server's post-processing, a
            # resume reuses them (charged once) instead of releasing again (a probe's Ctrl-C paid the release twice)
            counts = run_class_stats_stage(clients, server, mcfg.n_classes, plan.release_dp(), state.ledger, run.ledger,
                                           seeded=all(state.transport.replays_noise(i) for i in range(len(clients))),
                                           weights=cfg.release_weights(mcfg),
                                           distributed=plan.distributed, centre_share=cfg.centre_share,
                                           radius=cfg.release_radius, release_centre=cfg.centre_mode(),
                                           budget_check=functools.partial(_release_budget, state),
                                           outputs=run.root / "ckpt" / RELEASE_OUTPUTS,
                                           reuse_outputs=_release_charged(state.ledger, clients, cfg, any_step=True))
            # the clients' DP class counts (public DP outputs): a mixture weights its clients per class
            # and the release's post-processing choices (model.located_share = "auto" resolved, from F)
            atomic_write_json(run.root / RELEASE_FILE, {"client_class_counts": counts,
                                                        **getattr(server, "release_notes", {})})
            saved.parent.mkdir(parents=True, exist_ok=True)
            atomic_save_tensors(saved, server.state_tensors())  # the model set from the release (public DP outputs)
        for i, c in enumerate(clients):
            c.set_space(server.space_for(i))
    if cfg.statistics_only and not released:  # the model is the release itself: write it, no round
        atomic_write_json(run.metrics, [])
        _write_model(state, rounds_done=0)
        run.commit(0, {"statistics_released": True})


def _limits(state: RunState) -> dict[str, tuple[float, bool]]:
    """Client id → ``(the ε its ledger may reach, whether its node sets it)`` for the clients that have a cap.

    ``train.max_epsilon`` where it is set (a site node's cap is never below it); otherwise, over Flower, the cap a
    site SuperNode enforces itself (:func:`fedhype.federated.run_plan.planned_epsilon_caps`: its plan's ε), which
    the server must not find out round by round: a node stops a resume part-way once a release charged again (fresh
    noise) and the rounds after it pass its plan (a probe's secure-aggregation resume ran 7 rounds, refused at 8).
    """
    cfg = state.plan.cfg
    if cfg.no_dp:
        return {}
    if cfg.max_epsilon is not None:
        return {c.id: (float(cfg.max_epsilon), False) for c in state.clients}
    enforces = getattr(state.transport, "enforces_plan_cap", None)
    capped = [i for i in range(len(state.clients)) if enforces is not None and enforces(i)]
    if not capped:
        return {}
    caps = planned_epsilon_caps(cfg, list(state.plan.sizes)) or []
    return {state.clients[i].id: (float(caps[i]), True) for i in capped if i < len(caps)}


def _over(state: RunState, planned: list, limits: dict[str, tuple[float, bool]]) -> dict[str, tuple[float, float]]:
    """Client id → ``(ε with planned, its limit)`` for the clients ``planned`` would take past their limit."""
    out: dict[str, tuple[float, float]] = {}
    for client, (limit, _) in limits.items():
        mine = [e for e in planned if e.client == client]
        if mine:
            for c, eps in state.ledger.would_exceed(mine, limit * (1 + 1e-9)).items():
                out[c] = (eps, limit)
    return out


def _refusal(what: str, over: dict[str, tuple[float, float]], limits: dict[str, tuple[float, bool]],
             done: int) -> BudgetExceededError:
    """The refusal of :func:`_release_budget` / :func:`_rounds_budget`: ``what`` would take ``over`` past their cap.

    Each client is named with its own ε and its own cap, and the ``max_epsilon`` that would let the run finish is
    rounded up (:func:`fedhype.federated.run_plan.at_least`), so that it works as printed."""
    worst = max(eps for eps, _ in over.values())
    limit = min(lim for _, lim in over.values())
    each = "; ".join(f"client {c}: ε = {eps:.6g} > {lim:.6g}" for c, (eps, lim) in sorted(over.items()))
    nodes = any(limits[c][1] for c in over)
    keep = (f"; or keep the last committed round ({done}), whose ε is within it" if done else
            "; nothing was committed yet: there is no trained round to keep")
    if not nodes:
        return BudgetExceededError(
            f"{what.strip()} would take client(s) {sorted(over)} to ε = {worst:.6g} > --max-epsilon {limit:g} with what "
            f"the ledger already holds ({each}); stopped before spending (nothing was charged by this call; completed "
            f"rounds: {done}). To finish the run, raise --max-epsilon to at least {at_least(worst)}{keep}",
            epsilon=worst, limit=limit)
    return BudgetExceededError(
        f"{what.strip()} would take client(s) {sorted(over)} past the ε that the plan of the federation file gives "
        f"them, the cap their SuperNodes enforce, with what the server's ledger already holds ({each}; a release or "
        f"round run again with fresh noise after an interruption is charged again); stopped before spending (nothing "
        f"was charged by this call; completed rounds: {done}). To finish the run, set train.max_epsilon to at least "
        f"{at_least(worst)} in the federation file (a resume accepts the changed file), give every node the new file, "
        f"restart them and resume{keep} (`fedhype audit --run`; docs/flower.md, \"When a node fails\")",
        epsilon=worst, limit=limit)


def _future_rounds(state: RunState, start: int, stop: int) -> list:
    """The DP-SGD events of rounds ``start`` … ``stop − 1`` at full participation (every client every round)."""
    cfg = state.plan.cfg
    every = [(c.id, cfg.sample_rate(c.n), cfg.steps_per_round(c.n)) for c in state.clients]
    future: list = []
    for r in range(start, stop):
        future += dp_sgd_events(r, every, state.plan.noise_multiplier, cfg.clip_norm, mechanism=MECHANISM)
    return future


def _release_budget(state: RunState, pending: list) -> None:
    """Refuse a release that would take a client past its cap (:func:`_limits`: ``train.max_epsilon``, or over
    Flower the plan's ε its site node enforces); nothing charged.

    The plan's check (:func:`fedhype.federated.run_plan.check_plan`) prices a run from scratch; a resume of a run
    interrupted during its release re-releases with fresh noise (unseeded) and is charged again on top of the
    ledger. A new user's probe saw such a resume spend the release again and then stop at round 1 with "stopped
    before spending". So the pending release is priced with the ledger and, at full participation, every DP-SGD
    round still to run (with partial participation, which clients a round samples is not known: the release alone).
    """
    cfg = state.plan.cfg
    limits = _limits(state)
    if not limits or not pending:
        return
    future: list = []
    if cfg.participation >= 1 and not cfg.statistics_only and state.plan.noise_multiplier:
        future = _future_rounds(state, state.done, cfg.rounds)
    over = _over(state, list(pending) + future, limits)
    if over:
        again = any(e.client == pending[0].client and e.mechanism == pending[0].mechanism
                    for e in state.ledger.events)
        raise _refusal(("the statistics release (interrupted before, charged again with fresh noise on this resume) "
                        if again else "the statistics release ")
                       + (f"and the {cfg.rounds - state.done} DP-SGD rounds after it" if future else ""),
                       over, limits, state.done)


def _rounds_budget(state: RunState) -> None:
    """Refuse, before the first round this call runs, DP-SGD rounds still to run that would take a client past its
    cap (:func:`_limits`) with what its ledger already holds (nothing charged).

    The plan's check prices a run from scratch and each round is checked as it is charged; a resume whose ledger
    holds rounds charged again after an interruption (fresh noise) can pass the first and fail the second many rounds
    later: a new user's probe resumed with ``--max-epsilon 2`` ran 12 rounds and stopped at round 20 of 20, the budget
    spent and the model one round short. Over Flower a site node stops such a resume itself, at its plan's ε, without
    ``train.max_epsilon`` (a probe's secure-aggregation resume after a killed node ran 7 rounds and was refused at 8):
    the server prices the rounds against that cap too. At full participation every client runs every round, so the
    rounds left are priced with the ledger as they would be charged (a seeded replay of a charged round is free:
    :func:`fedhype.privacy.ledger.pending_charges`); with partial participation which clients a round samples is not
    known, and the per-round check alone applies.
    """
    cfg = state.plan.cfg
    if cfg.no_dp or cfg.statistics_only or cfg.participation < 1 or not state.plan.noise_multiplier \
            or state.done >= cfg.rounds_run():
        return
    limits = _limits(state)
    if not limits:
        return
    index = {c.id: i for i, c in enumerate(state.clients)}
    future = _future_rounds(state, state.done, cfg.rounds_run())
    planned = pending_charges(state.ledger, future, replays=lambda e: state.transport.replays_noise(index[e.client]))
    over = _over(state, planned, limits)
    if over:
        left = cfg.rounds_run() - state.done
        raise _refusal(f"the {left} DP-SGD round{'s' if left != 1 else ''} still to run (rounds {state.done + 1}–"
                       f"{cfg.rounds_run()})", over, limits, state.done)


# ------------------------------------------------------------------------------------------------ step 3: a round
@dataclass(frozen=True)
class RoundOutcome:
    """A round run and aggregated, not yet committed (:func:`run_round` → :func:`commit_round`).

    Attributes:
        round: r, 0-based.
        participants: the sampled clients' indices, sorted.
        aggregate: what the server's ``aggregate()`` returned (``participants``, ``lipschitz``).
        started: ``time.perf_counter()`` when the round started.
    """

    round: int
    participants: list[int]
    aggregate: dict[str, Any]
    started: float


def sample_clients(state: RunState) -> list[int]:
    """The round's clients: ``max(1, round(P·m))`` of them drawn with the public generator (all at P = 1)."""
    m = len(state.clients)
    k = max(1, round(state.plan.cfg.participation * m))
    return sorted(torch.randperm(m, generator=state.generator)[:k].tolist()) if k < m else list(range(m))


def charge_round(state: RunState, round_idx: int, chosen: list[int]) -> list:
    """Record the round's DP-SGD steps in the ledger before any record is touched (write-ahead); returns the events
    charged.

    Every chosen client is charged its (σ, q_i, K_i) for round ``round_idx``, except a rerun that
    replays the same seeded noise (the ledger's rerun rule, :func:`fedhype.privacy.ledger.pending_charges`).
    Nothing is charged without DP.

    Raises:
        BudgetExceededError: the round would take a client over ``max_epsilon`` (nothing is charged).
    """
    cfg, ledger, clients, transport = state.plan.cfg, state.ledger, state.clients, state.transport
    if cfg.no_dp:
        return []
    index = {clients[i].id: i for i in chosen}
    planned = pending_charges(ledger, dp_sgd_events(
        round_idx, [(clients[i].id, cfg.sample_rate(clients[i].n), cfg.steps_per_round(clients[i].n)) for i in chosen],
        state.plan.noise_multiplier, cfg.clip_norm, mechanism=MECHANISM),
        replays=lambda e: transport.replays_noise(index[e.client]))
    if cfg.max_epsilon is not None:
        over = ledger.would_exceed(planned, cfg.max_epsilon)
        if over:
            worst = max(over.values())
            raise BudgetExceededError(
                f"round {round_idx + 1} would take client(s) {sorted(over)} to ε = {worst:.4g} > --max-epsilon "
                f"{cfg.max_epsilon}; stopped before spending (completed rounds: {round_idx})", epsilon=worst,
                limit=cfg.max_epsilon)
    charge(ledger, planned, state.run.ledger)  # write-ahead: recorded before the data is touched
    return planned


def run_round(state: RunState, round_idx: int) -> RoundOutcome:
    """Step 3: sample, charge (write-ahead), run the clients' DP steps and aggregate their PrivatizedUpdates.

    Raises:
        ArtifactError: a chosen client's private state is corrupt (before anything is charged, where the
            transport can check it: :class:`~fedhype.federated.transport.SupportsPreflight`).
        BudgetExceededError: as :func:`charge_round`.
        FedhypeError: the aggregate is not finite (the round's steps stay in the ledger; nothing of it is
            written), or whatever the transport raises when a client fails (the charges of the clients it names
            as having refused the round before touching their records are voided first:
            :func:`~fedhype.federated.transport.void_refused`).
    """
    t0 = time.perf_counter()
    plan, server, clients = state.plan, state.server, state.clients
    cfg, mcfg = plan.cfg, plan.model
    chosen = sample_clients(state)
    if isinstance(state.transport, SupportsPreflight):  # a corrupt private state fails here, before the ledger is charged
        state.transport.preflight(round_idx, chosen, mcfg)
    charged = charge_round(state, round_idx, chosen)
    tasks = [RoundTask(round=round_idx, index=i, client=clients[i].id, theta=functools.partial(server.theta_for, i),
                       model=mcfg, dp=state.dp, batch_size=cfg.batch_size, steps=cfg.steps_per_round(clients[i].n),
                       lr=cfg.local_lr(mcfg))
             for i in chosen]
    try:
        for t, upd in zip(tasks, state.transport.run_round(round_idx, tasks), strict=True):  # PrivatizedUpdates only
            server.accept(t.index, float(plan.sizes[t.index]), upd)  # weighted by the public client sizes
    except FedhypeError as exc:  # a client that refused the round ran nothing: its write-ahead charge is voided
        void_refused(state.ledger, charged, exc, state.run.ledger)
        raise
    agg = server.aggregate()
    _check_finite(server, round_idx)  # a diverged round is not committed and the next one is not charged
    return RoundOutcome(round_idx, chosen, agg, t0)


# ------------------------------------------------------------------------------------------------ step 4: commit
def commit_round(state: RunState, outcome: RoundOutcome) -> dict[str, Any]:
    """Step 4: write the round's server checkpoint, metrics and model, then its commit point.

    Returns:
        the round's metrics ``{"round", "participants", "seconds", "epsilon", "epsilon_per_client",
        "lipschitz"[, "diagnostics_not_dp"]}`` (also appended to ``metrics.json``).
    """
    run, server, clients, cfg = state.run, state.server, state.clients, state.plan.cfg
    r = outcome.round
    atomic_save_tensors(run.server_ckpt(r + 1), server.state_tensors())
    eps = _epsilons(state.ledger, cfg)
    m = {"round": r, "participants": [clients[i].id for i in outcome.participants],
         "seconds": time.perf_counter() - outcome.started, "epsilon": max(eps.values()) if eps else None,
         "epsilon_per_client": eps, "lipschitz": outcome.aggregate.get("lipschitz")}
    diag = state.transport.diagnostics(server, r + 1, state.plan.model)
    if diag is not None:
        m["diagnostics_not_dp"] = diag
    state.metrics.append(m)
    atomic_write_json(run.metrics, state.metrics)
    _write_model(state)
    run.commit(r + 1)
    state.transport.after_commit(r + 1)
    return m


def result_of(state: RunState) -> TrainResult:
    """The :class:`TrainResult` of a run as it stands (ε recomputed from its ledger)."""
    run, plan = state.run, state.plan
    cfg, distributed = plan.cfg, plan.distributed
    eps = _epsilons(state.ledger, cfg)
    # a run that trains no DP-SGD round (a statistics-only method, or fedhypevae with its stage off) clips nothing and
    # sends nothing per round: no C and per-round bytes 0 (the configured C and the model's message size said otherwise);
    # a non-private run clips nothing either (no C)
    rounds = cfg.rounds_run() > 0
    traffic = state.server.hnet.traffic()
    return TrainResult(
        run_dir=str(run.root), epsilon=(max(eps.values()) if eps else None) if not cfg.no_dp else None,
        delta=cfg.delta, rounds=run.committed_round(), rounds_planned=cfg.rounds_run(),
        clients=[c.id for c in state.clients], noise_multiplier=plan.noise_multiplier, private=not cfg.no_dp,
        class_stats_noise_multiplier=plan.privacy["class_stats_noise_multiplier"], epsilon_per_client=eps,
        clip_norm=cfg.clip_norm if rounds and not cfg.no_dp else None, seed=cfg.seed, noise_seeded=cfg.seed is not None,
        traffic=traffic if rounds else without_rounds(traffic),
        secure_aggregation=({"clients": distributed.clients, "dropout_tolerance": distributed.dropout_tolerance,
                             "min_contributions": distributed.min_contributions} if distributed is not None else None),
        complete=run.committed_round() >= cfg.rounds_run(), client_names=[str(c.name) for c in plan.roster.clients],
        method=cfg.method)


# ------------------------------------------------------------------------------------------------ the loop
def run_federation(partition: "Partition | Roster", cfg: TrainConfig, out: str | Path, *, store_info: dict[str, Any],
                   n_classes: int, connect: Callable[[RunDir], ClientTransport], resume: bool = False,
                   progress: Callable[[dict], None] | None = None, stop_after: int | None = None,
                   on_plan: Callable[[RunDir, RunPlan], None] | None = None,
                   on_open: Callable[["RunState"], None] | None = None) -> TrainResult:
    """The round logic of every deployment (:func:`train` in process, the Flower ServerApp across machines).

    Resolves and checks the run's plan (:func:`resolve_plan`), writes its configuration, then asks
    ``connect(run)`` for the transport to the clients and runs the steps of the module docstring; the
    run directory is written here only.

    Args:
        partition: the clients: a :class:`~fedhype.data.roster.Roster` (names, public sizes n_i, data keys,
            class names), or a partition, of which only its roster is kept.
        cfg, out, resume, progress, stop_after: as for :func:`train`.
        store_info: :func:`describe_store` of the clients' store (public: digest, n, dim, encoder).
        n_classes: K.
        connect: ``connect(run) -> ClientTransport``, called once the run's config is written.
        on_plan: called with the run folder and its checked plan before anything is written
            (:func:`fedhype.federated.site_charges.refuse_site_plans`).
        on_open: called with the opened run before anything is charged
            (:func:`fedhype.federated.site_charges.attach_site_ledgers`).

    Returns and raises as :func:`train` (and whatever the transport raises when a client fails:
    the round is then not aggregated and nothing of it is committed).
    """
    run = RunDir(out)
    if run.root.exists() and not run.root.is_dir():
        raise ValidationError(f"--out {run.root} is a file; give a folder for the run")
    with run.writer_lock():  # one training process per run folder
        recorded = recorded_config(run, resume)
        # fedhypevae without its DP-SGD stage for small clients (public sizes; docs/method.md, decision 22)
        cfg = resolve_stage(cfg, [c.n_train for c in as_roster(partition).clients], recorded)
        check_resumed_settings(run, cfg, recorded)  # what differs, before a plan that is not this run's is checked
        plan = resolve_plan(partition, cfg, store_info=store_info, n_classes=n_classes, recorded=recorded)
        done = committed_rounds(run, plan, resume)
        # a full disk after the release's charge would make the resume pay it again: refused before anything
        check_run_disk(run.root, plan.model, cfg.method, len(plan.sizes), plan.model.linear_path)
        if on_plan is not None:
            on_plan(run, plan)
        state = open_run(run, plan, done, connect)
        if on_open is not None:
            on_open(state)
        release_statistics(state)
        _rounds_budget(state)
        for ran, r in enumerate(range(state.done, cfg.rounds_run())):
            if stop_after is not None and ran >= stop_after:
                break
            m = commit_round(state, run_round(state, r))
            if progress:
                progress(m)
        return result_of(state)


def _release_charged(ledger: PrivacyLedger, clients: list[ClientHandle], cfg: TrainConfig, any_step: bool = False) -> bool:
    """Whether every client's statistics release was charged (or the run is not private); with ``any_step``,
    its statistics step or its centre step (a release interrupted between the two steps charged the centre only:
    its saved outputs are reusable, :func:`fedhype.federated.class_stats.run_class_stats_stage`). A charge since
    voided counts (its node refused and released nothing: a saved partial file lacks it, and the resume asks it)."""
    from fedhype.federated.class_stats import MECHANISM as RELEASE
    from fedhype.privacy.centring import MECHANISM as CENTRE

    if cfg.no_dp:
        return True
    steps = {RELEASE, CENTRE} if any_step else {RELEASE}
    done = {e.client for e in ledger.recorded if e.mechanism in steps and e.round == -1 and not e.voids}
    return all(c.id in done for c in clients)


def _check_finite(server: ServerStrategy, round_idx: int) -> None:
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
                           "charged). A resume keeps the run's settings (and, seeded, replays the same noise): start a new run in "
                           "another --out with a smaller local learning rate (fedhype train --lr-local; fedhype run --set "
                           "train.lr_local=…) or a larger clipping norm C (--clip-norm; train.clip_norm=…)")


def _epsilons(ledger: PrivacyLedger, cfg: TrainConfig) -> dict[str, float]:
    if cfg.no_dp:
        return {}
    return ledger.epsilons()


def _write_model(state: RunState, rounds_done: int | None = None) -> None:
    """The run's model file: Φ, the codes and the public metadata (ε so far, sizes, the DP class counts)."""
    run, server, clients, plan = state.run, state.server, state.clients, state.plan
    cfg, partition, sizes = plan.cfg, plan.roster, plan.sizes
    eps = _epsilons(state.ledger, cfg)
    meta = {"model": server.cfg.to_dict(), "clients": [c.id for c in clients],
            "client_names": [c.name for c in partition.clients], "client_sizes": sizes,
            "class_names": partition.class_names, "epsilon": max(eps.values()) if eps else None,
            "delta": cfg.delta, "private": not cfg.no_dp, "rounds_done": run.committed_round() + 1 if rounds_done is None else rounds_done,
            "method": cfg.method, "run_id": run.root.name, "seed": cfg.seed,
            # provenance: the clients' data keys (random: a partition's or the sites') and how the data was embedded
            "data_keys": [c.key for c in partition.clients], "embedding": plan.resolved["store"].get("provenance")}
    release = run.root / RELEASE_FILE
    if release.exists():
        outputs = read_json(release, "release outputs")
        counts = outputs.get("client_class_counts")
        if counts is not None:
            meta["client_class_counts"] = counts  # DP counts [m][K]: per-class weights of a mixture
        # model.located_share = "auto"'s choice, F, r; and per client the share of its own statistics the client
        # shrinkage kept (synthesize notes a client code that is the pool's: fedhype.synthesis.sample.pooled_clients_note)
        for k in (*RELEASE_NOTE_KEYS, "client_mean_shrinkage", "client_cov_shrinkage"):
            if k in outputs:
                meta[k] = outputs[k]
    save_model(run.model, server.hnet, server.codes, meta)
