"""The coordinator's ledger when a site node refuses the server's request (no processes: an in-process fake Grid
whose nodes run the real site-node handlers; errors go back as Flower words them).

A user's probe: a node refused a round (its own policy) and the server's run ledger still held that round's
write-ahead charge for it, as if the node had released — the run's ε over-stated, and a resume had to allow more
``max_epsilon`` than the plan. A node's refusal is raised before it touches its records, so the engine now voids the
refused client's write-ahead charge with a void event (:func:`fedhype.privacy.ledger.void`); a node without a reply in
time keeps its charge (it may have released), and ``fedhype audit`` recomputes the same ε from the file.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from fedhype.federated.config import TrainConfig  # noqa: E402
from fedhype.federated.flower import handshake, wire  # noqa: E402
from fedhype.federated.flower.grid_transport import NodeFailure  # noqa: E402
from fedhype.privacy.accountant import epsilon  # noqa: E402
from fedhype.privacy.ledger import PrivacyLedger  # noqa: E402
from fake_grid import InboxGrid, NodeError, set_task_identity, two_site_folders  # noqa: E402  (tests/fake_grid.py)

#: max_epsilon: room for the unseeded reruns a resume pays (the nodes' own caps allow up to it)
CFG = dict(rounds=2, local_steps=2, batch_size=32, epsilon=None, noise_multiplier=1.0, delta=1e-4, seed=0,
           max_epsilon=10.0, model={"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8})


@pytest.fixture(autouse=True)
def _run_identity(monkeypatch):
    set_task_identity(monkeypatch)


@pytest.fixture(scope="module")
def sites(real_store, tmp_path_factory):

    root = tmp_path_factory.mktemp("sites")
    out = two_site_folders(real_store, root)
    return out


def _fresh(sites, tmp_path):
    """Copies of the sites (their ledgers across runs untouched by other tests) and their federation."""
    from fedhype.federated.flower.federation import Federation, write_site_federation

    copies = []
    for i, p in enumerate(sites):
        shutil.copytree(p, tmp_path / f"site{i}")
        copies.append(tmp_path / f"site{i}")
    path = write_site_federation(tmp_path / "fed", copies, TrainConfig(**CFG))
    return copies, path, Federation.load(path)


def _flower_reason(exc: BaseException) -> str:
    """What Flower's SuperNode sends the server for an exception its ClientApp raised."""
    return str(type(exc)) + ":<'" + str(exc) + "'>"


class SiteGrid(InboxGrid):
    """Site nodes running the real handlers. ``lost``: ``(node, message type)`` whose node runs the request but whose
    reply never arrives (a node that died after releasing, or a lost reply)."""

    def __init__(self, ncs: dict[int, dict], lost: set[tuple[int, str]] = frozenset()):
        super().__init__()
        self.ncs, self.lost, self.dropped, self.asked = ncs, set(lost), set(), []

    def get_node_ids(self):
        return list(self.ncs)

    def answer(self, m):
        from fedhype.federated.flower import node

        nc, kind = self.ncs[m.metadata.dst_node_id], m.metadata.message_type
        self.asked.append((m.metadata.dst_node_id, kind))
        handler = {handshake.QUERY_TYPE: handshake.node_identity, wire.STATS_TYPE: node.run_class_stats,
                   wire.TRAIN: node.run_train}[kind]
        try:
            return handler(nc, m.content)
        except Exception as exc:  # noqa: BLE001
            raise NodeError(_flower_reason(handshake.for_the_server(exc))) from None

    def pull_messages(self, ids):
        for i in ids:
            m = self._inbox.get(i)
            if i not in self.dropped and m is not None and (m.metadata.dst_node_id, m.metadata.message_type) in self.lost:
                self.dropped.add(i)
                self.answer(m)  # the node runs it: its reply is what is lost
        return super().pull_messages([i for i in ids if i not in self.dropped])


def _serve(grid, fed_path, run, **over):
    from fedhype.federated.flower.apps import ServerSettings, run_server

    return run_server(grid, ServerSettings.from_run_config({"federation": str(fed_path), "run-dir": str(run),
                                                            "connect-timeout": 30, "round-timeout": 30,
                                                            "straggler-timeout": 1, **over}))


