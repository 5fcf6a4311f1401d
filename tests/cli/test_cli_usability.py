"""Findings of a fresh-user test of the CLI: parser errors under --json, missing inputs, messages,
defaults and progress lines. Real optdigits pixels (sklearn ``load_digits``) stand in for embeddings."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import typer
from sklearn.datasets import load_digits
from typer.testing import CliRunner

from fedhype.cli.common import LineProgress
from fedhype.cli.main import app
from fedhype.data.partition import make_partition
from fedhype.data.store import EmbeddingStore

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _one_json(result) -> dict:
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def _digits_store(domains: np.ndarray, names: list[str]) -> EmbeddingStore:
    d = load_digits()
    return EmbeddingStore(torch.tensor(d.data, dtype=torch.float32), torch.tensor(d.target), torch.tensor(domains),
                          [f"optdigits/{i:05d}" for i in range(len(d.target))], [str(c) for c in range(10)], names)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """digits store (two halves as domains), a skewed one (a 25-record domain), their domain partition."""
    root = tmp_path_factory.mktemp("usability")
    n = len(load_digits().target)
    store = _digits_store((np.arange(n) >= n // 2).astype(int), ["first-half", "second-half"])
    store.save(root / "digits.safetensors")
    skew = np.zeros(n, dtype=int)
    skew[:25] = 1
    _digits_store(skew, ["big", "tiny"]).save(root / "skew.safetensors")
    make_partition(store, scheme="domain").save(root / "part.json")
    (root / "empty").mkdir()
    (root / "corrupt.json").write_text("{not json")
    return root


# ----------------------------------------------------------------------------- 1: parser errors under --json
@pytest.mark.parametrize("argv, needle", [
    (["train", "--bogus", "--json"], "No such option"),
    (["train", "--json"], "Missing option '--out'"),
    (["synthesize", "--per-class", "abc", "--run", "r", "--out", "o", "--json"], "Invalid value for '--per-class'"),
    (["--json", "--bogus"], "No such option"),
    (["prototypes", "train", "--json", "--epochs", "many"], "Invalid value for '--epochs'"),
    (["budget", "--delta", "x", "--json"], "Invalid value for '--delta'"),
])
def test_parser_errors_print_one_json_object(argv, needle):
    r = _invoke(*argv)
    assert r.exit_code == 2, r.output
    obj = _one_json(r)
    assert set(obj) == {"error", "kind", "exit_code"} and obj["kind"] == "usage" and obj["exit_code"] == 2
    assert needle in obj["error"] and "--help" in obj["error"]


def test_parser_errors_without_json_keep_typers_message():
    r = _invoke("train", "--bogus")
    assert r.exit_code == 2 and "No such option" in r.output and "{" not in r.stdout


def test_console_script_entry_point_prints_json_usage_error():
    p = subprocess.run([sys.executable, "-m", "fedhype.cli.main", "partition", "--scheme", "iid", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    obj = json.loads(p.stdout)
    assert obj["kind"] == "usage" and "--store" in obj["error"] and "error" in p.stderr


def test_run_command_errors_carry_a_kind(files, tmp_path):
    r = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "nope", "--out", tmp_path / "p.json",
                "--json")
    assert r.exit_code == 2 and _one_json(r)["kind"] == "usage"
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{trunc")
    r = _invoke("partition", "--store", bad, "--scheme", "iid", "--clients", 2, "--out", tmp_path / "p.json", "--json")
    assert r.exit_code == 4 and _one_json(r)["kind"] == "artifact"


# ----------------------------------------------------------------------------- 2: --json everywhere
def test_every_command_and_group_accepts_json():
    def walk(cmd, path):
        yield path, cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, f"{path} {name}")

    seen = []
    for path, cmd in walk(typer.main.get_command(app), "fedhype"):
        if path == "fedhype":
            continue
        seen.append(path)
        assert any("--json" in p.opts for p in cmd.params), f"{path} has no --json"
    assert {"fedhype prototypes", "fedhype prototypes train", "fedhype prototypes evaluate"} <= set(seen)


def test_prototypes_group_json(files, tmp_path):
    r = _invoke("prototypes", "--json")
    assert r.exit_code == 2 and "give a subcommand" in _one_json(r)["error"]
    # --json before the subcommand applies to it
    r = _invoke("prototypes", "--json", "train", "--data", files / "digits.safetensors", "--epochs", 1,
                "--out", tmp_path / "proto")
    assert r.exit_code == 0, r.output
    assert _one_json(r)["n_train"] == 1797


# ----------------------------------------------------------------------------- 3: missing inputs exit 2
MISSING = "/nonexistent/fedhype-missing.safetensors"


@pytest.mark.parametrize("argv, option", [
    (["partition", "--store", MISSING, "--scheme", "iid", "--clients", "2", "--out", "{tmp}/p.json"], "--store"),
    (["train", "--store", MISSING, "--partition", "{part}", "--out", "{tmp}/run"], "--store"),
    (["train", "--store", "{store}", "--partition", MISSING, "--out", "{tmp}/run"], "--partition"),
    (["synthesize", "--run", MISSING, "--out", "{tmp}/s.safetensors"], "--run"),
    (["evaluate", "--store", MISSING, "--synthetic", "{store}"], "--store"),
    (["evaluate", "--store", "{store}", "--synthetic", MISSING], "--synthetic"),
    (["evaluate", "--store", "{store}", "--synthetic", "{store}", "--real-train", MISSING], "--real-train"),
    (["evaluate", "--store", "{store}", "--synthetic", "{store}", "--partition", MISSING], "--partition"),
    (["budget", "--noise-multiplier", "1", "--delta", "1e-5", "--rounds", "2", "--local-steps", "1", "--batch-size",
      "8", "--partition", MISSING], "--partition"),
    (["audit", "--run", MISSING], "--run"),
    (["audit", "--run", "{tmp}", "--synthetic", MISSING], "--synthetic"),
    (["audit", "--canaries", "white-box", "--store", MISSING], "--store"),
    (["audit", "--run", "{tmp}", "--mia", "--store", "{store}", "--partition", MISSING], "--partition"),
    (["prototypes", "train", "--data", MISSING, "--out", "{tmp}/m"], "--data"),
    (["prototypes", "train", "--data", "{store}", "--partition", MISSING, "--out", "{tmp}/m"], "--partition"),
    (["prototypes", "train", "--data", "{store}", "--store", MISSING, "--out", "{tmp}/m"], "--store"),
    (["prototypes", "train", "--data", "{store}", "--ledger", MISSING, "--out", "{tmp}/m"], "--ledger"),
    (["prototypes", "evaluate", "--model", MISSING, "--store", "{store}"], "--model"),
    (["prototypes", "evaluate", "--model", "{tmp}", "--store", MISSING], "--store"),
    (["prototypes", "dp-linear", "--store", MISSING, "--partition", "{part}"], "--store"),
    (["prototypes", "dp-linear", "--store", "{store}", "--partition", MISSING], "--partition"),
    (["embed", "--images", MISSING, "--out", "{tmp}/e.safetensors"], "--images"),
    (["embed", "--dataset", "digits-domains", "--weights", MISSING, "--out", "{tmp}/e.safetensors"], "--weights"),
    (["run", "--config", MISSING, "--out", "{tmp}/job"], "--config"),
])
def test_missing_input_file_is_a_usage_error(files, tmp_path, argv, option):
    fill = {"{tmp}": str(tmp_path), "{store}": str(files / "digits.safetensors"), "{part}": str(files / "part.json")}
    args = [next((a.replace(k, v) for k, v in fill.items() if k in a), a) for a in argv]
    r = _invoke(*args, "--json")
    assert r.exit_code == 2, r.output
    err = _one_json(r)["error"]
    assert f"'{option}'" in err and MISSING in err and ("no such file" in err or "no such folder" in err)


def test_wrong_kind_of_path_and_corrupt_files(files, tmp_path):
    # a folder where a file is expected is a usage error too …
    r = _invoke("partition", "--store", files, "--scheme", "iid", "--clients", 2, "--out", tmp_path / "p.json", "--json")
    assert r.exit_code == 2 and "is a folder, not a file" in _one_json(r)["error"]
    # … and a folder that is not a run
    r = _invoke("synthesize", "--run", files / "empty", "--out", tmp_path / "s.safetensors", "--json")
    assert r.exit_code == 2 and "holds no model.safetensors" in _one_json(r)["error"]
    r = _invoke("audit", "--run", files / "empty", "--json")
    assert r.exit_code == 2 and "is not a run directory" in _one_json(r)["error"]
    r = _invoke("prototypes", "evaluate", "--model", files / "empty", "--store", files / "digits.safetensors", "--json")
    assert r.exit_code == 2 and "not a `fedhype prototypes train` model directory" in _one_json(r)["error"]
    # a file that exists but is corrupt stays an artifact error
    r = _invoke("budget", "--noise-multiplier", 1, "--delta", 1e-5, "--rounds", 2, "--local-steps", 1, "--batch-size",
                8, "--partition", files / "corrupt.json", "--json")
    assert r.exit_code == 4 and _one_json(r)["kind"] == "artifact"
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "corrupt.json",
                "--out", tmp_path / "run", "--json")
    assert r.exit_code == 4
    # a synthetic store where the real one is expected is named as such (not as another store's partition)
    syn = EmbeddingStore.load(files / "digits.safetensors")
    syn.meta["kind"] = "synthetic"
    syn.save(tmp_path / "syn.safetensors")
    r = _invoke("train", "--store", tmp_path / "syn.safetensors", "--partition", files / "part.json",
                "--out", tmp_path / "run", "--json")
    assert r.exit_code == 4 and "is a 'synthetic' store" in _one_json(r)["error"] and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- 4: synthesize / budget values
@pytest.mark.parametrize("args, needles", [
    (["--n", "0"], ["--n must be ≥ 1", "--per-class N"]),
    (["--per-class", "0"], ["--per-class must be ≥ 1", "--n N"]),
    (["--per-class", "abc"], ["'--per-class'", "must be auto or an integer ≥ 1"]),
    (["--per-class", "2.5"], ["'--per-class'", "must be auto or an integer ≥ 1"]),
    (["--n", "10", "--per-class", "5"], ["not both"]),
    (["--temperature", "-1"], ["--temperature must be > 0", "--temperature 1"]),
    (["--temperature", "0"], ["--temperature must be > 0"]),
    (["--temperature", "nan"], ["--temperature must be > 0"]),
    (["--temperature", "1e20"], ["--temperature must be > 0 and ≤ 100"]),  # a probe: all-zero vectors, exit 0
    (["--per-class", "5", "--label-weights", "1,1,1"], ["--label-weights splits a total --n"]),  # were ignored
])
def test_synthesize_counts_and_temperature_are_checked_first(files, tmp_path, args, needles):
    # checked before the model is read: --run is a folder without a model
    r = _invoke("synthesize", "--run", files / "empty", "--out", tmp_path / "s.safetensors", *args, "--json")
    assert r.exit_code == 2, r.output
    err = _one_json(r)["error"]
    assert all(n in err for n in needles), err
    assert not (tmp_path / "s.safetensors").exists()


def test_budget_zero_noise_is_infinite_epsilon():
    base = ["budget", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"]
    r = _invoke(*base, "--noise-multiplier", 0, "--json")
    assert r.exit_code == 0, r.output
    out = _one_json(r)
    assert out["epsilon"] is None and out["epsilon_infinite"] is True and "∞" in out["note"]
    assert "no differential-privacy guarantee" in out["note"]
    human = _invoke(*base, "--noise-multiplier", 0)
    assert human.exit_code == 0 and "∞" in human.stdout and "inf" not in human.stdout
    assert out["warnings"] == [] and "would not fit in memory" not in human.output  # σ = 0 is the reason, not PRV's grid
    finite = _one_json(_invoke(*base, "--noise-multiplier", 1, "--json"))
    assert finite["epsilon_infinite"] is False and finite["epsilon"] > 0 and "note" not in finite
    plan = _one_json(_invoke("budget", "--noise-multiplier", 0, "--delta", 1e-5, "--rounds", 2, "--local-steps", 1,
                             "--batch-size", 10, "--client-sizes", "100,200", "--json"))
    assert plan["epsilon_infinite"] is True and all(c["epsilon_infinite"] for c in plan["clients"])
    assert "--noise-multiplier" in _invoke("budget", "--help").stdout and "epsilon_infinite" in _invoke(
        "budget", "--help").stdout.replace("\n", "").replace("│", "").replace(" ", "")


# ----------------------------------------------------------------------------- 5, 6: partition refusals
def test_far_too_many_clients_is_short_and_says_what_to_do(files, tmp_path):
    for scheme in ("iid", "dirichlet"):
        r = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", scheme, "--clients", 10000,
                    "--out", tmp_path / "p.json", "--json")
        assert r.exit_code == 2
        err = _one_json(r)["error"]
        assert len(err) < 400, err
        # 1,797 records × 0.6 = 1,078 train records: at most 53 clients of ≥ 20
        assert "--clients 10000 is too many for 1797 records" in err
        if scheme == "iid":
            assert "use --clients 53 or fewer" in err
            continue
        # under label skew fewer fit: the count said is one that does (a probe followed "18 or fewer" into a refusal)
        import re

        k = int(re.search(r"use --clients (\d+) \(the most that fit with these settings and --seed\)", err).group(1))
        assert k <= 53
        r = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", scheme, "--clients", k,
                    "--out", tmp_path / "p.json", "--json")
        assert r.exit_code == 0, r.output


def test_clients_below_min_train_are_capped_in_the_message(files, tmp_path):
    r = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "dirichlet", "--clients", 50,
                "--alpha", 0.01, "--out", tmp_path / "p.json", "--json")
    assert r.exit_code == 2
    err = _one_json(r)["error"]
    assert err.count(" train / ") == 5 and " more;" in err and "(--min-records)" in err
    assert "a larger --alpha" in err and "lower --min-records" in err and len(err) < 500
    # the count advised fits: a probe's "use --clients ≤ 28" (the records' total) failed again at 28 under the skew
    import re

    k = int(re.search(r"use --clients (\d+) \(the most that fit with these settings and --seed\)", err).group(1))
    r = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "dirichlet", "--clients", k,
                "--alpha", 0.01, "--out", tmp_path / "p.json", "--json")
    assert r.exit_code == 0 and len(_one_json(r)["clients"]) == k, r.output
    r = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "iid", "--clients", 56,
                "--out", tmp_path / "p2.json", "--json")
    err = _one_json(r)["error"]
    assert r.exit_code == 2 and "use --clients 53 (the most that fit" in err and "--quantity-skew" in err


def test_domain_scheme_advice_fits_the_scheme(files, tmp_path):
    r = _invoke("partition", "--store", files / "skew.safetensors", "--scheme", "domain", "--out", tmp_path / "p.json",
                "--json")
    assert r.exit_code == 2
    err = _one_json(r)["error"]
    assert "1 of 2 domains are too small to be clients: tiny (15 train / 25 records)" in err
    assert "--scheme iid or dirichlet" in err and "lower --min-records" in err and "fewer --clients" not in err
    r = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "domain", "--clients", 40,
                "--min-records", 27, "--out", tmp_path / "p.json", "--json")
    err = _one_json(r)["error"]
    assert r.exit_code == 2 and "at least 2: one per domain" in err and "--alpha" not in err


# ----------------------------------------------------------------------------- 7: the two minimums
def test_train_min_records_names_its_option_and_both_remedies(files, tmp_path):
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json",
                "--out", tmp_path / "run", "--min-records", 1000, "--no-dp", "--rounds", 1, "--json")
    assert r.exit_code == 2, r.output
    err = _one_json(r)["error"]
    assert "fewer than --min-records 1000" in err and "lower --min-records" in err
    assert "`fedhype partition --min-records 1000`" in err and "min_records=" not in err


def test_train_warns_when_delta_is_not_well_below_1_over_n(files, tmp_path):
    """As `fedhype budget`: δ < 1/n passes, n·δ > 0.1 is warned about (a new user's probe: train said nothing)."""
    part = json.loads((files / "part.json").read_text())
    n_max = max(len(c["train"]) for c in part["clients"])
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json",
                "--out", tmp_path / "run", "--min-records", 100000, "--delta", 0.5 / n_max, "--rounds", 1, "--json")
    assert r.exit_code == 2 and "n·delta reaches 0.5" in r.stderr, r.stderr  # printed before the run's own refusal
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json",
                "--out", tmp_path / "run", "--min-records", 100000, "--delta", 0.05 / n_max, "--rounds", 1, "--json")
    assert r.exit_code == 2 and "n·delta" not in r.stderr and "q = 1" not in r.stderr
    # and a batch of all of a client's records (q = 1), as `budget` says (a probe: train said nothing)
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json",
                "--out", tmp_path / "run", "--min-records", 100000, "--batch-size", n_max, "--rounds", 1, "--json")
    assert r.exit_code == 2 and f"--batch-size {n_max} is at least the training-set size of" in r.stderr, r.stderr


