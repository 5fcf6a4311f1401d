"""``fedhype audit``: exit codes, the --json contract, tamper detection and canary flags."""

from __future__ import annotations

import json
import shutil

import pytest
import typer
from typer.testing import CliRunner

from fedhype.cli import audit_cmd
from fedhype.data.partition import make_partition
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train

from conftest import AUDIT_CFG as CFG  # noqa: E402


@pytest.fixture(scope="module")
def app():
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test root"""

    audit_cmd.register(app)
    return app


@pytest.fixture(scope="module")
def shared(audit_run, real_store, tmp_path_factory):
    """The run shared with tests/eval/test_audit_*.py, plus its store and partition files."""
    run_dir, part = audit_run
    files = tmp_path_factory.mktemp("audit-cli-data")
    real_store.save(files / "store.safetensors")
    part.save(files / "part.json")
    return {"run": run_dir, "store": files / "store.safetensors", "partition": files / "part.json"}


@pytest.fixture
def run_copy(shared, tmp_path):
    shutil.copytree(shared["run"], tmp_path / "run")
    return tmp_path / "run"


def _run(app, *args):
    result = CliRunner().invoke(app, ["audit", *args])
    return result, (json.loads(result.stdout) if "--json" in args and result.stdout.strip() else None)


def test_clean_run_exits_0(app, shared):
    result, out = _run(app, "--run", str(shared["run"]), "--json")
    assert result.exit_code == 0, result.output
    assert out["consistent"] and out["ledger_ok"] and out["mismatches"] == []
    assert out["epsilon"] == pytest.approx(2.1016, abs=1e-3) and out["epsilon_rdp"] > out["epsilon"]
    assert out["delta"] == 1e-4 and "exit_code" not in out
    human, _ = _run(app, "--run", str(shared["run"]))
    assert human.exit_code == 0 and "ledger consistency" in human.stdout
    # the ledger keys clients by id, privacy.json and the report by name: the audit gives both
    assert out["client_names"] == {"0": "client-0", "1": "client-1"}
    assert f"{out['worst_client']} (client-{out['worst_client']})" in human.stdout


def test_tampered_ledger_exits_4_naming_the_event(app, run_copy):
    text = (run_copy / "ledger.json").read_text()
    (run_copy / "ledger.json").write_text(text.replace('"noise_multiplier":1.0', '"noise_multiplier":0.5', 1))
    result, out = _run(app, "--run", str(run_copy), "--json")
    assert result.exit_code == 4
    assert out["exit_code"] == 4 and out["ledger_ok"] is False and out["epsilon"] is None
    assert "event 0 hash mismatch" in out["error"] and "client '0', round 0" in out["error"]


def test_edited_metrics_and_synthetic_epsilon_exit_4_with_differences(app, run_copy, tmp_path):
    from fedhype.synthesis.sample import synthesize

    metrics = json.loads((run_copy / "metrics.json").read_text())
    metrics[-1]["epsilon"] = 1.0
    (run_copy / "metrics.json").write_text(json.dumps(metrics))
    syn = synthesize(run_copy, "neutral", per_class=3, seed=0)
    syn.meta["epsilon"] = 0.5
    syn.save(tmp_path / "syn.safetensors")
    result, out = _run(app, "--run", str(run_copy), "--synthetic", str(tmp_path / "syn.safetensors"), "--json")
    assert result.exit_code == 4, result.output
    got = {m["name"]: m for m in out["mismatches"]}
    assert set(got) == {"metrics.json: round 1 epsilon", f"synthetic {tmp_path / 'syn.safetensors'}: meta.epsilon"}
    eps = out["epsilon"]
    assert got["metrics.json: round 1 epsilon"]["difference"] == pytest.approx(1.0 - eps)
    assert got[f"synthetic {tmp_path / 'syn.safetensors'}: meta.epsilon"]["recomputed"] == eps
    human, _ = _run(app, "--run", str(run_copy), "--synthetic", str(tmp_path / "syn.safetensors"))
    assert human.exit_code == 4 and "MISMATCHES" in human.stdout and "metrics.json: round 1" in human.stdout


def test_a_synthetic_store_of_another_model_with_the_same_epsilon_exits_4(app, run_copy, shared, tmp_path):
    """A probe audited run A with a store drawn from run B (same settings, so the same ε and δ): it passed. The
    store's provenance now names the model file it was drawn from (its content digest), and the audit compares."""
    import shutil

    from fedhype.federated.rundir import load_model, model_digest, save_model
    from fedhype.synthesis.sample import synthesize

    ok = synthesize(run_copy, "neutral", per_class=3, seed=0)
    assert ok.meta["model_digest"] == model_digest(run_copy) is not None
    other = tmp_path / "other"
    shutil.copytree(run_copy, other)
    hnet, codes, meta = load_model(other)
    save_model(other / "model.safetensors", hnet, codes + 0.01, meta)  # another model, the same claims
    synthesize(other, "neutral", per_class=3, seed=0).save(tmp_path / "b.safetensors")
    ok.save(tmp_path / "a.safetensors")
    result, out = _run(app, "--run", str(run_copy), "--synthetic", str(tmp_path / "a.safetensors"), "--json")
    assert result.exit_code == 0, result.output
    result, out = _run(app, "--run", str(run_copy), "--synthetic", str(tmp_path / "b.safetensors"), "--json")
    assert result.exit_code == 4, result.output
    assert [m["name"] for m in out["mismatches"]] == \
        [f"synthetic {tmp_path / 'b.safetensors'}: meta.model_digest (the model it was drawn from)"]


