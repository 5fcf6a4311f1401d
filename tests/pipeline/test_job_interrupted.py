"""A `fedhype run` that stops (Ctrl-C, SIGTERM, an error) keeps its stage timings, and a non-private job never
calls its output shareable DP output.

One small non-private job (the shared real test store, 4 domain clients, 2 tiny rounds) is interrupted during
training (KeyboardInterrupt from the round callback: what Ctrl-C and SIGTERM raise), stopped by an error in
synthesis (monkeypatched), then finished; the report lists all three runs.
"""

from __future__ import annotations

import json

import pytest

from conftest import REAL_STORE, TEST_CACHE
from fedhype.pipeline.config import resolve
from fedhype.pipeline.job import TIMINGS_FILE, run_job

SMALL = [f"data.limit={REAL_STORE['limit']}", f"data.image_size={REAL_STORE['image_size']}",
         f"data.cache_dir=\"{TEST_CACHE / 'embeddings'}\"", "train.rounds=2", "train.batch_size=32", "train.seed=0",
         "model.hidden=32", "model.latent=8", "model.hyper_hidden=16", "model.code_dim=8", "synthesis.per_class=20",
         "evaluate.permutations=20", "evaluate.dp_linear=false", "evaluate.downstream=false",
         "evaluate.interpolation=false", "evaluate.prototypes=false", "evaluate.code_domain=false"]


def _runs(out):
    return json.loads((out / TIMINGS_FILE).read_text())["runs"]


