"""The Flower wire format without processes: what a node may send and what the server accepts.

Real client, real embeddings (one local DP round on digits-domains); Flower records round-trip
through their own serialisation (``Array`` .npy bytes), as on the wire.
"""

import json

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict  # noqa: E402

from fedhype.data.partition import make_partition  # noqa: E402
from fedhype.errors import ArtifactError, ValidationError  # noqa: E402
from fedhype.federated.engine import build_client  # noqa: E402
from fedhype.federated.flower import handshake, wire  # noqa: E402
from fedhype.federated.flower.node import prepare_state  # noqa: E402
from fedhype.federated.server import Server  # noqa: E402
from fedhype.federated.transport import RoundTask  # noqa: E402
from fedhype.io import atomic_save_tensors, load_tensors  # noqa: E402
from fedhype.models.config import ModelConfig  # noqa: E402
from fedhype.privacy.dp_step import DPConfig, PrivatizedUpdate  # noqa: E402

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


def _wire(content: RecordDict) -> RecordDict:
    """Serialise and parse every array as Flower does on the wire (``.npy`` bytes)."""
    out = RecordDict()
    for name, rec in content.items():
        if isinstance(rec, ArrayRecord):
            out[name] = ArrayRecord({k: Array(a.dtype, tuple(a.shape), a.stype, bytes(a.data)) for k, a in rec.items()})
        else:
            out[name] = ConfigRecord(dict(rec))
    return out


@pytest.fixture(scope="module")
def setup(real_store, tmp_path_factory):
    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    cfg = ModelConfig(dim=real_store.dim, n_classes=real_store.n_classes, **SMALL)
    server = Server(cfg, 2, torch.Generator().manual_seed(0))
    task = RoundTask(round=0, index=1, client="1", theta=server.theta_for(1), model=cfg, dp=DPConfig(1.0, 1.5),
                     batch_size=32, steps=2, lr=1e-3)
    client = build_client(real_store, part, 1, tmp_path_factory.mktemp("state"), seed=0)
    upd = client.run_round(0, task.theta, cfg, task.dp, batch_size=32, steps=2, lr=1e-3)
    store_path = real_store.save(tmp_path_factory.mktemp("store") / "store.safetensors")
    return {"part": part, "cfg": cfg, "server": server, "task": task, "client": client, "update": upd,
            "store_path": store_path}


def test_task_round_trip_carries_theta_and_public_settings_only(setup):
    task = setup["task"]
    space = (torch.randn(setup["cfg"].dim), torch.tensor(0.05))
    content = wire.encode_task(task, run_key="run-abc", n_train=setup["client"].n, data_key="d" * 64, space=space)
    assert set(content) == {"theta", "task", "space"}
    got, extra = wire.decode_task(_wire(content))
    assert got.client == "1" and got.round == 0 and got.steps == 2 and got.batch_size == 32 and got.lr == 1e-3
    assert got.dp == task.dp and got.model == task.model
    assert set(got.theta) == set(task.theta) and all(torch.equal(got.theta[k], v) for k, v in task.theta.items())
    assert extra["run"] == "run-abc" and extra["n-train"] == setup["client"].n and torch.equal(extra["space"][0], space[0])


def test_update_round_trip_is_exact_and_accepted_by_the_server(setup):
    task, upd = setup["task"], setup["update"]
    content = wire.encode_update(upd, 0)
    assert set(content) == {"update", "update-meta"} and set(content["update"]) == set(task.theta)
    got = wire.decode_update(_wire(content), wire.Expected.of_task(task, 32 / setup["client"].n))
    assert type(got) is PrivatizedUpdate and got.sample_rate == upd.sample_rate and got.noise_multiplier == 1.0
    assert all(torch.equal(got.tensors[k], v) for k, v in upd.tensors.items())
    setup["server"].accept(1, float(setup["client"].n), got)
    assert setup["server"].aggregate()["participants"] == 1


def test_a_node_can_only_send_a_privatized_update(setup):
    with pytest.raises(TypeError, match="only a PrivatizedUpdate"):
        wire.encode_update(dict(setup["update"].tensors), 0)


def _tampered(setup, edit):
    content = _wire(wire.encode_update(setup["update"], 0))
    edit(content)
    return content