def _plan(fed):
    """``(prefix, [(σ, q_i, K_i) of one round per client])`` of the federation's plan."""
    from fedhype.federated.run_plan import plan_privacy

    cfg, sizes = fed.train, [c.n_train for c in fed.roster.clients]
    rnd = [(float(cfg.noise_multiplier), cfg.sample_rate(n), cfg.steps_per_round(n)) for n in sizes]
    return [tuple(p) for p in plan_privacy(cfg, sizes)["prefix"]], rnd


def _nc(site, fed_path, state, **extra):
    return {"site": str(site), "federation": str(fed_path), "state-dir": str(state), **extra}


def _node_ledger(state, run, client):
    from fedhype.federated.flower.grid_transport import run_key_of
    from fedhype.federated.flower.node_budget import LEDGER
    from fedhype.federated.rundir import RunDir

    return PrivacyLedger.load(state / run_key_of(RunDir(run)) / f"client-{client}" / LEDGER)


def test_a_round_a_node_refuses_is_voided_in_the_server_ledger_the_audit_agrees_and_the_resume_charges_it_once(
        sites, tmp_path):
    from fedhype.eval.audit_ledger import audit_run

    (site0, site1), fed_path, fed = _fresh(sites, tmp_path)
    prefix, rnd = _plan(fed)
    delta = fed.train.delta
    assert min(s for s, _, _ in prefix) > 1.5 > rnd[1][0]  # the node's floor: the release passes, the round does not
    run = tmp_path / "run"
    ncs = {20: _nc(site0, fed_path, tmp_path / "n0"), 21: _nc(site1, fed_path, tmp_path / "n1", **{
        "min-noise-multiplier": 1.5})}
    with pytest.raises(NodeFailure) as failed:
        _serve(SiteGrid(ncs), fed_path, run)
    text = str(failed.value)
    assert text.startswith("round 1: no update from 1 client(s): client 1 (site-1): node refused: this SuperNode "
                           "refuses σ = 1 < its min-noise-multiplier 1.5")
    assert failed.value.refused == {"1": "this SuperNode refuses σ = 1 < its min-noise-multiplier 1.5"}
    assert text.endswith("(The write-ahead ledger keeps this round's events of the client(s) without a refusal; the "
                         "charge of each client that refused is voided in it: its node released nothing, and the "
                         "resume charges it afresh.)")

    ledger = PrivacyLedger.load(run / "ledger.json")
    # what the nodes released: both the statistics release, client 0 round 1; client 1 nothing of round 1
    want = {"0": epsilon(prefix + [rnd[0]], delta), "1": epsilon(prefix, delta)}
    assert ledger.epsilons().keys() == want.keys()
    for c in want:
        assert abs(ledger.epsilon(c) - want[c]) <= 1e-9
    assert want["1"] < epsilon(prefix + [rnd[1]], delta)  # what the charge left in force would have said
    # the charge stays in the file, withdrawn by a void an auditor sees: the same numbers, its digest, the reason
    (charge, void), = ledger.voided()
    assert (charge.client, charge.round, charge.mechanism) == (void.client, void.round, void.mechanism) == ("1", 0,
                                                                                                           "dp-sgd")
    assert (charge.noise_multiplier, charge.sample_rate, charge.steps) == (void.noise_multiplier, void.sample_rate,
                                                                          void.steps) == rnd[1]
    assert void.note == ("void: its node refused the request before running anything, so nothing was released: this "
                         "SuperNode refuses σ = 1 < its min-noise-multiplier 1.5")
    assert len(ledger.recorded) == len(ledger.events) + 2
    assert '"voids":"' in (run / "ledger.json").read_text()
    # the node's own ledger: it charged what it released and nothing of the round it refused — the same ε
    assert abs(_node_ledger(tmp_path / "n1", run, 1).epsilon("1") - want["1"]) <= 1e-9
    # fedhype audit recomputes the same ε from the file and names the void
    res = audit_run(run)
    assert res["ledger_ok"] and res["consistent"] and res["voided_charges"] == 1
    assert all(abs(res["epsilon_per_client"][c] - want[c]) <= 1e-9 for c in want)
    assert abs(res["epsilon"] - max(want.values())) <= 1e-9
    assert any(w.startswith("1 write-ahead charge(s) were voided in the ledger and do not count in ε") and
               "client '1' (site-1), round 1: its node refused" in w for w in res["warnings"])

    # the site lowers its floor (restarts its SuperNode) and the coordinator resumes: client 1's round 1 is a first
    # charge (not "charged again"), so its ε is the plan's exactly; client 0 (unseeded) pays its rerun of round 1
    ncs[21] = _nc(site1, fed_path, tmp_path / "n1")
    result = _serve(SiteGrid(ncs), fed_path, run, resume=True)
    assert result["complete"] and result["rounds"] == 2
    ledger = PrivacyLedger.load(run / "ledger.json")
    full = {c: epsilon(prefix + [rnd[int(c)]] * 2, delta) for c in ("0", "1")}
    assert abs(ledger.epsilon("1") - full["1"]) <= 1e-9
    assert not [e for e in ledger.events if e.client == "1" and "charged again" in e.note]
    assert abs(ledger.epsilon("0") - epsilon(prefix + [rnd[0]] * 3, delta)) <= 1e-9  # round 1 twice: fresh noise
    assert abs(_node_ledger(tmp_path / "n1", run, 1).epsilon("1") - full["1"]) <= 1e-9  # node and server agree
    res = audit_run(run)
    assert res["consistent"] and res["voided_charges"] == 1, res["mismatches"]
    assert abs(res["epsilon_per_client"]["1"] - full["1"]) <= 1e-9
    assert abs(result["epsilon"] - res["epsilon"]) <= 1e-9


