"""A SuperNode's node config naming a path that is not there (no processes: the node's handlers and the server's
transport are called directly, errors go between them as Flower words them).

A user's probe started a SuperNode with a site= that did not exist: the node started, and the coordinator's run
failed with an opaque "ArtifactError on the node". Flower (1.42) gives an app no hook at SuperNode start (the
ClientApp and its lifespan first run for a message), so the identity handshake — the first message of every run —
names each wrong key and what to do (the paths go to the node's own log only), and
``python -m fedhype.federated.flower.check`` checks a node config before the SuperNode starts.
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from fedhype.federated.config import TrainConfig  # noqa: E402
from fedhype.federated.flower import check, handshake  # noqa: E402
from fedhype.federated.flower.grid_transport import FlowerTransport, NodeFailure  # noqa: E402
from fedhype.federated.flower.handshake import NodeConfigError  # noqa: E402
from fake_grid import InboxGrid, NodeError, set_task_identity, two_site_folders  # noqa: E402  (tests/fake_grid.py)

CFG = dict(rounds=2, local_steps=2, batch_size=32, epsilon=None, noise_multiplier=1.0, delta=1e-4, seed=0,
           model={"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8})


@pytest.fixture(autouse=True)
def _run_identity(monkeypatch):
    set_task_identity(monkeypatch)


@pytest.fixture(scope="module")
def sites(real_store, tmp_path_factory):
    """Two sites and the federation written from their cards: ``(site folders, federation path, Federation)``."""
    from fedhype.federated.flower.federation import Federation, write_site_federation

    root = tmp_path_factory.mktemp("sites")
    folders = two_site_folders(real_store, root)
    fed = write_site_federation(root / "fed", folders, TrainConfig(**CFG))
    return folders, fed, Federation.load(fed)


def _flower_reason(exc: BaseException) -> str:
    """What Flower's SuperNode sends the server for an exception its ClientApp raised."""
    return str(type(exc)) + ":<'" + str(exc) + "'>"


def test_a_missing_site_folder_is_named_by_its_key_at_the_first_message_and_its_path_stays_in_the_node_log(
        sites, tmp_path, caplog):
    (_, site1), fed_path, _ = sites
    missing = tmp_path / "hospital-x" / "no-such-site"
    nc = {"site": str(missing), "federation": str(fed_path), "state-dir": str(tmp_path / "state")}
    handshake.NodeSettings.from_node_config(nc)  # the keys are fine: only the path is wrong
    with pytest.raises(NodeConfigError) as refused:
        handshake.node_identity(nc, handshake.encode_query(""))
    exc = refused.value
    text = str(exc)
    assert exc.problems == [("site", str(missing), "no site folder there; give the site folder that `fedhype site` "
                                                   "wrote, which holds site.json")]
    assert text.startswith("this SuperNode's --node-config names what is not there or cannot be written: site= — no "
                           "site folder there; give the site folder that `fedhype site` wrote, which holds site.json. "
                           f"The path is in that SuperNode's log (reference {exc.reference}); the node's operator "
                           "fixes site= and restarts the SuperNode. Flower hands a SuperNode its node config only "
                           "with a run's first message")
    assert "python -m fedhype.federated.flower.check --node-config" in text
    assert "hospital-x" not in text and str(tmp_path) not in text  # a local path never reaches the server
    assert exc.detail == (f'SuperNode --node-config: site="{missing}": no site folder there; give the site folder '
                          "that `fedhype site` wrote, which holds site.json. Fix the node config and restart the "
                          "SuperNode")
    # the ClientApp raises it to Flower as it is (a refusal), and writes the paths to the node's own log
    with caplog.at_level(logging.ERROR):
        assert handshake.for_the_server(exc) is exc
    logged = [r.getMessage() for r in caplog.records if exc.reference in r.getMessage()]
    assert logged == [f"fedhype: node config error {exc.reference}: {exc.detail}"]
    reason = _flower_reason(exc)
    assert handshake.node_refused(reason) and handshake.node_reason(reason) == f"node refused: {text}"
    assert not (tmp_path / "state").exists()  # nothing was written
    # the same site folder with the right path answers
    assert handshake.decode_identity(handshake.node_identity({**nc, "site": str(site1)}), "t")["client"] == "1"