@pytest.mark.parametrize("edit, match", [
    # the local encoder ψ_i (or anything else) in an extra record
    (lambda c: c.__setitem__("psi", ArrayRecord({"w": Array(torch.zeros(3).numpy())})), "expected exactly"),
    # an extra array in the update
    (lambda c: c["update"].__setitem__("extra", Array(torch.zeros(2).numpy())), "unexpected"),
    # another σ than planned (e.g. a node that skipped the noise)
    (lambda c: c["update-meta"].__setitem__("noise-multiplier", 0.0), "differs from the plan"),
    (lambda c: c["update-meta"].__setitem__("steps", 3), "differs from the plan"),
    (lambda c: c["update-meta"].__setitem__("round", 4), "differs from the plan"),
    (lambda c: c["update-meta"].__setitem__("client", "0"), "differs from the plan"),
    (lambda c: c["update-meta"].__setitem__("private", False), "differs from the plan"),
    (lambda c: c["update-meta"].__setitem__("raw-mean", 0.3), "keys"),
])
def test_server_refuses_what_is_not_the_planned_update(setup, edit, match):
    content = _tampered(setup, edit)
    with pytest.raises(ArtifactError, match=match):
        wire.decode_update(content, wire.Expected.of_task(setup["task"], 32 / setup["client"].n))


def test_server_refuses_wrong_dtype_or_shape(setup):
    name = sorted(setup["task"].theta)[0]
    for arr in (setup["update"].tensors[name].double().numpy(), torch.zeros(7, 7).numpy()):
        content = _tampered(setup, lambda c, a=arr: c["update"].__setitem__(name, Array(a)))
        with pytest.raises(ArtifactError, match=f"array '{name}'"):
            wire.decode_update(content, wire.Expected.of_task(setup["task"], 32 / setup["client"].n))


def test_identity_handshake_and_node_config(setup, tmp_path):
    setup["part"].save(tmp_path / "part.json")
    # the identity reads the partition file only, but checks that every path of the node config is there
    base = {"embeddings": str(setup["store_path"]), "partition": str(tmp_path / "part.json"), "state-dir": str(tmp_path)}
    name = setup["part"].clients[1].name
    for client in ("1", name):
        got = handshake.decode_identity(_wire(handshake.node_identity({**base, "client": client})), "test")
        assert got == {"client": "1", "seeded": False, "federation": ""}  # a pooled-partition node: no file of its own
    assert handshake.decode_identity(handshake.node_identity({**base, "client": "0", "seed": 3}), "t")["seeded"]
    with pytest.raises(ValidationError, match=r"lacks \['client'\]"):
        handshake.node_identity(base)
    with pytest.raises(ValidationError, match="is not a client"):
        handshake.node_identity({**base, "client": "7"})
    bad = RecordDict({"identity": ConfigRecord({"client": "1", "seeded": False, "federation": "",
                                                "fedhype-version": "0.0.0"})})
    with pytest.raises(ArtifactError, match="same fedhype version"):
        handshake.decode_identity(bad, "node 5")


def test_prepare_state_carries_the_latest_state_and_drops_older(tmp_path):
    for r in (1, 2):
        atomic_save_tensors(tmp_path / f"state-r{r}.safetensors", {"x": torch.tensor([float(r)])})
    prepare_state(tmp_path, 4)  # not sampled in rounds 2 and 3: state 2 carried to 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state-r4.safetensors"]
    assert load_tensors(tmp_path / "state-r4.safetensors")["x"].item() == 2.0
    prepare_state(tmp_path, 4)  # a rerun of round 4 keeps its state
    assert load_tensors(tmp_path / "state-r4.safetensors")["x"].item() == 2.0


def test_describe_lists_structure_never_values(setup):
    d = wire.describe(wire.encode_update(setup["update"], 0))
    assert d["update"]["type"] == "ArrayRecord" and d["update-meta"]["keys"]["steps"] == "int"
    text = json.dumps(d)
    v = float(next(iter(setup["update"].tensors.values())).view(-1)[0])
    assert repr(v)[:8] not in text