def test_a_node_without_a_reply_in_time_keeps_its_charge(sites, tmp_path):
    from fedhype.eval.audit_ledger import audit_run

    (site0, site1), fed_path, fed = _fresh(sites, tmp_path)
    prefix, rnd = _plan(fed)
    run = tmp_path / "run"
    grid = SiteGrid({20: _nc(site0, fed_path, tmp_path / "n0"), 21: _nc(site1, fed_path, tmp_path / "n1")},
                    lost={(21, wire.TRAIN)})
    with pytest.raises(NodeFailure) as failed:
        _serve(grid, fed_path, run)
    assert "client 1 (site-1, SuperNode 21): no reply in time" in str(failed.value)
    assert failed.value.refused == {} and "voided" not in str(failed.value)
    ledger = PrivacyLedger.load(run / "ledger.json")
    assert ledger.voided() == [] and len(ledger.recorded) == len(ledger.events)
    for c in ("0", "1"):  # the node may have released (here it did): its charge stays
        assert abs(ledger.epsilon(c) - epsilon(prefix + [rnd[int(c)]], fed.train.delta)) <= 1e-9
    assert abs(_node_ledger(tmp_path / "n1", run, 1).epsilon("1") - ledger.epsilon("1")) <= 1e-9
    res = audit_run(run)
    assert res["voided_charges"] == 0 and abs(res["epsilon_per_client"]["1"] - ledger.epsilon("1")) <= 1e-9