def test_mia_and_white_box_canaries_in_one_call(app, shared):
    result, out = _run(app, "--run", str(shared["run"]), "--mia", "--store", str(shared["store"]),
                       "--partition", str(shared["partition"]), "--canaries", "white-box", "--break", "clipping",
                       "--json")
    assert result.exit_code == 4, result.output  # an exceeded claim exits 4; the whole result is still printed
    assert out["exit_code"] == 4 and out["kind"] == "artifact" and "--break clipping" in out["error"]
    (mia,) = out["mia"]
    assert mia["n_members"] == 480 and 0 <= mia["dcr"]["auroc"] <= 1
    assert mia["dcr"]["auroc_ci"][0] <= mia["dcr"]["auroc"] <= mia["dcr"]["auroc_ci"][1]
    assert out["exceeds_claim"] is True and out["canary"]["breakage"] == "clipping"
    assert out["empirical_epsilon_lower_bound"] > out["claimed_epsilon"] == pytest.approx(out["epsilon"])
    assert (out["n_canaries"], out["guesses"], out["correct"]) == (1000, 100, 100)


def test_white_box_from_flags_without_a_run(app, shared):
    # no run: a freshly initialised default-size model (dimensions from --store); no --partition: canaries only
    result, out = _run(app, "--canaries", "white-box", "--store", str(shared["store"]), "--noise-multiplier", "2.0",
                       "--sample-rate", "0.2", "--steps", "1", "--n-canaries", "200", "--json")
    assert result.exit_code == 0, result.output
    assert out["canary"]["n_real_records"] == 0 and out["canary"]["n_parameters"] > 10**5
    assert out["run"] is None and out["canary"]["phases"] == [
        {"noise_multiplier": 2.0, "sample_rate": 0.2, "steps": 1, "clip_norm": 1.5}]
    assert out["guesses"] == 20 and not out["exceeds_claim"] and out["canary"]["delta"] == 1e-4


@pytest.mark.parametrize("args, message", [
    ([], "nothing to audit"),
    (["--canaries", "black-box", "--break", "noise"], "--break applies"),
    (["--canaries", "grey-box"], "is not one of"),  # the parser's refusal (in a rich box here: no root --json group)
    (["--canaries", "white-box", "--noise-multiplier", "1.0"], "missing"),
    # a probe: --delta and --n-canaries without --canaries were ignored without a word
    (["RUN", "--delta", "1e-6", "--n-canaries", "50"], "--n-canaries, --delta: these apply to a canary audit only"),
    (["RUN", "--confidence", "0.9"], "--confidence: this applies to a canary audit only"),
])
def test_usage_errors_exit_2(app, shared, args, message):
    if args and args[0] == "--canaries" and "--noise-multiplier" in args:
        args = [*args, "--store", str(shared["store"])]
    if args and args[0] == "RUN":
        args = ["--run", str(shared["run"]), *args[1:]]
    result, out = _run(app, *args, "--json")
    assert result.exit_code == 2 and message in (out["error"] if out else result.output)


