"""The Flower server's statistics step when some SuperNodes fail after others answered (no processes: a fake Grid).

A probe killed a SuperNode during the statistics step: the server had the other nodes' replies but dropped them, and
every node released (and was charged for) its statistics again on the unseeded resume. The transport now raises its
NodeFailure (same message) carrying the updates that arrived, by client index, and a resume asks only the clients
still missing (:func:`fedhype.federated.class_stats.run_class_stats_stage` saves and merges them)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")


from fedhype.data.partition import make_partition  # noqa: E402
from fedhype.federated.class_stats import RELEASED, release_all_class_stats  # noqa: E402
from fedhype.federated.flower import wire  # noqa: E402
from fedhype.federated.flower.grid_transport import FlowerTransport, NodeFailure, RemoteClient  # noqa: E402
from fedhype.federated.rundir import RunDir  # noqa: E402
from fedhype.privacy.dp_step import LEGACY_WEIGHTS, RELEASE_SENSITIVITY, DPConfig, PrivatizedUpdate  # noqa: E402
from fake_grid import InboxGrid, NodeError  # noqa: E402  (tests/fake_grid.py)

K, D, SIGMA = 3, 4, 1.5
DP = DPConfig(SIGMA, RELEASE_SENSITIVITY, enabled=True)


@pytest.fixture(autouse=True)
def _run_identity(monkeypatch):
    """Messages are built inside a ServerApp run in production; give them a run id here."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1, raising=False)


def _update(client: str) -> PrivatizedUpdate:
    base = float(client) + 1.0
    t = {"class_sums": torch.full((K, D), base), "class_counts": torch.arange(K, dtype=torch.float32) + base}
    return PrivatizedUpdate.from_wire(client=client, tensors=t, like=t, steps=1, noise_multiplier=SIGMA,
                                      clip_norm=float(RELEASE_SENSITIVITY), sample_rate=1.0, private=True)


class StatsGrid(InboxGrid):
    """A Grid whose nodes answer a statistics request with an update, except the ``dead`` ones (a ClientApp error)."""

    def __init__(self, nodes: dict[int, str], dead: set[int]):
        super().__init__()
        self.nodes, self.dead, self.asked = nodes, dead, []

    @staticmethod
    def reply(client: str) -> PrivatizedUpdate:
        return _update(client)

    def answer(self, m):
        req, _ = wire.decode_stats_request(m.content)
        self.asked.append(req["client"])
        if m.metadata.dst_node_id in self.dead:
            raise NodeError("<class 'RuntimeError'>:<'node lost'>")
        return wire.encode_update(self.reply(self.nodes[m.metadata.dst_node_id]), -1)


def _transport(part, grid, tmp_path) -> FlowerTransport:
    t = FlowerTransport(grid, part, D, {0: 10, 1: 11, 2: 12}, {0: False, 1: False, 2: False}, round_timeout=5,
                        straggler_timeout=1, poll=0.01)
    return t.bind(RunDir(tmp_path / "run"))


def test_a_statistics_step_that_fails_for_one_node_carries_the_others_updates(real_store, tmp_path):
    part = make_partition(real_store, scheme="iid", n_clients=3, seed=0)
    ids = [str(c.id) for c in part.clients]
    grid = StatsGrid({10: ids[0], 11: ids[1], 12: ids[2]}, dead={11})
    t = _transport(part, grid, tmp_path)
    with pytest.raises(NodeFailure) as failed:
        release_all_class_stats(t.clients, K, DP, LEGACY_WEIGHTS, [None] * 3)
    exc = failed.value
    text = str(exc)
    # the node failure's message as before (who failed, the state, the ledger's rule), and what is kept
    assert text.startswith("the class statistics: no update from 1 client(s): client 1 (")
    assert "No round was trained (completed rounds: 0)." in text and "keeps the release's events" in text
    assert "a resume asks only the client(s) above" in text
    assert sorted(exc.received) == [0, 2]  # by client index
    arrived = getattr(exc, RELEASED)  # by position in the clients asked (here: every client)
    assert sorted(arrived) == [0, 2]
    for i in (0, 2):
        assert arrived[i].client == ids[i] and torch.equal(arrived[i].tensors["class_sums"],
                                                            _update(ids[i]).tensors["class_sums"])
    assert sorted(grid.asked) == sorted(ids)

    # the resume (a new ServerApp, a new transport) asks only the missing client; its node is back
    grid = StatsGrid({10: ids[0], 11: ids[1], 12: ids[2]}, dead=set())
    t = _transport(part, grid, tmp_path)
    got = release_all_class_stats([t.clients[1]], K, DP, LEGACY_WEIGHTS, [None])
    assert grid.asked == [ids[1]] and [u.client for u in got] == [ids[1]]


