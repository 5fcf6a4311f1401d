"""A coordinator cannot get a site's planned ε twice on a real Flower deployment (a SuperLink and two site
SuperNodes on 127.0.0.1, insecure mode, unseeded nodes as in a real deployment).

The fresh-user probe this reproduces: after a run, the coordinator started another one with the federation file
the sites had accepted — under another run-dir, or the same run-dir deleted and recreated — and each site node
charged the whole plan again (ε = 7.03 spent on a site whose plan allowed 2). And with a site whose lifetime cap
the plan would pass, the other site had already released (and spent) its statistics before that site refused.

One deployment, four Flower runs (``dp-gaussian``: the statistics release only, ε = 2 per site):

1. the run, completed; site 1's lifetime cap (2.3) holds one such plan, not two;
2. the same run-dir, deleted and recreated: a new run (a new random key), refused at the handshake;
3. another run-dir: refused the same way, nothing charged anywhere;
4. both nodes restarted with a new federation file (accepted by the sites): site 1 refuses the connection at the
   handshake, since the plan would pass its lifetime cap — before site 0 released anything.

Every wait is on a condition (``flwr run`` returns when its ServerApp ends); every process started here is killed.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from fedhype.federated.config import TrainConfig  # noqa: E402
from flower_deployment import BIN, Deployment, two_sites  # noqa: E402  (tests/flower_deployment.py)

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}
CFG = dict(epsilon=2.0, delta=1e-4, model=SMALL, method="dp-gaussian")
CAP = 2.3  # site 1's lifetime cap: one plan of ε = 2, not two
BUDGET_S = 480.0


def _site_events(site) -> list[dict]:
    path = site / "site-ledger.json"
    return json.loads(path.read_text())["events"] if path.exists() else []


@pytest.fixture(scope="module")
def scenario(real_store, tmp_path_factory):
    from fedhype.federated.flower.federation import write_app, write_site_federation
    from fedhype.privacy.site_ledger import set_site_ledger

    if not (BIN / "flower-superlink").exists() or not (BIN / "flwr").exists():
        pytest.skip(f"Flower's executables are not in {BIN}")
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("flower-second-run")
    sites = two_sites(real_store, root)
    set_site_ledger(sites[1], "site-1", max_epsilon=CAP, delta=CFG["delta"])
    fed_a = write_site_federation(root / "fed-a", sites, TrainConfig(**CFG, seed=0))
    fed_b = write_site_federation(root / "fed-b", sites, TrainConfig(**CFG, seed=1))  # another file, the same ε
    apps = {k: write_app(root / f"app-{k}", federation=f, run_dir=root / "run", connect_timeout=90,
                         round_timeout=180, straggler_timeout=30).parent for k, f in (("a", fed_a), ("b", fed_b))}

    def node_cfg(i, fed):
        return f'site="{sites[i]}" federation="{fed}" state-dir="{root / f"node{i}-private"}"'

    dep = Deployment(root)
    out: dict = {"root": root, "sites": sites}
    try:
        dep.start_link()
        for i in range(2):
            dep.start_node(i, node_cfg(i, fed_a))
        out["first"] = dep.flwr_run(apps["a"])
        if not (root / "run" / "checkpoint.json").exists():
            pytest.fail("the first run did not complete:\n" + out["first"][-3000:] + "\n--- node1 ---\n"
                        + dep.log("node1"))
        out["key"] = json.loads((root / "run" / "ckpt" / "run-key.json").read_text())["key"]
        out["after_first"] = [_site_events(s) for s in sites]
        shutil.rmtree(root / "run")  # the probe: the same path, deleted and recreated
        out["same_path"] = dep.flwr_run(apps["a"])
        out["same_path_key"] = json.loads((root / "run" / "ckpt" / "run-key.json").read_text())["key"] \
            if (root / "run" / "ckpt" / "run-key.json").exists() else None
        out["other_dir"] = dep.flwr_run(apps["a"], "--run-config", f'run-dir="{root / "run-2"}"')
        out["after_refusals"] = [_site_events(s) for s in sites]
        for i in range(2):  # the sites accept a new federation file: their nodes restart with it
            dep.kill(f"node{i}")
            dep.start_node(i, node_cfg(i, fed_b))
        out["over_cap"] = dep.flwr_run(apps["b"], "--run-config", f'run-dir="{root / "run-3"}"')
        out["after_cap"] = [_site_events(s) for s in sites]
        out["seconds"] = time.monotonic() - t0
        yield out
    finally:
        left = dep.close()
        assert not left, f"processes left alive: {left}"


def test_the_first_run_charges_each_site_once(scenario):
    assert all(len(ev) >= 1 for ev in scenario["after_first"]), scenario["after_first"]
    assert [e["mechanism"] for e in scenario["after_first"][0]] == [e["mechanism"] for e in scenario["after_first"][1]]
    assert all(e["note"].startswith(f"run {scenario['key']}") for ev in scenario["after_first"] for e in ev)


def test_a_second_run_with_the_same_federation_file_is_refused_and_charged_nowhere(scenario):
    key = scenario["key"]
    for name in ("same_path", "other_dir"):
        text = scenario[name]
        assert (f"node refused: this site's federation file was already used for run {key}; a new run needs a new "
                "federation file from the coordinator, accepted by the site (restart the SuperNode with it)") in text, \
            text[-3000:]
        assert "refused the connection" in text and "Nothing was released or charged" in text and "<class" not in text
    # refused at the handshake, before the ServerApp wrote anything: the recreated folder got no run (nor a key)
    assert scenario["same_path_key"] is None and not (scenario["root"] / "run-2").exists()
    assert scenario["after_refusals"] == scenario["after_first"]
    root = scenario["root"]
    for i in range(2):
        assert [p.name for p in (root / f"node{i}-private").iterdir() if p.is_dir()] == [key]


def test_a_plan_past_a_sites_lifetime_cap_is_refused_before_any_site_releases(scenario):
    text = scenario["over_cap"]
    assert ("refused the connection — node refused: this site's ledger across runs: the federation's plan (the "
            "release and every planned round) would pass the site's lifetime ε cap; refused at the handshake") in text, \
        text[-3000:]
    assert str(scenario["sites"][1]) not in text  # the site's folder and figures stay at the site
    assert scenario["after_cap"] == scenario["after_first"]  # site 0 released nothing either


def test_scenario_time(scenario):
    assert scenario["seconds"] < BUDGET_S