# ----------------------------------------------------------------------------- 8: embed checks cheap options first
@pytest.mark.parametrize("args, needle", [
    (["--encoder", "resnet-9000"], "unknown encoder 'resnet-9000'"),
    (["--image-size", "0"], "--image-size must be a positive number"),
    (["--pooling", "max"], "'max' is not one of 'cls', 'mean'"),
    (["--batch-size", "0"], "--batch-size must be ≥ 1"),
    (["--workers", "-1"], "--workers must be ≥ 0"),
    (["--dtype", "float8"], "'float8' is not one of 'auto'"),
    (["--limit", "0"], "--limit must be ≥ 1"),
])
def test_embed_validates_options_before_scanning(files, tmp_path, monkeypatch, args, needle):
    import fedhype.data.images as images

    scanned = []
    monkeypatch.setattr(images, "scan_image_folder", lambda *a, **k: scanned.append(a) or pytest.fail("scanned"))
    r = _invoke("embed", "--images", files / "empty", *args, "--device", "cpu", "--out", tmp_path / "e.safetensors",
                "--json")
    assert r.exit_code == 2, r.output
    assert needle in _one_json(r)["error"] and scanned == []


# ----------------------------------------------------------------------------- 9: progress lines without a TTY
def test_line_progress_prints_periodic_plain_lines(capsys):
    now = [0.0]
    lp = LineProgress("embed: enc", 100, "img", every_s=10, clock=lambda: now[0])
    for _ in range(9):
        now[0] += 3
        lp.update(10)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["embed: enc: 40/100 (40%)  3.3 img/s  12 s", "embed: enc: 80/100 (80%)  3.3 img/s  24 s"]
    now[0] += 1
    lp.update(10)
    assert capsys.readouterr().err.strip() == "embed: enc: 100/100 (100%)  3.6 img/s  28 s"