# ----------------------------------------------------------------------------- a `fedhype run` output folder
@pytest.fixture(scope="module")
def job(shared, tmp_path_factory):
    """The layout `fedhype run --out JOB` writes: JOB/config.json (the job's), embeddings, partition, run/."""
    from fedhype.pipeline.config import DEFAULTS

    root = tmp_path_factory.mktemp("audit-job") / "job"
    shutil.copytree(shared["run"], root / "run")
    shutil.copy(shared["store"], root / "embeddings.safetensors")
    shutil.copy(shared["partition"], root / "partition.json")
    (root / "config.json").write_text(json.dumps(DEFAULTS))  # the job configuration: no "store" digest
    return root


def test_mia_on_a_job_folder_audits_its_run(app, job, shared):
    result, out = _run(app, "--run", str(job), "--mia", "--store", str(job / "embeddings.safetensors"),
                       "--partition", str(job / "partition.json"), "--json")
    assert result.exit_code == 0, result.output
    assert out["run"] == str(job / "run") and out["consistent"]
    (mia,) = out["mia"]
    assert mia["n_members"] == 480 and 0 <= mia["dcr"]["auroc"] <= 1
    _, direct = _run(app, "--run", str(shared["run"]), "--mia", "--store", str(shared["store"]),
                     "--partition", str(shared["partition"]), "--json")
    assert mia["dcr"]["auroc"] == direct["mia"][0]["dcr"]["auroc"]  # the same run, the same attack


def test_white_box_canaries_on_a_job_folder_replay_its_ledger(app, job, shared):
    result, out = _run(app, "--run", str(job), "--canaries", "white-box", "--n-canaries", "500", "--json")
    assert result.exit_code == 0, result.output
    assert out["n_canaries"] == 500 and out["guesses"] == 50 and not out["exceeds_claim"]
    assert out["claimed_epsilon"] == pytest.approx(out["epsilon"]) and out["epsilon"] == pytest.approx(2.1016, abs=1e-3)
    assert out["canary"]["steps"] == 4 and out["canary"]["phases"][0]["noise_multiplier"] == 1.0


def test_exceeded_claim_exits_4_with_the_figures(app, shared):
    args = ("--run", str(shared["run"]), "--canaries", "white-box", "--break", "noise", "--n-canaries", "500")
    result, out = _run(app, *args, "--json")
    assert result.exit_code == 4, result.output
    assert out["exceeds_claim"] is True and out["exit_code"] == 4 and out["kind"] == "artifact"
    assert out["consistent"] and out["mismatches"] == []  # the ledger is fine: the canaries are what failed
    bound, claim = out["empirical_epsilon_lower_bound"], out["claimed_epsilon"]
    assert bound > claim == pytest.approx(2.1016, abs=1e-3)
    assert f"lower bound {bound:.4g} exceeds the claimed ε {claim:.4g}" in out["error"]
    assert "--break noise" in out["error"] and "500 canaries" in out["error"]
    human, _ = _run(app, *args)
    assert human.exit_code == 4 and "EXCEEDS CLAIM" in human.output and f"{bound:.4g}" in human.output