def test_every_wrong_path_is_named_at_once(sites, tmp_path, monkeypatch):
    (site0, _), fed_path, _ = sites
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "state-file").write_text("")
    nc = {"site": str(empty), "federation": str(tmp_path / "federation.json"), "state-dir": str(tmp_path / "state-file")}
    with pytest.raises(NodeConfigError) as refused:
        handshake.node_identity(nc)
    assert [(k, p) for k, p, _ in refused.value.problems] == [("site", str(empty)),
                                                             ("federation", str(tmp_path / "federation.json")),
                                                             ("state-dir", str(tmp_path / "state-file"))]
    text = str(refused.value)
    assert ("site= — a folder without site.json, not a site folder; give the site folder that `fedhype site` wrote, "
            "which holds site.json; federation= — no federation file there; give the federation.json the coordinator "
            "sent; state-dir= — a file, not a folder; give a folder for the node's private state. The paths are in "
            "that SuperNode's log") in text
    assert "fixes site=, federation=, state-dir= and restarts" in text and str(tmp_path) not in text
    # a federation file that is not JSON; a state-dir that this user cannot write (os.access: root writes anywhere)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = handshake.os.access
    monkeypatch.setattr(handshake.os, "access", lambda p, mode: False if str(p) == str(locked) else real_access(p, mode))
    nc = {"site": str(site0), "federation": str(bad), "state-dir": str(locked / "state")}
    with pytest.raises(NodeConfigError) as refused:
        handshake.node_identity(nc)
    assert refused.value.problems == [
        ("federation", str(bad), "the federation file is unreadable (JSONDecodeError); give the federation.json the "
                                 "coordinator sent"),
        ("state-dir", str(locked / "state"), f"missing, and it cannot be created ({locked} is not a writable folder); "
                                             "create it or name another folder")]
    with pytest.raises(NodeConfigError, match=r"state-dir= — a folder this SuperNode's user cannot write"):
        handshake.node_identity({**nc, "federation": str(fed_path), "state-dir": str(locked)})
    # a pooled-partition node: its store and partition files
    nc = {"client": "0", "embeddings": str(tmp_path / "store.safetensors"), "partition": str(empty),
          "state-dir": str(tmp_path / "s")}
    with pytest.raises(NodeConfigError) as refused:
        handshake.node_identity(nc)
    assert [(k, w) for k, _, w in refused.value.problems] == [("embeddings", "no embeddings store there"),
                                                             ("partition", "a folder, not the partition file")]


class NodeGrid(InboxGrid):
    """A Grid whose nodes answer the identity query with the real site-node handler (errors as Flower words them)."""

    def __init__(self, ncs: dict[int, dict]):
        super().__init__()
        self.ncs = ncs

    def get_node_ids(self):
        return list(self.ncs)

    def answer(self, m):
        try:
            return handshake.node_identity(self.ncs[m.metadata.dst_node_id], m.content)
        except Exception as exc:  # noqa: BLE001
            raise NodeError(_flower_reason(handshake.for_the_server(exc))) from None


def test_the_coordinator_is_told_which_key_of_which_node_is_wrong_before_anything_is_released(sites, tmp_path):
    (site0, _), fed_path, fed = sites
    missing = tmp_path / "typo-site"
    grid = NodeGrid({20: {"site": str(site0), "federation": str(fed_path), "state-dir": str(tmp_path / "n0")},
                     21: {"site": str(missing), "federation": str(fed_path), "state-dir": str(tmp_path / "n1")}})
    with pytest.raises(NodeFailure) as failed:
        FlowerTransport.connect(grid, fed.roster, int(fed.store["dim"]), connect_timeout=30, round_timeout=5,
                                straggler_timeout=1, poll=0.01, federation=fed.digest)
    text = str(failed.value)
    assert text.startswith("SuperNode 21 refused the connection — node refused: this SuperNode's --node-config names "
                           "what is not there or cannot be written: site= — no site folder there")
    assert text.endswith("Nothing was released or charged") and "<class" not in text and str(missing) not in text


def test_the_check_module_names_key_and_path_before_the_supernode_starts(sites, tmp_path, capsys):
    (site0, _), fed_path, _ = sites
    missing = tmp_path / "no-site"
    assert check.main(["--node-config", f'site="{missing}" federation="{fed_path}" state-dir="{tmp_path / "st"}"']) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f'SuperNode --node-config: site="{missing}": no site folder there; give the site folder '
                           "that `fedhype site` wrote, which holds site.json. Fix the node config and restart the "
                           "SuperNode")
    assert check.main(["--node-config", f'site="{site0}" federation="{fed_path}" state-dir="{tmp_path / "st"}"']) == 0
    assert capsys.readouterr().out.strip() == "node config ok: this SuperNode holds client 0"
    assert not (tmp_path / "st").exists()  # a check writes nothing
    assert check.main(["--node-config", f'site="{site0}" federation="{fed_path}"']) == 2  # a missing key
    assert "lacks ['state-dir']" in capsys.readouterr().err