def test_embed_and_train_print_progress_lines_to_a_non_tty_stderr(files, tmp_path, tiny_dinov2_dir, monkeypatch):
    monkeypatch.setenv("FEDHYPE_CACHE", str(tmp_path / "cache"))  # image folders are cached: not in ~/.cache
    root = tmp_path / "imgs"
    d = load_digits()
    for c in ("0", "1"):
        (root / c).mkdir(parents=True)
        for i in np.flatnonzero(d.target == int(c))[:3]:
            from PIL import Image

            Image.fromarray(np.kron(d.images[i] * 15, np.ones((4, 4))).astype(np.uint8), "L").save(root / c / f"{i}.png")
    r = _invoke("embed", "--images", root, "--encoder", f"hf:{tiny_dinov2_dir}", "--image-size", 28, "--device", "cpu",
                "--workers", 0, "--batch-size", 4, "--out", tmp_path / "e.safetensors", "--json")
    assert r.exit_code == 0, r.output
    assert "6/6 (100%)" in r.stderr and "img/s" in r.stderr and "━" not in r.stderr
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json",
                "--out", tmp_path / "run", "--rounds", 2, "--local-steps", 1, "--batch-size", 32, "--noise-multiplier", 1,
                "--hidden", 16, "--latent", 4, "--seed", 0, "--json")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("train: ")]
    assert lines[0].startswith("train: 2 rounds over 2 clients (fedhypevae, σ = 1")
    assert [ln.split("  ")[0] for ln in lines[1:]] == ["train: round 1/2", "train: round 2/2"]
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json",
                "--out", tmp_path / "run-g", "--method", "dp-gaussian", "--noise-multiplier", 1, "--seed", 0, "--json")
    assert r.exit_code == 0, r.output  # it said "train: 8 rounds over …" and ran none (a probe)
    assert "train: the statistics release alone (no DP-SGD round) over 2 clients (dp-gaussian" in r.stderr


