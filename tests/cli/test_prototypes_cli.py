"""``fedhype prototypes train|evaluate``: JSON output, DP matching from the CLI, exit codes 2 and 4."""

import json

import pytest
from typer.testing import CliRunner

from fedhype.cli.main import app
from fedhype.data.partition import make_partition
from fedhype.data.store import EmbeddingStore


@pytest.fixture(scope="module")
def files(real_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("protocli")
    real = real_store.save(root / "real.safetensors")
    part = make_partition(real_store, scheme="domain", seed=0)
    part.save(root / "part.json")
    val = part.split_store(real_store, "val")                 # stand-in for a DP synthetic store
    syn = EmbeddingStore(val.embeddings, val.labels, val.domains * 0, [f"syn/{i}" for i in range(len(val))],
                         val.class_names, ["neutral"], {"kind": "synthetic", "private": True, "epsilon": 1.0})
    narrow = EmbeddingStore(real_store.embeddings[:, :32].clone(), real_store.labels, real_store.domains,
                            real_store.sample_ids, real_store.class_names, real_store.domain_names, {"kind": "real"})
    return {"root": root, "real": real, "part": root / "part.json", "syn": syn.save(root / "syn.safetensors"),
            "narrow": narrow.save(root / "narrow.safetensors")}


def _run(*args):
    return CliRunner().invoke(app, ["prototypes", *map(str, args)])


def test_train_on_real_partition_and_evaluate_per_client(files):
    out = files["root"] / "real-model"
    r = _run("train", "--data", files["real"], "--partition", files["part"], "--epochs", 6, "--out", out, "--json")
    assert r.exit_code == 0, r.output
    # the old name works, said like every renamed option (a probe: --data alone gave no word)
    assert "warning: --data is deprecated and will be removed in the next release; use --synthetic" in r.stderr
    res = json.loads(r.stdout)
    assert res["n_train"] == 480 and res["private"] is False and res["matching"] == "none"
    # trained on real records: no DP guarantee, so no ε (an ε of 0 had read as perfect privacy)
    assert res["epsilon"] is None and res["epsilon_scope"].startswith("none") and res["privacy"]["epsilon"] is None
    assert json.loads((out / "config.json").read_text())["privacy"]["epsilon"] is None
    assert res["train_accuracy"] > 0.45                      # chance 0.1; 6 short epochs
    r = _run("evaluate", "--model", out, "--store", files["real"], "--partition", files["part"], "--json")
    assert r.exit_code == 0, r.output
    ev = json.loads(r.stdout)
    assert ev["n"] == 160 and 0.35 < ev["accuracy"] <= 1 and 0 < ev["macro_f1"] <= 1
    assert ev["store"] == str(files["real"]) and "real" not in ev  # the key is the option's name, --store
    assert ev["warnings"] == []  # trained on the train split, scored on the test split
    # scored on the records it was trained on: said (it had printed 0.98 as if held out; a new user's probe)
    r = _run("evaluate", "--model", out, "--store", files["real"], "--partition", files["part"], "--split", "train", "--json")
    assert r.exit_code == 0 and "not held-out accuracy" in json.loads(r.stdout)["warnings"][0]
    r = _run("evaluate", "--model", out, "--store", files["real"], "--json")  # the whole store holds them too
    assert "its train split" in json.loads(r.stdout)["warnings"][0]
    assert set(ev["heads"]) == {"linear", "prototype", "both"}
    assert set(ev["per_client"]) == {"mnist", "optdigits", "mnist-m", "rotated-mnist"}
    assert sum(c["n"] for c in ev["per_client"].values()) == 160
    # refuses to overwrite without --overwrite (exit 2)
    r = _run("train", "--data", files["real"], "--partition", files["part"], "--epochs", 1, "--out", out, "--json")
    assert r.exit_code == 2 and "--overwrite" in json.loads(r.stdout)["error"]


def test_train_on_synthetic_with_dp_matching(files):
    out = files["root"] / "dp-model"
    r = _run("train", "--data", files["syn"], "--store", files["real"], "--partition", files["part"], "--matching", "dp",
             "--epochs", 3, "--noise-multiplier", 1.5, "--delta", 1e-4, "--out", out, "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["private"] is True and res["data_epsilon"] == 1.0
    assert 0 < res["epsilon"] < 5 and res["epsilon_scope"].startswith("the DP matching alone") and res["privacy"]["events"] == 3 * 4
    assert (out / "ledger.json").exists()
    r = _run("evaluate", "--model", out, "--store", files["real"], "--json")      # the whole store, per domain
    assert r.exit_code == 0, r.output
    ev = json.loads(r.stdout)
    assert ev["n"] == 800 and ev["per_client"] is None and len(ev["per_domain"]) == 4
    assert ev["privacy"]["epsilon"] == res["epsilon"]
    # over budget: exit 3 before anything is spent
    r = _run("train", "--data", files["syn"], "--store", files["real"], "--partition", files["part"], "--matching", "dp",
             "--epochs", 3, "--max-epsilon", 0.01, "--delta", 1e-4, "--out", files["root"] / "x", "--json")
    assert r.exit_code == 3 and json.loads(r.stdout)["epsilon"] > 0.01


def test_federated_train(files):
    out = files["root"] / "fed-model"
    r = _run("train", "--data", files["real"], "--partition", files["part"], "--federated", "--epochs", 3,
             "--local-epochs", 2, "--out", out, "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["federated"] is True and res["private"] is False and res["n_clients"] == 4 and res["n_train"] == 480
    assert res["privacy"]["model_private"] is False and len(res["privacy"]["clients"]) == 4
    r = _run("train", "--data", files["syn"], "--partition", files["part"], "--federated", "--out", out / "x", "--json")
    assert r.exit_code == 4 and "synthetic store" in json.loads(r.stdout)["error"]


@pytest.mark.parametrize("args, message", [
    (["--head", "knn"], "'knn' is not one of 'prototype', 'linear', 'both'"),
    (["--federated"], "--federated needs --partition"),
    (["--matching", "dp"], "--matching dp needs --partition"),
    (["--split", "dev"], "'dev' is not one of 'train', 'val', 'test'"),
])
def test_train_usage_errors_exit_2(files, args, message):
    r = _run("train", "--data", files["real"], "--epochs", 1, "--out", files["root"] / "bad", *args, "--json")
    assert r.exit_code == 2, r.output
    assert message in json.loads(r.stdout)["error"]


def test_artifact_errors_exit_4_and_mismatch_exit_2(files):
    r = _run("evaluate", "--model", files["root"] / "missing", "--store", files["real"], "--json")
    assert r.exit_code == 2 and "no such folder" in json.loads(r.stdout)["error"]  # a missing input is a usage error
    out = files["root"] / "small"
    assert _run("train", "--data", files["real"], "--epochs", 1, "--out", out, "--json").exit_code == 0
    # a hyper-prototype model given where a generator is read, and a generator's run folder where a hyper-prototype
    # model is (a helper read "format None"): each names what was given
    r = CliRunner().invoke(app, ["synthesize", "--run", str(out), "--n", "10", "--out", str(files["root"] / "q.st"),
                                 "--json"])
    assert r.exit_code == 4 and "a hyper-prototype classifier (`fedhype prototypes train`), not a generator model" in \
        json.loads(r.stdout)["error"], r.output
    gen = files["root"] / "gen"
    (gen).mkdir()
    (gen / "config.json").write_text(json.dumps({"train": {"epsilon": 1.0}}))
    (gen / "model.safetensors").write_bytes(b"")
    r = _run("evaluate", "--model", gen, "--store", files["real"], "--json")
    assert r.exit_code == 4 and "a generator's run or release folder" in json.loads(r.stdout)["error"], r.output
    r = _run("evaluate", "--model", out, "--store", files["narrow"], "--json")
    assert r.exit_code == 2 and "D=32" in json.loads(r.stdout)["error"]
    raw = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(raw[:100])
    r = _run("evaluate", "--model", out, "--store", files["real"], "--json")
    assert r.exit_code == 4, r.output
    r = _run("train", "--data", files["root"] / "nope.safetensors", "--out", files["root"] / "y", "--json")
    assert r.exit_code == 2 and "--data" in json.loads(r.stdout)["error"]


def test_evaluate_refuses_a_partition_other_than_the_synthetic_runs(files, real_store):
    """`prototypes evaluate --partition other.json` scored a model trained on a run's synthetic store on another
    partition's test split (which may hold that run's training records) with no word; `evaluate` refuses it."""
    from fedhype.data.partition import Partition

    part = Partition.load(files["part"])
    syn = EmbeddingStore.load(files["syn"])
    keyed = EmbeddingStore(syn.embeddings, syn.labels, syn.domains, syn.sample_ids, syn.class_names, syn.domain_names,
                           {**syn.meta, "data_keys": [part.data_key]})
    keyed.save(files["root"] / "keyed.safetensors")
    out = files["root"] / "keyed-model"
    r = _run("train", "--data", files["root"] / "keyed.safetensors", "--epochs", 1, "--out", out, "--json")
    assert r.exit_code == 0, r.output
    r = _run("evaluate", "--model", out, "--store", files["real"], "--partition", files["part"], "--json")
    assert r.exit_code == 0, r.output  # the run's own partition
    make_partition(real_store, scheme="iid", n_clients=2, seed=0).save(files["root"] / "other.json")
    r = _run("evaluate", "--model", out, "--store", files["real"], "--partition", files["root"] / "other.json", "--json")
    assert r.exit_code == 4 and "is not among the run's data keys" in json.loads(r.stdout)["error"]


def test_dp_linear_names_its_local_learning_rate_as_train_does(files):
    """`prototypes dp-linear --lr` and `train --lr-local` are the same thing (the clients' step size) under two names;
    dp-linear now takes --lr-local, and --lr still works for one release with the renamed-option warning."""
    base = ["dp-linear", "--store", files["real"], "--partition", files["part"], "--epsilon", 4, "--rounds", 1,
            "--seed", 0, "--json"]
    new, old, slow = _run(*base, "--lr-local", 0.5), _run(*base, "--lr", 0.5), _run(*base, "--lr-local", 0.01)
    assert new.exit_code == old.exit_code == slow.exit_code == 0, (new.output, old.output)
    assert "warning: --lr is deprecated and will be removed in the next release; use --lr-local" in old.stderr
    assert "deprecated" not in new.stderr
    assert json.loads(new.stdout)["accuracy"] == json.loads(old.stdout)["accuracy"]  # the same run
    assert json.loads(slow.stdout)["accuracy"] != json.loads(new.stdout)["accuracy"]  # the value is used
    both = _run(*base, "--lr", 0.5, "--lr-local", 0.5)
    assert both.exit_code == 2 and "--lr is the old name of --lr-local" in both.output


def test_a_synthetic_store_where_real_records_are_read_exits_4(files):
    """A synthetic store where a command reads the clients' real records is a file of another kind (exit 4, as the
    README's exit-code list says), named, with nothing written: the DP reference and --matching dp."""
    out = files["root"] / "kind"
    r = _run("dp-linear", "--store", files["syn"], "--partition", files["part"], "--rounds", 1, "--out", out, "--json")
    assert r.exit_code == 4 and json.loads(r.stdout)["error"] == (
        f"--store {files['syn']} is a synthetic store; this reference trains on real records"), r.output
    r = _run("train", "--synthetic", files["syn"], "--store", files["syn"], "--partition", files["part"],
             "--matching", "dp", "--epochs", 1, "--out", out, "--json")
    assert r.exit_code == 4 and json.loads(r.stdout)["error"].startswith(
        f"--store {files['syn']} is a synthetic store; --matching dp needs the clients' real store"), r.output
    assert not out.exists()
