"""Secure aggregation on a real Flower deployment: a SuperLink and three SuperNodes on 127.0.0.1 (insecure mode).

One deployment per module, four Flower runs (m = 3 clients, --dropout-tolerance t = 1, seeded nodes):

A. ``fedhypevae``, one round: the release before round 0 goes through SecAgg+ with Skellam noise; the result
   must equal the in-process engine's with the same integer mechanism and seed
   (:class:`fedhype.federated.secure_release.LocalIntegerSession`: SecAgg+'s ideal sum; the sums are exact
   integers, so only float rounding may differ), the ledger must record Skellam releases at the planned ε,
   and the wire may carry, during the release, keys, encrypted shares and masked uint64 vectors only (the
   dumped vectors are uniform on [0, 2⁶⁴), unlike any node's own integer share).
B. ``dp-gaussian``: SuperNode 2 is killed when the release's first SecAgg+ setup goes out (within t): the release
   is summed over clients 0 and 1 and committed, equal to the in-process reference without client 2.
C. ``dp-gaussian``, node 2 restarted: nodes 1 and 2 are killed at the first setup (beyond t): a clear error,
   nothing committed, nothing charged.
D. ``dp-gaussian``, nodes restarted, node 1 with ``secure-aggregation=false`` (a node that does not take part in
   the protocol): a clear error at setup, nothing charged.
Every wait is bounded; every process started here (and its children) is killed at the end.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from fedhype.data.partition import make_partition  # noqa: E402
from fedhype.federated.config import TrainConfig  # noqa: E402
from fedhype.federated.engine import _build_clients, build_client, describe_store, plan_privacy, run_federation  # noqa: E402
from fedhype.federated.rundir import RunDir, load_model  # noqa: E402
from fedhype.federated.secure_release import attach_local_session, planned_tails  # noqa: E402
from fedhype.federated.transport import InProcessTransport  # noqa: E402
from fedhype.privacy.accountant import epsilon  # noqa: E402
from fedhype.privacy.ledger import PrivacyLedger  # noqa: E402
from flower_deployment import BIN, Deployment, _wait_for  # noqa: E402  (tests/flower_deployment.py)

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}
BASE = dict(epsilon=2.0, delta=1e-4, seed=0, model=SMALL, secure_aggregation=True, dropout_tolerance=1)
CFG_A = dict(BASE, rounds=1, local_steps=1, batch_size=32)
CFG_B = dict(BASE, method="dp-gaussian")
STRAGGLER_S = 30.0  # a live node answers well within it on a loaded 2-core machine (each stage starts a process)
SCENARIO_BUDGET_S = 600.0


def _reference(real_store, part, cfg: TrainConfig, out: Path, drop=()):
    """The in-process engine with the deployment's integer mechanism (same seed), single-threaded like the nodes."""
    def connect(run):
        clients, _ = _build_clients(real_store, part, run, cfg)
        attach_local_session(clients, cfg.distributed_noise(len(clients)), cfg.delta,
                             planned_tails(cfg, [len(c.train) for c in part.clients]), drop=drop)
        return InProcessTransport(clients, None)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_federation(part, cfg, out, store_info=describe_store(real_store), n_classes=real_store.n_classes,
                              connect=connect)
    finally:
        torch.set_num_threads(threads)


def _first_setup(log: Path) -> bool:
    if not log.exists():
        return False
    return any(json.loads(line)["type"] == "train.secagg/setup" for line in log.read_text().splitlines() if line)


