"""SecAgg+ without processes: the server's session against each node's real handler, through Flower's records.

A fake Grid delivers every ``train.secagg`` message to :func:`fedhype.federated.flower.secagg.handle` of its
node (each with its own Flower context state and real client), after a round trip through Flower's
serialisation. Checked: the unmasked sum equals the in-process ideal sum of the same integer shares
exactly; a node that drops out at any stage within t is survived (its pair masks removed from its
reconstructed key); beyond t the session stops; a node that refuses the protocol stops it at setup; the
vectors that cross are masked; a node refuses inconsistent requests. The real SuperLink/SuperNode runs are
in tests/federated/test_flower_secure.py.
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402

from fedhype.data.partition import make_partition  # noqa: E402
from fedhype.errors import ArtifactError, ValidationError  # noqa: E402
from fedhype.federated.engine import build_client  # noqa: E402
from fedhype.federated.flower import secagg  # noqa: E402
from fedhype.federated.flower.grid_transport import FlowerTransport  # noqa: E402
from fedhype.federated.flower.handshake import NodeSettings  # noqa: E402
from fedhype.federated.secure_release import LocalIntegerSession  # noqa: E402
from fedhype.privacy.dp_step import ReleaseWeights  # noqa: E402
from fedhype.privacy.secure_agg import DistributedNoise, SecureAggregationError  # noqa: E402
from fedhype.privacy.skellam import Layout, SkellamPlan, integer_secure_sum  # noqa: E402

W = ReleaseWeights.split(0.3)


@pytest.fixture(autouse=True)
def _run_identity(monkeypatch):
    """Messages are built inside a ServerApp run in production; give them a run id here."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1, raising=False)
    for name in ("_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1, raising=False)


def _wire(content: RecordDict) -> RecordDict:
    """Serialise and parse as Flower does on the wire."""
    out = RecordDict()
    for name, rec in content.items():
        if isinstance(rec, ArrayRecord):
            out[name] = ArrayRecord({k: Array(a.dtype, tuple(a.shape), a.stype, bytes(a.data)) for k, a in rec.items()})
        else:
            out[name] = ConfigRecord(dict(rec))
    return out


class SecAggGrid:
    """Each node runs :func:`secagg.handle` with its own context state; ``silent(node, stage)`` drops a message
    unanswered (a dead node); a handler exception becomes Flower's error reply."""

    def __init__(self, nodes: dict, silent=lambda node, stage: False):
        self.nodes, self.silent = nodes, silent
        self._next, self._out, self.sent = 0, {}, []

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            self._next += 1
            mid, node = str(self._next), m.metadata.dst_node_id
            ids.append(mid)
            stage = dict(m.content[secagg.RECORD])["stage"]
            self.sent.append((node, stage))
            if self.silent(node, stage):
                continue
            n = self.nodes[node]
            meta = SimpleNamespace(reply_to_message_id=mid)
            try:
                content = secagg.handle(_wire(m.content), n["state"], n["settings"],
                                        client_factory=lambda extra, cid, c=n["client"]: c)
                self._out[mid] = SimpleNamespace(metadata=meta, has_error=lambda: False, error=None,
                                                 has_content=lambda: True, content=_wire(content))
            except Exception as exc:  # noqa: BLE001 - what Flower turns into an error reply
                err = SimpleNamespace(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(exc).__name__}: {exc}")
                self._out[mid] = SimpleNamespace(metadata=meta, has_error=lambda: True, error=err,
                                                 has_content=lambda: False, content=None)
        return ids

    def pull_messages(self, ids):
        return [self._out.pop(i) for i in list(ids) if i in self._out]


@pytest.fixture(scope="module")
def fed(real_store, tmp_path_factory):
    part = make_partition(real_store, scheme="iid", n_clients=3, seed=0)
    root = tmp_path_factory.mktemp("secagg")
    clients = [build_client(real_store, part, i, root / f"c{i}", seed=0) for i in range(3)]
    return {"part": part, "clients": clients, "dim": real_store.dim, "K": real_store.n_classes, "root": root}


def _transport(fed, *, silent=lambda node, stage: False, refuse=(), t=1, log=None, dump=None):
    nodes = {100 + i: {"settings": NodeSettings(str(i), fed["root"], fed["root"], fed["root"], 0,
                                                secure_aggregation=i not in refuse),
                       "client": fed["clients"][i], "state": RecordDict()} for i in range(3)}
    grid = SecAggGrid(nodes, silent)
    tr = FlowerTransport(grid, fed["part"], fed["dim"], {i: 100 + i for i in range(3)}, {i: True for i in range(3)},
                         round_timeout=10, straggler_timeout=0.3, poll=0.01, wire_log=log, wire_dump=dump)
    tr.run_key = "test-run"
    tr.enable_secure_aggregation(DistributedNoise(3, t), 1e-4, [])
    return tr, grid


def _plan(fed, kind="statistics", sigma=2.0):
    lay = Layout.centre(fed["dim"]) if kind == "centre" else Layout.statistics(fed["K"], fed["dim"], W)
    return lay, SkellamPlan.for_layout(lay, DistributedNoise(3, 1), sigma)


def _reference(fed, plan, lay, members):
    shares = [fed["clients"][i].release_integer(lay.kind, plan, n_classes=fed["K"], weights=W) for i in members]
    return integer_secure_sum(shares, lay)


def _same(a, b):
    assert a.contributors == b.contributors and set(a.tensors) == set(b.tensors)
    for k in a.tensors:
        assert torch.equal(a.tensors[k], b.tensors[k]), k


@pytest.mark.parametrize("kind", ["centre", "statistics"])
def test_unmasked_sum_equals_the_ideal_sum_of_the_same_shares(fed, kind, tmp_path):
    tr, grid = _transport(fed, dump=tmp_path / "dump")
    lay, plan = _plan(fed, kind)
    s = tr.secure
    assert s.open(kind) == [0, 1, 2]
    got = s.release(kind, plan, n_classes=fed["K"], weights=W, centring=None)
    _same(got, _reference(fed, plan, lay, [0, 1, 2]))
    # the in-process session (the engine's reference) gives the same aggregate
    local = LocalIntegerSession(fed["clients"], DistributedNoise(3, 1), 1e-4, [])
    local.open(kind)
    _same(local.release(kind, plan, n_classes=fed["K"], weights=W, centring=None), got)
    assert [st for _, st in grid.sent] == ["setup"] * 3 + ["share_keys"] * 3 + ["collect"] * 3 + ["unmask"] * 3


def test_what_crosses_is_masked(fed, tmp_path):
    """Each collect reply is uniform on [0, 2⁶⁴) (an unmasked statistic, even noised, sits near 0) and differs
    from the node's own integer share in every entry but a handful."""
    tr, _ = _transport(fed, dump=tmp_path / "dump")
    lay, plan = _plan(fed)
    tr.secure.open("statistics")
    tr.secure.release("statistics", plan, n_classes=fed["K"], weights=W, centring=None)
    files = sorted((tmp_path / "dump").glob("*collect*_masked_vector.npy"))
    assert len(files) == 3
    for i, f in enumerate(files):
        y = np.load(f)
        assert y.dtype == np.uint64 and y.shape == (plan.length,)
        top = (y >> np.uint64(56)).astype(np.int64)
        counts = np.bincount(top, minlength=256)
        chi2 = float(((counts - y.size / 256) ** 2 / (y.size / 256)).sum())
        assert chi2 < 400, chi2  # 255 dof: mean 255, sd 22.6
        share = fed["clients"][i].release_integer("statistics", plan, n_classes=fed["K"], weights=W)
        assert float(np.abs(share._ints).max()) < 2.0 ** 40  # the node's own share, unmasked: small integers
        assert float(np.mean(y == share._ints.view(np.uint64))) < 1e-3


def test_a_resumed_server_numbers_its_wire_dump_after_the_failed_attempt(fed, tmp_path):
    """A helper's probe: a resume's dump restarted at 00001 beside its failed attempt's files (a file of the same
    message number and name was overwritten). A new transport on the same folder continues after the largest."""
    lay, plan = _plan(fed)
    runs = []
    for attempt in range(2):
        tr, _ = _transport(fed, dump=tmp_path / "dump")
        tr.secure.open("statistics")
        tr.secure.release("statistics", plan, n_classes=fed["K"], weights=W, centring=None)
        runs.append(sorted(p.name for p in (tmp_path / "dump").glob("*.npy")))
    first, both = runs
    assert first and len(both) == 2 * len(first) and set(first) < set(both)  # nothing overwritten
    last = max(int(n[:5]) for n in first)
    assert min(int(n[:5]) for n in set(both) - set(first)) > last  # the resume's messages follow the attempt's


@pytest.mark.parametrize("stage", ["setup", "share_keys", "collect", "unmask"])
def test_a_dropout_within_t_is_survived_at_every_stage(fed, stage):
    dead = 102
    tr, grid = _transport(fed, silent=lambda node, st: node == dead and st == stage)
    lay, plan = _plan(fed)
    live = tr.secure.open("statistics")
    assert live == ([0, 1] if stage in ("setup", "share_keys") else [0, 1, 2])
    got = tr.secure.release("statistics", plan, n_classes=fed["K"], weights=W, centring=None)
    members = [0, 1] if stage != "unmask" else [0, 1, 2]  # a node that answered collect but not unmask is summed
    _same(got, _reference(fed, plan, lay, members))
    assert got.noise_variance_factor == pytest.approx(len(members) / 2)


@pytest.mark.parametrize("stage", ["setup", "share_keys", "collect"])
def test_dropouts_beyond_t_stop_the_release_with_a_clear_error(fed, stage):
    tr, _ = _transport(fed, silent=lambda node, st: node in (101, 102) and st == stage)
    lay, plan = _plan(fed)
    with pytest.raises(SecureAggregationError, match=r"1 of 3 clients left, fewer than m − t = 2") as e:
        tr.secure.open("statistics")
        tr.secure.release("statistics", plan, n_classes=fed["K"], weights=W, centring=None)
    msg = str(e.value)
    assert "client 1" in msg and "client 2" in msg and "no answer in time" in msg
    assert ("Nothing of the statistics was released or charged" in msg) == (stage != "collect")
    assert ("write-ahead ledger charge stays" in msg) == (stage == "collect")


def test_a_node_that_refuses_the_protocol_stops_it_at_setup(fed):
    tr, grid = _transport(fed, refuse={1})
    with pytest.raises(secagg.ProtocolRefused, match=r"client 1 .*does not take part in fedhype's secure-aggregation "
                                                    r"protocol.*secure-aggregation=false.*Nothing was released or charged"):
        tr.secure.open("statistics")
    assert {st for _, st in grid.sent} == {"setup"}


def test_the_flower_deployment_needs_2t_below_m(fed):
    with pytest.raises(ValidationError, match=r"2t < m.*--dropout-tolerance ≤ 1"):
        _transport(fed, t=2)


def test_a_node_refuses_inconsistent_requests(fed):
    """Out-of-order stages, an unknown session, and an unmask asking both shares of one node."""
    tr, grid = _transport(fed)
    n = grid.nodes[100]
    handle = lambda content: secagg.handle(content, n["state"], n["settings"],  # noqa: E731
                                           client_factory=lambda extra, cid: n["client"])
    hdr = secagg._header("setup", "s1", 1)
    handle(RecordDict({secagg.RECORD: ConfigRecord({**hdr, "m": 3, "t": 1, "threshold": 2})}))
    with pytest.raises(ArtifactError, match="stage 'unmask' after 'setup'"):
        handle(RecordDict({secagg.RECORD: ConfigRecord({**secagg._header("unmask", "s1", 1), "active": [1, 2],
                                                        "dead": [3]})}))
    with pytest.raises(ArtifactError, match="holds no session"):
        handle(RecordDict({secagg.RECORD: ConfigRecord({**secagg._header("share_keys", "other", 1), "ids": [1],
                                                        "pk1s": [b"x"], "pk2s": [b"y"]})}))
    with pytest.raises(ArtifactError, match="threshold 3 .*must be m − t"):
        handle(RecordDict({secagg.RECORD: ConfigRecord({**hdr, "m": 3, "t": 1, "threshold": 3})}))
    # a node past collect refuses an unmask that names a node both active and dropped (that would hand the server
    # both the mask seed and the key of that node)
    tr.secure.open("statistics")
    sess = tr.secure._open["session"]
    s = json.loads(dict(n["state"].config_records[secagg._STATE])["json"], object_hook=secagg._unhex)
    s.update(stage="collect", srcs=[2, 3])
    secagg._save(n["state"], sess, s)
    with pytest.raises(ArtifactError, match="must be disjoint"):
        handle(RecordDict({secagg.RECORD: ConfigRecord({**secagg._header("unmask", sess, 1), "active": [1, 2],
                                                        "dead": [2]})}))
