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
    # a federation file that is not JSON; a state-dir that this user cannot write (root writes anywhere the
    # permission bits forbid: the write is tried, and stopped here for the test)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    locked = tmp_path / "locked"
    locked.mkdir()
    real_can = handshake._can_write
    monkeypatch.setattr(handshake, "_can_write", lambda p: False if str(p) == str(locked) else real_can(p))
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
    out = capsys.readouterr().out.strip()
    assert out.endswith("node config ok: this SuperNode holds client 0") and "site ledger:" in out
    assert not (tmp_path / "st").exists()  # a check writes nothing
    assert check.main(["--node-config", f'site="{site0}" federation="{fed_path}"']) == 2  # a missing key
    assert "lacks ['state-dir']" in capsys.readouterr().err
    # unquoted paths (a helper: a traceback, exit 1) and a state-dir no one can create (/proc: root's permission bits
    # said writable)
    assert check.main(["--node-config", f"site={site0} federation={fed_path} state-dir={tmp_path / 'st'}"]) == 2
    err = capsys.readouterr().err
    assert "a path is a string and goes in double quotes" in err and "Traceback" not in err
    assert check.main(["--node-config", f'site="{site0}" federation="{fed_path}" state-dir="/proc/fedhype-x"']) == 2
    assert 'state-dir="/proc/fedhype-x": missing, and it cannot be created' in capsys.readouterr().err


def _fresh_sites(sites, tmp_path, **over):
    """A copy of the two site folders (their ledgers untouched by other tests) and a federation of ``CFG | over``."""
    import shutil

    from fedhype.federated.flower.federation import write_site_federation

    copies = []
    for i, p in enumerate(sites[0]):
        shutil.copytree(p, tmp_path / f"site{i}")
        copies.append(tmp_path / f"site{i}")
    return copies, write_site_federation(tmp_path / "fed", copies, TrainConfig(**{**CFG, **over}))


def _check(site, fed, state, capsys, extra=""):
    rc = check.main(["--node-config", f'site="{site}" federation="{fed}" state-dir="{state}"{extra}'])
    got = capsys.readouterr()
    return rc, got.out, got.err


def test_the_check_module_refuses_what_the_handshake_refuses_on_the_sites_ledger(sites, tmp_path, capsys):
    """A user's probe: the checker said "node config ok" for a plan past the site's cap, an ε = 50 federation on a
    capped site and an edited or missing site ledger, all of which the handshake refuses."""
    import json

    from fedhype.federated.flower.node_budget import BINDINGS, bind_run, site_cap
    from fedhype.privacy.ledger import LedgerEvent
    from fedhype.privacy.site_ledger import SiteCharger, ledger_path, set_site_ledger

    (site0, _), fed = _fresh_sites(sites, tmp_path)
    state = tmp_path / "state"
    nc = {"site": str(site0), "federation": str(fed), "state-dir": str(state)}
    plan_eps, delta = site_cap(handshake.NodeSettings.from_node_config(nc), "0")
    # a plan past the site's cap: the handshake refuses, so does the checker (with the figures: it runs at the site)
    set_site_ledger(site0, "site-0", max_epsilon=plan_eps * 0.9, delta=delta)
    with pytest.raises(handshake.NodeRefusal, match="would pass the site's lifetime ε cap"):
        handshake.node_identity(nc, handshake.encode_query(""))
    rc, out, err = _check(site0, fed, state, capsys)
    assert rc == 2 and "node config ok" not in out
    assert err.startswith("PlanRefused: the identity handshake would refuse: this site's ledger across runs: the "
                          "federation's plan (the release and every planned round) would pass the site's lifetime ε "
                          "cap; refused at the handshake")
    assert f"At the site: site 'site-0': this run's plan (ε = {plan_eps:.4f} alone)" in err
    assert f"past the site's cap of {plan_eps * 0.9:g}" in err
    # the plan fits: the checker says what it checked
    set_site_ledger(site0, "site-0", max_epsilon=plan_eps * 1.05)
    handshake.node_identity(nc, handshake.encode_query(""))
    rc, out, err = _check(site0, fed, state, capsys)
    assert rc == 0, err
    assert f"site ledger: {ledger_path(site0)} intact, ε = 0.0000 at δ = {delta:g} spent over its runs, cap " \
           f"{plan_eps * 1.05:g}" in out
    assert f"run binding: {state / BINDINGS}: this federation file is not bound to a run yet" in out
    assert ("plan: the federation's plan (the release and every planned round), as a new run, composed with the "
            f"site's ledger, fits under its cap {plan_eps * 1.05:g}") in out
    assert "the run key of its query (at the handshake)" in out
    assert out.strip().endswith("node config ok: this SuperNode holds client 0")
    # a seeded node on the capped site: ε = ∞ for the site
    rc, _, err = _check(site0, fed, state, capsys, " seed=0")
    assert rc == 2 and "a node with seeded noise (ε = ∞ for the site) would pass" in err
    # an ε = 50 federation on the capped site
    (site0b, _), fed50 = _fresh_sites(sites, tmp_path / "b", epsilon=50.0, noise_multiplier=None)
    set_site_ledger(site0b, "site-0", max_epsilon=plan_eps * 1.05, delta=delta)
    nc50 = {**nc, "site": str(site0b), "federation": str(fed50)}
    with pytest.raises(handshake.NodeRefusal, match="would pass the site's lifetime ε cap"):
        handshake.node_identity(nc50, handshake.encode_query(""))
    rc, _, err = _check(site0b, fed50, state, capsys)
    assert rc == 2 and "PlanRefused: the identity handshake would refuse" in err
    # a federation file already bound to a run: the checker says which, and checks the plan as that run's resume
    bind_run(handshake.NodeSettings.from_node_config(nc), "run-a-0123456789ab")
    rc, out, _ = _check(site0, fed, state, capsys)
    assert rc == 0 and ("this federation file is bound to run run-a-0123456789ab: the node serves only its resume, "
                        "and refuses a new run with this file") in out and "as the resume of run run-a-0123456789ab" in out
    # an edited site ledger
    SiteCharger(site0, "site-0", "other-000000000001", delta, expected=True).charge(
        [LedgerEvent("site-0", -1, "release", 4.0, 1.0, 1, 1.0)])
    path = ledger_path(site0)
    good = path.read_text()
    raw = json.loads(good)
    raw["events"][0]["noise_multiplier"] = 40.0
    path.write_text(json.dumps(raw))
    with pytest.raises(Exception) as refused:
        handshake.node_identity(nc, handshake.encode_query("run-a-0123456789ab"))
    rc, out, err = _check(site0, fed, state, capsys)
    assert rc == 2 and err.startswith("ArtifactError: the site's ledger across runs") and "node config ok" not in out
    assert type(refused.value).__name__ == "ArtifactError"
    # a missing site ledger where site.json says `fedhype site` started it (as `fedhype site` writes it now)
    path.unlink()
    own = json.loads((site0 / "site.json").read_text())
    (site0 / "site.json").write_text(json.dumps({**own, "site_ledger": "site-ledger.json"}))
    with pytest.raises(Exception, match="is missing"):
        handshake.node_identity(nc, handshake.encode_query("run-a-0123456789ab"))
    rc, _, err = _check(site0, fed, state, capsys)
    assert rc == 2 and f"ArtifactError: {path} is missing, though the site's site.json says `fedhype site` started " \
                       "it" in err


