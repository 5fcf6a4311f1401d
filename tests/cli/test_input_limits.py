"""Requests that cannot be met are refused up front with the CLI's own flag names (exit 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fedhype.cli import synthesize_cmd
from fedhype.cli.main import app

runner = CliRunner()


def _invoke(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r, (json.loads(r.stdout) if r.stdout.strip() else None)


@pytest.fixture(scope="module")
def run_dir(audit_run):
    return audit_run[0]


def test_synthesize_n_above_the_store_limit(run_dir, tmp_path):
    r, obj = _invoke("synthesize", "--run", run_dir, "--n", 10**12, "--out", tmp_path / "s.safetensors", "--json")
    assert r.exit_code == 2, r.output
    assert obj["error"].startswith("--n 1000000000000 asks for 1,000,000,000,000 synthetic embeddings; one store "
                                   "holds at most 5,000,000")
    r, obj = _invoke("synthesize", "--run", run_dir, "--per-class", 600_000, "--out", tmp_path / "s.safetensors",
                     "--json")  # 10 classes × 600,000
    assert r.exit_code == 2 and obj["error"].startswith("--per-class 600000 × 10 classes asks for 6,000,000")
    assert not (tmp_path / "s.safetensors").exists()


def test_synthesize_beyond_available_memory(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(synthesize_cmd, "available_memory", lambda: 1 << 20)  # 1 MiB
    r, obj = _invoke("synthesize", "--run", run_dir, "--n", 1000, "--out", tmp_path / "s.safetensors", "--json")
    assert r.exit_code == 2, r.output
    need = 1000 * (3 * 4 * 384 + 160) / 2**20  # 4.55 MiB: in MiB, not "0.0 GiB" (a probe)
    assert obj["error"] == (f"--n 1000 asks for 1,000 synthetic embeddings of dimension 384, which need about "
                            f"{need:.2f} MiB of memory; 1.00 MiB is available: draw fewer, or several stores with "
                            "different --seed")
    monkeypatch.setattr(synthesize_cmd, "available_memory", lambda: None)  # unknown: not refused
    r, obj = _invoke("synthesize", "--run", run_dir, "--n", 20, "--seed", 0, "--out", tmp_path / "s.safetensors",
                     "--json")
    assert r.exit_code == 0 and obj["n"] == 20


def test_synthesize_beyond_free_disk_space_names_the_folder(run_dir, tmp_path, monkeypatch):
    """A probe started a multi-GB store without a look at the disk; the release folder holds a second copy."""
    free = 1000 * (4 * 384 + 40) * 3 // 2  # room for one copy of 1,000 embeddings, not two
    monkeypatch.setattr(synthesize_cmd, "free_disk", lambda path: free)
    out = tmp_path / "s.safetensors"
    r, obj = _invoke("synthesize", "--run", run_dir, "--n", 1000, "--out", out, "--release", tmp_path / "rel", "--json")
    assert r.exit_code == 2, r.output
    need = 2 * 1000 * (4 * 384 + 40) / 2**20
    assert obj["error"].startswith(f"--n 1000: the store and its release copy need about {need:.2f} MiB on disk where "
                                   f"--out {out} goes; {free / 2**20:.2f} MiB is free there")
    assert str(out) in obj["error"] and not out.exists() and not (tmp_path / "rel").exists()
    r, obj = _invoke("synthesize", "--run", run_dir, "--n", 1000, "--seed", 0, "--out", out, "--json")  # one copy fits
    assert r.exit_code == 0 and obj["n"] == 1000
    assert synthesize_cmd.free_disk(tmp_path / "no" / "such" / "folder" / "s.safetensors") > 0  # nearest existing folder


def test_a_store_too_large_for_its_header_is_refused_before_writing(tmp_path, monkeypatch):
    import torch

    from fedhype.data import store as store_mod
    from fedhype.errors import ValidationError

    monkeypatch.setattr(store_mod, "MAX_HEADER_BYTES", 1_000_000 + 2_000)  # room for ~150 ids
    s = store_mod.EmbeddingStore(torch.zeros(300, 2), torch.zeros(300), torch.zeros(300), [f"syn/{i}" for i in range(300)],
                                 ["a"], ["d"])
    with pytest.raises(ValidationError, match=r"s.safetensors: 300 embeddings are too many for one store"):
        s.save(tmp_path / "s.safetensors")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.parametrize("args, message", [
    (["--n-canaries", "0"], "--n-canaries must be ≥ 1, got 0"),
    (["--n-canaries", "5"], "no guesses: --guess-in 0.1 and --guess-out 0 of --n-canaries 5 both round to 0"),
    (["--guess-in", "0.7", "--guess-out", "0.5"], "--guess-in + --guess-out = 1.2 exceeds 1"),
    (["--guess-in", "2"], "--guess-in must be a fraction in [0, 1], got 2.0"),
    (["--confidence", "1"], "--confidence must be in (0, 1), got 1"),
    (["--n-canaries", "100000000"], "--n-canaries 100000000: each white-box canary needs its own model coordinate"),
])
def test_canary_options_are_named_by_their_flags(run_dir, args, message):
    r, obj = _invoke("audit", "--run", run_dir, "--canaries", "white-box", *args, "--json")
    assert r.exit_code == 2, r.output
    assert message in obj["error"] and "n_canaries" not in obj["error"] and "guess_in" not in obj["error"]
    assert "white-box audit: client" not in r.output or args == ["--n-canaries", "100000000"]


def test_a_model_too_large_for_memory_is_refused_before_anything_is_charged(real_store, tmp_path, monkeypatch):
    """A probe's ``train --hidden 20000`` charged the release and was then killed by the out-of-memory killer (the
    folder held a charged run no resume could finish); the parameters, counted on the meta device, times
    TRAIN_BYTES_PER_PARAMETER are now checked against the available memory first."""
    import fedhype.resources
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.run_plan import TRAIN_BYTES_PER_PARAMETER, training_memory

    real_store.save(tmp_path / "s.safetensors")
    make_partition(real_store, scheme="iid", n_clients=2, seed=0).save(tmp_path / "p.json")
    mcfg = TrainConfig(model={"hidden": 64, "latent": 8}).model_config(real_store.dim, real_store.n_classes)
    n, need = training_memory(mcfg, "fedhypevae", 2)
    assert 10_000 < n < 10_000_000 and need == n * TRAIN_BYTES_PER_PARAMETER
    n_local, need_local = training_memory(mcfg, "local-cvae", 2)  # one model per client, one of them training
    assert n_local == 2 * training_memory(mcfg, "local-cvae", 1)[0] and need_local < n_local * TRAIN_BYTES_PER_PARAMETER
    monkeypatch.setattr(fedhype.resources, "available_memory", lambda: n * TRAIN_BYTES_PER_PARAMETER - 1)  # one byte short
    args = ("train", "--store", tmp_path / "s.safetensors", "--partition", tmp_path / "p.json", "--epsilon", 4,
            "--rounds", 1, "--hidden", 64, "--latent", 8, "--seed", 0, "--json")
    r, obj = _invoke(*args, "--out", tmp_path / "run")
    assert r.exit_code == 2 and f"has {n:,} parameters" in obj["error"] and "nothing was written or charged" in obj["error"]
    assert obj["error"].startswith("the model has ")  # --hidden 64 is below the default: no width to blame
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(fedhype.resources, "available_memory", lambda: n * TRAIN_BYTES_PER_PARAMETER)  # it fits
    r, obj = _invoke(*args, "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    # the refusal leads with the width that made the model large, where one did (it listed every width)
    from fedhype.errors import ValidationError
    from fedhype.federated.run_plan import check_model_memory

    wide = TrainConfig(model={"hidden": 2000, "latent": 8}).model_config(real_store.dim, real_store.n_classes)
    at_default = training_memory(TrainConfig(model={"latent": 8}).model_config(real_store.dim, real_store.n_classes),
                                 "fedhypevae", 2)[0]
    monkeypatch.setattr(fedhype.resources, "available_memory", lambda: at_default * TRAIN_BYTES_PER_PARAMETER)
    with pytest.raises(ValidationError) as err:
        check_model_memory(wide, "fedhypevae", 2)
    assert str(err.value).startswith(f"model.hidden = 2000 makes the model this large (at its default, 128, it would "
                                     f"have {at_default:,} parameters): the model has ")


def test_a_client_without_training_records_is_not_told_to_lower_the_minimum_to_0():
    """A probe read "lower --min-records (to 0 or less)" for a client with no training records."""
    from fedhype.cli.train_cmd import explain_min_records
    from fedhype.errors import MinRecordsError

    def told(n):
        exc = MinRecordsError("x", stage="train", minimum=8, clients=[("c", n, 10)])
        return str(explain_min_records(exc, records="--min-records", partition="`fedhype partition` again"))

    assert "it has none, so re-partition" in told(0) and "to 0 or less" not in told(0)
    assert "lower --min-records (to 3 or less)" in told(3)


def test_a_disk_too_small_for_the_run_is_refused_before_anything_is_charged(real_store, tmp_path, monkeypatch):
    """A probe filled the disk: "No space left on device" came after the release's write-ahead charge and before its
    outputs were saved, so the resume released — and paid — again. What a run writes (run_plan.run_disk: checkpoints,
    clients' states, the release's outputs) is now checked against the free space of --out's disk first; the
    estimate holds what a real run wrote, with the next round's checkpoint beside the last."""
    import fedhype.resources
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.run_plan import DISK_MARGIN, run_disk

    real_store.save(tmp_path / "s.safetensors")
    make_partition(real_store, scheme="iid", n_clients=2, seed=0).save(tmp_path / "p.json")
    mcfg = TrainConfig().model_config(real_store.dim, real_store.n_classes)  # the job's model
    need = run_disk(mcfg, "fedhypevae", 2, True)
    monkeypatch.setattr(fedhype.resources, "free_disk", lambda path: need - 1)  # one byte short
    args = ("train", "--store", tmp_path / "s.safetensors", "--partition", tmp_path / "p.json", "--epsilon", 4,
            "--rounds", 2, "--seed", 0, "--json")
    r, obj = _invoke(*args, "--out", tmp_path / "run")
    assert r.exit_code == 2, r.output
    assert "free space there or give an --out on another disk; nothing was written or charged" in obj["error"]
    assert not (tmp_path / "run" / "ledger.json").exists()
    monkeypatch.setattr(fedhype.resources, "free_disk", lambda path: need)  # it fits
    r, obj = _invoke(*args, "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    written = sum(p.stat().st_size for p in (tmp_path / "run").rglob("*") if p.is_file())
    server = max(p.stat().st_size for p in (tmp_path / "run" / "ckpt").glob("server-r*.safetensors"))
    assert written + server <= need - DISK_MARGIN  # the peak: the next round's checkpoint written beside the last
    assert need - DISK_MARGIN < 4 * (written + server)  # and not far above it
    assert fedhype.resources.free_disk(tmp_path / "not" / "made" / "yet") is not None  # measured where it will be made


def test_a_run_whose_epsilon_protects_nothing_says_so(real_store, tmp_path):
    """A probe's `train --noise-multiplier 0.001` reported ε = 5.5e5 with "private True" and no word more; the
    summary now warns above MEANINGLESS_EPSILON (and says nothing at a usual ε)."""
    from fedhype.cli.train_cmd import MEANINGLESS_EPSILON
    from fedhype.data.partition import make_partition

    real_store.save(tmp_path / "s.safetensors")
    make_partition(real_store, scheme="iid", n_clients=2, seed=0).save(tmp_path / "p.json")
    base = ("train", "--store", tmp_path / "s.safetensors", "--partition", tmp_path / "p.json", "--rounds", 1,
            "--hidden", 32, "--latent", 8, "--seed", 0)
    r = runner.invoke(app, [str(a) for a in (*base, "--noise-multiplier", 0.01, "--out", tmp_path / "weak")])
    assert r.exit_code == 0, r.output
    assert "protects no record" in r.output and "raise --noise-multiplier or give --epsilon" in r.output
    from fedhype.privacy.ledger import PrivacyLedger

    assert PrivacyLedger.load(tmp_path / "weak" / "ledger.json").worst()[1] > MEANINGLESS_EPSILON  # the run's own ε
    r = runner.invoke(app, [str(a) for a in (*base, "--epsilon", 4, "--out", tmp_path / "fine")])
    assert r.exit_code == 0 and "protects no record" not in r.output
