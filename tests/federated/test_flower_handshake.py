"""The identity handshake skips stale (unavailable) SuperNode ids and still fails on real errors."""

from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, RecordDict
from flwr.common.constant import ErrorCode

from fedhype import __version__
from fedhype.data.partition import make_partition
from fedhype.federated.flower.grid_transport import FlowerTransport, NodeFailure
from fedhype.federated.flower.handshake import IDENTITY


@pytest.fixture(autouse=True)
def _run_identity(monkeypatch):
    """Messages are built inside a ServerApp run in production; give them a run id here."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1, raising=False)
    for name in ("_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1, raising=False)


class FakeGrid:
    """A Grid whose node ``stale`` answers NODE_UNAVAILABLE (a dead SuperNode still listed) and whose
    other nodes answer with the identity of the client they hold."""

    def __init__(self, holds: dict[int, str], stale: int, stale_code: int = ErrorCode.NODE_UNAVAILABLE,
                 federation: dict[int, str] | None = None):
        self.holds, self.stale, self.code = holds, stale, stale_code
        self.federation = federation or {}  # node → the digest of its own federation file ("": a pooled node)
        self._next, self._inbox = 0, {}

    def get_node_ids(self):
        return [self.stale, *self.holds]

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            self._next += 1
            ids.append(str(self._next))
            self._inbox[str(self._next)] = m.metadata.dst_node_id
        return ids

    def pull_messages(self, ids):
        out = []
        for i in ids:
            node = self._inbox.pop(i)
            meta = SimpleNamespace(reply_to_message_id=i)
            if node == self.stale:
                err = SimpleNamespace(code=self.code, reason="Node Unavailable — no heartbeat")
                out.append(SimpleNamespace(metadata=meta, has_error=lambda: True, error=err, content=None))
            else:
                content = RecordDict({IDENTITY: ConfigRecord({"client": self.holds[node], "seeded": True,
                                                              "federation": self.federation.get(node, ""),
                                                              "fedhype-version": __version__})})
                out.append(SimpleNamespace(metadata=meta, has_error=lambda: False, error=None, content=content))
        return out


def test_stale_node_is_skipped_and_every_client_connects(real_store):
    part = make_partition(real_store, scheme="domain", seed=0)
    holds = {20 + i: str(c.id) for i, c in enumerate(part.clients)}
    t = FlowerTransport.connect(FakeGrid(holds, stale=7), part, real_store.dim, connect_timeout=5, round_timeout=5,
                                straggler_timeout=1, poll=0.01)
    assert t.nodes == {i: 20 + i for i in range(len(part.clients))}


def test_missing_client_at_the_deadline_names_the_unavailable_node(real_store):
    part = make_partition(real_store, scheme="domain", seed=0)
    holds = {20 + i: str(c.id) for i, c in enumerate(part.clients[1:], start=1)}  # client 0's node is dead
    with pytest.raises(NodeFailure, match=r"no answer for client\(s\) \[0\].*unavailable: \[7\]"):
        FlowerTransport.connect(FakeGrid(holds, stale=7), part, real_store.dim, connect_timeout=0.3, round_timeout=5,
                                straggler_timeout=1, poll=0.01)


def test_other_node_errors_still_fail_at_once(real_store):
    part = make_partition(real_store, scheme="domain", seed=0)
    holds = {20 + i: str(c.id) for i, c in enumerate(part.clients)}
    with pytest.raises(NodeFailure, match="could not say which client it holds"):
        FlowerTransport.connect(FakeGrid(holds, stale=7, stale_code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION), part,
                                real_store.dim, connect_timeout=30, round_timeout=5, straggler_timeout=1, poll=0.01)


def test_a_site_node_holding_another_federation_file_is_refused_before_anything_is_released(real_store):
    """A new user's probe: nodes holding the sites' ε = 1 federation file trained a coordinator's ε = 8 run."""
    part = make_partition(real_store, scheme="domain", seed=0)
    holds = {20 + i: str(c.id) for i, c in enumerate(part.clients)}
    same = {n: "a" * 64 for n in holds}
    t = FlowerTransport.connect(FakeGrid(holds, stale=7, federation=same), part, real_store.dim, connect_timeout=5,
                                round_timeout=5, straggler_timeout=1, poll=0.01, federation="a" * 64)
    assert t.federation == "a" * 64 and len(t.nodes) == len(part.clients)
    other = {**same, 21: "b" * 64}
    with pytest.raises(NodeFailure, match=r"SuperNode 21 \(client 1\) holds another federation file.*Nothing was "
                                          r"released or charged"):
        FlowerTransport.connect(FakeGrid(holds, stale=7, federation=other), part, real_store.dim, connect_timeout=5,
                                round_timeout=5, straggler_timeout=1, poll=0.01, federation="a" * 64)
    # a node of a pooled partition has no file of its own ("") and is not compared
    FlowerTransport.connect(FakeGrid(holds, stale=7), part, real_store.dim, connect_timeout=5, round_timeout=5,
                            straggler_timeout=1, poll=0.01, federation="a" * 64)