def test_white_box_audit_without_a_run_replays_the_model_train_builds():
    """The audit's default model is the job's (hidden 128, latent 64, the default method's preset). It used
    to build the bare ModelConfig (then 256 / 100) while saying it matched; ModelConfig's own defaults are
    now the job's (one source of defaults), so the two agree."""
    from fedhype.cli.audit_cmd import job_model
    from fedhype.eval.canary import default_model
    from fedhype.federated.config import TrainConfig
    from fedhype.models.config import ModelConfig
    from fedhype.pipeline.config import DEFAULTS

    cfg = job_model(384, 10)
    # the white-box audit replays a DP run: the job's latent "auto" is 64 there
    assert (cfg.hidden, cfg.latent) == (DEFAULTS["model"]["hidden"], 64) and DEFAULTS["model"]["latent"] == "auto"
    assert cfg == TrainConfig(model=dict(DEFAULTS["model"])).model_config(384, 10)
    assert (ModelConfig(dim=384, n_classes=10).hidden, ModelConfig(dim=384, n_classes=10).latent) == (128, 64)
    built, theta = default_model(384, 10, 0, cfg=cfg)
    assert built is cfg and theta["dec.wl"].shape[0] == 64
    # and the job's code dimension for the partition's clients ("auto": one per client, in steps of 32)
    assert job_model(384, 10).code_dim == 32 and job_model(384, 10, n_clients=100).code_dim == 128