@pytest.fixture(scope="module")
def scenario(real_store, tmp_path_factory):
    from fedhype.federated.flower.federation import write_app, write_federation

    if not (BIN / "flower-superlink").exists() or not (BIN / "flwr").exists():
        pytest.skip(f"Flower's executables are not in {BIN}")
    t0 = time.monotonic()
    part = make_partition(real_store, scheme="iid", n_clients=3, seed=0)
    root = tmp_path_factory.mktemp("flower-secure")
    real_store.save(root / "store.safetensors")
    part.save(root / "partition.json")
    apps = {}
    for name, cfg in (("a", CFG_A), ("b", CFG_B), ("c", CFG_B), ("d", CFG_B)):
        write_federation(root / f"server-{name}", real_store, part, TrainConfig(**cfg))
        apps[name] = write_app(root / f"app-{name}", federation=root / f"server-{name}" / "federation.json",
                               run_dir=root / f"run-{name}", connect_timeout=90, round_timeout=180,
                               straggler_timeout=STRAGGLER_S, wire_log=root / f"wire-{name}.jsonl",
                               wire_dump=root / f"dump-{name}").parent

    def node_cfg(i, extra=""):
        return (f'client="{part.clients[i].id}" embeddings="{root / "store.safetensors"}" '
                f'partition="{root / "partition.json"}" state-dir="{root / f"node{i}-private"}" seed=0{extra}')

    dep = Deployment(root)
    out: dict = {"root": root, "part": part, "store": real_store}
    try:
        dep.start_link()
        for i in range(3):
            dep.start_node(i, node_cfg(i))
        out["ref_a"] = _reference(real_store, part, TrainConfig(**CFG_A), root / "ref-a")
        out["ref_b"] = _reference(real_store, part, TrainConfig(**CFG_B), root / "ref-b", drop=[2])
        # A: the whole run
        out["a_output"] = dep.flwr_run(apps["a"], timeout=300)
        # B: node 2 dies when the first setup goes out
        with open(root / "flwr-run-b.log", "w") as log:
            run_b = subprocess.Popen([str(BIN / "flwr"), "run", str(apps["b"]), "local", "--stream"], env=dep.env,
                                     stdout=log, stderr=subprocess.STDOUT, cwd=root)
        try:
            _wait_for(lambda: _first_setup(root / "wire-b.jsonl") or run_b.poll() is not None, 240, "run B's setup")
            dep.kill("node2")
            run_b.wait(timeout=240)
        finally:
            if run_b.poll() is None:
                run_b.kill()
        out["b_output"] = (root / "flwr-run-b.log").read_text(errors="replace")
        # C: node 2 back, then nodes 1 and 2 die at the first setup
        dep.start_node(2, node_cfg(2))
        with open(root / "flwr-run-c.log", "w") as log:
            run_c = subprocess.Popen([str(BIN / "flwr"), "run", str(apps["c"]), "local", "--stream"], env=dep.env,
                                     stdout=log, stderr=subprocess.STDOUT, cwd=root)
        try:
            _wait_for(lambda: _first_setup(root / "wire-c.jsonl") or run_c.poll() is not None, 240, "run C's setup")
            dep.kill("node1")
            dep.kill("node2")
            run_c.wait(timeout=240)
        finally:
            if run_c.poll() is None:
                run_c.kill()
        out["c_output"] = (root / "flwr-run-c.log").read_text(errors="replace")
        # D: nodes back, node 1 refuses secure aggregation
        dep.start_node(1, node_cfg(1, " secure-aggregation=false"))
        dep.start_node(2, node_cfg(2))
        out["d_output"] = dep.flwr_run(apps["d"], timeout=300)
        out["seconds"] = time.monotonic() - t0
        if not (root / "run-a" / "checkpoint.json").exists():
            pytest.fail("run A did not complete:\n" + out["a_output"][-3000:] + "\n--- superlink ---\n"
                        + dep.log("superlink") + "\n--- node0 ---\n" + dep.log("node0"))
        yield out
    finally:
        out["left_alive"] = dep.close()
        assert not out["left_alive"], f"processes left alive: {out['left_alive']}"


def _same_model(run: Path, ref: Path, atol=1e-5):
    h_ref, c_ref, meta_ref = load_model(ref)
    h_got, c_got, meta_got = load_model(run)
    torch.testing.assert_close(c_got, c_ref, rtol=0, atol=atol)
    for (k, a), (_, b) in zip(h_got.state_dict().items(), h_ref.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=k)
    assert {k: v for k, v in meta_got.items() if k != "run_id"} == {k: v for k, v in meta_ref.items() if k != "run_id"}


def _events(path: Path) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "time"} for e in json.loads(path.read_text())["events"]]


def test_secure_run_equals_the_in_process_engine_with_the_same_integer_mechanism(scenario):
    root = scenario["root"]
    _same_model(root / "run-a", root / "ref-a")
    # the same ledger: Skellam releases for every client, then the round's DP-SGD steps
    assert _events(root / "run-a" / "ledger.json") == _events(root / "ref-a" / "ledger.json")
    led = PrivacyLedger.load(root / "run-a" / "ledger.json")
    rel = [e for e in led.events if e.round == -1]
    assert [(e.client, e.mechanism, e.noise) for e in rel] == \
        [(c, m, "skellam") for m in ("dp-release-centre", "dp-class-stats") for c in ("0", "1", "2")]
    cfg = TrainConfig(**CFG_A)
    sizes = [len(c.train) for c in scenario["part"].clients]
    planned = max(epsilon(plan_privacy(cfg, sizes)["prefix"] + t, cfg.delta) for t in planned_tails(cfg, sizes))
    assert led.worst()[1] <= planned + 1e-9 <= cfg.epsilon + 1e-6
    assert "SecAgg+ statistics: summed 3 of 3 clients" in scenario["a_output"]