def test_an_interrupted_non_private_job_keeps_its_timings_and_never_calls_its_release_private(tmp_path, monkeypatch, real_store):
    import fedhype.synthesis as synthesis
    from fedhype.eval.audit_ledger import audit_run

    out = tmp_path / "jr0"
    conf = resolve(None, [*SMALL, "train.no_dp=true", "evaluate.dp_linear=true"])

    # 1. Ctrl-C (or SIGTERM, which the CLI raises as KeyboardInterrupt) after the first committed round
    def ctrl_c(m):
        raise KeyboardInterrupt

    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_job(conf, out, log=said.append, on_round=ctrl_c)
    runs = _runs(out)
    assert len(runs) == 1 and list(runs[0]["stages"]) == ["embed_s", "partition_s", "train_s"]
    assert runs[0]["interrupted"] == "train_s" and runs[0]["stopped_by"] == "Ctrl-C or SIGTERM"
    assert all(v > 0 for v in runs[0]["stages"].values())
    assert not list(out.glob(".*timings*"))  # written atomically: no temporary file left beside it
    # a non-private job's progress speaks of no σ, no DP statistics, no DP-SGD
    log = "\n".join(said)
    assert "train: checking the training plan (NON-PRIVATE: no clipping, no noise)" in log and "σ" not in log
    assert ("train: 4 clients release their class statistics (NON-PRIVATE: no noise), then 2 training rounds (no "
            "clipping, no noise) (latent size L = 8)") in log and "DP" not in log.replace("NON-PRIVATE", "")

    # 2. an error in a later stage of the rerun: recorded too, with the stage it stopped in
    def broken(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(synthesis, "synthesize", broken)
    said.clear()
    with pytest.raises(RuntimeError, match="disk on fire"):
        run_job(conf, out, log=said.append)
    runs = _runs(out)
    assert len(runs) == 2 and runs[0]["stopped_by"] == "Ctrl-C or SIGTERM"
    assert list(runs[1]["stages"]) == ["embed_s", "partition_s", "train_s", "synthesize_s"]
    assert runs[1]["interrupted"] == "synthesize_s" and runs[1]["stopped_by"] == "error RuntimeError"
    log = "\n".join(said)
    assert ("train: resuming after round 1 of 2 (NON-PRIVATE: nothing is charged; the class statistics were computed "
            "before and are reused)") in log and "charged again" not in log
    assert "train: 1 training round left (no clipping, no noise) (latent size L = 8)" in log

    # 3. the rerun that finishes lists every run into the folder, the stopped ones marked
    monkeypatch.undo()
    said.clear()
    rep = run_job(conf, out, log=said.append)
    runs = _runs(out)
    assert len(runs) == 3 and "stopped_by" not in runs[2] and list(runs[2]["stages"]) == list(rep["timings_s"])
    assert rep["timings_earlier_s"] == [runs[0]["stages"], runs[1]["stages"]]
    assert [r.get("interrupted") for r in rep["timings_earlier_runs"]] == ["train_s", "synthesize_s"]
    md = (out / "report.md").read_text()
    timings = md[md.index("## Timings (s)"):md.index("![projection]")]
    e1, e2 = runs[0]["stages"], runs[1]["stages"]
    assert (f"- earlier run 1 (interrupted in train: Ctrl-C or SIGTERM): embed {e1['embed_s']:.1f} · partition "
            f"{e1['partition_s']:.1f} · train {e1['train_s']:.1f} (interrupted)") in timings
    assert (f"- earlier run 2 (interrupted in synthesize: error RuntimeError): embed {e2['embed_s']:.1f} · partition "
            f"{e2['partition_s']:.1f} · train {e2['train_s']:.1f} · synthesize {e2['synthesize_s']:.1f} "
            "(interrupted)") in timings
    assert timings.count("(interrupted") == 4 and "- this run: embed " in timings

    # the non-private release, report and last line say so, consistently with the NON-PRIVATE warning
    assert rep["private"] is False
    readme = (out / "release" / "README.md").read_text()
    assert readme.startswith("# fedhype release (NOT private)\n\nThis folder is NOT private: the model was trained "
                             "without differential privacy (no_dp)")
    assert "Nothing here may leave the site as private data" in readme
    assert "**Warning: NON-PRIVATE: trained with no_dp; nothing here is differentially private.**" in readme
    assert "- `model.safetensors`: the generator (hypernetwork Φ and the client codes), trained without DP" in readme
    for claim in ("may leave the site:", "DP mechanisms", "DP generator", "DP client codes", "no further cost"):
        assert claim not in readme, claim
    assert audit_run(out / "release")["mismatches"] == []  # the audit recomputes that README: still consistent
    glance = md[md.index("## At a glance"):md.index("## Details")]
    assert "- **What to share: nothing, as private data.** This run was trained without DP (`no_dp`)" in glance
    assert "must not leave the site as private data" in glance and "the DP model" not in glance
    assert said[-1] == (f"release: {out / 'release'} holds the NON-PRIVATE generator, its synthetic embeddings and "
                        "privacy.json (private = false): none of it is private, so it must not leave the site as "
                        "private data; like everything else in the folder it stays with the data holder")
    assert not any("may be shared" in line or "σ calibrated" in line for line in said)
    assert ("dp linear: FedAvg linear classifier on the clients' real embeddings (the reference; NON-PRIVATE, as the "
            "job: no clipping, no noise)") in said and not any("DP-SGD" in line for line in said)
    assert "## Reference: non-private FedAvg linear classifier" in md and "| FedAvg logistic regression |" in md

    # 4. a rerun with another synthesis setting that stops before its release leaves no release of the old settings
    # beside the new configuration (the old release held the old synthetic store), and the one that finishes writes it
    assert (out / "release" / "synthetic.safetensors").exists()
    monkeypatch.setattr(synthesis, "synthesize", broken)
    later = resolve(None, [*SMALL, "train.no_dp=true", "evaluate.dp_linear=true", "synthesis.per_class=10"])
    with pytest.raises(RuntimeError, match="disk on fire"):
        run_job(later, out, log=said.append)
    assert not (out / "release").exists() and not (out / "report.md").exists()
    assert (out / "run" / "model.safetensors").exists()  # the trained model is kept
    monkeypatch.undo()
    rep = run_job(later, out, log=said.append)
    assert rep["n_synthetic"] == 10 * 10 and audit_run(out / "release")["mismatches"] == []


def test_a_killed_run_is_listed_as_killed_in_the_stage_it_was_in(tmp_path, monkeypatch):
    """SIGKILL (or the OOM killer) runs no handler, so the run cannot say it stopped; a probe's `kill -9` in training
    was listed as an ordinary earlier run ("embed 0.1 · partition 0.0"). Each stage is recorded as running when it
    starts: the next run lists the killed one as killed, in that stage, with no time for it."""
    from fedhype.pipeline.job import KILLED, StageTimings

    out = tmp_path / "killed"
    conf = resolve(None, [*SMALL, "train.no_dp=true"])

    def killed(m):  # the state a SIGKILL leaves: no handler records the stop
        monkeypatch.setattr(StageTimings, "stopped", lambda self, exc: None)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_job(conf, out, log=lambda s: None, on_round=killed)
    monkeypatch.undo()
    raw = _runs(out)
    assert raw[0]["running"] == "train_s" and "train_s" not in raw[0]["stages"] and "stopped_by" not in raw[0]
    rep = run_job(conf, out, log=lambda s: None)
    runs = _runs(out)
    assert runs[0]["interrupted"] == "train_s" and runs[0]["stopped_by"] == KILLED and "running" not in runs[0]
    assert "running" not in runs[1] and "stopped_by" not in runs[1]  # the run that finished
    assert rep["timings_earlier_runs"][0]["stopped_by"] == KILLED
    md = (out / "report.md").read_text()
    assert (f"- earlier run 1 (interrupted in train: {KILLED}): embed {runs[0]['stages']['embed_s']:.1f} · partition "
            f"{runs[0]['stages']['partition_s']:.1f} · train (interrupted)") in md


def test_a_second_run_into_a_live_job_folder_is_refused_and_leaves_the_first_as_it_was(tmp_path):
    """No job-level lock: a second `fedhype run` into a live job's folder marked the first run killed (its stage was
    "running"), then failed at the training run's own lock (a review). The job folder is locked for the whole job
    (``<out>/.lock``, flock: released by the kernel when the holder dies); a refused second run writes nothing, and a
    folder the refused run would have made is not left behind."""
    import os
    import subprocess
    import sys

    from fedhype.errors import ValidationError

    out = tmp_path / "live"
    out.mkdir()
    (out / TIMINGS_FILE).write_text(json.dumps({"runs": [{"started": "then", "stages": {"embed_s": 1.0},
                                                           "running": "train_s"}]}))  # the live run's record
    before = (out / TIMINGS_FILE).read_bytes()
    hold = ("import sys, time; from fedhype.io import exclusive_lock\n"
            "with exclusive_lock(sys.argv[1], 'busy {pid}'):\n    print('locked', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"  # waits on the condition, not on a timer
        with pytest.raises(ValidationError, match=f"job folder {out} is being run by another process \\(pid "
                                                  f"{holder.pid}\\)"):
            run_job(resolve(None, [*SMALL, "train.no_dp=true"]), out, log=lambda s: None)
        assert (out / TIMINGS_FILE).read_bytes() == before  # the live run is not marked killed
        assert sorted(p.name for p in out.iterdir()) == [".lock", TIMINGS_FILE]
    finally:
        holder.kill()
        holder.wait()
    refused = resolve(None, [*SMALL, "train.epsilon=2", "train.delta=0.05"])
    with pytest.raises(ValidationError, match="is not below 1/n"):  # refused after the lock, before writing
        run_job(refused, tmp_path / "new" / "deeper", log=lambda s: None)
    assert not (tmp_path / "new").exists()  # the folders made for the lock are removed again
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValidationError, match="is not below 1/n"):
        run_job(refused, tmp_path / "empty", log=lambda s: None)
    assert list((tmp_path / "empty").iterdir()) == []  # an existing folder is left as it was: no lock file in it
    assert os.path.exists(out / ".lock")


def test_an_interrupted_job_resumes_under_a_spending_cap_given_only_now(tmp_path):
    """`train.max_epsilon` may be added on a resume (the README and the interruption message suggest it; a probe's
    `fedhype run --set train.max_epsilon=…` was refused as "a different configuration"): a cap below what the rest
    of the plan costs refuses before spending, a cap above it lets the job finish, and nothing else may change."""
    from fedhype.errors import BudgetExceededError, ValidationError

    out = tmp_path / "capped"
    conf = resolve(None, [*SMALL, "train.epsilon=2"])

    def ctrl_c(m):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_job(conf, out, log=lambda s: None, on_round=ctrl_c)
    ledger = (out / "run" / "ledger.json").read_bytes()
    # a release of the interrupted job's model says how a job resumes (a helper was pointed at `train --resume`)
    from typer.testing import CliRunner

    from fedhype.cli.main import app

    rel = CliRunner().invoke(app, ["synthesize", "--run", str(out), "--out", str(tmp_path / "syn.safetensors"),
                                   "--release", str(tmp_path / "rel")])
    assert rel.exit_code == 0, rel.output
    words = " ".join(rel.output.split())
    assert f"run the job again — `fedhype run` with its --config/--set and --out {out} — first" in words, words
    assert "train --resume" not in words
    # a resumed job's rounds were trained: a refusal says this run trained nothing, not "nothing was trained"
    with pytest.raises(ValidationError, match="synthesis.temperature must be .*; this run trained nothing$"):
        run_job(resolve(None, [*SMALL, "train.epsilon=2", "synthesis.temperature=0"]), out, log=lambda s: None)
    said: list[str] = []
    with pytest.raises(BudgetExceededError, match="max-epsilon 1.5"):
        run_job(resolve(None, [*SMALL, "train.epsilon=2", "train.max_epsilon=1.5"]), out, log=said.append)
    assert (out / "run" / "ledger.json").read_bytes() == ledger  # refused before spending
    assert "run: train.max_epsilon: None → 1.5 (a cap on what the job may still spend" in "\n".join(said)
    with pytest.raises(ValidationError, match="train.epsilon: 2 → 3"):  # the cap frees no other setting
        run_job(resolve(None, [*SMALL, "train.epsilon=3", "train.max_epsilon=2.1"]), out, log=lambda s: None)
    rep = run_job(resolve(None, [*SMALL, "train.epsilon=2", "train.max_epsilon=2.1"]), out, log=lambda s: None)
    assert rep["private"] and rep["epsilon"] <= 2.1
    assert json.loads((out / "config.json").read_text())["train"]["max_epsilon"] == 2.1  # the cap it ran under
    # the finished job again under a cap below its ε: nothing is left to spend, so the cap stops nothing (a helper's
    # such rerun was refused, quoting the plan's ε instead of the ledger's; `train --resume` already went on)
    ledger, said = (out / "run" / "ledger.json").read_bytes(), []
    again = run_job(resolve(None, [*SMALL, "train.epsilon=2", "train.max_epsilon=0.5"]), out, log=said.append)
    assert again["epsilon"] == rep["epsilon"] and (out / "run" / "ledger.json").read_bytes() == ledger
    assert any(line.startswith(f"train: the job's run is finished (ε = {rep['epsilon']:.4g}): nothing more is spent, "
                               "so train.max_epsilon = 0.5 has nothing to stop (the run's ε is above it already")
               for line in said), said


def test_a_job_at_a_meaningless_epsilon_says_so(tmp_path):
    """A helper's job at train.epsilon = 1e6 finished as "private" without a word; `fedhype train` warned already."""
    said: list[str] = []
    rep = run_job(resolve(None, [*SMALL, "train.epsilon=1e6", "evaluate.dp_linear=false"]), tmp_path / "weak",
                  log=said.append)
    assert rep["private"] and rep["epsilon"] > 50
    assert any(line.startswith(f"train: warning: ε = {rep['epsilon']:.4g}: a guarantee this weak protects no record")
               for line in said), said
    said.clear()
    run_job(resolve(None, [*SMALL, "train.epsilon=1", "evaluate.dp_linear=false"]), tmp_path / "usual", log=said.append)
    assert not any("protects no record" in line for line in said)


def test_a_job_refused_before_it_wrote_anything_leaves_an_older_jobs_timings_as_they_were(tmp_path):
    """The timings of a new (or replaced) job are written only once it wrote its configuration: a refusal before
    that (here: δ ≥ 1/n, known only after the partition) leaves the folder, timings.json included, untouched."""
    from fedhype.errors import ValidationError

    out = tmp_path / "job"
    old = resolve(None, [*SMALL, "train.epsilon=2"])
    out.mkdir()
    (out / "config.json").write_text(json.dumps(old))  # a job that never started training
    (out / TIMINGS_FILE).write_text(json.dumps({"runs": [{"started": "then", "stages": {"embed_s": 1.0}}]}))
    before = (out / TIMINGS_FILE).read_bytes()
    with pytest.raises(ValidationError, match="is not below 1/n"):
        run_job(resolve(None, [*SMALL, "train.epsilon=2", "train.delta=0.05"]), out, log=lambda s: None)
    assert (out / TIMINGS_FILE).read_bytes() == before


def test_a_refused_rerun_is_listed_as_refused_not_interrupted():
    """A probe's rerun with a changed image folder (exit 2) appeared as "earlier run 4 (interrupted in embed: error
    ValidationError)"."""
    from fedhype.pipeline.report import _stopped

    assert _stopped({"interrupted": "embed_s", "stopped_by": "refused (ValidationError)"}) == \
        " (refused in embed: ValidationError)"
    assert _stopped({"interrupted": "train_s", "stopped_by": "Ctrl-C or SIGTERM"}) == \
        " (interrupted in train: Ctrl-C or SIGTERM)"
    assert _stopped({"stages": {}}) == ""


def test_a_job_whose_disk_cannot_hold_its_run_is_refused_before_it_writes_or_says_it_trains(tmp_path, monkeypatch,
                                                                                             real_store):
    """A helper's `fedhype run` on an 8 MB file system embedded, wrote its store and partition, printed "train: 3
    clients release their DP class statistics" and only then was refused for the disk. The job checks the run's disk
    (run_plan.check_run_disk) once its plan is known, before it writes anything into --out or says what it trains."""
    import fedhype.resources
    from fedhype.errors import ValidationError

    monkeypatch.setattr(fedhype.resources, "free_disk", lambda path: 1_000_000)
    lines: list[str] = []
    with pytest.raises(ValidationError, match="its disk has 976.56 KiB free: free space there or give an --out on another "
                                              "disk; nothing was written or charged"):
        run_job(resolve(None, [*SMALL, "train.epsilon=4"]), tmp_path / "job", log=lines.append)
    assert not any("release" in x for x in lines), lines
    assert not (tmp_path / "job").exists() or not any((tmp_path / "job").iterdir())