@pytest.mark.parametrize("floor, refused", [(8.0, "centre"), (2.0, "statistics")])
def test_a_node_that_refuses_a_step_of_the_release_has_that_step_voided(sites, tmp_path, floor, refused):
    """The release's two steps (centre at σ_A, statistics at σ_B < σ_A) are each charged just before they run: a
    node refusing its centre has that charge voided and no client's statistics step is charged (it never ran); one
    refusing the statistics step ran its centre (that stays)."""
    from fedhype.eval.audit_ledger import audit_run
    from fedhype.privacy.centring import MECHANISM as CENTRE
    from fedhype.privacy.events import RELEASE

    (site0, site1), fed_path, fed = _fresh(sites, tmp_path)
    prefix, rnd = _plan(fed)
    (sigma_a, _, _), (sigma_b, _, _) = prefix
    assert sigma_b < 2.0 < sigma_a < 8.0
    delta = fed.train.delta
    run = tmp_path / "run"
    ncs = {20: _nc(site0, fed_path, tmp_path / "n0"), 21: _nc(site1, fed_path, tmp_path / "n1",
                                                             **{"min-noise-multiplier": floor})}
    with pytest.raises(NodeFailure, match="node refused: this SuperNode refuses σ = ") as failed:
        _serve(SiteGrid(ncs), fed_path, run)
    assert list(failed.value.refused) == ["1"]
    ledger = PrivacyLedger.load(run / "ledger.json")
    voided = [(c.client, c.mechanism) for c, _ in ledger.voided()]
    if refused == "centre":
        assert voided == [("1", CENTRE)] and "1" not in ledger.epsilons()
        # client 0 answered its centre; the statistics step was asked of no one, and is charged to no one
        assert abs(ledger.epsilon("0") - epsilon(prefix[:1], delta)) <= 1e-9
        assert not [e for e in ledger.events if e.mechanism == RELEASE]
    else:
        assert voided == [("1", RELEASE)] and abs(ledger.epsilon("1") - epsilon(prefix[:1], delta)) <= 1e-9
        assert abs(ledger.epsilon("0") - epsilon(prefix, delta)) <= 1e-9  # client 0 answered both steps
    res = audit_run(run)
    assert res["voided_charges"] == len(voided)
    assert res["epsilon_per_client"] == pytest.approx(ledger.epsilons(), abs=1e-12)
    # the resume (the floor lifted) charges client 1's refused step(s) once, as first charges: ε as planned
    ncs[21] = _nc(site1, fed_path, tmp_path / "n1")
    grid = SiteGrid(ncs)
    result = _serve(grid, fed_path, run, resume=True)
    assert result["complete"]
    # client 0's statistics (saved when they arrived) are not asked again; after a refused centre, everything is
    assert ((20, wire.STATS_TYPE) in grid.asked) == (refused == "centre")
    ledger = PrivacyLedger.load(run / "ledger.json")
    assert abs(ledger.epsilon("1") - epsilon(prefix + [rnd[1]] * 2, delta)) <= 1e-9
    assert not [e for e in ledger.events if e.client == "1" and "charged again" in e.note]
    assert abs(_node_ledger(tmp_path / "n1", run, 1).epsilon("1") - ledger.epsilon("1")) <= 1e-9
    assert audit_run(run)["consistent"]


def test_a_void_withdraws_exactly_one_charge_in_force_and_a_forged_one_fails_verification(tmp_path):
    """The ledger's side (:func:`fedhype.privacy.ledger.void`): what an auditor can rely on."""
    import hashlib
    import json

    from fedhype.errors import ArtifactError, ValidationError
    from fedhype.privacy.ledger import LedgerEvent, charge, event_digest, pending_charges, void

    delta = 1e-5
    ledger = PrivacyLedger(delta, {"run": "t", "refusals": True})
    a = LedgerEvent("0", 0, "dp-sgd", 1.0, 0.1, 10, 1.0)
    b = LedgerEvent("1", 0, "dp-sgd", 1.0, 0.1, 10, 1.0, seeded=True)
    charge(ledger, [a, b], tmp_path / "ledger.json")
    (v,) = void(ledger, [b], "refused", tmp_path / "ledger.json")
    assert v.voids == event_digest(b) and v.note == "void: refused" and v.seeded
    assert ledger.events == (a,) and ledger.recorded == (a, b, v) and ledger.voided() == [(b, v)]
    assert ledger.clients() == ["0"] and ledger.epsilon("1") == 0.0
    assert abs(ledger.epsilon("0") - epsilon([(1.0, 0.1, 10)], delta)) <= 1e-9
    again = PrivacyLedger.load(tmp_path / "ledger.json")  # saved atomically, verified on load
    assert again.recorded == ledger.recorded and again.epsilons() == ledger.epsilons()
    # a voided charge is no earlier attempt: charged afresh, even seeded (its node released nothing to replay)
    (fresh,) = pending_charges(again, [LedgerEvent("1", 0, "dp-sgd", 1.0, 0.1, 10, 1.0)], replays=lambda e: True)
    assert fresh.seeded and "charged again" not in fresh.note
    # a charge is withdrawn once; a void must repeat its charge; nothing is recorded when one of them is bad
    with pytest.raises(ValidationError, match="still in force"):
        void(ledger, [b], "again")
    with pytest.raises(ValidationError, match=r"its \['steps'\] differ"):
        ledger.record(LedgerEvent("0", 0, "dp-sgd", 1.0, 0.1, 1, 1.0, voids=event_digest(a)))
    assert len(ledger) == 3
    # a void forged into the file (hashes recomputed) that withdraws no charge of it fails verification
    state = again.state_dict()
    forged = PrivacyLedger(delta, {"run": "t", "refusals": True})
    link = forged.genesis
    for e in (a, LedgerEvent("0", 0, "dp-sgd", 1.0, 0.1, 10, 1.0, voids="0" * 64)):  # record() would refuse it
        link = hashlib.sha256((link + json.dumps(e.to_dict(), sort_keys=True, separators=(",", ":"),
                                                 ensure_ascii=False)).encode()).hexdigest()
        forged._events.append(e)
        forged._chain.append(link)
    with pytest.raises(ArtifactError, match=r"event 1 is invalid: a void must name an earlier charge"):
        PrivacyLedger.from_state_dict(forged.state_dict())
    assert PrivacyLedger.from_state_dict(state).epsilons() == ledger.epsilons()
    # a ledger without voids keeps its form: no "voids" key
    assert "voids" not in json.dumps(a.to_dict())


