"""`fedhype partition` end to end: outputs, the written file and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
import typer
from typer.testing import CliRunner

from fedhype.cli import partition_cmd
from fedhype.data.partition import Partition
from fedhype.cli.common import JsonUsageGroup
from fedhype.data.store import EmbeddingStore

runner = CliRunner()

# The command on its own app, so these tests do not depend on the other subcommands' modules;
# test_subprocess_exit_code runs it through the real `fedhype.cli.main` entry point.
app = typer.Typer(cls=JsonUsageGroup)  # parser errors under --json as one object, as the real root group
app.callback()(lambda: None)
partition_cmd.register(app)


@pytest.fixture(scope="module")
def store_file(tmp_path_factory):
    """Real optdigits pixels as 64-d embeddings; domains = the two halves of the UCI collection."""
    d = load_digits()
    n = len(d.target)
    store = EmbeddingStore(
        embeddings=torch.tensor(d.data, dtype=torch.float32),
        labels=torch.tensor(d.target),
        domains=torch.tensor((np.arange(n) >= n // 2).astype(int)),
        sample_ids=[f"optdigits/{i:05d}" for i in range(n)],
        class_names=[str(c) for c in range(10)],
        domain_names=["first-half", "second-half"],
    )
    return store.save(tmp_path_factory.mktemp("s") / "digits.safetensors")


def invoke(*args):
    return runner.invoke(app, ["partition", *map(str, args)])


def test_json_output_and_file(store_file, tmp_path):
    out = tmp_path / "p.json"
    res = invoke("--store", store_file, "--scheme", "dirichlet", "--clients", 4, "--alpha", 0.5, "--seed", 3,
                 "--out", out, "--json")
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["partition"] == str(out) and obj["scheme"] == "dirichlet"
    # the settings under their option names (--fractions, --min-records), not the file format's keys
    assert obj["params"]["fractions"] == [0.6, 0.2, 0.2] and obj["params"]["min_records"] == 20
    assert "splits" not in obj["params"] and "min_train_per_client" not in obj["params"]
    part = Partition.load(out)
    assert [{k: c[k] for k in ("client", "name", "train", "val", "test")} for c in obj["clients"]] == part.sizes()
    assert sum(c["train"] + c["val"] + c["test"] for c in obj["clients"]) == 1797
    assert all(1 <= c["classes_present"] <= 10 for c in obj["clients"])
    part.check_store(EmbeddingStore.load(store_file))


def test_table_output_domain_scheme(store_file, tmp_path):
    res = invoke("--store", store_file, "--scheme", "domain", "--fractions", "0.5,0.25,0.25", "--out", tmp_path / "d.json")
    assert res.exit_code == 0, res.output
    assert "first-half" in res.stdout and "second-half" in res.stdout and "10/10" in res.stdout
    part = Partition.load(tmp_path / "d.json")
    assert part.params["splits"] == [0.5, 0.25, 0.25] and [c.name for c in part.clients] == ["first-half", "second-half"]


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--scheme", "random", "--clients", "3"], "'random' is not one of 'domain', 'dirichlet', 'iid'"),
        (["--scheme", "dirichlet", "--clients", "3", "--alpha", "-1"], "alpha"),
        # a probe: --scheme domain --alpha was accepted and ignored
        (["--scheme", "domain", "--alpha", "0.1"], "--alpha applies to --scheme dirichlet only"),
        (["--scheme", "iid", "--clients", "3", "--alpha", "0.1"], "--quantity-skew sets unequal client sizes"),
        (["--scheme", "iid", "--clients", "3", "--fractions", "0.6,0.4"], "--fractions"),
        (["--scheme", "iid", "--clients", "200"], "--clients 200 is too many"),
        (["--scheme", "iid", "--clients", "56"], "fewer than 20 train records (--min-records)"),
    ],
)
def test_validation_errors_exit_2(store_file, tmp_path, extra, match):
    res = invoke("--store", store_file, *extra, "--out", tmp_path / "x.json", "--json")
    assert res.exit_code == 2
    obj = json.loads(res.stdout)
    assert obj["exit_code"] == 2 and match in obj["error"]
    assert not (tmp_path / "x.json").exists()


def test_corrupt_store_exits_4(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{trunc")
    res = invoke("--store", bad, "--scheme", "iid", "--clients", 2, "--out", tmp_path / "x.json", "--json")
    assert res.exit_code == 4 and "corrupt" in json.loads(res.stdout)["error"]


def test_subprocess_exit_code(store_file, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fedhype.cli.main", "partition", "--store", str(store_file), "--scheme", "iid",
         "--clients", "3", "--out", str(tmp_path / "s.json"), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    sizes = [(c["train"], c["val"], c["test"]) for c in json.loads(proc.stdout)["clients"]]
    assert sizes == [(359, 120, 120)] * 3  # 1,797 = 3 × 599, split 60/20/20 per client
    assert "wrote" in proc.stderr


def test_a_synthetic_store_is_refused(store_file, tmp_path):
    """A partition splits real records (as `fedhype site` and `fedhype train`): a synthetic store exits 2, writes nothing."""
    real = EmbeddingStore.load(store_file)
    syn = EmbeddingStore(real.embeddings, real.labels, real.domains, real.sample_ids, real.class_names,
                         real.domain_names, {"kind": "synthetic"}).save(tmp_path / "syn.safetensors")
    res = invoke("--store", syn, "--scheme", "iid", "--clients", 2, "--out", tmp_path / "p.json", "--json")
    assert res.exit_code == 4 and "'synthetic' store" in res.output and "fedhype embed" in res.output
    assert not (tmp_path / "p.json").exists()


def test_an_out_name_of_another_format_is_warned_about(store_file, tmp_path):
    """A probe's `synthesize --out x.npy` wrote a safetensors file named .npy without a word; the same rule holds for
    every --out file (partition's JSON here), and a right suffix gets no warning."""
    res = invoke("--store", store_file, "--scheme", "iid", "--clients", 2, "--out", tmp_path / "p.txt", "--json")
    assert res.exit_code == 0, res.output
    assert ("`fedhype partition` writes a json file whatever its name; name it *.json" in " ".join(res.stderr.split()))
    Partition.load(tmp_path / "p.txt")
    res = invoke("--store", store_file, "--scheme", "iid", "--clients", 2, "--out", tmp_path / "p.JSON", "--json")
    assert res.exit_code == 0 and "whatever its name" not in res.stderr
