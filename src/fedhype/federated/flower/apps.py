"""fedhype's Flower ServerApp and ClientApp (Message API, flwr ≥ 1.42).

* :data:`server_app` runs on the SuperLink's machine. It reads the public ``federation.json``
  (:mod:`fedhype.federated.flower.federation`), waits for one SuperNode per client, and runs the
  engine's round logic (:func:`fedhype.federated.engine.run_federation`: sampling, write-ahead
  ledger, aggregation, commits) with a :class:`~fedhype.federated.flower.grid_transport.FlowerTransport`.
  It writes the run directory exactly as ``fedhype train`` does — except ``clients/``: the clients'
  private state stays on their own machines.
* :data:`client_app` runs on each SuperNode. It answers ``query`` (its public client id),
  ``train.class_stats`` (the DP class statistics, once), ``train.secagg`` (a stage of SecAgg+, under
  secure aggregation instead of ``train.class_stats``) and ``train`` (one round of local DP-SGD
  steps) with :mod:`fedhype.federated.flower.node`; its replies are PrivatizedUpdates, or SecAgg+
  keys, encrypted shares and masked integer vectors (:mod:`fedhype.federated.flower.wire`,
  :mod:`fedhype.federated.flower.secagg`).

Server run config (``[tool.flwr.app.config]``, see :func:`~fedhype.federated.flower.federation.write_app`):
``federation``, ``run-dir``, ``resume``, ``connect-timeout``, ``round-timeout``, ``straggler-timeout``,
``wire-log``, ``wire-dump``.

With ``train.secure_aggregation`` the statistics release before round 0 goes through SecAgg+ between
the SuperNodes, with Skellam noise in the integer domain (:mod:`fedhype.federated.flower.secagg`,
:mod:`fedhype.privacy.skellam`); the DP-SGD rounds are per client, as without it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from logging import ERROR, INFO
from pathlib import Path
from typing import Any, Mapping

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedhype.errors import FedhypeError, ValidationError
from fedhype.federated.flower.handshake import for_the_server, node_identity

# Every message runs in a fresh ``flwr-clientapp`` process that imports this module: the torch
# stack is imported only by the handlers that need it (the identity answer stays cheap).

server_app = ServerApp()
client_app = ClientApp()


@dataclass(frozen=True)
class ServerSettings:
    """The ServerApp's run config."""

    federation: Path
    run_dir: Path
    resume: bool = False
    connect_timeout: float = 300.0
    round_timeout: float = 3600.0
    straggler_timeout: float = 600.0
    wire_log: Path | None = None
    wire_dump: Path | None = None

    @classmethod
    def from_run_config(cls, rc: Mapping[str, Any]) -> "ServerSettings":
        """Raises ValidationError naming a missing or bad key."""
        for key in ("federation", "run-dir"):
            if not str(rc.get(key, "")):
                raise ValidationError(f"run config lacks {key!r}; set it in the app's pyproject.toml or with "
                                      f"flwr run ... --run-config '{key}=\"/path\"'")
        try:
            timeouts = [float(rc.get(k, d)) for k, d in (("connect-timeout", 300.0), ("round-timeout", 3600.0),
                                                        ("straggler-timeout", 600.0))]
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"run config: timeouts must be numbers of seconds ({exc})") from None
        if min(timeouts) <= 0:
            raise ValidationError(f"run config: timeouts must be > 0 seconds, got {timeouts}")
        resume = rc.get("resume", False)
        if not isinstance(resume, bool):
            raise ValidationError(f"run config: resume must be true or false (TOML), got {resume!r}")
        wire_log, wire_dump = str(rc.get("wire-log", "")), str(rc.get("wire-dump", ""))
        return cls(Path(str(rc["federation"])), Path(str(rc["run-dir"])), resume, *timeouts,
                   Path(wire_log) if wire_log else None, Path(wire_dump) if wire_dump else None)


def run_server(grid: Grid, settings: ServerSettings) -> dict[str, Any]:
    """Train the federation of ``settings`` over ``grid``; returns :func:`run_federation`'s result.

    Raises:
        ValidationError: bad settings, a non-federated method, a too-small client.
        NodeFailure: SuperNodes missing, or a client failed in a round (nothing of that round is committed).
        ArtifactError: a bad federation file, or a reply that is not a valid PrivatizedUpdate.
        BudgetExceededError: as for ``fedhype train``.
    """
    try:
        return _run_server(grid, settings)
    except FedhypeError as exc:  # the engine's advice names fedhype train's flags: on Flower, the run config keys
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (flower_terms(exc.args[0]), *exc.args[1:])
        raise