def test_only_a_flower_coordinators_ledger_takes_voids_and_an_appended_void_elsewhere_is_tampering(tmp_path):
    """A probe appended exact-match voids to a site's ledger across runs (chain extended, earlier links kept): its
    spent ε fell 2.942 → 2.677 and a run its cap refused went through. Only a ledger started with meta
    ``refusals`` (a Flower coordinator's: part of its genesis hash) takes voids; in any other the record is refused,
    and a file holding one fails to load."""
    import dataclasses
    import json

    from fedhype.errors import ArtifactError, ValidationError
    from fedhype.privacy.ledger import LedgerEvent, charge, event_digest, void
    from fedhype.privacy.site_ledger import load_site_ledger, set_site_ledger

    delta = 1e-5
    a = LedgerEvent("0", 0, "dp-sgd", 1.0, 0.1, 10, 1.0)
    plain = PrivacyLedger(delta, {"run": "t"})  # an in-process run's
    charge(plain, [a], tmp_path / "plain.json")
    assert not plain.takes_voids
    with pytest.raises(ValidationError, match="cannot have refused requests"):
        void(plain, [a], "refused")
    assert plain.events == (a,)

    def append_void(path, charge_event):  # what the probe did: a valid-looking line, the chain and checksum extended
        from fedhype.privacy import ledger as lm

        state = json.loads(path.read_text())
        v = dataclasses.replace(charge_event, voids=event_digest(charge_event), note="void: forged")
        state["events"].append(v.to_dict())
        state["chain"].append(lm._sha256(state["chain"][-1] + lm._canonical(v.to_dict())))
        body = {k: state[k] for k in ("format", "delta", "meta", "events", "chain")}
        state["checksum"] = lm._sha256(lm._canonical(body))
        path.write_text(json.dumps(state))

    append_void(tmp_path / "plain.json", a)
    with pytest.raises(ArtifactError, match="cannot have refused requests"):
        PrivacyLedger.load(tmp_path / "plain.json")

    site = tmp_path / "site"
    site.mkdir()
    set_site_ledger(site, "hospital_a", delta=delta)
    led = load_site_ledger(site, site="hospital_a")
    b = LedgerEvent("hospital_a", 0, "dp-sgd", 1.0, 0.1, 10, 1.0, note="run r1")
    charge(led, [b], site / "site-ledger.json")
    before = load_site_ledger(site, site="hospital_a").epsilons()
    append_void(site / "site-ledger.json", b)
    with pytest.raises(ArtifactError, match="cannot have refused requests"):
        load_site_ledger(site, site="hospital_a")
    assert before["hospital_a"] > 0
