"""Canary audit of the statistics release (``fedhype audit --canaries white-box --release``): on secure-aggregation
runs (Gaussian shares in process, Skellam integer shares as on a Flower deployment) and a per-client release, a
correct mechanism stays below the claimed ε of the release and a broken one (no noise) is flagged."""

import json

import pytest
from typer.testing import CliRunner

from fedhype.cli.main import app
from fedhype.data.partition import make_partition
from fedhype.errors import ValidationError
from fedhype.eval.canary import phases_from_ledger
from fedhype.eval.canary_release import release_audit, release_mechanism
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import _build_clients, describe_store, run_federation, train
from fedhype.federated.secure_release import attach_local_session, planned_tails
from fedhype.federated.transport import InProcessTransport
from fedhype.privacy.ledger import PrivacyLedger

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}
SECURE = dict(method="dp-gaussian", epsilon=1.0, delta=1e-4, seed=0, model=SMALL, secure_aggregation=True,
              dropout_tolerance=1)


@pytest.fixture(scope="module")
def runs(real_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("release-audit")
    dom = make_partition(real_store, scheme="domain", seed=0)  # 4 clients
    train(real_store, dom, TrainConfig(**SECURE), root / "gauss", diagnostics=False)
    train(real_store, dom, TrainConfig(**{**SECURE, "secure_aggregation": False, "dropout_tolerance": 0}),
          root / "plain", diagnostics=False)
    iid = make_partition(real_store, scheme="iid", n_clients=3, seed=0)
    cfg = TrainConfig(**SECURE)

    def connect(run):  # the Flower deployment's integer mechanism, in process
        clients, _ = _build_clients(real_store, iid, run, cfg)
        attach_local_session(clients, cfg.distributed_noise(3), cfg.delta,
                             planned_tails(cfg, [len(c.train) for c in iid.clients]))
        return InProcessTransport(clients, None)

    run_federation(iid, cfg, root / "skellam", store_info=describe_store(real_store), n_classes=real_store.n_classes,
                   connect=connect)
    dom.save(root / "dom.json")
    iid.save(root / "iid.json")
    real_store.save(root / "store.safetensors")
    return {"root": root, "dom": dom, "iid": iid}


def _release_epsilon(run, client):
    led = PrivacyLedger.load(run / "ledger.json")
    out = PrivacyLedger(led.delta)
    for e in led.events:
        if e.client == client and e.round == -1:
            out.record(e)
    return out.epsilon(client)


@pytest.mark.parametrize("name", ["gauss", "skellam", "plain"])
def test_a_correct_release_stays_below_its_claim(runs, real_store, name):
    run = runs["root"] / name
    mech = release_mechanism(run)
    assert [s.kind for s in mech["steps"]] == ["centre", "statistics"]
    assert {s.noise for s in mech["steps"]} == {"skellam" if name == "skellam" else "gaussian"}
    assert (mech["distributed"] is None) == (name == "plain")
    assert mech["claimed_epsilon"] == pytest.approx(_release_epsilon(run, mech["client"]))
    assert 0.9 < mech["claimed_epsilon"] <= 1.0 + 1e-6  # dp-gaussian: the release gets the whole target
    part = runs["iid" if name == "skellam" else "dom"]
    tr = part.client_store(real_store, int(mech["client"]), "train")
    res = release_audit(mech, records=(tr.embeddings, tr.labels), n_canaries=real_store.dim, seed=1)
    assert not res["exceeds_claim"] and res["empirical_epsilon_lower_bound"] < res["claimed_epsilon"]
    assert res["n_canaries"] == real_store.dim and res["n_real_records"] == len(tr.labels)
    assert res["secure_aggregation"] == (None if name == "plain" else {"clients": 3 if name == "skellam" else 4,
                                                                        "dropout_tolerance": 1})


@pytest.mark.parametrize("name", ["gauss", "skellam"])
def test_a_release_without_noise_is_flagged(runs, real_store, name):
    res = release_audit(release_mechanism(runs["root"] / name), n_canaries=real_store.dim, breakage="noise", seed=2)
    assert res["exceeds_claim"] and res["correct"] == res["guesses"]
    assert res["empirical_epsilon_lower_bound"] > res["claimed_epsilon"]


def test_release_audit_refuses_too_many_canaries_and_runs_without_a_release(runs, audit_run):
    mech = release_mechanism(runs["root"] / "gauss")
    with pytest.raises(ValidationError, match="one canary on its own embedding coordinate|own embedding coordinate"):
        release_audit(mech, n_canaries=mech["dim"] + 1)
    with pytest.raises(ValidationError, match="released no class statistics"):
        release_mechanism(audit_run[0])


def test_the_dp_sgd_replay_leaves_skellam_releases_out(runs):
    led = PrivacyLedger.load(runs["root"] / "skellam" / "ledger.json")
    assert all(e.noise == "skellam" for e in led.events)
    with pytest.raises(ValidationError, match="no mechanism events"):
        phases_from_ledger(led, "0")


def test_cli_release_audit(runs):
    root = runs["root"]
    base = ["audit", "--run", str(root / "skellam"), "--canaries", "white-box", "--release", "--json"]
    r = CliRunner().invoke(app, [*base, "--store", str(root / "store.safetensors"), "--partition", str(root / "iid.json")])
    assert r.exit_code == 0, r.stdout
    out = json.loads(r.stdout)
    assert out["canary"]["mode"] == "white-box (release)" and out["exceeds_claim"] is False
    assert out["n_canaries"] == 384 and out["consistent"] is True  # the ledger check of --run passes too
    r = CliRunner().invoke(app, [*base, "--break", "noise"])
    assert r.exit_code == 4 and "exceeds the claimed ε" in json.loads(r.stdout)["error"]
    r = CliRunner().invoke(app, [*base, "--n-canaries", "1000"])
    assert r.exit_code == 2 and "use --n-canaries 384 or fewer" in json.loads(r.stdout)["error"]
    r = CliRunner().invoke(app, ["audit", "--run", str(root / "gauss"), "--canaries", "black-box", "--release", "--json"])
    assert r.exit_code == 2 and "--release applies to --canaries white-box only" in json.loads(r.stdout)["error"]
