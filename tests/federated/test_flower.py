"""Flower deployment: a real SuperLink and two SuperNodes on 127.0.0.1 (loopback, insecure mode).

One scenario, run once per module (real processes are slow to start), checked by the tests below:
a 2-round DP run (:data:`CFG`: the default model with its DP class statistics, small sizes) on
two sites, each with its own store (an iid half of the real digits embeddings) and its own split
(``fedhype site``); the server is given only the federation written from their public cards; after
round 1 is committed, SuperNode 1 is killed
(SIGKILL); the server stops the round with a clear error; the node is restarted and the run
resumed. The result must equal the in-process engine's (same seed), the ledger must equal its
ledger (nothing charged twice), and only the records of :mod:`fedhype.federated.flower.wire` may
have crossed the wire. Every wait is bounded; every process started here (and its children) is
killed at the end.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from fedhype.federated.config import TrainConfig  # noqa: E402
from fedhype.federated.rundir import RunDir, load_model  # noqa: E402
from fedhype.io import load_tensors  # noqa: E402
from flower_deployment import BIN, Deployment, _alive, _wait_for, two_sites  # noqa: E402  (tests/flower_deployment.py)

#: Small sizes, the default model otherwise (DP class statistics before round 1 included).
CFG = dict(rounds=2, local_steps=2, batch_size=32, epsilon=None, noise_multiplier=1.0, delta=1e-4, seed=0,
           model={"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8})
STRAGGLER_S = 15.0  # the live node of the killed round answers; the dead one is given up this long after
SCENARIO_BUDGET_S = 420.0


@pytest.fixture(scope="module")
def scenario(real_store, tmp_path_factory):
    """Run the kill-and-resume scenario once; returns what the tests check."""
    from fedhype.data.sites import Site
    from fedhype.federated.engine import train_sites
    from fedhype.federated.flower.federation import write_app, write_site_federation

    if not (BIN / "flower-superlink").exists() or not (BIN / "flwr").exists():
        pytest.skip(f"Flower's executables are not in {BIN}")
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("flower")
    sites = two_sites(real_store, root)
    write_site_federation(root / "server", sites, TrainConfig(**CFG))  # from the public cards only
    app, run = root / "app", root / "run"
    write_app(app, federation=root / "server" / "federation.json", run_dir=run, connect_timeout=90,
              round_timeout=180, straggler_timeout=STRAGGLER_S, wire_log=root / "wire.jsonl")
    node_cfg = [f'site="{s}" federation="{root / "server" / "federation.json"}" '
                f'state-dir="{root / f"node{i}-private"}" seed={CFG["seed"]}' for i, s in enumerate(sites)]
    dep = Deployment(root)
    out: dict = {"root": root, "run": run, "ref": root / "in-process", "classes": real_store.class_names,
                 "ids": real_store.sample_ids, "digests": [real_store.digest()] + [
                     Site.load(s).store().digest() for s in sites]}
    try:
        dep.start_link()
        for i, nc in enumerate(node_cfg):
            dep.start_node(i, nc)
        # the in-process reference, same settings and seed (while the SuperNodes connect), with one thread as the
        # nodes and the ServerApp run (OMP_NUM_THREADS=1): the same float32 reduction order, so the two agree to
        # rounding; with two threads here the codes differed by up to 6e-5 on an AVX512 CPU
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            train_sites([Site.load(s) for s in sites], TrainConfig(**CFG), out["ref"], diagnostics=False)
        finally:
            torch.set_num_threads(threads)
        # run 1 in the background; kill node 1 as soon as round 1 is committed
        with open(root / "flwr-run-1.log", "w") as log:
            first = subprocess.Popen([str(BIN / "flwr"), "run", str(app), "local", "--stream"], env=dep.env,
                                     stdout=log, stderr=subprocess.STDOUT, cwd=root)
        try:
            _wait_for(lambda: RunDir(run).committed_round() >= 1 or first.poll() is not None, 240,
                      "round 1 to be committed")
            out["killed_pids"] = dep.kill("node1")
            out["killed_at"] = time.monotonic()
            first.wait(timeout=240)
        finally:
            if first.poll() is None:
                first.kill()
        out["first_output"] = (root / "flwr-run-1.log").read_text(errors="replace")
        out["first_seconds_after_kill"] = time.monotonic() - out["killed_at"]
        out["after_failure"] = {"rounds": RunDir(run).committed_round(),
                                "ledger": json.loads((run / "ledger.json").read_text())["events"]}
        # restart node 1 (same private state folder) and resume
        dep.start_node(1, node_cfg[1])
        out["second_output"] = dep.flwr_run(app, "--run-config", "resume=true")
        out["seconds"] = time.monotonic() - t0
        if not (run / "checkpoint.json").exists() or RunDir(run).committed_round() < CFG["rounds"]:
            pytest.fail("the resumed Flower run did not complete:\n" + out["second_output"][-3000:]
                        + "\n--- superlink ---\n" + dep.log("superlink") + "\n--- node0 ---\n" + dep.log("node0"))
        yield out
    finally:
        out["left_alive"] = dep.close()
        assert not out["left_alive"], f"processes left alive: {out['left_alive']}"


def _events(path: Path) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "time"} for e in json.loads(path.read_text())["events"]]


def test_killed_supernode_stops_the_round_with_a_clear_error(scenario):
    text = scenario["first_output"]
    assert "NodeFailure" in text and "round 2: no update from 1 client(s): client 1" in text, text[-3000:]
    assert "nothing of it is committed (completed rounds: 1)" in text and "resume=true" in text
    # bounded: given up STRAGGLER_S after the live node's answer, not after Flower's heartbeat expiry
    assert scenario["first_seconds_after_kill"] < STRAGGLER_S + 60
    assert scenario["after_failure"]["rounds"] == 1
    # the killed node's processes are gone, not left behind
    assert not [p for p in scenario["killed_pids"] if _alive(p)]


def test_ledger_was_written_ahead_and_resume_charges_nothing_twice(scenario):
    ref = _events(scenario["ref"] / "ledger.json")
    got = _events(scenario["run"] / "ledger.json")
    # before the kill: round 2 was charged to both sampled clients before any data was touched
    at_failure = [{k: v for k, v in e.items() if k != "time"} for e in scenario["after_failure"]["ledger"]]
    assert at_failure == ref
    # after the resume (seeded nodes replay the same noise): exactly the in-process ledger
    assert got == ref
    assert [(e["client"], e["round"], e["mechanism"]) for e in got] == \
        [(e["client"], e["round"], e["mechanism"]) for e in ref] and not any("rerun" in e["note"] for e in got)
    # the accountant's figures agree too
    m_ref = json.loads((scenario["ref"] / "metrics.json").read_text())
    m_got = json.loads((scenario["run"] / "metrics.json").read_text())
    assert [m["epsilon_per_client"] for m in m_got] == [m["epsilon_per_client"] for m in m_ref]
    assert [m["participants"] for m in m_got] == [["0", "1"], ["0", "1"]]
    # each site node kept its own ledger of what it ran (fedhype.federated.flower.node_budget): the server's
    # events for its client, once each — the restarted node's replay of round 2 was free (same request, seeded)
    fields = ("client", "round", "mechanism", "noise_multiplier", "sample_rate", "steps")
    for i in (0, 1):
        (path,) = (scenario["root"] / f"node{i}-private").rglob("node-ledger.json")
        node = [tuple(e[k] for k in fields) for e in json.loads(path.read_text())["events"]]
        assert node == [tuple(e[k] for k in fields) for e in got if e["client"] == str(i)], i


def test_result_matches_the_in_process_engine(scenario):
    h_ref, c_ref, meta_ref = load_model(scenario["ref"])
    h_got, c_got, meta_got = load_model(scenario["run"])
    torch.testing.assert_close(c_got, c_ref, rtol=0, atol=1e-5)
    # float32 rounding only: the client-statistics heads have weights up to ~35, so the two deployments'
    # different summation orders differ by a few ulps of that (measured ≤ 1e-5 absolute, ≤ 1e-4 relative
    # on the codes' Adam moments)
    for (k, a), (_, b) in zip(h_got.state_dict().items(), h_ref.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=k)
    assert {k: v for k, v in meta_got.items() if k != "run_id"} == {k: v for k, v in meta_ref.items() if k != "run_id"}
    ck_ref = load_tensors(RunDir(scenario["ref"]).server_ckpt(2))
    ck_got = load_tensors(RunDir(scenario["run"]).server_ckpt(2))
    assert set(ck_got) == set(ck_ref)
    for k in ck_ref:
        torch.testing.assert_close(ck_got[k].float(), ck_ref[k].float(), rtol=1e-4, atol=1e-5, msg=k)
    # the same run directory: config and commit point equal; private client state stayed on the nodes
    assert json.loads((scenario["run"] / "config.json").read_text()) == \
        json.loads((scenario["ref"] / "config.json").read_text())
    assert not (scenario["run"] / "clients").exists()
    assert list((scenario["root"] / "node1-private").rglob("state-r2.safetensors"))


def test_only_privatized_updates_and_theta_cross_the_wire(scenario):
    from fedhype.federated.flower.wire import META_KEYS, TASK_KEYS

    h, codes, _ = load_model(scenario["ref"])
    theta = {k: [str(v.dtype).replace("torch.", ""), list(v.shape)] for k, v in h(codes[0]).items()}
    d, k = real_dim(scenario), len(scenario["classes"])
    stats_on = bool(getattr(TrainConfig(**CFG).model_config(d, k), "class_bias", False))
    stats = {"class_sums": ["float32", [k, d]], "class_counts": ["float32", [k]]}
    if TrainConfig(**CFG).model_config(d, k).linear_path:  # the second-order release: M = Σ x xᵀ [D, D]
        stats["second_moment"] = ["float32", [d, d]]
    centre = {"sum": ["float32", [d]], "count": ["float32", [1]]}
    log = [json.loads(line) for line in (scenario["root"] / "wire.jsonl").read_text().splitlines()]
    seen, replies, stages = set(), [], []
    for e in log:
        rec, kind = e["records"], e["type"]
        seen.add((e["direction"], kind))
        if e["direction"] == "node→server":
            if kind == "query":
                assert rec == {"identity": {"type": "ConfigRecord",
                                            "keys": {"client": "str", "seeded": "bool", "federation": "str",
                                                     "fedhype-version": "str"}}}
                continue
            assert set(rec) == {"update", "update-meta"}, e
            # the centred release: the centre's sum and count first, then the class statistics
            assert rec["update"]["arrays"] in ([theta] if kind == "train" else [stats, centre]), e
            replies.append(rec["update"]["arrays"])
            assert rec["update-meta"]["type"] == "ConfigRecord"
            assert set(rec["update-meta"]["keys"]) == META_KEYS | {"noise-multiplier"}
        else:
            if kind == "train":
                assert set(rec) == {"theta", "task"} | ({"space"} if stats_on else set())
                assert rec["theta"]["arrays"] == theta
                if stats_on:
                    assert rec["space"]["arrays"] == {"mean": ["float32", [d]], "scale": ["float32", []]}
                assert set(rec["task"]["keys"]) == TASK_KEYS | {"noise-multiplier"}
            else:
                assert set(rec) == ({"query"} if kind == "query" else {"stats-task"}), e
                if kind != "query":  # public settings only: σ₀ and the release weights, no data
                    from fedhype.federated.flower.wire import STATS_KEYS

                    keys = set(rec["stats-task"]["keys"])
                    centred = {"centre", "radius"} & keys  # the statistics of a centred release: its public centre
                    assert keys == STATS_KEYS | {"noise-multiplier"} | centred and centred in (set(), {"centre", "radius"})
                    stages.append(bool(centred))
    kinds = ("query", "train.class_stats", "train") if stats_on else ("query", "train")
    assert seen == {(a, t) for a in ("server→node", "node→server") for t in kinds}
    if stats_on and TrainConfig(**CFG).centre_share > 0:  # per client: the centre, then the centred statistics
        assert sorted(stages) == [False, False, True, True]
        assert sum(r == centre for r in replies) == 2 and sum(r == stats for r in replies) == 2
    n_updates = sum(e["direction"] == "node→server" and e["type"] == "train" for e in log)
    assert n_updates == 2 + 1 + 2  # round 1, round 2 (node 1 killed: no reply), round 2 again


def test_no_record_id_or_store_digest_reaches_the_server(scenario):
    """The server's inputs and outputs (federation file, run folder, wire log) hold no record id and no
    digest of a site's records: the coordinator is given the sites' public cards only."""
    files = [p for p in (scenario["root"] / "server").rglob("*") if p.is_file()] + \
            [p for p in scenario["run"].rglob("*") if p.is_file()] + [scenario["root"] / "wire.jsonl"]
    for path in files:
        data = path.read_bytes()
        assert not any(d.encode() in data for d in scenario["digests"]), path
        assert not any(i.encode() in data for i in scenario["ids"][:200]), path


def real_dim(scenario) -> int:
    return int(json.loads((scenario["run"] / "config.json").read_text())["store"]["dim"])


def test_scenario_time(scenario):
    """The whole scenario (two Flower runs, a kill, a resume) stays bounded."""
    assert scenario["seconds"] < SCENARIO_BUDGET_S


def test_each_sites_ledger_holds_the_flower_run_once_beside_the_in_process_one(scenario):
    # real SuperNodes started with site=: each charges its site folder's ledger across runs with exactly its
    # node ledger's events (the killed node's resume replays seeded noise: charged once), beside the charges of
    # the in-process reference run on the same site folders; the accountant composes both
    from fedhype.privacy.ledger import PrivacyLedger
    from fedhype.privacy.site_ledger import by_run, composed, load_site_ledger, run_of, seeded_runs, spent

    root = scenario["root"]
    for i in range(2):
        led = load_site_ledger(root / f"site{i}")
        nodes = list((root / f"node{i}-private").glob("*/client-*/node-ledger.json"))
        assert len(nodes) == 1
        key, node = nodes[0].parent.parent.name, PrivacyLedger.load(nodes[0])
        runs = by_run(led, seeded_infinite=False)  # the accountant's figures, as if the seeded noise were secret
        assert len(runs) == 2 and next(iter(runs)).startswith("in-process-") and key in runs
        assert [(e.round, e.mechanism, e.noise_multiplier, e.sample_rate, e.steps) for e in led.events
                if run_of(e) == key] == [(e.round, e.mechanism, e.noise_multiplier, e.sample_rate, e.steps)
                                         for e in node.events]
        assert runs[key] == pytest.approx(node.epsilon(str(i)), rel=1e-9)
        assert composed(led.events, led.delta, seeded_infinite=False) > max(runs.values())
        # both runs were seeded (seed=): their noise can be regenerated from the seed, so the site's ε is ∞
        assert seeded_runs(led) == list(runs) and spent(led) == float("inf")