# ----------------------------------------------------------------------------- 10: train defaults = run defaults
def test_train_defaults_are_the_jobs(files, tmp_path, monkeypatch):
    import fedhype.federated.engine as engine
    from fedhype.pipeline.config import DEFAULTS, resolve, train_config

    seen = {}

    def fake_train(store, part, cfg, out, **kw):
        seen["cfg"] = cfg
        return {"run_dir": str(out), "epsilon": 1.0, "delta": cfg.delta, "noise_multiplier": 1.0, "rounds": cfg.rounds,
                "private": True, "noise_seeded": False, "clients": ["0", "1"], "traffic": {"upload_bytes_per_round": 0}}

    monkeypatch.setattr(engine, "train", fake_train)
    base = ["train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--out", tmp_path / "r"]
    assert _invoke(*base, "--json").exit_code == 0
    assert seen["cfg"].to_dict() == train_config(resolve()).to_dict()
    assert _invoke(*base, "--hidden", 7, "--latent", 3, "--json").exit_code == 0
    assert seen["cfg"].model == {**DEFAULTS["model"], "hidden": 7, "latent": 3}
    r = _invoke(*base, "--hidden", 0, "--json")
    assert r.exit_code == 2 and "model.hidden" in _one_json(r)["error"]
    text = " ".join(runner.invoke(app, ["train", "--help"], env={"COLUMNS": "250"}).stdout.split())
    assert "`fedhype run`'s" in text
    for flag, value in (("--rounds", DEFAULTS["train"]["rounds"]), ("--batch-size", DEFAULTS["train"]["batch_size"]),
                        ("--hidden", DEFAULTS["model"]["hidden"]), ("--latent", DEFAULTS["model"]["latent"])):
        assert f"[default: {value}]" in text.split(flag, 1)[1].split(" --", 1)[0], flag


# ----------------------------------------------------------------------------- third fresh-user round
def test_a_device_file_is_named_as_such_not_as_missing(files, tmp_path):
    r = _invoke("budget", "--epsilon", 1, "--delta", 1e-5, "--rounds", 2, "--local-steps", 1, "--batch-size", 8,
                "--partition", "/dev/null", "--json")
    assert r.exit_code == 2, r.output
    err = _one_json(r)["error"]
    assert "/dev/null is not a regular file" in err and "no such" not in err
    from fedhype.errors import ArtifactError
    from fedhype.io import read_json

    with pytest.raises(ArtifactError, match="is not a regular file"):
        read_json("/dev/null", "partition file")
    with pytest.raises(ArtifactError, match="is a folder; give the file itself"):
        read_json(files, "partition file")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_budget_target_epsilon_is_named_by_its_flag(value):
    r = _invoke("budget", "--epsilon", value, "--delta", 1e-5, "--sample-rate", 0.01, "--steps", 10, "--json")
    assert r.exit_code == 2, r.output
    assert _one_json(r)["error"].startswith("--epsilon must be a finite number > 0")
    assert "δ, in (0, 1)" in _invoke("budget", "--help").output


def test_train_resume_above_the_target_says_so(files, tmp_path, monkeypatch):
    from fedhype.federated import client as client_mod

    orig, calls = client_mod.Client.run_round, {"n": 0}

    def crash(self, *a, **k):  # dies in round 1: the write-ahead ledger has already charged it
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return orig(self, *a, **k)

    args = ["train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--out",
            tmp_path / "run", "--epsilon", 2, "--delta", 1e-5, "--rounds", 2, "--hidden", 16, "--latent", 4]
    monkeypatch.setattr(client_mod.Client, "run_round", crash)
    r = _invoke(*args, "--json")
    assert r.exit_code != 0 and calls["n"] == 3
    monkeypatch.setattr(client_mod.Client, "run_round", orig)
    r = _invoke(*args, "--resume", "--json")
    assert r.exit_code == 0, r.output
    res = _one_json(r)
    assert res["target_epsilon"] == 2 and res["above_target"] is True and res["epsilon"] > 2
    assert "is above the target ε = 2" in " ".join(r.stderr.split())  # with --json too, on stderr (a user's probe)
    r = _invoke(*args, "--resume")  # nothing left to train: the table and the warning again
    assert r.exit_code == 0, r.output
    assert "is above the target ε = 2" in " ".join(r.output.split())


def test_an_output_path_that_is_a_folder_is_a_usage_error(files, tmp_path):
    (tmp_path / "adir").mkdir()
    r = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "domain", "--out", tmp_path / "adir",
                "--json")
    assert r.exit_code == 2, r.output
    assert "adir is a folder; give a file name such as" in _one_json(r)["error"]  # checked before any work
    assert list((tmp_path / "adir").iterdir()) == [] and not list(tmp_path.glob(".adir.*"))  # nothing half-written


def test_above_target_is_the_accountants_figure_past_the_target():
    from fedhype.pipeline.report import above_target

    assert above_target(1.059, 1.0) and not above_target(0.9997, 1.0) and not above_target(1.0 + 1e-12, 1.0)
    assert not above_target(None, 1.0) and not above_target(5.0, None)  # no DP / σ given directly: no target


def test_no_dp_with_a_privacy_target_is_refused_not_ignored(files, tmp_path):
    base = ["train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--out",
            tmp_path / "run", "--no-dp", "--rounds", 1, "--json"]
    for flag, value in (("--epsilon", 3), ("--noise-multiplier", 1.0), ("--max-epsilon", 2)):
        r = _invoke(*base, flag, value)
        assert r.exit_code == 2, r.output
        assert _one_json(r)["error"] == f"{flag} asks for privacy but --no-dp turns it off; drop one of the two"
    assert not (tmp_path / "run").exists()
    from fedhype.errors import ValidationError
    from fedhype.pipeline.config import resolve

    with pytest.raises(ValidationError, match=r"--set train.epsilon=4: train.epsilon asks for privacy but train.no_dp"):
        resolve(None, ["train.epsilon=4", "train.no_dp=true"])
    assert resolve(None, ["train.no_dp=true"])["train"]["epsilon"] is None  # the default ε alone is not a request