def test_only_masked_vectors_cross_the_wire_during_the_release(scenario):
    """The structure of every message of run A, and the values of what the nodes sent: no float statistic, no
    unmasked integer share — only keys, encrypted shares, Shamir shares of the mask secrets and uint64 vectors
    indistinguishable from uniform noise."""
    from fedhype.privacy.secure_agg import DistributedNoise
    from fedhype.privacy.skellam import Layout, SkellamPlan

    root = scenario["root"]
    log = [json.loads(line) for line in (root / "wire-a.jsonl").read_text().splitlines()]
    types = [e["type"] for e in log]
    assert "train.class_stats" not in types  # the plain release is never asked for
    stages = ("setup", "share_keys", "collect", "unmask")
    replies = {s: {"protocol", "fedhype-version", "stage", "session", "participant"} for s in stages}
    replies["setup"] |= {"pk1", "pk2"}
    replies["share_keys"] |= {"dsts", "ctxts"}
    replies["collect"] |= {"client", "length"}
    replies["unmask"] |= {"b-ids", "b-shares", "sk-ids", "sk-shares"}
    vectors = 0
    for e in log:
        rec = e["records"]
        if not e["type"].startswith("train.secagg/"):
            continue
        stage = e["type"].split("/")[1]
        if e["direction"] == "node→server":
            assert set(rec["secagg"]["keys"]) == replies[stage], e
            if stage == "collect":
                assert set(rec) == {"secagg", "masked"} and rec["masked"]["type"] == "ArrayRecord"
                (dtype, shape), = rec["masked"]["arrays"].values()
                assert dtype == "uint64" and len(shape) == 1
                vectors += 1
            else:
                assert set(rec) == {"secagg"}
        elif stage == "collect":  # the request: public settings (the plan, the release request) and ciphertexts
            assert set(rec) == {"secagg", "stats-task"}
    assert vectors == 6  # the centre and the statistics, three nodes each
    # the values: every received array of the release is a masked uint64 vector
    dumped = sorted((root / "dump-a").glob("*train.secagg*"))
    assert len(dumped) == 6 and all("_masked_vector.npy" in f.name for f in dumped)
    led = PrivacyLedger.load(root / "run-a" / "ledger.json")
    plans = {e.mechanism: e for e in led.events if e.round == -1 and e.client == "0"}
    centres = 0
    for f in dumped:
        y = np.load(f)
        counts = np.bincount((y >> np.uint64(56)).astype(np.int64), minlength=256)
        assert float(((counts - y.size / 256) ** 2 / (y.size / 256)).sum()) < 400, f.name  # top byte uniform
        client = f.name.split("_")[2]
        if y.size < 1000:  # the centre: compare with the node's own integer share, recomputed with its seed
            centres += 1
            ev = plans["dp-release-centre"]
            lay = Layout.centre(int(json.loads((root / "run-a" / "config.json").read_text())["store"]["dim"]))
            plan = SkellamPlan(DistributedNoise(3, 1), ev.noise_multiplier, int(ev.scale), ev.record_dim, lay.length,
                               "centre")
            c = build_client(scenario["store"], scenario["part"], int(client), root / "tmp", seed=0)
            own = c.release_integer("centre", plan)
            assert np.abs(own._ints).max() < 2 ** 40 and float(np.mean(y == own._ints.view(np.uint64))) < 0.01
    assert centres == 3


def test_a_node_dropped_within_t_is_survived(scenario):
    root = scenario["root"]
    text = scenario["b_output"]
    assert "dropped out" in text and "summed 2 of 3 clients" in text, text[-3000:]
    assert RunDir(root / "run-b").committed_round() == 0 and (root / "run-b" / "model.safetensors").exists()
    _same_model(root / "run-b", root / "ref-b")
    led = PrivacyLedger.load(root / "run-b" / "ledger.json")
    # client 2 was gone before it computed anything: it is not charged
    assert sorted({e.client for e in led.events}) == ["0", "1"] and all(e.noise == "skellam" for e in led.events)


def test_dropouts_beyond_t_stop_the_release_with_nothing_charged_or_committed(scenario):
    root = scenario["root"]
    text = scenario["c_output"]
    assert "SecureAggregationError" in text and "1 of 3 clients left, fewer than m − t = 2" in text, text[-3000:]
    assert "Nothing of the centre was released or charged" in text
    assert not (root / "run-c" / "checkpoint.json").exists() and not (root / "run-c" / "model.safetensors").exists()
    assert not (root / "run-c" / "ledger.json").exists() or _events(root / "run-c" / "ledger.json") == []


def test_a_node_that_does_not_speak_the_protocol_gets_a_clear_error(scenario):
    root = scenario["root"]
    text = scenario["d_output"]
    assert "ProtocolRefused" in text and "client 1" in text and "does not take part in fedhype's secure-aggregation" \
        in text and "secure-aggregation=false" in text, text[-3000:]
    assert not (root / "run-d" / "checkpoint.json").exists()
    assert not (root / "run-d" / "ledger.json").exists() or _events(root / "run-d" / "ledger.json") == []


def test_scenario_time(scenario):
    assert scenario["seconds"] < SCENARIO_BUDGET_S