#: the engine's words for ``fedhype train``'s flags and what they are on Flower (the ServerApp's run config)
_FLOWER_TERMS = (
    ("pass --resume to continue it or choose another --out",
     "continue it with --run-config 'resume=true' or choose another run-dir"),
    ("drop --resume to start a new run", "set resume=false (the default) to start a new run"),
    ("resume this run with --resume", "resume this run with resume=true"),
    ("in another --out", "in another run-dir"),
    ("give an --out on", "give a run-dir on"),
    ("--resume:", "resume=true:"),
    ("--out ", "run-dir "),
    ("--resume", "resume=true"),
    ("raise --max-epsilon to", "set train.max_epsilon in the federation file (give every node the new file, restart "
                               "them) to"),
    ("> --max-epsilon", "> train.max_epsilon"),
)


def flower_terms(text: str) -> str:
    """``text`` (an error of the engine) with ``fedhype train``'s ``--resume`` / ``--out`` named as the ServerApp's
    run config keys ``resume=true`` / ``run-dir``."""
    for old, new in _FLOWER_TERMS:
        text = text.replace(old, new)
    return text


def _run_server(grid: Grid, settings: ServerSettings) -> dict[str, Any]:
    from fedhype.federated.baselines import federation as federation_kind
    from fedhype.federated.engine import check_client_sizes, run_federation
    from fedhype.federated.flower.federation import Federation, check_secure_aggregation
    from fedhype.federated.flower.grid_transport import FlowerTransport, run_key_of
    from fedhype.federated.rundir import RunDir

    fed = Federation.load(settings.federation)
    if federation_kind(fed.train.method) == "pooled":
        raise ValidationError(f"method {fed.train.method!r} pools all records on one machine; use `fedhype train`")
    distributed = check_secure_aggregation(fed.train, len(fed.roster.clients))  # SecAgg+ needs 2t < m
    check_client_sizes(fed.roster, fed.train)
    transport = FlowerTransport.connect(grid, fed.roster, int(fed.store["dim"]),
                                        connect_timeout=settings.connect_timeout, round_timeout=settings.round_timeout,
                                        straggler_timeout=settings.straggler_timeout, wire_log=settings.wire_log,
                                        wire_dump=settings.wire_dump, federation=fed.digest,
                                        # the run a resume continues ("" for a new one): its sites check it first
                                        run_key=(run_key_of(RunDir(settings.run_dir)) or "") if settings.resume else "")
    if distributed is not None:  # the release before round 0 through SecAgg+ (fedhype.federated.flower.secagg)
        from fedhype.federated.secure_release import planned_tails

        transport.enable_secure_aggregation(distributed, fed.train.delta, planned_tails(
            fed.train, [c.n_train for c in fed.roster.clients]))
    result = run_federation(fed.roster, fed.train, settings.run_dir, store_info=fed.store, n_classes=fed.n_classes,
                            connect=transport.bind, resume=settings.resume, progress=_log_round)
    log(INFO, "fedhype: %s", json.dumps({k: result[k] for k in ("run_dir", "rounds", "rounds_planned", "epsilon",
                                                                 "delta", "complete")}))
    return result


def _log_round(m: dict) -> None:
    eps = m.get("epsilon")
    log(INFO, "fedhype: round %d committed (participants %s, ε so far %s, %.1f s)", m["round"] + 1,
        m["participants"], "n/a" if eps is None else f"{eps:.4g}", m["seconds"])


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    try:
        run_server(grid, ServerSettings.from_run_config(context.run_config))
    except FedhypeError as exc:
        log(ERROR, "fedhype: %s: %s", type(exc).__name__, exc)
        raise


def _node_side(handler):
    """A ClientApp handler whose errors reach the server only as :func:`~fedhype.federated.flower.handshake.for_the_server`
    lets them (a refusal's text; any other error's type and a reference into the node's log)."""

    @functools.wraps(handler)
    def run(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except Exception as exc:  # noqa: BLE001  (Flower sends the type and text of whatever is raised here)
            out = for_the_server(exc)
            if out is exc:
                raise
            raise out from exc  # the cause shows in the node's own log (Flower logs the traceback), not on the wire

    return run


@client_app.query()
@_node_side
def _identity(msg: Message, context: Context) -> Message:
    return Message(node_identity(context.node_config, msg.content), reply_to=msg)


@client_app.train("class_stats")
@_node_side
def _class_stats(msg: Message, context: Context) -> Message:
    from fedhype.federated.flower import node

    return Message(node.run_class_stats(context.node_config, msg.content), reply_to=msg)


@client_app.train("secagg")
@_node_side
def _secagg(msg: Message, context: Context) -> Message:
    from fedhype.federated.flower import secagg  # the node's secrets stay in its context state

    return Message(secagg.node_message(context.node_config, context.state, msg.content), reply_to=msg)


@client_app.train()
@_node_side
def _train(msg: Message, context: Context) -> Message:
    from fedhype.federated.flower import node

    return Message(node.run_train(context.node_config, msg.content), reply_to=msg)