def test_a_refused_train_leaves_no_folder_behind(files, tmp_path):
    args = ["train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--out",
            tmp_path / "run", "--epsilon", 1, "--rounds", 1, "--hidden", 16, "--latent", 4, "--json"]
    r = _invoke(*args, "--delta", 0.5)  # δ ≥ 1/n: refused before anything is written
    assert r.exit_code == 2 and "is not below 1/n" in _one_json(r)["error"]
    assert not (tmp_path / "run").exists()
    (tmp_path / "kept").mkdir()  # a folder the user made is left where it was
    r = _invoke(*[a if a != tmp_path / "run" else tmp_path / "kept" for a in args], "--delta", 0.5)
    assert r.exit_code == 2 and (tmp_path / "kept").is_dir()


def test_ctrl_c_exits_130(files, tmp_path, monkeypatch):
    from fedhype.federated import client as client_mod

    def interrupt(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(client_mod.Client, "run_round", interrupt)
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--out",
                tmp_path / "run", "--epsilon", 2, "--delta", 1e-5, "--rounds", 1, "--hidden", 16, "--latent", 4, "--json")
    assert r.exit_code == 130
    got = _one_json(r)
    assert got["kind"] == "interrupted" and "last completed round" in got["error"]  # training: how to resume
    import fedhype.encoders

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(fedhype.encoders, "create_encoder", stop)  # any other command: no talk of rounds or the ledger
    r = _invoke("embed", "--dataset", "digits-domains", "--out", tmp_path / "e.safetensors", "--json")
    got = _one_json(r)
    assert r.exit_code == 130 and got["kind"] == "interrupted", r.output
    assert "start it again" in got["error"] and "round" not in got["error"] and "ledger" not in got["error"]


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                                "message: \"No space left on device\" })")])
def test_a_full_disk_says_so_and_how_to_resume(files, tmp_path, monkeypatch, error):
    """A probe's train on a full disk ended with "internal error: SafetensorError … No space left on device", with
    ε already in the ledger and no word on resuming."""
    from fedhype.federated import client as client_mod

    def full(self, *a, **k):
        raise error

    monkeypatch.setattr(client_mod.Client, "run_round", full)
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--out",
                tmp_path / "run", "--epsilon", 2, "--delta", 1e-5, "--rounds", 1, "--hidden", 16, "--latent", 4, "--json")
    got = _one_json(r)
    assert r.exit_code == 1 and got["error"].startswith("no space left on device"), r.output
    assert "resumes from its last completed round" in got["error"] and "internal error" not in got["error"]


def test_train_set_takes_the_model_settings_without_a_flag(files, tmp_path):
    """A probe found no way to set model.client_shrinkage from `fedhype train`; --set model.key=value takes the job's
    [model] keys with the job's checks, and refuses other sections, unknown keys and a key its flag also sets."""
    args = ("train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--epsilon", 4,
            "--rounds", 1, "--hidden", 16, "--latent", 4, "--seed", 0, "--json")
    r = _invoke(*args, "--out", tmp_path / "run", "--set", "model.client_shrinkage=client-cov",
                "--set", "model.located_share=0.8")
    assert r.exit_code == 0, r.output
    notes = json.loads((tmp_path / "run" / "release.json").read_text())
    assert notes["client_shrinkage"] == "client-cov" and notes["located_share"] == 0.8
    for extra, says in ((["--set", "train.rounds=2"], "takes model.key=value"),
                        # the user's text quoted back as typed, the flag named (a probe read "--set '--seed
                        # (train.seed)=7': … the  settings have flags": brackets eaten as console markup)
                        (["--set", "train.seed=7"], "--set 'train.seed=7': `fedhype train --set` takes model.key=value "
                                                    "(e.g. model.client_shrinkage=client-cov); --seed (train.seed) is "
                                                    "set with its flag"),
                        (["--set", "model.bogus=1"], "unknown key model.bogus"),
                        (["--set", "model.hidden=32"], "set the same thing"),
                        (["--set", "model.client_shrinkage=bogus"], "model.client_shrinkage must be one of"),
                        # a typo was told "train.epsilonn is set with its flag" (a probe)
                        (["--set", "train.epsilonn=3"], "there is no setting train.epsilonn")):
        r = _invoke(*args, "--out", tmp_path / "bad", *extra)
        assert r.exit_code == 2 and says in _one_json(r)["error"], (extra, r.output)
        assert not (tmp_path / "bad").exists()
    # without --hidden, --set model.hidden is the setting, checked as such (a probe was told that the flag, which it
    # had not given, set the same thing)
    no_flag = [a for a in args if a not in ("--hidden", 16)]
    r = _invoke(*no_flag, "--out", tmp_path / "bad", "--set", "model.hidden=1.5")
    err = _one_json(r)["error"]
    assert r.exit_code == 2 and "must be an integer, got 1.5" in err and "same thing" not in err, r.output


# ----------------------------------------------------------------------------- one vocabulary
def test_renamed_options_still_work_under_their_old_names_and_warn(files, tmp_path):
    new = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "domain", "--fractions",
                  "0.5,0.25,0.25", "--min-records", 30, "--out", tmp_path / "new.json", "--json")
    old = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "domain", "--split",
                  "0.5,0.25,0.25", "--min-train", 30, "--out", tmp_path / "old.json", "--json")
    assert new.exit_code == old.exit_code == 0, old.output
    assert "deprecated" not in new.stderr
    assert "--split is deprecated" in old.stderr and "use --fractions" in old.stderr
    assert "--min-train is deprecated" in old.stderr and "use --min-records" in old.stderr
    drop_key = lambda p: {k: v for k, v in json.loads(p.read_text()).items() if k not in ("key", "seal")}  # noqa: E731 (random)
    assert drop_key(tmp_path / "new.json") == drop_key(tmp_path / "old.json")  # same meaning
    # the records of the split scored against, given as --synthetic: refused (a helper's TSTR 1.000 under a warning)
    same = _invoke("evaluate", "--store", files / "digits.safetensors", "--synthetic", files / "digits.safetensors",
                   "--partition", files / "part.json", "--json")
    assert same.exit_code == 2 and "holds" in same.output and "(its test split)" in same.output, same.output
    assert "trained on the test records themselves" in same.output
    from fedhype.data.partition import Partition

    Partition.load(files / "part.json").split_store(EmbeddingStore.load(files / "digits.safetensors"), "train").save(
        tmp_path / "train.safetensors")  # real records disjoint from the split: a real-vs-real reference, allowed
    r = _invoke("evaluate", "--real", files / "digits.safetensors", "--synthetic", tmp_path / "train.safetensors",
                "--partition", files / "part.json", "--real-split", "val", "--permutations", 0, "--json")
    assert r.exit_code == 0, r.output
    assert "--real is deprecated" in r.stderr and "--real-split is deprecated" in r.stderr
    # a real store scored as --synthetic: said on stderr and in the JSON object (a new user's probe)
    assert _one_json(r)["synthetic_kind"] == "real" and "not 'synthetic'" in _one_json(r)["warnings"][0]
    both = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "domain", "--split",
                   "0.5,0.25,0.25", "--fractions", "0.6,0.2,0.2", "--out", tmp_path / "both.json", "--json")
    assert both.exit_code == 2 and "--split is the old name of --fractions; give only --fractions" in both.output
    assert not (tmp_path / "both.json").exists()
    part = make_partition(EmbeddingStore.load(files / "digits.safetensors"), scheme="domain")
    assert _one_json(r)["n_real"] == sum(len(c.val) for c in part.clients)  # the val split, as --split val