def test_a_subset_release_reports_the_arrived_updates_by_position_and_is_asked_once(real_store, tmp_path):
    part = make_partition(real_store, scheme="iid", n_clients=3, seed=0)
    ids = [str(c.id) for c in part.clients]
    grid = StatsGrid({10: ids[0], 11: ids[1], 12: ids[2]}, dead={12})
    t = _transport(part, grid, tmp_path)
    with pytest.raises(NodeFailure) as failed:
        RemoteClient.release_class_stats_all([t.clients[1], t.clients[2]], K, DP, LEGACY_WEIGHTS, [None, None])
    assert sorted(failed.value.received) == [1]  # client index 1 answered …
    assert list(getattr(failed.value, RELEASED)) == [0]  # … the first of the clients asked
    assert sorted(grid.asked) == [ids[1], ids[2]]
    # within one transport a client that answered is not asked again (one release per client)
    grid.dead, grid.asked = set(), []
    got = RemoteClient.release_class_stats_all(t.clients, K, DP, LEGACY_WEIGHTS, [None] * 3)
    assert sorted(grid.asked) == [ids[0], ids[2]] and [u.client for u in got] == ids
    # … nor around another centre (that second release would not be in the ledger)
    from fedhype.privacy.centring import Centring

    with pytest.raises(RuntimeError, match="already released around other centres"):
        t.class_stats(K, DP, LEGACY_WEIGHTS, [Centring(torch.zeros(D), 0.5)], indices=[0])


def _centre(client: str) -> PrivatizedUpdate:
    t = {"sum": torch.full((D,), float(client) + 1.0), "count": torch.tensor([float(client) + 5.0])}
    return PrivatizedUpdate.from_wire(client=client, tensors=t, like=t, steps=1, noise_multiplier=SIGMA,
                                      clip_norm=float(RELEASE_SENSITIVITY), sample_rate=1.0, private=True)


class CentreGrid(StatsGrid):
    """Nodes that answer the centre step (stage ``centre``), except the ``dead`` ones."""

    @staticmethod
    def reply(client: str) -> PrivatizedUpdate:
        return _centre(client)


def test_a_centre_step_that_fails_for_one_node_carries_the_others_centres(real_store, tmp_path):
    """The centre step as the statistics step: a node lost during it no longer loses the centres that arrived (the
    release saves them; a resume asks — and charges — only the lost node's client)."""
    from fedhype.federated.class_stats import release_all_centres

    part = make_partition(real_store, scheme="iid", n_clients=3, seed=0)
    ids = [str(c.id) for c in part.clients]
    grid = CentreGrid({10: ids[0], 11: ids[1], 12: ids[2]}, dead={12})
    t = _transport(part, grid, tmp_path)
    with pytest.raises(NodeFailure) as failed:
        release_all_centres(t.clients, SIGMA)
    text = str(failed.value)
    assert text.startswith("the release's centre: no update from 1 client(s): client 2 (")
    assert "The other clients' centres (public DP outputs) are kept in the run folder" in text
    arrived = getattr(failed.value, RELEASED)
    assert sorted(arrived) == [0, 1] and [arrived[i].client for i in (0, 1)] == ids[:2]
    assert torch.equal(arrived[1].tensors["sum"], _centre(ids[1]).tensors["sum"])
    assert sorted(grid.asked) == sorted(ids)  # one message to every node

    grid = CentreGrid({10: ids[0], 11: ids[1], 12: ids[2]}, dead=set())  # the resume: a new transport
    t = _transport(part, grid, tmp_path)
    got = release_all_centres([t.clients[2]], SIGMA)
    assert grid.asked == [ids[2]] and [u.client for u in got] == [ids[2]]
