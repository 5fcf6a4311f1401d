"""A site node serves its federation file for one run only, checks the whole plan against its site's lifetime cap
at the handshake, and the server's run key is random and kept in the run folder (no processes: the node's
handlers and the server's transport are called directly, errors go between them as Flower words them).

A fresh-user probe: a coordinator started a second Flower run (another run-dir, hence another run key) with the
federation file the site had accepted, and got the site's whole planned ε again (ε = 7.03 spent where the plan
gave 2); one node released its centre while the other was refused by its site's lifetime cap later (1.9 ε spent
for nothing); a node's refusal reached the CLI as ``<class '…NodeRefusal'>:<'…'>``.
"""

from __future__ import annotations

import re

import json
import shutil
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")


from fedhype.data.partition import make_partition  # noqa: E402
from fedhype.errors import ValidationError  # noqa: E402
from fedhype.federated.config import TrainConfig  # noqa: E402
from fedhype.federated.flower import handshake, wire  # noqa: E402
from fedhype.federated.flower.grid_transport import FlowerTransport, NodeFailure, run_key_of  # noqa: E402
from fedhype.federated.flower.handshake import NodeRefusal, NodeSettings  # noqa: E402
from fedhype.federated.flower.node_budget import BINDINGS, LEDGER, charge_request, site_cap  # noqa: E402
from fedhype.federated.rundir import RunDir  # noqa: E402
from fedhype.privacy.dp_step import LEGACY_WEIGHTS, RELEASE_SENSITIVITY, DPConfig  # noqa: E402
from fedhype.privacy.ledger import PrivacyLedger  # noqa: E402
from fake_grid import InboxGrid, NodeError, set_task_identity, two_site_folders  # noqa: E402  (tests/fake_grid.py)