def test_every_command_answers_dash_h():
    for argv in ([], ["embed"], ["partition"], ["train"], ["synthesize"], ["evaluate"], ["budget"], ["audit"],
                 ["prototypes"], ["prototypes", "train"], ["run"]):
        r = _invoke(*argv, "-h")
        assert r.exit_code == 0 and "Usage: " in r.stdout, (argv, r.output)


def test_help_does_not_import_torch():
    code = ("import sys\nfrom fedhype.cli.main import app\nfrom typer.testing import CliRunner\n"
            "for c in ['embed', 'partition', 'train', 'synthesize', 'evaluate', 'budget', 'audit', 'prototypes', 'run']:\n"
            "    assert CliRunner().invoke(app, [c, '--help']).exit_code == 0\n"
            "print(sorted(m for m in ('torch', 'sklearn', 'scipy', 'transformers') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"  # every --help answers without the heavy libraries (< 1 s: benchmarks/cli_help.py)


def test_parser_choices_are_the_librarys():
    from fedhype.cli import choices
    from fedhype.data import layout, partition
    from fedhype.encoders import base, registry
    from fedhype.eval import inputs
    from fedhype.prototypes import classifier

    assert choices.SCHEMES == partition.SCHEMES and choices.SPLITS == partition.SPLITS
    assert choices.POOLINGS == registry.POOLINGS and set(choices.DTYPES) == {"auto", *base._DTYPES}
    assert choices.SPACES == inputs.SPACES and choices.HEADS == classifier.HEADS and choices.LAYOUTS == layout.LAYOUTS
    assert set(choices.MATCHINGS) == set(classifier.MATCHING)
    r = _invoke("train", "--method", "gan", "--json")  # refused by the parser, before anything else is read
    assert r.exit_code == 2 and "'gan' is not one of 'fedhypevae'" in _one_json(r)["error"]


# ----------------------------------------------------------------------------- output folders that spent budget
def test_no_command_writes_into_a_folder_that_records_spent_budget(files, tmp_path, audit_run):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(audit_run[0], run)
    ledger = (run / "ledger.json").read_bytes()
    syn = tmp_path / "syn.safetensors"
    _digits_store(np.zeros(len(load_digits().target), dtype=int), ["all"]).save(syn)
    for argv in (["prototypes", "train", "--data", syn, "--epochs", 1, "--out", run, "--overwrite"],
                 ["run", "--out", run], ["train", "--store", files / "digits.safetensors", "--partition",
                                         files / "part.json", "--out", files, "--rounds", 1]):
        r = _invoke(*argv, "--json")
        assert r.exit_code == 2, (argv, r.output)
        assert "does not write into it" in _one_json(r)["error"], argv
    assert (run / "ledger.json").read_bytes() == ledger and (run / "model.safetensors").is_file()
    other = tmp_path / "photos"
    other.mkdir()
    (other / "holiday.txt").write_text("x")
    r = _invoke("run", "--out", other, "--json")
    assert r.exit_code == 2 and "files fedhype did not write" in _one_json(r)["error"]
    assert sorted(p.name for p in other.iterdir()) == ["holiday.txt"]


def test_epsilon_and_noise_multiplier_together_are_refused(files, tmp_path):
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json",
                "--out", tmp_path / "run", "--epsilon", 1, "--noise-multiplier", 0.5, "--json")
    assert r.exit_code == 2 and "give one of the two" in _one_json(r)["error"]
    assert not (tmp_path / "run").exists()
    from fedhype.errors import ValidationError
    from fedhype.pipeline.config import resolve

    with pytest.raises(ValidationError, match="give one of the two"):
        resolve(None, ["train.epsilon=1", "train.noise_multiplier=0.5"])
    assert resolve(None, ["train.noise_multiplier=0.5"])["train"]["epsilon"] is None  # σ alone: ε is reported
    with pytest.raises(ValidationError, match="data.dataset .* and data.images both name the real data"):
        resolve(None, ["data.dataset='fashion-mnist'", f"data.images='{tmp_path}'"])


def test_an_epsilon_above_its_target_is_printed_apart_from_it():
    """`train`/`run`/report.md printed "ε = 2 is above the target ε = 2" for 2.0000024 (a new user's probe)."""
    from fedhype.privacy.plan import epsilon_text

    assert epsilon_text(2.0000024, 2) == "2.000002" and epsilon_text(4.0034, 4) == "4.003"
    assert epsilon_text(0.99912, 1) == "0.9991" and epsilon_text(1.5, None) == "1.5"  # at or below: 4 digits


@pytest.mark.parametrize("flag, key", [("--rounds", "train.rounds"), ("--batch-size", "train.batch_size"),
                                       ("--hidden", "model.hidden")])
def test_a_bad_value_is_named_by_the_flag_the_user_gave(files, tmp_path, flag, key):
    """The engine's checks name job-file keys; a command that has an option for the key names the option too
    (`fedhype train --rounds 0` said "train.rounds must be ≥ 1": a new user's probe)."""
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json",
                "--out", tmp_path / "run", flag, 0, "--json")
    assert r.exit_code == 2 and f"{flag} ({key}) must be a whole number ≥ 1" in _one_json(r)["error"], r.output
    assert not (tmp_path / "run").exists()


SIGTERM_BODY = """
import sys, time
import typer
from fedhype.cli.common import run_command

def body():
    try:
        print("ready", file=sys.stderr, flush=True)  # inside the try: a signal right after it still runs finally
        time.sleep(600)
    finally:
        print("cleaned up", file=sys.stderr, flush=True)  # finally blocks run, as on Ctrl-C
    return {}

app = typer.Typer()


@app.command()
def main():
    run_command(body, json_mode=True)


app()
"""


def test_sigterm_stops_a_command_as_ctrl_c_does():
    """A new user's probe: `kill` (SIGTERM: docker stop, systemd, Slurm) ended a command with exit 143 and no
    --json object; it is now the same clean stop as Ctrl-C (exit 130, the "interrupted" object)."""
    import signal
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", SIGTERM_BODY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr.readline().strip() == "ready"  # waits on the condition, not on a timer
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, (out, err)
    got = json.loads(out)
    assert got["kind"] == "interrupted" and got["exit_code"] == 130 and "SIGTERM" in got["error"]
    assert "cleaned up" in err