def test_a_round_refused_by_a_node_says_that_a_restart_will_not_help(real_store):
    """A new user's probe: the server's advice after a node's refusal (its σ policy, its own ledger) was
    "Restart the SuperNode(s) … resume=true", which changes nothing and charges the healthy sites again."""
    part = make_partition(real_store, scheme="domain", seed=0)
    holds = {20 + i: str(c.id) for i, c in enumerate(part.clients)}
    t = FlowerTransport.connect(FakeGrid(holds, stale=7), part, real_store.dim, connect_timeout=5, round_timeout=5,
                                straggler_timeout=1, poll=0.01)

    def reply(reason):
        return SimpleNamespace(has_error=lambda: True, error=SimpleNamespace(code=0, reason=reason))

    refused = {0: reply("NodeRefusal: this site's own ledger: … over the ε …")}
    with pytest.raises(NodeFailure, match="A node refused the request .* a restart does not change that"):
        t._raise_failures(refused, [0], "round 3", "Nothing of it is committed.")
    with pytest.raises(NodeFailure, match=r"Restart the SuperNode\(s\), then run again with resume=true") as exc:
        t._raise_failures({}, [0], "round 3", "Nothing of it is committed.")
    assert "refused" not in str(exc.value)


def test_a_node_for_no_client_of_a_large_federation_names_five_and_counts_the_rest():
    """A probe's unknown-client error over 100 clients listed every (id, name) pair."""
    from fedhype.errors import ValidationError
    from fedhype.federated.flower.handshake import NodeSettings

    node = NodeSettings.__new__(NodeSettings)
    object.__setattr__(node, "client", "nosuch")
    object.__setattr__(node, "partition", "part.json")
    clients = [(str(i), f"site-{i}") for i in range(100)]
    assert NodeSettings.client_index(node, clients[:3] + [("7", "nosuch")]) == 3  # by name, where no id matches
    with pytest.raises(ValidationError) as e:
        NodeSettings.client_index(node, clients)
    assert str(e.value).endswith("is not a client of part.json (its 100 clients by id (name): 0 (site-0), 1 (site-1), "
                                 "2 (site-2), 3 (site-3), 4 (site-4) and 95 more)")


def test_the_engines_budget_refusal_names_the_federation_files_setting_on_flower():
    """A helper set max_epsilon in federation.json as advised and was refused again, told "ε = 2.01 > --max-epsilon
    2.01": a flag of `fedhype train`, not a setting of the deployment. On Flower it names train.max_epsilon."""
    from fedhype.federated.flower.apps import flower_terms

    text = flower_terms("the 5 DP-SGD rounds still to run (rounds 5–9) would take client(s) ['2'] to ε = 2.01028 > "
                        "--max-epsilon 2.01 with what the ledger already holds (client 2: ε = 2.01028 > 2.01); stopped "
                        "before spending (nothing was charged by this call; completed rounds: 4). To finish the run, "
                        "raise --max-epsilon to at least 2.0103; or keep the last committed round (4), whose ε is "
                        "within it")
    assert "--max-epsilon" not in text and "> train.max_epsilon 2.01 with" in text
    assert "set train.max_epsilon in the federation file (give every node the new file, restart them) to at least " \
           "2.0103" in text