CFG = dict(rounds=2, local_steps=2, batch_size=32, epsilon=None, noise_multiplier=1.0, delta=1e-4, seed=0,
           model={"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8})
RUN_A, RUN_B = "run-a-0123456789ab", "run-b-ba9876543210"


@pytest.fixture(autouse=True)
def _run_identity(monkeypatch):
    set_task_identity(monkeypatch)


@pytest.fixture(scope="module")
def sites(real_store, tmp_path_factory):
    """Two sites (each its own store and split) and the federation written from their cards."""
    from fedhype.federated.flower.federation import write_site_federation

    root = tmp_path_factory.mktemp("sites")
    out = two_site_folders(real_store, root)
    return root, out


def _fresh(sites, tmp_path, **over):
    """A copy of the sites (their ledgers untouched by other tests) and a federation file of ``CFG | over``."""
    from fedhype.federated.flower.federation import Federation, write_site_federation

    root, paths = sites
    copies = []
    for i, p in enumerate(paths):
        shutil.copytree(p, tmp_path / f"site{i}")
        copies.append(tmp_path / f"site{i}")
    fed = write_site_federation(tmp_path / "fed", copies, TrainConfig(**{**CFG, **over}))
    return copies, fed, Federation.load(fed)


def _nc(site, fed, state, **extra):
    return {"site": str(site), "federation": str(fed), "state-dir": str(state), **extra}


def _centre_request(federation, client: int, run: str):
    from fedhype.federated.run_plan import plan_privacy

    cfg, sizes = federation.train, [c.n_train for c in federation.roster.clients]
    sigma = plan_privacy(cfg, sizes)["prefix"][0][0]
    c = federation.roster.clients[client]
    return wire.encode_stats_request(str(c.id), 0, DPConfig(sigma, RELEASE_SENSITIVITY), LEGACY_WEIGHTS, run_key=run,
                                     n_train=c.n_train, data_key=c.key, stage="centre", federation=federation.digest)


def _site_runs(site):
    from fedhype.privacy.site_ledger import by_run, load_site_ledger

    led = load_site_ledger(site)
    return {} if led is None else by_run(led)


def _flower_reason(exc: BaseException) -> str:
    """What Flower's SuperNode sends the server for an exception its ClientApp raised."""
    return str(type(exc)) + ":<'" + str(exc) + "'>"


def test_a_second_run_with_the_same_federation_file_is_refused_whatever_key_the_server_picks(sites, tmp_path):
    from fedhype.federated.flower.node import run_class_stats

    (site0, site1), fed_path, fed = _fresh(sites, tmp_path)
    state = tmp_path / "node1"
    nc = _nc(site1, fed_path, state, seed=0)
    run_class_stats(nc, _centre_request(fed, 1, RUN_A))  # run A's release: charged and bound
    first = _site_runs(site1)
    assert list(first) == [RUN_A] and first[RUN_A] > 0
    assert json.loads((state / BINDINGS).read_text())["runs"][fed.digest]["run"] == RUN_A
    # the coordinator starts another run (another run-dir: another key) with the same file: refused, nothing run
    for _ in range(2):  # also after a node restart: the binding is in the state-dir
        with pytest.raises(NodeRefusal, match=f"this site's federation file was already used for run {RUN_A}; a new "
                                              r"run needs a new federation file from the coordinator, accepted by the "
                                              r"site \(restart the SuperNode with it\)"):
            run_class_stats(dict(nc), _centre_request(fed, 1, RUN_B))
    assert not (state / RUN_B).exists() and _site_runs(site1) == first
    # and at the handshake already, for a new run ("") or another run's key; the bound run itself may resume
    for key in ("", RUN_B):
        with pytest.raises(NodeRefusal, match=f"already used for run {RUN_A}"):
            handshake.node_identity(nc, handshake.encode_query(key))
    ident = handshake.decode_identity(handshake.node_identity(nc, handshake.encode_query(RUN_A)), "t")
    assert ident["client"] == "1"
    run_class_stats(nc, _centre_request(fed, 1, RUN_A))  # the resume's same (seeded) request: replayed, free
    assert _site_runs(site1) == pytest.approx(first, rel=1e-12)
    assert len(PrivacyLedger.load(state / RUN_A / "client-1" / LEDGER)) == 1
    # a new federation file the site accepts (its SuperNode restarted with it) serves a new run
    from fedhype.federated.flower.federation import Federation, write_site_federation

    fed2_path = write_site_federation(tmp_path / "fed2", [site0, site1], TrainConfig(**{**CFG, "rounds": 3}))
    fed2 = Federation.load(fed2_path)
    assert fed2.digest != fed.digest
    nc2 = _nc(site1, fed2_path, state, seed=0)
    handshake.node_identity(nc2, handshake.encode_query(""))
    run_class_stats(nc2, _centre_request(fed2, 1, RUN_B))
    assert set(_site_runs(site1)) == {RUN_A, RUN_B}
    runs = json.loads((state / BINDINGS).read_text())["runs"]
    assert {k: v["run"] for k, v in runs.items()} == {fed.digest: RUN_A, fed2.digest: RUN_B}


def test_the_site_node_refuses_at_the_handshake_a_plan_that_would_pass_its_lifetime_cap(sites, tmp_path):
    from fedhype.privacy.ledger import LedgerEvent
    from fedhype.privacy.site_ledger import SiteCharger, load_site_ledger, set_site_ledger, spent

    (_, site1), fed_path, fed = _fresh(sites, tmp_path)
    nc = _nc(site1, fed_path, tmp_path / "node1")
    plan_eps, delta = site_cap(NodeSettings.from_node_config(nc), "1")
    set_site_ledger(site1, "site-1", max_epsilon=plan_eps * 0.9, delta=delta)
    with pytest.raises(NodeRefusal, match=r"this site's ledger across runs: the federation's plan \(the release and "
                                          r"every planned round\) would pass the site's lifetime ε cap; refused at the "
                                          r"handshake, before anything was released anywhere") as refused:
        handshake.node_identity(nc, handshake.encode_query(""))
    assert str(tmp_path) not in str(refused.value) and f"{plan_eps:.4f}" not in str(refused.value)
    assert len(load_site_ledger(site1)) == 0
    set_site_ledger(site1, "site-1", max_epsilon=plan_eps * 1.05)
    handshake.node_identity(nc, handshake.encode_query(""))  # the plan fits
    # another run spent some of the site's budget: the plan composed with it no longer fits
    other = SiteCharger(site1, "site-1", "other-000000000001", delta, expected=True)
    other.charge([LedgerEvent("site-1", -1, "release", 2.0, 1.0, 1, 1.0)])  # alone within the cap
    with pytest.raises(NodeRefusal, match="would pass the site's lifetime ε cap; refused at the handshake"):
        handshake.node_identity(nc, handshake.encode_query(""))
    # a resume: what the run itself charged before its stop is part of its plan, not counted twice
    from fedhype.federated.run_plan import plan_privacy
    from fedhype.federated.secure_release import planned_tails
    from fedhype.privacy.site_ledger import composed

    set_site_ledger(site1, "site-1", max_epsilon=None)
    charge_request(NodeSettings.from_node_config(nc), tmp_path / "node1" / RUN_A / "client-1",
                   [LedgerEvent("1", -1, "release-centre", 2.0, 1.0, 1, 1.0)], "0" * 64)  # run A, before its stop
    led = load_site_ledger(site1)
    assert len(led) == 2
    sizes = [c.n_train for c in fed.roster.clients]
    plan = [LedgerEvent("site-1", -1, "planned", s, q, n, 1.0)
            for s, q, n in list(plan_privacy(fed.train, sizes)["prefix"]) + planned_tails(fed.train, sizes)[1]]
    with_other = composed([led.events[0], *plan], delta)  # the other run and run A's whole plan
    with_both = composed([*led.events, *plan], delta)  # … and run A's charge counted twice
    assert spent(led) < with_other < with_both
    set_site_ledger(site1, "site-1", max_epsilon=(with_other + with_both) / 2)
    handshake.node_identity(nc, handshake.encode_query(RUN_A))  # run A resumes: fits
    with pytest.raises(NodeRefusal, match="would pass the site's lifetime ε cap"):  # a new run with this plan does not
        handshake.node_identity(nc, handshake.encode_query(""))
    # the server's transport reports the refusal as plain text, before any node releases anything
    set_site_ledger(site1, "site-1", max_epsilon=spent(load_site_ledger(site1)) * 1.01)
    grid = NodeGrid({20: _nc(sites[1][0], fed_path, tmp_path / "node0"), 21: nc})
    with pytest.raises(NodeFailure) as failed:
        FlowerTransport.connect(grid, fed.roster, int(fed.store["dim"]), connect_timeout=30, round_timeout=5,
                                straggler_timeout=1, poll=0.01, federation=fed.digest)
    text = str(failed.value)
    assert text.startswith("SuperNode 21 refused the connection — node refused: this site's ledger across runs: the "
                           "federation's plan") and text.endswith("Nothing was released or charged")
    assert "<class" not in text and "NodeRefusal" not in text
    assert grid.queries == [{"want": "identity", "run": ""}] * 2


def test_a_seeded_site_node_is_refused_at_the_handshake_where_the_site_has_a_cap(sites, tmp_path):
    """A seeded node's noise can be regenerated from its seed: ε = ∞ for the site (fedhype.privacy.site_ledger), so a
    capped site refuses it at the handshake, as `train --site --seed` is refused before anything is written (its first
    charge was refused before; the connection is now)."""
    from fedhype.privacy.site_ledger import load_site_ledger, set_site_ledger

    (_, site1), fed_path, _ = _fresh(sites, tmp_path)
    seeded, fresh = _nc(site1, fed_path, tmp_path / "n1", seed=0), _nc(site1, fed_path, tmp_path / "n2")
    plan_eps, delta = site_cap(NodeSettings.from_node_config(fresh), "1")
    set_site_ledger(site1, "site-1", max_epsilon=plan_eps * 2, delta=delta)
    with pytest.raises(NodeRefusal, match=r"a node with seeded noise \(ε = ∞ for the site\) would pass the site's "
                                          "lifetime ε cap; refused at the handshake"):
        handshake.node_identity(seeded, handshake.encode_query(""))
    handshake.node_identity(fresh, handshake.encode_query(""))  # the same plan with noise from OS entropy fits
    assert len(load_site_ledger(site1)) == 0
    set_site_ledger(site1, "site-1", max_epsilon=None)
    handshake.node_identity(seeded, handshake.encode_query(""))  # no cap: recorded as ∞ when it runs, not refused


class NodeGrid(InboxGrid):
    """A Grid whose nodes answer the identity query with the real site-node handler (errors as Flower words them)."""

    def __init__(self, ncs: dict[int, dict]):
        super().__init__()
        self.ncs, self.queries = ncs, []

    def get_node_ids(self):
        return list(self.ncs)

    def answer(self, m):
        self.queries.append(dict(m.content[handshake.QUERY]))
        try:
            return handshake.node_identity(self.ncs[m.metadata.dst_node_id], m.content)
        except Exception as exc:  # noqa: BLE001
            raise NodeError(_flower_reason(handshake.for_the_server(exc))) from None


def test_the_server_run_key_is_random_kept_in_the_run_folder_and_new_for_a_recreated_folder(real_store, tmp_path):
    from fedhype.federated.flower.handshake import _RUN_KEY

    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)

    def make_roster():
        return part

    run = RunDir(tmp_path / "my run")  # a space: not a character a node's folder name takes
    assert run_key_of(run) is None  # a new run has no key before it is bound
    t = FlowerTransport(None, make_roster(), 4, {}, {}, round_timeout=1, straggler_timeout=1)
    key = t.bind(run).run_key
    assert _RUN_KEY.match(key) and key.startswith("my_run-")
    assert json.loads(run.run_key_file.read_text())["key"] == f"my run-{key[-12:]}"
    assert FlowerTransport(None, make_roster(), 4, {}, {}, round_timeout=1, straggler_timeout=1).bind(run).run_key == key
    assert run_key_of(run) == key  # what a resume's handshake sends
    shutil.rmtree(run.root)  # the same path, a new run: a new key (the nodes do not take it for a rerun)
    again = t.bind(RunDir(tmp_path / "my run")).run_key
    assert again != key and _RUN_KEY.match(again)
    # a run begun before the key was random (a ledger, no key file) keeps the key its nodes know it by
    import hashlib

    old = RunDir(tmp_path / "old")
    (old.root).mkdir()
    old.ledger.write_text("{}")
    expected = f"old-{hashlib.sha256(str(old.root.resolve()).encode()).hexdigest()[:12]}"
    assert run_key_of(old) == expected == t.bind(old).run_key and not old.run_key_file.exists()


def test_a_node_refusal_reaches_the_server_as_plain_text_and_a_release_failure_says_the_release(sites, tmp_path):
    (_, site1), fed_path, fed = _fresh(sites, tmp_path)
    t = FlowerTransport(None, fed.roster, int(fed.store["dim"]), {0: 20, 1: 21}, {0: False, 1: False},
                        round_timeout=1, straggler_timeout=1)
    refusal = NodeRefusal("this site's own ledger: the server's request would take it to ε = 3.1, over the ε = 2")

    def reply(exc):
        return SimpleNamespace(has_error=lambda: True, error=SimpleNamespace(code=0, reason=_flower_reason(exc)))

    with pytest.raises(NodeFailure) as failed:
        t._raise_failures({1: reply(refusal)}, [1], "the class statistics", "No round was trained (completed rounds: "
                          "0).", "the release")
    text = str(failed.value)
    assert f"client 1 (site-1): node refused: {refusal}" in text and "<class" not in text
    assert "A node refused the request" in text and "keeps the release's events" in text
    assert "this round's events" not in text
    with pytest.raises(NodeFailure, match=r"node error: ValueError on the node.*keeps this round's events"):
        t._raise_failures({1: reply(handshake.for_the_server(ValueError("/private/path")))}, [1], "round 2", "x.")
    # the node's own refusal of a rerun of the release names the release, not a round
    node = NodeSettings.from_node_config(_nc(site1, fed_path, tmp_path / "node1"))
    from fedhype.privacy.events import RELEASE_CENTRE, release_events
    from fedhype.federated.run_plan import plan_privacy

    sigma = plan_privacy(fed.train, [c.n_train for c in fed.roster.clients])["prefix"][0][0]
    ev = release_events(["1"], [(sigma, 1.0, 1)], [RELEASE_CENTRE], 1.0)
    state = tmp_path / "node1" / RUN_A / "client-1"
    charge_request(node, state, ev, "1" * 64)
    charge_request(node, state, ev, "2" * 64)  # the plan has room for one more release-sized step (its rounds)
    with pytest.raises(NodeRefusal, match=r"the statistics release\).*A rerun of an unseeded release is a new "
                                          r"release: allow it with train.max_epsilon") as refused:
        for k in range(3, 40):
            charge_request(node, state, ev, f"{k:064x}")
    assert "round" not in str(refused.value).split("nothing was run")[1].split(" — ")[0]
    # the way on, with the ε it needs (a probe's Flower run stopped there and the remedy was only in the docs)
    need = float(re.search(r"would take it to ε = ([0-9.]+)", str(refused.value)).group(1))
    assert f"allow it with train.max_epsilon (at least {need:.4f}) in the federation file — a resume accepts" \
        in str(refused.value) and "keep the last committed round" in str(refused.value)


def test_the_server_app_names_the_run_config_keys_resume_and_run_dir(real_store, tmp_path):
    from fedhype.federated.flower.apps import ServerSettings, run_server
    from fedhype.federated.flower.federation import write_federation

    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    fed = write_federation(tmp_path / "fed", real_store, part, TrainConfig(**CFG))
    real_store.save(tmp_path / "store.safetensors")
    part.save(tmp_path / "partition.json")
    ncs = {20 + i: {"client": str(c.id), "embeddings": str(tmp_path / "store.safetensors"),
                    "partition": str(tmp_path / "partition.json"), "state-dir": str(tmp_path / f"n{i}")}
           for i, c in enumerate(part.clients)}
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")  # a run is there
    settings = {"federation": str(fed), "run-dir": str(run), "connect-timeout": 30}
    with pytest.raises(ValidationError) as exc:
        run_server(NodeGrid(ncs), ServerSettings.from_run_config(settings))
    assert str(exc.value) == (f"run directory {run} already holds a run; continue it with --run-config 'resume=true' "
                              "or choose another run-dir")
    with pytest.raises(ValidationError) as exc:
        run_server(NodeGrid(ncs), ServerSettings.from_run_config({**settings, "run-dir": str(tmp_path / "none"),
                                                                  "resume": True}))
    assert "resume=true:" in str(exc.value) and "set resume=false (the default) to start a new run" in str(exc.value)
    assert "--resume" not in str(exc.value) and "--out" not in str(exc.value)