@pytest.mark.parametrize("args, message", [
    (["--max-epsilon", "-1"], "--max-epsilon (train.max_epsilon) must be a finite number > 0"),  # was exit 3, "ε > -1"
    (["--max-epsilon", "nan"], "--max-epsilon (train.max_epsilon) must be a finite number > 0"),  # named the field
    (["--epsilon", "inf"], "--epsilon (train.epsilon), the target ε, must be a finite number > 0"),  # "raise --epsilon"
    (["--epsilon", "1", "--dropout-tolerance", "-1"],
     "--dropout-tolerance (train.dropout_tolerance) must be a whole number ≥ 0"),
])
def test_train_values_are_refused_naming_the_flag_once(files, tmp_path, args, message):
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--out",
                tmp_path / "run", *args, "--json")
    assert r.exit_code == 2, r.output
    err = _one_json(r)["error"]
    assert message in err and err.count(args[-2]) == 1, err  # one mention of the flag (it was named twice)
    assert not (tmp_path / "run").exists()


def test_an_out_path_that_cannot_be_written_is_a_usage_error_naming_it(files, tmp_path):
    """`train --out /proc/x` said "internal error: FileNotFoundError" (exit 1; a new user's probe)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--out",
                blocker / "run", "--epsilon", 1, "--json")
    assert r.exit_code == 2, r.output
    err = _one_json(r)["error"]
    assert "internal error" not in err and str(blocker) in err and "check the paths given" in err


def test_a_resume_with_another_method_names_the_method_first(files, tmp_path):
    """A resume with another --method listed the model fields it implies (model.client_stats, …) and not the
    method itself (a new user's probe)."""
    args = ["train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--out",
            tmp_path / "run", "--epsilon", 4, "--rounds", 1, "--local-steps", 1, "--hidden", 16, "--latent", 4,
            "--seed", 0, "--json"]
    assert _invoke(*args).exit_code == 0
    r = _invoke(*args, "--resume", "--method", "dp-gaussian")
    assert r.exit_code == 2, r.output
    err = _one_json(r)["error"]
    # the train.* settings are compared before the plan (which would add the model fields they imply)
    assert "train.method: 'fedhypevae' → 'dp-gaussian'" in err
    assert "model." not in err or err.index("train.method") < err.index("model.")
    # nor does it first announce the refused settings as what runs (a probe saw "(dp-gaussian, target ε = 4 …)"), nor
    # that it resumes (a later probe saw "resuming the run …" and then the refusal): the refusal is the only word
    said = r.stderr if getattr(r, "stderr_bytes", None) is not None else r.output
    assert "resuming the run in" not in said and "(dp-gaussian, target" not in said, said


def test_the_same_thing_has_the_same_option_name_in_every_command():
    """`audit` kept its canary run under --audit-out where every other command writes to --out (a new user's
    probe): --out now, --audit-out still accepted."""
    import typer.main

    from fedhype.cli.main import app

    audit = typer.main.get_command(app).commands["audit"]
    opts = {o for p in audit.params for o in getattr(p, "opts", [])}
    assert {"--out", "--audit-out"} <= opts
    out = next(p for p in audit.params if "--out" in getattr(p, "opts", []))
    assert out.name == "audit_out" and "--audit-out" in out.opts


@pytest.mark.parametrize("tol", ["5", "-1", "nan", "0.011"])
def test_audit_tolerance_is_for_rounding_only(tmp_path, tol):
    """`audit --run rel --tolerance 5` called a privacy.json edited from ε 2.005 to 1.0 consistent (a probe)."""
    (tmp_path / "ledger.json").write_text("{}")  # a run folder in name; the tolerance is refused before it is read
    r = CliRunner().invoke(app, ["audit", "--run", str(tmp_path), "--tolerance", tol, "--json"])
    assert r.exit_code == 2, r.output
    assert "--tolerance must be a number in [0, 0.01]" in json.loads(r.stdout.strip().splitlines()[-1])["error"]


def test_evaluate_names_an_empty_held_out_split(files, tmp_path):
    """`partition --fractions 0.8,0.2,0.0` then `evaluate` said "MMD² needs at least 2 samples, got 0" (a probe)."""
    r = _invoke("partition", "--store", files / "digits.safetensors", "--scheme", "domain", "--fractions", "0.8,0.2,0.0",
                "--out", tmp_path / "p.json", "--json")
    assert r.exit_code == 0, r.output
    r = _invoke("evaluate", "--store", files / "digits.safetensors", "--synthetic", files / "digits.safetensors",
                "--partition", tmp_path / "p.json", "--permutations", 0, "--json")
    assert r.exit_code == 2, r.output
    err = _one_json(r)["error"]
    assert "has no test records" in err and "[0.8, 0.2, 0.0]" in err and "--fractions" in err


def test_partition_overwrite_says_a_run_bound_to_the_old_key_needs_the_old_file(files, tmp_path):
    """Rerunning `partition … --overwrite` draws a new key: a finished run's `evaluate` then fails on the new file.
    A probe orphaned a run that way with no word; the replacement is now said."""
    args = ["partition", "--store", files / "digits.safetensors", "--scheme", "domain", "--out", tmp_path / "p.json"]
    assert _invoke(*args, "--json").exit_code == 0
    old = json.loads((tmp_path / "p.json").read_text())["key"]
    r = _invoke(*args, "--overwrite", "--json")
    assert r.exit_code == 0, r.output
    new = json.loads((tmp_path / "p.json").read_text())["key"]
    assert new != old and f"warning: --overwrite replaced the partition" in r.stderr and old[:8] in r.stderr


def test_python_dash_m_fedhype_is_the_cli():
    # ``python -m fedhype`` runs the console script's app (a venv whose bin/ is not on PATH), without torch for --help
    r = subprocess.run([sys.executable, "-m", "fedhype", "budget", "--help"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "--epsilon" in r.stdout, r.stderr
    code = "import sys, runpy\nsys.argv = ['fedhype', '--help']\ntry:\n    runpy.run_module('fedhype', run_name='__main__')\n" \
           "except SystemExit as e:\n    assert e.code == 0\nprint('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("False"), (r.stdout[-500:], r.stderr[-500:])
    r = subprocess.run([sys.executable, "-m", "fedhype", "train", "--method", "gan"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "gan" in r.stderr


@pytest.mark.parametrize("args, named", [
    (["budget", "--epsilon", "1", "--epsilon", "4"], "--epsilon 1 and --epsilon 4"),
    (["budget", "--epsilon=1", "--epsilon", "4", "--json"], "--epsilon=1 and --epsilon 4"),
    (["run", "--set", "train.epsilon=1", "--set", "train.epsilon=4", "--json"],
     "--set train.epsilon=1 and --set train.epsilon=4"),
    (["run", "--secure-aggregation", "--no-secure-aggregation", "--json"],
     "--secure-aggregation and --no-secure-aggregation"),
    # run's shortcut flags against a --set of their key: the flag won silently, whichever came last (a probe:
    # per-client releases where secure aggregation was asked for)
    (["run", "--no-secure-aggregation", "--set", "train.secure_aggregation=true", "--json"],
     "--set train.secure_aggregation=true and --no-secure-aggregation"),
    (["run", "--set", "train.secure_aggregation=false", "--secure-aggregation", "--json"],
     "--set train.secure_aggregation=false and --secure-aggregation"),
    (["run", "--secure-aggregation", "--dropout-tolerance", "1", "--set", "train.dropout_tolerance=0", "--json"],
     "--set train.dropout_tolerance=0 and --dropout-tolerance 1"),
    (["run", "--method", "dp-gaussian", "--set", "train.method=dp-cvae", "--json"],
     "--set train.method=dp-cvae and --method dp-gaussian"),
])
def test_an_option_given_twice_with_different_values_is_refused_before_anything_runs(args, named, tmp_path):
    """A probe's ``fedhype train --epsilon 1 --epsilon 4`` charged every site ε = 4 without a word (Click keeps the
    last value): exit 2, both uses named, nothing written."""
    r = runner.invoke(app, [*args, *(["--out", str(tmp_path / "o")] if args[0] != "budget" else [])])
    assert r.exit_code == 2, r.output
    text = _one_json(r)["error"] if "--json" in args else r.output
    assert named in " ".join(text.split()) and "give it once" in " ".join(text.split())
    assert "fedhype --help" not in text and "fedhype -h" not in text  # the command's usage, not the group's (a probe)
    assert not (tmp_path / "o").exists()


def test_an_option_given_twice_with_the_same_value_and_repeatable_options_pass():
    from fedhype.cli.common import given_twice
    from fedhype.cli.main import _register  # noqa: F401  (the commands are registered at import)
    import typer.main

    group = typer.main.get_command(app)
    budget, train = group.commands["budget"], group.commands["train"]
    assert given_twice(budget, ["--epsilon", "1", "--epsilon", "1.0"]) is None
    assert given_twice(train, ["--site", "a", "--site", "b", "--set", "train.rounds=2", "--set", "train.seed=1"]) is None
    assert given_twice(train, ["--set", "train.rounds=2", "--set", "train.rounds=2"]) is None
    # run's shortcut flag and a --set of its key with the same value agree
    from fedhype.cli.run_cmd import _refuse_shortcut_contradictions

    _refuse_shortcut_contradictions(["train.secure_aggregation=true", "train.method=\"dp-gaussian\"",
                                     "train.dropout_tolerance=1"], True, 1, "dp-gaussian")
    assert "--delta 1e-5 and --delta=1e-4" in given_twice(train, ["--delta", "1e-5", "--delta=1e-4"])
    # the options that do not set the privacy budget keep the usual rule: the last one given is used
    assert given_twice(train, ["--rounds", "1", "--rounds", "2", "--set", "evaluate.permutations=1",
                               "--set", "evaluate.permutations=2"]) is None
    assert "--max-epsilon 2 and --max-epsilon 3" in given_twice(train, ["--max-epsilon", "2", "--max-epsilon", "3"])


@pytest.mark.parametrize("command", [["embed"], ["partition"], ["site"], ["evaluate"], ["audit"], ["synthesize"],
                                     ["prototypes", "train"], ["prototypes", "dp-linear"]])
@pytest.mark.parametrize("seed", ["-1", str(2 ** 63), str(2 ** 64 + 5)])
def test_every_seed_option_refuses_what_numpy_and_torch_cannot_take(command, seed):
    """A probe: `--seed -1` ended in "internal error: ValueError: expected non-negative integer" (exit 1) in six
    commands, `synthesize --seed -5` drew as 2^64 − 5 and 2^64 + 5 overflowed; train's own check said what to give."""
    r = _invoke(*command, "--seed", seed, "--json")
    assert r.exit_code == 2, r.output
    err = json.loads(r.stdout)
    assert err["kind"] == "usage" and err["error"].startswith(
        f"Invalid value for '--seed': must be a whole number ≥ 0 and below 2^63, got {seed}"), err


def test_a_job_refuses_a_bad_data_or_partition_seed_before_it_embeds(tmp_path):
    for key in ("partition.seed", "data.seed"):
        r = _invoke("run", "--set", f"{key}=-1", "--out", str(tmp_path / "job"), "--json")
        assert r.exit_code == 2, r.output
        assert json.loads(r.stdout)["error"].startswith(f"{key} must be a whole number ≥ 0 and below 2^63, got -1")
        assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("classes", ["", "a,,b", "a,b,a", " , "])
def test_an_empty_or_repeated_classes_list_is_refused_not_taken_as_not_given(files, tmp_path, classes):
    """A helper's `--classes ""` was taken as the default (no agreed list) without a word."""
    r = _invoke("site", "--store", files / "digits.safetensors", "--name", "a", "--classes", classes,
                "--out", tmp_path / "s", "--json")
    want = "names 'a' more than once" if classes == "a,b,a" else "includes an empty name (a stray comma?)"
    assert r.exit_code == 2 and _one_json(r)["error"].startswith(f"--classes {classes!r} {want}"), r.output
    assert not (tmp_path / "s").exists()
    r = _invoke("train", "--store", files / "digits.safetensors", "--partition", files / "part.json", "--classes",
                classes, "--out", tmp_path / "run", "--json")
    assert r.exit_code == 2 and "use it with --site" in _one_json(r)["error"], r.output


def test_run_takes_epsilon_as_train_does(tmp_path):
    """`fedhype run --epsilon 2` said "No such option '--epsilon'. Did you mean '--json'?" (a helper's); it is
    train's --epsilon, the shortcut of --set train.epsilon, and contradicting --set is refused before anything runs."""
    from fedhype.cli.run_cmd import _refuse_shortcut_contradictions
    from fedhype.errors import ValidationError

    _refuse_shortcut_contradictions(["train.epsilon=2"], None, None, None, 2.0)
    with pytest.raises(ValidationError, match=r"--set train.epsilon=3 and --epsilon 2 contradict"):
        _refuse_shortcut_contradictions(["train.epsilon=3"], None, None, None, 2.0)
    r = _invoke("run", "--epsilon", "2", "--set", "train.epsilon=3", "--out", str(tmp_path / "o"), "--json")
    assert r.exit_code == 2 and "contradict each other" in _one_json(r)["error"], r.output
    r = _invoke("run", "--epsilon", "0", "--out", str(tmp_path / "o"), "--json")
    assert r.exit_code == 2 and "train.epsilon, the target ε, must be a finite number > 0" in _one_json(r)["error"]
    assert not (tmp_path / "o").exists()