def test_node_policy_refuses_what_the_institution_did_not_agree_to(tmp_path):
    base = {"client": "0", "embeddings": "e", "partition": "p", "state-dir": str(tmp_path)}
    node = handshake.NodeSettings.from_node_config(base)
    node.check_mechanism(True, 0.8)  # default: any σ, DP required
    with pytest.raises(ValidationError, match="refuses non-private"):
        node.check_mechanism(False, None)
    strict = handshake.NodeSettings.from_node_config({**base, "min-noise-multiplier": 1.0, "allow-no-dp": True})
    strict.check_mechanism(False, None)
    with pytest.raises(ValidationError, match="σ = 0.8 < its min-noise-multiplier 1"):
        strict.check_mechanism(True, 0.8)
    with pytest.raises(ValidationError, match="allow-no-dp must be true or false"):
        handshake.NodeSettings.from_node_config({**base, "allow-no-dp": "yes"})
    # a misspelt safety setting is refused, not dropped (a new user's node ran with "min-noise-multipler=50")
    with pytest.raises(ValidationError, match=r"unknown key\(s\) \['allow-nodp', 'min-noise-multipler'\]"):
        handshake.NodeSettings.from_node_config({**base, "min-noise-multipler": 50.0, "allow-nodp": True})
    # "private" with σ = 0 is clipped, un-noised release under a DP label: refused by every node (a privacy
    # audit found that the default node, which refuses --no-dp, took it)
    lax = handshake.NodeSettings.from_node_config({**base, "allow-no-dp": True})
    for n in (node, lax):
        for sigma in (0.0, -1.0, None):
            with pytest.raises(ValidationError, match="needs noise"):
                n.check_mechanism(True, sigma)


def test_a_node_takes_only_a_run_key_of_the_servers_form():
    """The run key names a folder under the node's state-dir: '.', '..' or a path are not run keys."""
    from fedhype.federated.flower.node import _SAFE

    assert _SAFE.match("main-0123456789ab") and _SAFE.match("-0123456789ab") and _SAFE.match("..-0123456789ab")
    for bad in (".", "..", "../x", "a/b-0123456789ab", "main", "main-0123456789AB", "x" * 61 + "-0123456789ab"):
        assert not _SAFE.match(bad), bad


def test_a_node_error_reaches_the_server_as_its_type_and_a_reference_never_its_text(setup, tmp_path, caplog):
    """Flower sends the server the type and text of whatever a ClientApp raises; a node's own errors can name
    local paths, its training-set size or its classes. Only refusals of the server's request go as they are."""
    from types import SimpleNamespace

    from flwr.app import Context

    from fedhype.federated.flower import apps
    from fedhype.federated.flower.handshake import NodeError, NodeMismatch, NodeRefusal
    from fedhype.federated.flower.node import _client

    task, part = setup["task"], setup["part"]
    secret = tmp_path / "hospital-x-private"
    nc = {"client": "1", "embeddings": str(secret / "store.safetensors"), "partition": str(secret / "part.json"),
          "state-dir": str(tmp_path / "state")}
    content = wire.encode_task(task, run_key="run-0123456789ab", n_train=setup["client"].n, data_key=part.data_key,
                               space=None)
    msg = SimpleNamespace(content=content)  # what the handler reads of Flower's Message before it replies
    ctx = Context(run_id=1, node_id=1, node_config=nc, state=RecordDict(), run_config={})
    with caplog.at_level("ERROR"), pytest.raises(NodeError) as err:
        apps._train(msg, ctx)  # the partition file is missing: its path must not reach the server
    text = str(err.value)
    assert "hospital-x-private" not in text and "ArtifactError on the node" in text
    ref = text.split("reference ")[1][:8]
    assert any(ref in r.getMessage() and "hospital-x-private" in r.getMessage() for r in caplog.records)  # the node's log
    # a refusal of the server's request names only that request: sent as it is
    off = RoundTask(**{**task.__dict__, "dp": DPConfig(None, 1.5, enabled=False)})
    msg = SimpleNamespace(content=wire.encode_task(off, run_key="run-0123456789ab", n_train=1, data_key="d" * 64,
                                                   space=None))
    with pytest.raises(NodeRefusal, match="refuses non-private"):
        apps._train(msg, ctx)
    # the node's size differs from the plan: said without the size itself
    part.save(tmp_path / "part.json")
    nc_ok = {**nc, "partition": str(tmp_path / "part.json"), "embeddings": str(setup["store_path"])}
    node = handshake.NodeSettings.from_node_config(nc_ok)
    n = setup["client"].n
    with pytest.raises(NodeMismatch, match="another number of training records") as err:
        _client(node, {"run": "run-0123456789ab", "data-key": part.data_key, "n-train": n + 7}, "1")
    assert str(n) not in str(err.value).replace(str(n + 7), "")
