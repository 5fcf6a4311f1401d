"""``fedhype evaluate``: JSON keys, human output, partitions, exit codes 2 and 4."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from typer.testing import CliRunner

from fedhype.cli.main import app
from fedhype.data.store import EmbeddingStore

CLASSES = [str(i) for i in range(10)]
FAST = ["--permutations", "20", "--max-samples", "300"]


def _store(x, y, prefix, kind="real"):
    n = len(y)
    return EmbeddingStore(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)), torch.from_numpy(np.arange(n) % 2),
                          [f"{prefix}/{i}" for i in range(n)], CLASSES, ["a", "b"], {"kind": kind})


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = load_digits()
    perm = np.random.default_rng(0).permutation(len(d.target))
    x, y = (d.data[perm] / 16.0).astype(np.float32), d.target[perm]
    root = tmp_path_factory.mktemp("evalcli")
    paths = {
        "real": _store(x[:300], y[:300], "te").save(root / "real.safetensors"),
        "train": _store(x[300:700], y[300:700], "tr").save(root / "train.safetensors"),
        "syn": _store(x[700:1000], y[700:1000], "sy", "synthetic").save(root / "syn.safetensors"),
        "narrow": _store(x[700:1000, :32].copy(), y[700:1000], "na", "synthetic").save(root / "narrow.safetensors"),
        "full": _store(x, y, "all").save(root / "full.safetensors"),
    }
    raw = paths["syn"].read_bytes()
    (root / "corrupt.safetensors").write_bytes(raw[: len(raw) // 2])
    paths["corrupt"] = root / "corrupt.safetensors"
    return paths


def _run(*args):
    return CliRunner().invoke(app, ["evaluate", *map(str, args)])


def test_json_output(stores):
    r = _run("--store", stores["real"], "--synthetic", stores["syn"], "--real-train", stores["train"], *FAST,
             "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for key in ("mmd2", "mmd2_p_value", "fd", "precision", "recall", "density", "coverage", "tstr_accuracy",
                "trtr_accuracy"):
        assert isinstance(out[key], float), key
    assert out["tstr_accuracy"] > 0.85 and out["trtr_accuracy"] > 0.85
    assert out["mmd2_n_real"] == 300 and out["space"] == "l2"
    # no --partition: the whole store is the reference; said on stderr and in the JSON (it was stderr only)
    assert len(out["warnings"]) == 1 and out["warnings"][0].startswith("no --partition: all 300 records")


def test_a_synthetic_reference_is_warned_about(stores):
    """--store is the real reference: a synthetic store there compares two synthetic sets (a new user's probe)."""
    r = _run("--store", stores["syn"], "--synthetic", stores["syn"], *FAST, "--json")
    assert r.exit_code == 0, r.output
    w = json.loads(r.stdout)["warnings"]
    assert any("kind='synthetic': the reference is not real data" in x for x in w) and "not real data" in r.stderr


def test_a_one_class_reference_is_warned_about(stores, tmp_path):
    """One class in the real reference: TSTR and TRTR of 1.0 came with no warning (a new user's probe)."""
    real = EmbeddingStore.load(stores["real"])
    one = real.subset((real.labels == 3).nonzero().flatten())
    one.save(tmp_path / "one.safetensors")
    r = _run("--store", tmp_path / "one.safetensors", "--synthetic", stores["syn"], "--real-train", stores["train"],
             *FAST, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    # not "any classifier scores 1.0": a classifier trained on ten classes may predict others (a probe read 0.875)
    assert any("holds 1 class(es) (3): accuracy on it is the share of its records predicted as that class" in w
               for w in out["warnings"]), out["warnings"]
    assert "nothing of how classes are told apart" in " ".join(r.stderr.split())
    r = _run("--store", stores["real"], "--synthetic", stores["syn"], *FAST, "--json")  # ten classes: no such warning
    assert not any("class(es)" in w for w in json.loads(r.stdout)["warnings"])


def test_the_real_train_store_must_be_real_and_embedded_as_the_run(stores, tmp_path):
    """A probe: --real-train took a synthetic store (TRTR 0.967, labelled "train on real") and a mean-pooled store
    against a CLS run (TRTR 1.0) without a word."""
    r = _run("--store", stores["real"], "--synthetic", stores["syn"], "--real-train", stores["syn"], *FAST, "--json")
    assert r.exit_code == 4 and json.loads(r.stdout)["error"].startswith(
        f"--real-train {stores['syn']} is a 'synthetic' store; TRTR trains on real embeddings"), r.output
    syn = EmbeddingStore.load(stores["syn"])
    syn.meta["embedding"] = {"encoder": "dinov2-vits14", "pooling": "cls"}
    syn.save(tmp_path / "syn.safetensors")
    train = EmbeddingStore.load(stores["train"])
    train.meta.update(encoder="dinov2-vits14", pooling="mean")
    train.save(tmp_path / "mean.safetensors")
    r = _run("--store", stores["real"], "--synthetic", tmp_path / "syn.safetensors", "--real-train",
             tmp_path / "mean.safetensors", *FAST, "--json")
    assert r.exit_code == 4, r.output
    assert "was embedded with pooling = 'mean'" in json.loads(r.stdout)["error"]


def test_human_output_is_a_table(stores):
    r = _run("--store", stores["real"], "--synthetic", stores["syn"], *FAST)
    assert r.exit_code == 0, r.output
    assert "fidelity" in r.stdout and "TSTR" in r.stdout and "balanced_accuracy" in r.stdout
    assert "per domain" in r.stdout


def test_partition_gives_per_client_results(stores, tmp_path):
    from fedhype.data.partition import make_partition

    full = EmbeddingStore.load(stores["full"])
    part = make_partition(full, scheme="iid", n_clients=3, seed=0, min_train_per_client=20)
    part_path = part.save(tmp_path / "part.json")
    r = _run("--store", stores["full"], "--synthetic", stores["syn"], "--partition", part_path, "--interpolation",
             *FAST, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out["per_domain"]) == {c.name for c in part.clients}
    assert out["n_real"] == sum(len(c.test) for c in part.clients)
    assert out["trtr_accuracy"] is not None
    assert set(out["interpolation"]["clients"]) == {c.name for c in part.clients}
    assert not any("--split train" in w for w in out["warnings"])
    # scored on the training records: said (a helper's --split train scored without a word)
    r = _run("--store", stores["full"], "--synthetic", stores["syn"], "--partition", part_path, "--split", "train",
             *FAST, "--json")
    assert r.exit_code == 0, r.output
    said = [w for w in json.loads(r.stdout)["warnings"] if w.startswith("--split train: ")]
    assert len(said) == 1 and "not held-out quality" in said[0] and said[0] in r.stderr.replace("\n", " ")
    # a partition made from another store is refused as a mismatched artifact
    r = _run("--store", stores["real"], "--synthetic", stores["syn"], "--partition", part_path, *FAST, "--json")
    assert r.exit_code == 4
    # a synthetic store as --store is named as such, not as a digest mismatch (a probe)
    r = _run("--store", stores["syn"], "--synthetic", stores["syn"], "--partition", part_path, *FAST, "--json")
    assert r.exit_code == 4 and json.loads(r.stdout)["error"].startswith(
        f"--store {stores['syn']} is a 'synthetic' store; with --partition it must be the real embeddings store")


def test_downstream_table_per_client_and_its_human_output(stores, tmp_path):
    from fedhype.data.partition import make_partition

    full = EmbeddingStore.load(stores["full"])
    part = make_partition(full, scheme="dirichlet", n_clients=3, alpha=0.2, seed=0, min_train_per_client=20)
    part_path = part.save(tmp_path / "part.json")
    args = ("--store", stores["full"], "--synthetic", stores["syn"], "--partition", part_path, *FAST)
    r = _run(*args, "--downstream", "--interpolation", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    d = out["downstream"]
    assert set(d["clients"]) == {c.name for c in part.clients} and "interpolation" not in d
    assert d["n_union_test"] == sum(len(c.test) for c in part.clients) == out["n_real"]
    # the λ protocol ran once, inside the downstream table: the same λ, and the union scores with it
    for name, c in d["clients"].items():
        assert out["interpolation"]["clients"][name]["lambda"] == c["lambda"]
        assert out["interpolation"]["clients"][name]["union"]["accuracy"] == c["union"]["interpolation"]["accuracy"]
    assert d["gain_union_accuracy"] > 0  # Dirichlet α = 0.2: the clients lack classes the (real) stand-in store has
    r = _run(*args, "--downstream")
    assert r.exit_code == 0, r.output
    assert "downstream accuracy per client" in r.stdout and "local+syn" in r.stdout
    r = _run("--store", stores["real"], "--synthetic", stores["syn"], "--downstream", *FAST, "--json")
    assert r.exit_code == 2 and "--downstream" in json.loads(r.stdout)["error"]


@pytest.mark.parametrize(
    "extra, code",
    [
        (["--synthetic", "corrupt"], 4),
        (["--synthetic", "narrow"], 2),
        (["--synthetic", "syn", "--space", "cosine"], 2),
        (["--synthetic", "syn", "--split", "test"], 2),
        (["--synthetic", "syn", "--k", "0"], 2),
        (["--synthetic", "syn", "--permutations", "many"], 2),
    ],
)
def test_exit_codes(stores, extra, code):
    extra = [str(stores[a]) if a in stores else a for a in extra]
    r = _run("--store", stores["real"], *FAST, *extra, "--json")
    assert r.exit_code == code, r.output
    if code == 4 or "narrow" in " ".join(extra):
        err = json.loads(r.stdout)
        assert err["exit_code"] == code
    if "narrow" in " ".join(extra):
        assert "D=64" in err["error"] and "D=32" in err["error"] and "narrow.safetensors" in err["error"]


def test_console_script_prints_one_json_object(stores):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "-m", "fedhype.cli.main", "evaluate", "--store", str(stores["real"]),
                        "--synthetic", str(stores["syn"]), *FAST, "--json"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 and "mmd2" in json.loads(lines[0])