def test_wrong_files_are_named_with_what_to_give(audit_run, tmp_path):
    """A probe's messages: a ledger given as --synthetic pointed at `fedhype embed` only; a model.safetensors that is
    a folder was "not found: …/model.safetensors/model.safetensors"; an empty config.json said "re-create it" (a run's
    files cannot be); `budget --card` on a folder without card.json exited 4 where a missing path exits 2."""
    from fedhype.cli.main import app as full

    src, _ = audit_run
    runner = CliRunner()
    r = runner.invoke(full, ["audit", "--run", str(src), "--synthetic", str(src / "ledger.json"), "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 4 and "JSON file" in err and "`fedhype synthesize` a synthetic one" in err, err
    run = tmp_path / "run"
    shutil.copytree(src, run)
    (run / "model.safetensors").unlink()
    (run / "model.safetensors").mkdir()
    r = runner.invoke(full, ["audit", "--run", str(run), "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 4 and "is a folder, not the model file" in err and "model.safetensors/model" not in err, err
    shutil.rmtree(run)
    shutil.copytree(src, run)
    (run / "config.json").write_text("")
    r = runner.invoke(full, ["audit", "--run", str(run), "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 4 and "restore the run folder from a backup" in err and "re-create it" not in err, err
    (tmp_path / "empty").mkdir()
    r = runner.invoke(full, ["budget", "--epsilon", "1", "--card", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "without card.json" in r.output, r.output


def test_a_run_still_training_is_refused_not_reported_as_tampered(audit_run, tmp_path):
    """A helper's `fedhype audit --run job/run` while the job trained exited 4 ("6 reported figure(s) … disagree with
    the ledger"): the ledger holds the next round's write-ahead charge before the model. `synthesize --run` drew from
    it with a warning. Both now refuse while a process holds the run's (or the job's) lock, naming its pid."""
    import os

    from fedhype.cli.main import app as full
    from fedhype.io import exclusive_lock

    src, _ = audit_run
    job = tmp_path / "job"
    shutil.copytree(src, job / "run")
    runner = CliRunner()
    for lock in (job / "run" / ".lock", job / ".lock"):  # a training process, then a `fedhype run` job
        with exclusive_lock(lock, "busy"):
            for args in (["audit", "--run", str(job / "run")], ["audit", "--run", str(job)],
                         ["synthesize", "--run", str(job / "run"), "--out", str(tmp_path / "s.safetensors")]):
                r = runner.invoke(full, [*args, "--json"])
                err = json.loads(r.stdout)["error"]
                assert r.exit_code == 2 and f"(pid {os.getpid()}: a training run or a `fedhype run` job in progress)" \
                    in err and "wait for it to finish" in err, (args, r.stdout)
        assert not (tmp_path / "s.safetensors").exists()
    # the locks released (the process that held them gone): the same commands read the run
    assert runner.invoke(full, ["audit", "--run", str(job / "run"), "--json"]).exit_code == 0
    r = runner.invoke(full, ["synthesize", "--run", str(job / "run"), "--out", str(tmp_path / "s.safetensors"),
                             "--per-class", "2", "--json"])
    assert r.exit_code == 0, r.stdout


def test_mia_on_a_release_folder_says_to_give_the_run_folder(audit_run, real_store, tmp_path):
    """A helper's `audit --run job/release --mia --store … --partition …` (the right store) exited 4: "the store … is
    not the one run … trained on (digest None…)" — a release carries no store digest by design."""
    from fedhype.cli.main import app as full

    src, part = audit_run
    store, pfile = real_store.save(tmp_path / "real.safetensors"), part.save(tmp_path / "part.json")
    runner = CliRunner()
    r = runner.invoke(full, ["synthesize", "--run", str(src), "--out", str(tmp_path / "s.safetensors"), "--per-class",
                             "2", "--release", str(tmp_path / "rel"), "--json"])
    assert r.exit_code == 0, r.stdout
    r = runner.invoke(full, ["audit", "--run", str(tmp_path / "rel"), "--mia", "--store", str(store), "--partition",
                             str(pfile), "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 2 and "a release folder names no store" in err and "the run folder it was released" in err, err


def test_a_model_relabelled_by_hand_is_neither_drawn_nor_released_and_fails_the_audit(audit_run, tmp_path):
    """A helper changed only the class names in model.safetensors' metadata (["0", "1", …] → ["a", "b", …]): synthesize
    --release wrote a release whose synthetic classes were named wrongly, and both audits passed."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from fedhype.cli.main import app as full

    src, _ = audit_run
    run = tmp_path / "run"
    shutil.copytree(src, run)
    recorded = json.loads((run / "config.json").read_text())["class_names"]
    with safe_open(str(run / "model.safetensors"), "pt") as f:
        meta = dict(f.metadata())
    body = json.loads(meta["fedhype"])
    assert body["class_names"] == recorded
    body["class_names"] = list(reversed(recorded))  # a swap: label 0 named as the last class
    save_file(load_file(str(run / "model.safetensors")), str(run / "model.safetensors"),
              metadata={**meta, "fedhype": json.dumps(body)})
    runner = CliRunner()
    r = runner.invoke(full, ["synthesize", "--run", str(run), "--out", str(tmp_path / "s.safetensors"), "--per-class",
                             "2", "--release", str(tmp_path / "rel"), "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 4 and "class_names vs config.json" in err and "otherwise than the run recorded" in err, err
    assert not (tmp_path / "rel").exists() and not (tmp_path / "s.safetensors").exists()
    r = runner.invoke(full, ["audit", "--run", str(run), "--json"])
    res = json.loads(r.stdout)
    assert r.exit_code == 4 and any("class_names" in m["name"] for m in res["mismatches"]), res["mismatches"]


def test_a_synthetic_store_relabelled_by_hand_fails_the_audit(audit_run, tmp_path):
    from fedhype.cli.main import app as full
    from fedhype.data.store import EmbeddingStore

    src, _ = audit_run
    runner = CliRunner()
    r = runner.invoke(full, ["synthesize", "--run", str(src), "--out", str(tmp_path / "s.safetensors"), "--per-class",
                             "2", "--json"])
    assert r.exit_code == 0, r.stdout
    s = EmbeddingStore.load(tmp_path / "s.safetensors")
    assert runner.invoke(full, ["audit", "--run", str(src), "--synthetic", str(tmp_path / "s.safetensors")]).exit_code == 0
    EmbeddingStore(s.embeddings, s.labels, s.domains, s.sample_ids, list(reversed(s.class_names)), s.domain_names,
                   s.meta).save(tmp_path / "t.safetensors")
    r = runner.invoke(full, ["audit", "--run", str(src), "--synthetic", str(tmp_path / "t.safetensors"), "--json"])
    res = json.loads(r.stdout)
    bad = [m for m in res["mismatches"] if "class_names" in m["name"]]
    assert r.exit_code == 4 and len(bad) == 1 and "t.safetensors" in bad[0]["name"], res["mismatches"]