@pytest.mark.parametrize("keys, named", [
    ('federaton="{fed}" state-dir="{st}"', "'federaton': did you mean 'federation'?"),
    ('federation="{fed}" state_dir="{st}"', "'state_dir': did you mean 'state-dir'?"),
    ('federation="{fed}" state-dir="{st}" alow-no-dp=true', "'alow-no-dp': did you mean 'allow-no-dp'?"),
])
def test_an_unknown_key_is_named_with_the_closest_known_one(sites, tmp_path, capsys, keys, named):
    """A user's probe: "federaton=" gave only "lacks ['federation']", "state_dir=" only "lacks ['state-dir']"."""
    (site0, _), fed_path, _ = sites
    nc_text = f'site="{site0}" ' + keys.format(fed=fed_path, st=tmp_path / "st")
    assert check.main(["--node-config", nc_text]) == 2
    err = capsys.readouterr().err
    assert "unknown key(s)" in err and named in err and "lacks" not in err


def test_a_misspelt_site_key_is_not_taken_for_a_pooled_partition_node_and_the_server_is_told(sites, tmp_path, capsys):
    """``Site=… alow-no-dp=true`` fell back to the pooled-partition keys and named neither unknown key."""
    from flwr.common.config import parse_config_args

    (site0, _), fed_path, _ = sites
    text = f'Site="{site0}" federation="{fed_path}" state-dir="{tmp_path / "st"}" alow-no-dp=true'
    assert check.main(["--node-config", text]) == 2
    err = capsys.readouterr().err
    assert ("unknown key(s) ['Site', 'alow-no-dp'] ('Site': did you mean 'site'?; 'alow-no-dp': did you mean "
            "'allow-no-dp'?)") in err and "lacks" not in err
    # at the handshake: a refusal the server sees as it is (key names only, no local path)
    with pytest.raises(handshake.NodeRefusal) as refused:
        handshake.node_identity(parse_config_args([text]), handshake.encode_query(""))
    assert handshake.for_the_server(refused.value) is refused.value
    assert "did you mean 'site'?" in str(refused.value) and str(tmp_path) not in str(refused.value)
    assert str(site0) not in str(refused.value)
    reason = _flower_reason(refused.value)
    assert handshake.node_refused(reason)


def test_a_site_card_given_as_the_federation_file_is_named_as_such(sites, tmp_path, capsys):
    """``federation=<card.json>`` gave "unreadable ('roster')"."""
    (site0, _), _, _ = sites
    rc = check.main(["--node-config", f'site="{site0}" federation="{site0 / "card.json"}" '
                                      f'state-dir="{tmp_path / "st"}"'])
    err = capsys.readouterr().err
    assert rc == 2 and "is not a federation file: it looks like a site card (card.json)" in err
    assert "'roster'" not in err and "write_site_federation" in err
