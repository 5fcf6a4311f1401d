"""The server side of a Flower deployment: a :class:`~fedhype.federated.transport.ClientTransport`
over a Flower ``Grid`` (one SuperNode per client).

:meth:`FlowerTransport.connect` waits for the SuperNodes and asks each for its public client id
(``query``); :meth:`FlowerTransport.run_round` sends every sampled client its ``train`` message
(θ_i^0 and public settings) at once and decodes the replies with
:func:`fedhype.federated.flower.wire.decode_update`. A round returns all updates or raises
:class:`NodeFailure` — it is then not aggregated, :func:`fedhype.federated.engine.run_federation`
stops before its commit, and a later run with ``resume = true`` reruns it (the write-ahead ledger
already holds its events: a node with seeded noise replays them and is not charged again, an
unseeded node is charged again). A node that *refused* the request (its reply is a
:class:`~fedhype.federated.flower.handshake.Refusal`, raised before it touches its records) released
nothing: :class:`NodeFailure` names it in ``refused`` and the engine voids its write-ahead charge
(:func:`fedhype.federated.transport.void_refused`); a node without a reply in time, or with any other
error, keeps its charge (it may have run).

Waiting is bounded: ``connect_timeout`` for the nodes to appear, ``round_timeout`` per round, and
``straggler_timeout`` after the first reply of a round (a node that died mid-round is detected
after that long, well before Flower's heartbeat expiry).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from fedhype.data.partition import Partition
from fedhype.data.roster import Roster, as_roster
from fedhype.errors import FedhypeError
from fedhype.federated.flower import handshake, wire
from fedhype.federated.flower.handshake import node_reason, node_refused
from fedhype.federated.rundir import RunDir
from fedhype.federated.transport import RoundTask
from fedhype.privacy.dp_step import RELEASE_SENSITIVITY, DPConfig, PrivatizedUpdate


class NodeFailure(FedhypeError):
    """A SuperNode is missing, did not answer in time, or answered with an error (exit code 1).

    Attributes:
        received: the updates that did arrive, by client index (a pre-round release that failed for some clients:
            :meth:`FlowerTransport.class_stats`); empty otherwise.
        refused: ``{client id: the node's refusal}`` of the clients whose node refused the request explicitly,
            before touching its records (:data:`fedhype.federated.transport.REFUSED`: their charges are voided);
            a node without a reply in time or with another error is not in it.
    """

    def __init__(self, message: str, *, received: "dict[int, PrivatizedUpdate] | None" = None,
                 refused: "dict[str, str] | None" = None):
        super().__init__(message)
        self.received = dict(received or {})
        self.refused = dict(refused or {})


def run_key_of(run: RunDir, create: bool = False) -> str | None:
    """The run's key on its nodes: ``ckpt/run-key.json``'s (:meth:`~fedhype.federated.rundir.RunDir.run_key`: the
    run folder's name and a random token drawn once, as the in-process engine keys its sites' ledgers), with the
    characters a node's state-dir cannot take in a folder name replaced by "_"; None (``create`` False) before a
    new run has one. A run begun before the key was random (a ``ledger.json``, no key file) keeps the key its nodes
    know it by: its folder's name and a digest of its path.

    Raises:
        ArtifactError: an unreadable key file.
    """
    key = run.run_key()
    if key is None and run.ledger.exists():
        root = Path(run.root).resolve()
        return f"{_safe_name(root.name[:60])}-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"
    if key is None and create:
        key = run.run_key(create=True)
    if key is None:
        return None
    name, _, token = key.rpartition("-")
    return f"{_safe_name(name[:60])}-{token}"


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


class RemoteClient:
    """The server's handle of a client that lives on a SuperNode: public id, name and size only."""

    def __init__(self, transport: "FlowerTransport", index: int, client_id: str, name: str, n: int):
        self._transport = transport
        self.index, self.id, self.name, self.n = index, client_id, name, n
        self.space: tuple[torch.Tensor, torch.Tensor] | None = None

    def release_centre(self, noise_multiplier: float | None) -> PrivatizedUpdate:
        """This client's DP centre release (all clients are asked at once, on the first call)."""
        return self._transport.centres(noise_multiplier)[self.index]

    def release_class_stats(self, n_classes: int, dp: DPConfig, weights=None, *, centring=None) -> PrivatizedUpdate:
        """This client's DP class statistics, every client around ``centring`` (all asked at once, on the first call)."""
        return self._transport.class_stats(n_classes, dp, weights, [centring] * len(self._transport.clients))[self.index]

    @staticmethod
    def release_centre_all(clients: "list[RemoteClient]", noise_multiplier: float | None) -> list[PrivatizedUpdate]:
        """The DP centre releases of ``clients`` (every client, or the ones a resume still misses), in one message to
        each of their nodes (:func:`fedhype.federated.class_stats.release_all_centres`).

        Raises:
            NodeFailure: some nodes gave no centre; it carries the centres that arrived as
                :data:`fedhype.federated.class_stats.RELEASED` (by position in ``clients``), which the release saves.
        """
        return RemoteClient._batch(clients, lambda t, idx: t.centres(noise_multiplier, indices=idx))

    @staticmethod
    def _batch(clients: "list[RemoteClient]", ask) -> list[PrivatizedUpdate]:
        from fedhype.federated.class_stats import RELEASED

        if not clients:
            return []
        try:
            return ask(clients[0]._transport, [c.index for c in clients])
        except NodeFailure as exc:
            setattr(exc, RELEASED, {j: exc.received[c.index] for j, c in enumerate(clients) if c.index in exc.received})
            raise

    @staticmethod
    def release_class_stats_all(clients: "list[RemoteClient]", n_classes: int, dp: DPConfig, weights,
                                centrings: list) -> list[PrivatizedUpdate]:
        """The DP class statistics of ``clients`` (every client, or the ones a resume still misses), client i around
        ``centrings[i]``, in one message to each of their nodes (:func:`fedhype.federated.class_stats.release_all_class_stats`).

        Raises:
            NodeFailure: some nodes gave no update; it carries the updates that arrived as
                :data:`fedhype.federated.class_stats.RELEASED` (by position in ``clients``), which the release saves.
        """
        return RemoteClient._batch(clients, lambda t, idx: t.class_stats(n_classes, dp, weights, centrings, indices=idx))

    def secure_session(self):
        """The run's SecAgg+ session (:class:`~fedhype.federated.flower.secagg.FlowerSecureSession`): under secure
        aggregation the release before round 0 goes through it (:mod:`fedhype.federated.secure_release`)."""
        if self._transport.secure is None:
            raise RuntimeError("secure aggregation was not enabled on this Flower transport")
        return self._transport.secure

    def set_space(self, space: tuple[torch.Tensor, torch.Tensor]) -> None:
        """The public model space ``(mean [D], scale [])`` sent with this client's round tasks."""
        self.space = (space[0].detach().clone(), space[1].detach().clone())


class FlowerTransport:
    """Round tasks to SuperNodes and PrivatizedUpdates back, through a Flower ``Grid``.

    Build it with :meth:`connect`; :meth:`bind` attaches the run directory (done by the ServerApp
    as the engine's ``connect`` callback).
    """

    #: a node refuses a request before touching its records (its reply says so): the run's ledger may void the
    #: refused charge (:attr:`fedhype.privacy.ledger.PrivacyLedger.takes_voids`)
    explicit_refusals = True

    def __init__(self, grid, partition: Roster | Partition, dim: int, nodes: dict[int, int], seeded: dict[int, bool], *,
                 round_timeout: float, straggler_timeout: float, poll: float = 0.25, wire_log: Path | None = None,
                 wire_dump: Path | None = None, federation: str = ""):
        self.grid = grid
        self.federation = str(federation)  # the digest of the server's federation file, sent with every task
        self.roster, self.dim = as_roster(partition), int(dim)
        self.nodes, self.seeded = nodes, seeded
        self.capped: dict[int, bool] = {}  # client index → its node is a site node (its own ledger, capped at the plan)
        self.round_timeout, self.straggler_timeout, self.poll = float(round_timeout), float(straggler_timeout), poll
        self.wire_log, self.wire_dump = wire_log, wire_dump
        self.secure = None  # the SecAgg+ session under secure aggregation (enable_secure_aggregation)
        self._logged = 0
        self.clients = [RemoteClient(self, i, str(c.id), c.name, c.n_train) for i, c in enumerate(self.roster.clients)]
        self.run_key: str | None = None
        self._stats: dict[tuple, dict[int, tuple]] = {}  # a pre-round release → {client index: (centre, update)}

    # ------------------------------------------------------------------ connection
    @classmethod
    def connect(cls, grid, partition: Roster | Partition, dim: int, *, connect_timeout: float, round_timeout: float,
                straggler_timeout: float, poll: float = 0.25, wire_log: Path | None = None,
                wire_dump: Path | None = None, federation: str = "", run_key: str = "") -> "FlowerTransport":
        """Wait for one SuperNode per partition client and learn which node holds which client.

        Args:
            grid: the ServerApp's Flower ``Grid``.
            partition: the public roster (one SuperNode per client; a partition is reduced to its roster).
            dim: D of the store (shape of the class statistics).
            connect_timeout, round_timeout, straggler_timeout: seconds (see the module docstring).
            poll: seconds between pulls of replies.
            wire_log: append the structure of every message sent and received here (JSON lines).
            wire_dump: write the arrays of every message received here (``.npy``; audit).
            federation: :func:`~fedhype.federated.flower.handshake.federation_digest` of the server's federation
                file; a site node holding another file is refused here, before anything is released.
            run_key: the key of the run a resume continues (:func:`run_key_of`; "" for a new run), sent with the
                query: a site node refuses here a federation file it already served for another run, and a plan
                that would pass its site's lifetime ε cap (:mod:`fedhype.federated.flower.node_budget`).

        A node that Flower reports unavailable (``ErrorCode.NODE_UNAVAILABLE``: the stale id of a
        SuperNode that died, listed until its heartbeat expires) is skipped; its client is still
        expected from another node until the deadline.

        Raises:
            NodeFailure: a client's node did not answer within ``connect_timeout`` seconds, two
                nodes claim the same client, or a node's answer is another error (e.g. a bad node config).
        """
        self = cls(grid, partition, dim, {}, {}, round_timeout=round_timeout, straggler_timeout=straggler_timeout,
                   poll=poll, wire_log=wire_log, wire_dump=wire_dump, federation=federation)
        partition = self.roster
        ids = {str(c.id): i for i, c in enumerate(partition.clients)}
        pending: dict[str, int] = {}  # message id → node id
        asked: set[int] = set()
        unavailable: dict[int, str] = {}  # node id → Flower's reason (stale ids of dead SuperNodes)
        deadline = time.monotonic() + connect_timeout
        while True:
            new = [n for n in grid.get_node_ids() if n not in asked]
            if new:
                msgs = [Message(handshake.encode_query(run_key), dst_node_id=n, message_type=handshake.QUERY_TYPE,
                                ttl=connect_timeout + 60) for n in new]
                for n, m in zip(new, msgs):
                    self._log("server→node", handshake.QUERY_TYPE, None, None, m.content)
                pending.update(zip(grid.push_messages(msgs), new))
                asked.update(new)
            for rep in grid.pull_messages(list(pending)):
                node = pending.pop(rep.metadata.reply_to_message_id, None)
                if node is None:
                    continue
                if rep.has_error():
                    if rep.error.code == ErrorCode.NODE_UNAVAILABLE:
                        # a stale node id: a SuperNode that died (and may have been restarted under a new
                        # id) stays listed by the SuperLink until its heartbeat expires; skip it, and fail
                        # only if a client is still missing at the deadline
                        unavailable[node] = str(rep.error.reason)
                        log(INFO, "fedhype: SuperNode %s is unavailable (stale id?); skipped", node)
                        continue
                    if node_refused(str(rep.error.reason)):
                        raise NodeFailure(f"SuperNode {node} refused the connection — {node_reason(rep.error.reason)}. "
                                          "Nothing was released or charged")
                    raise NodeFailure(f"SuperNode {node} could not say which client it holds: "
                                      f"{node_reason(rep.error.reason)}")
                self._log("node→server", handshake.QUERY_TYPE, None, None, rep.content)
                ident = handshake.decode_identity(rep.content, f"identity of SuperNode {node}")
                if ident["client"] not in ids:
                    raise NodeFailure(f"SuperNode {node} holds client {ident['client']!r}, which is not in the server's "
                                      f"partition (clients {sorted(ids)}); check the SuperNodes' --node-config")
                index = ids[ident["client"]]
                if ident["federation"] and self.federation and ident["federation"] != self.federation:
                    raise NodeFailure(f"SuperNode {node} (client {ident['client']}) holds another federation file than "
                                      "this server (its plan — ε, δ, rounds, batch size — differs from the one the site "
                                      "agreed to); give the coordinator and every site the same federation.json. "
                                      "Nothing was released or charged")
                if index in self.nodes and self.nodes[index] != node:
                    raise NodeFailure(f"client {ident['client']} is held by two SuperNodes ({self.nodes[index]}, {node}); "
                                      "start exactly one SuperNode per client")
                self.nodes[index], self.seeded[index] = node, ident["seeded"]
                self.capped[index] = bool(ident["federation"])  # a site node: it refuses past its plan's ε
            if len(self.nodes) == len(ids):
                log(INFO, "fedhype: %d SuperNodes connected (client → node: %s)", len(ids),
                    {partition.clients[i].id: n for i, n in sorted(self.nodes.items())})
                return self
            if time.monotonic() > deadline:
                missing = [c.id for i, c in enumerate(partition.clients) if i not in self.nodes]
                raise NodeFailure(f"waited {connect_timeout:g} s for the SuperNodes: no answer for client(s) {missing} "
                                  f"({len(asked)} node(s) seen" + (f", {len(unavailable)} of them unavailable: "
                                                                   f"{sorted(unavailable)}" if unavailable else "")
                                  + "); start one SuperNode per client against this SuperLink (--node-config "
                                    "site=... federation=... for a site, or client=... for a pooled partition), then "
                                    "run again; after a SuperLink restart every SuperNode must be restarted too")
            time.sleep(poll)

    def enable_secure_aggregation(self, noise, delta: float, tails) -> "FlowerTransport":
        """Release the statistics before round 0 through SecAgg+ with Skellam noise (:mod:`fedhype.federated.flower.secagg`).

        Args:
            noise: the run's (m, t) (:class:`~fedhype.privacy.secure_agg.DistributedNoise`; 2t < m).
            delta: δ. tails: every client's planned DP-SGD history (the noise calibration,
                :func:`fedhype.federated.secure_release.release_plans`).
        """
        from fedhype.federated.flower.secagg import FlowerSecureSession

        self.secure = FlowerSecureSession(self, noise, delta, tails)
        return self

    def bind(self, run: RunDir) -> "FlowerTransport":
        """Attach the run: its key (:func:`run_key_of`, drawn at random once and kept in the run folder) names the
        nodes' private state folders and their charges across runs; a resume of the same folder keeps it."""
        self.run_key = run_key_of(run, create=True)
        return self

    # ------------------------------------------------------------------ ClientTransport
    def replays_noise(self, index: int) -> bool:
        return bool(self.seeded.get(index, False))

    def enforces_plan_cap(self, index: int) -> bool:
        """True where client ``index``'s SuperNode is a site node: it holds the federation file and refuses any
        request past the ε that file's plan gives it (:mod:`fedhype.federated.flower.node_budget`)."""
        return bool(self.capped.get(index, False))

    def diagnostics(self, server, rounds_done: int, model) -> None:
        return None  # held-out diagnostics would read the clients' validation records: not on a deployment

    def after_commit(self, rounds_done: int) -> None:
        return None  # each node drops its older private state when the next round reaches it

    def run_round(self, round_idx: int, tasks: list[RoundTask]) -> list[PrivatizedUpdate]:
        """Send every task at once; return the decoded updates in task order, or raise NodeFailure."""
        ttl = self.round_timeout + 60
        msgs = []
        for t in tasks:
            content = wire.encode_task(t, run_key=self._key(), n_train=self.clients[t.index].n,
                                       data_key=self.roster.clients[t.index].key, space=self.clients[t.index].space,
                                       federation=self.federation)
            msgs.append(Message(content, dst_node_id=self.nodes[t.index], message_type=wire.TRAIN,
                                group_id=str(round_idx), ttl=ttl))
        replies = self._exchange([t.index for t in tasks], msgs, wire.TRAIN, round_idx)
        self._raise_failures(replies, [t.index for t in tasks], f"round {round_idx + 1}",
                             f"The round was not aggregated and nothing of it is committed (completed rounds: "
                             f"{round_idx}).", "this round")
        # q_i as planned (TrainConfig.sample_rate) and as the client computes it (Client.run_round)
        return [wire.decode_update(replies[t.index].content,
                                   wire.Expected.of_task(t, min(1.0, t.batch_size / self.clients[t.index].n)))
                for t in tasks]

    def centres(self, noise_multiplier: float | None, indices: "list[int] | None" = None) -> list[PrivatizedUpdate]:
        """The DP centre releases of the clients ``indices`` (default every client; ``train.class_stats`` with stage
        ``centre``, each client asked once), in that order.

        Raises:
            NodeFailure: some nodes gave no centre; its ``received`` holds the others' by client index (the release
                saves them: a resume asks only the missing).
        """
        from fedhype.privacy.dp_step import LEGACY_WEIGHTS

        dp = DPConfig(noise_multiplier, RELEASE_SENSITIVITY, enabled=bool(noise_multiplier))
        return self._release(("centre", dp), "the release's centre", lambda i: wire.encode_stats_request(
            self.clients[i].id, 0, dp, LEGACY_WEIGHTS, run_key=self._key(), n_train=self.clients[i].n,
            data_key=self.roster.clients[i].key, stage="centre", federation=self.federation),
            lambda i: wire.Expected.of_centre(self.clients[i].id, self.dim, dp),
            None if indices is None else [int(i) for i in indices],
            kept=("The other clients' centres (public DP outputs) are kept in the run folder: a resume asks only the "
                  "client(s) above for theirs."))

    def class_stats(self, n_classes: int, dp: DPConfig, weights=None, centrings=None,
                    indices: "list[int] | None" = None) -> list[PrivatizedUpdate]:
        """The DP class statistics of the clients ``indices`` (default every client; one ``train.class_stats``
        message each, each client asked once), in that order.

        ``centrings``: None (uncentred) or one public :class:`~fedhype.privacy.centring.Centring` per
        client asked, in the order of ``indices`` (a node gets its own in its request).

        Raises:
            NodeFailure: some nodes gave no update (no reply in time, or an error); its ``received`` holds the
                updates of the others by client index (the release saves them: a resume asks only the missing).
        """
        from fedhype.privacy.dp_step import LEGACY_WEIGHTS

        weights = LEGACY_WEIGHTS if weights is None else weights
        indices = list(range(len(self.clients))) if indices is None else [int(i) for i in indices]
        cens = [None] * len(indices) if centrings is None else list(centrings)
        if len(cens) != len(indices):
            raise ValueError(f"{len(cens)} centrings for {len(indices)} clients")
        by_index = dict(zip(indices, cens))
        return self._release((n_classes, dp, weights), "the class statistics", lambda i: wire.encode_stats_request(
            self.clients[i].id, n_classes, dp, weights, run_key=self._key(), n_train=self.clients[i].n,
            data_key=self.roster.clients[i].key, centring=by_index[i], federation=self.federation),
            lambda i: wire.Expected.of_stats(self.clients[i].id, n_classes, self.dim, dp, weights), indices,
            {i: None if c is None else (tuple(c.centre.tolist()), float(c.radius)) for i, c in by_index.items()},
            kept=("The other clients' updates (public DP outputs) are kept in the run folder: a resume asks "
                  "only the client(s) above."))

    def _release(self, key, what: str, request, expected, indices: "list[int] | None" = None,
                 around: "dict[int, object] | None" = None, kept: str = "") -> list[PrivatizedUpdate]:
        """Ask each client of ``indices`` (default every client) once for a pre-round release (cached by ``key`` and
        client) and decode the replies, in the order of ``indices``. ``around``: what each client's release is
        computed around (its centring), checked against a cached one. ``kept``: said on a partial failure.

        Raises:
            RuntimeError: a client already released under ``key`` around another centre (one release per run: a second
                one would not be in the ledger).
            NodeFailure: some clients gave no update (``received``: the others', by client index).
        """
        indices = list(range(len(self.clients))) if indices is None else indices
        around = around or {}
        done = self._stats.setdefault(key, {})
        if any(i in done and done[i][0] != around.get(i) for i in indices):
            raise RuntimeError("the class statistics were already released around other centres; refusing a second release")
        ask = [i for i in indices if i not in done]
        if ask:
            msgs = [Message(request(i), dst_node_id=self.nodes[i], message_type=wire.STATS_TYPE,
                            ttl=self.round_timeout + 60) for i in ask]
            replies = self._exchange(ask, msgs, wire.STATS_TYPE, -1)
            ok = [i for i in ask if i in replies and not replies[i].has_error()]
            if len(ok) < len(ask):  # the others' updates (public DP outputs) travel with the failure
                received = {}
                for i in ok:
                    try:
                        received[i] = wire.decode_update(replies[i].content, expected(i))
                    except FedhypeError:  # a malformed reply counts as missing: asked again on a resume
                        continue
                for i, u in received.items():
                    done[i] = (around.get(i), u)
                state = "No round was trained (completed rounds: 0)." + (f" {kept}" if kept and received else "")
                self._raise_failures(replies, ask, what, state, "the release", received=received)
            for i in ask:
                done[i] = (around.get(i), wire.decode_update(replies[i].content, expected(i)))
        return [done[i][1] for i in indices]

    # ------------------------------------------------------------------ plumbing
    def _key(self) -> str:
        if self.run_key is None:
            raise RuntimeError("FlowerTransport.bind(run) must be called before any round")
        return self.run_key

    def _exchange(self, labels: list[int], msgs: list[Message], kind: str, round_idx: int) -> dict[int, Message]:
        for lab, m in zip(labels, msgs):
            self._log("server→node", kind, round_idx, self.clients[lab].id, m.content)
        pending = dict(zip(self.grid.push_messages(msgs), labels))
        replies: dict[int, Message] = {}
        deadline = time.monotonic() + self.round_timeout
        while pending:
            for rep in self.grid.pull_messages(list(pending)):
                lab = pending.pop(rep.metadata.reply_to_message_id, None)
                if lab is None:
                    continue
                replies[lab] = rep
                if rep.has_content():
                    self._log("node→server", kind, round_idx, self.clients[lab].id, rep.content)
                if len(replies) == 1:  # a live node should answer soon after the first one
                    deadline = min(deadline, time.monotonic() + self.straggler_timeout)
            if pending and time.monotonic() >= deadline:
                break
            if pending:
                time.sleep(self.poll)
        return replies

    def _raise_failures(self, replies: dict[int, Message], labels: list[int], what: str, state: str,
                        step: str = "this round", received: "dict[int, PrivatizedUpdate] | None" = None) -> None:
        """Raise NodeFailure naming every client without an update; ``step``: "this round" or "the release" (what
        the write-ahead ledger holds the events of, and what a rerun repeats); ``received``: the updates that did
        arrive, by client index (carried by the NodeFailure)."""
        problems, refused = [], {}
        for lab in labels:
            c = self.clients[lab]
            if lab not in replies:
                problems.append(f"client {c.id} ({c.name}, SuperNode {self.nodes[lab]}): no reply in time "
                                "(node stopped or unreachable?)")
            elif replies[lab].has_error():
                reason = str(replies[lab].error.reason)
                if node_refused(reason):  # raised before the node touched its records: it released nothing
                    refused[c.id] = node_reason(reason).removeprefix("node refused: ")
                problems.append(f"client {c.id} ({c.name}): {node_reason(reason)}")
        if problems:
            advice = ("A node refused the request (its reason is above): a restart does not change that; fix what it "
                      "names (the federation file every node holds, the node config, a site's card), then run again "
                      "with resume=true. " if refused else "Restart the SuperNode(s), then run again with resume=true. ")
            others = len(problems) > len(refused)
            ledger = (f"(The write-ahead ledger keeps {step}'s events" + (" of the client(s) without a refusal" if refused
                                                                          else "")
                      + (": seeded nodes replay them uncharged, unseeded nodes are charged again — so a site node's own "
                         "ledger can pass the ε its federation file plans before the last round; the resume then stops "
                         "before its first step, naming the ε it would reach: to finish, give every node a "
                         "federation file whose train.max_epsilon covers the charge made again (`fedhype audit --run` "
                         "shows what was charged) before resuming" if others else "")
                      + ("; the charge of each client that refused is voided in it: its node released nothing, and "
                         "the resume charges it afresh" if refused else "") + ".)")
            raise NodeFailure(f"{what}: no update from {len(problems)} client(s): " + "; ".join(problems) + f". {state} "
                              + advice + ledger, received=received, refused=refused)

    def _log(self, direction: str, kind: str, round_idx: int | None, client: str | None, content: Any) -> None:
        """Append the structure of a message (never values) to the wire log, and the arrays of a received one to
        the wire dump, if kept."""
        if self._logged == 0 and self.wire_dump is not None:
            self._logged = _last_dumped(self.wire_dump)  # a resume's files follow its failed attempt's, not over them
        self._logged += 1
        if self.wire_dump is not None and direction == "node→server":
            from flwr.app import ArrayRecord

            self.wire_dump.mkdir(parents=True, exist_ok=True)
            for name, rec in content.items():
                if isinstance(rec, ArrayRecord):
                    for key, arr in rec.items():
                        np.save(self.wire_dump / f"{self._logged:05d}_{kind.replace('/', '-')}_{client}_{name}_{key}.npy",
                                arr.numpy(), allow_pickle=False)
        if self.wire_log is None:
            return
        entry = {"time": round(time.time(), 3), "direction": direction, "type": kind, "round": round_idx,
                 "client": client, "records": wire.describe(content)}
        with open(self.wire_log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


def _last_dumped(folder: Path) -> int:
    """The largest message number of the ``NNNNN_….npy`` files already in a wire dump (0 for none or no folder)."""
    numbers = [int(p.name[:5]) for p in Path(folder).glob("*.npy") if p.name[:5].isdigit() and p.name[5:6] == "_"]
    return max(numbers, default=0)
