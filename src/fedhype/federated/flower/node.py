"""The SuperNode side: one institution's client, rebuilt from its node config for each message.

The node config (:class:`~fedhype.federated.flower.handshake.NodeSettings`) names the node's own
files: its embeddings store, the public partition, a private state folder. For a ``train`` message
the node builds the same :class:`~fedhype.federated.client.Client` as the in-process engine
(:func:`fedhype.federated.engine.build_client`), runs
:meth:`~fedhype.federated.client.Client.run_round` and replies with the resulting
:class:`~fedhype.privacy.dp_step.PrivatizedUpdate` (:func:`fedhype.federated.flower.wire.encode_update`).
Its private state lives in ``<state-dir>/<run key>/client-<id>/``, never on the wire. A site node serves
its federation file for one run key only (:func:`~fedhype.federated.flower.node_budget.bind_run`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from flwr.app import RecordDict

from fedhype.data.partition import Partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError
from fedhype.federated.client import Client
from fedhype.federated.engine import build_client
from fedhype.federated.flower import wire
from fedhype.federated.flower.handshake import _RUN_KEY, NodeMismatch, NodeSettings, check_federation
from fedhype.federated.flower.node_budget import bind_run, charge_no_dp, charge_request, request_digest
from fedhype.io import atomic_save_tensors, load_tensors
from fedhype.privacy.dp_step import RELEASE_SENSITIVITY
from fedhype.privacy.events import RELEASE, RELEASE_CENTRE, dp_sgd_events, release_events

#: the run key the server sends (see handshake._RUN_KEY)
_SAFE = _RUN_KEY


def _site_client(node: NodeSettings, extra: dict[str, Any], client_id: str) -> Client:
    """A site node's Client: its own store and split, labels renumbered to the federation's classes."""
    from fedhype.data.sites import Site
    from fedhype.federated.flower.handshake import site_place

    check_federation(node, extra["federation"])  # the plan the site agreed to, before anything else
    index, key, roster = site_place(node)
    if str(index) != client_id:
        raise NodeMismatch(f"this SuperNode holds client {index} of its federation file, the server asked client "
                           f"{client_id}; give every node the coordinator's federation.json")
    if key != extra["data-key"]:
        raise NodeMismatch("the server's task is for another split of this site (site key differs); give the node the "
                           "federation.json the server runs")
    if not _SAFE.match(extra["run"]):
        raise NodeMismatch(f"bad run key {extra['run']!r} from the server")
    bind_run(node, extra["run"])  # the federation file serves one run: the server cannot start its plan afresh
    site = Site.load(node.site)
    tr = site.records("train", [str(k) for k in roster["class_names"]])
    client = Client(client_id, index, tr.embeddings, tr.labels, node.state_dir / extra["run"] / f"client-{client_id}",
                    node.seed)
    if client.n != extra["n-train"]:
        raise NodeMismatch(f"site {site.name!r} has another number of training records than the server planned for "
                           f"({extra['n-train']}, from its card): send the coordinator this site's current card.json")
    return client


def _client(node: NodeSettings, extra: dict[str, Any], client_id: str) -> Client:
    """This node's Client for the server's request, after checking it matches what the server planned."""
    if node.site is not None:
        return _site_client(node, extra, client_id)
    part = Partition.load(node.partition)
    index = node.client_index([(str(c.id), c.name) for c in part.clients])
    if str(part.clients[index].id) != client_id:
        raise NodeMismatch(f"this SuperNode holds client {part.clients[index].id}, the server asked client "
                           f"{client_id}; check --node-config client=")
    if part.data_key != extra["data-key"]:
        raise NodeMismatch("this node's partition file is not the one the server's federation was written from "
                           "(partition key differs); use the same partition file on every node")
    if not _SAFE.match(extra["run"]):
        raise NodeMismatch(f"bad run key {extra['run']!r} from the server")
    store = EmbeddingStore.load(node.embeddings)
    part.check_store(store)  # the node's store is the one its partition was made from
    state_dir = node.state_dir / extra["run"] / f"client-{client_id}"
    client = build_client(store, part, index, state_dir, node.seed)
    if client.n != extra["n-train"]:
        raise NodeMismatch(f"client {client_id} has another number of training records here than the server "
                           f"planned for ({extra['n-train']}); use the same partition file on every machine")
    return client


def _decoded(decode, content: RecordDict):
    """``decode(content)``; a malformed server message is refused with its (public) reason."""
    try:
        return decode(content)
    except ArtifactError as exc:  # it describes what the server sent, nothing of this node's data
        raise NodeMismatch(str(exc)) from None


def prepare_state(state_dir: Path, round_idx: int) -> None:
    """Bring the private state to the start of round ``round_idx``.

    The server commits round r − 1 before it sends round r, so older states are no longer needed.
    A node that was not sampled since its last round carries its latest state forward unchanged
    (what :class:`~fedhype.federated.transport.InProcessTransport` does round by round).
    """
    found = {int(p.stem.split("-r")[1]): p for p in state_dir.glob("state-r*.safetensors")}
    older = [k for k in found if k < round_idx]
    if round_idx not in found and older:
        atomic_save_tensors(state_dir / f"state-r{round_idx}.safetensors", load_tensors(found[max(older)]))
    for k in older:
        found[k].unlink(missing_ok=True)


def run_train(nc: Mapping[str, Any], content: RecordDict) -> RecordDict:
    """Handle a ``train`` message: K local DP-SGD steps from θ_i^0; reply with the PrivatizedUpdate."""
    task, extra = _decoded(wire.decode_task, content)
    node = NodeSettings.from_node_config(nc)
    node.check_mechanism(task.dp.enabled, task.dp.noise_multiplier)
    client = _client(node, extra, task.client)
    if extra["space"] is not None:
        client.set_space(extra["space"])
    if task.dp.enabled:  # a site node charges its own ledger first (node_budget), or refuses
        q = min(1.0, task.batch_size / client.n)
        charge_request(node, client.state_dir, dp_sgd_events(task.round, [(task.client, q, task.steps)],
                                                             task.dp.noise_multiplier, task.dp.clip_norm),
                       request_digest(content))
    else:  # allowed by the node's allow-no-dp: a site node records it on its ledger across runs (ε = ∞)
        charge_no_dp(node, client.state_dir)
    prepare_state(client.state_dir, task.round)
    update = client.run_round(task.round, task.theta_tensors(), task.model, task.dp, batch_size=task.batch_size,
                              steps=task.steps, lr=task.lr)
    return wire.encode_update(update, task.round)


def run_class_stats(nc: Mapping[str, Any], content: RecordDict) -> RecordDict:
    """Handle a ``train.class_stats`` message: release the client's DP class statistics once."""
    req, extra = _decoded(wire.decode_stats_request, content)
    node = NodeSettings.from_node_config(nc)
    node.check_mechanism(req["dp"].enabled, req["dp"].noise_multiplier)
    client = _client(node, extra, req["client"])
    if req["dp"].enabled:  # a site node charges its own ledger first (node_budget), or refuses
        mechanism = RELEASE_CENTRE if req["stage"] == "centre" else RELEASE
        charge_request(node, client.state_dir, release_events([req["client"]], [(req["dp"].noise_multiplier, 1.0, 1)],
                                                              [mechanism], RELEASE_SENSITIVITY), request_digest(content))
    else:
        charge_no_dp(node, client.state_dir)
    if req["stage"] == "centre":  # the centred release's first step (fedhype.privacy.centring)
        return wire.encode_update(client.release_centre(req["dp"].noise_multiplier if req["dp"].enabled else None), -1)
    return wire.encode_update(client.release_class_stats(req["n-classes"], req["dp"], req["weights"],
                                                         centring=req["centring"]), -1)
