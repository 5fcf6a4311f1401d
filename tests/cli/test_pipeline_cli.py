"""train / synthesize / run through the real CLI, with exit codes and the --json contract."""

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from conftest import REAL_STORE, TEST_CACHE
from fedhype.cli.main import app
from fedhype.data.store import EmbeddingStore

SMALL = ["--rounds", "2", "--local-steps", "2", "--batch-size", "32", "--seed", "0"]
SMALL_MODEL_SET = ["--set", "model.hidden=32", "--set", "model.latent=8", "--set", "model.hyper_hidden=16",
                   "--set", "model.code_dim=8"]


def _json(result):
    assert result.stdout.count("\n") == 1, result.stdout  # exactly one JSON object on stdout
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def files(real_store, tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    real_store.save(d / "emb.safetensors")
    r = CliRunner().invoke(app, ["partition", "--store", str(d / "emb.safetensors"), "--scheme", "domain",
                                 "--out", str(d / "part.json"), "--json"])
    assert r.exit_code == 0, r.output
    return d


def test_train_and_synthesize(files, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["train", "--store", str(files / "emb.safetensors"), "--partition", str(files / "part.json"),
                            "--out", str(tmp_path / "run"), "--epsilon", "2", "--json", *SMALL])
    assert r.exit_code == 0, r.output
    res = _json(r)
    assert {"run_dir", "epsilon", "delta", "rounds", "clients"} <= set(res)
    assert 1.5 < res["epsilon"] <= 2.0 and res["delta"] == 1e-4 and res["rounds"] == 2 and len(res["clients"]) == 4
    assert res["noise_seeded"] is True  # --seed 0: reproducible noise, not secret
    # rounds ran: C and the bytes a client sends per round are the run's
    assert res["clip_norm"] == 1.5 and res["traffic"]["upload_bytes_per_round"] > 0 and "note" not in res["traffic"]
    # ids key the ledger, names the report and privacy.json: train says both
    assert res["client_names"] == ["mnist", "optdigits", "mnist-m", "rotated-mnist"] and res["clients"] == list("0123")
    from fedhype.cli.common import client_labels

    assert client_labels(res["clients"], res["client_names"]).startswith("0 (mnist), 1 (optdigits), 2 (mnist-m)")
    assert client_labels(["0", "1"], None) == "0, 1"
    r = runner.invoke(app, ["synthesize", "--run", str(tmp_path / "run"), "--code", "mixture:0=0.5,1=0.5",
                            "--n", "101", "--seed", "3", "--out", str(tmp_path / "syn.safetensors"), "--json"])
    assert r.exit_code == 0, r.output
    out = _json(r)
    syn = EmbeddingStore.load(tmp_path / "syn.safetensors")
    assert len(syn) == 101 and out["epsilon"] == pytest.approx(res["epsilon"]) and syn.meta["private"] is True
    assert syn.meta["code"] == "mixture:0=0.5,1=0.5" and syn.domain_names == ["mnist", "optdigits"]
    assert torch.allclose(syn.embeddings.norm(dim=1), torch.ones(101), atol=1e-5)
    # synthesis reads only the released model: a folder with model.safetensors alone gives the same samples
    lone = tmp_path / "released"
    lone.mkdir()
    shutil.copy(tmp_path / "run" / "model.safetensors", lone / "model.safetensors")
    r = runner.invoke(app, ["synthesize", "--run", str(lone), "--code", "mixture:0=0.5,1=0.5", "--n", "101",
                            "--seed", "3", "--out", str(tmp_path / "syn2.safetensors"), "--json"])
    assert r.exit_code == 0, r.output
    assert torch.equal(EmbeddingStore.load(tmp_path / "syn2.safetensors").embeddings, syn.embeddings)
    # unknown client in a code spec → exit 2
    r = runner.invoke(app, ["synthesize", "--run", str(lone), "--code", "client:nope", "--out", str(tmp_path / "x"), "--json"])
    assert r.exit_code == 2 and "unknown client" in _json(r)["error"]


def test_synthesis_never_opens_client_files(files, tmp_path, monkeypatch):
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.data.partition import Partition
    from fedhype.synthesis import synthesize

    store = EmbeddingStore.load(files / "emb.safetensors")
    train(store, Partition.load(files / "part.json"),
          TrainConfig(rounds=1, local_steps=1, batch_size=32, epsilon=4, seed=0,
                      model={"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}), tmp_path / "run",
          diagnostics=False)
    opened = []
    import builtins
    import safetensors

    real_open, real_safe_open = builtins.open, safetensors.safe_open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(str(f)), real_open(f, *a, **k))[1])
    monkeypatch.setattr(safetensors, "safe_open", lambda f, *a, **k: (opened.append(str(f)), real_safe_open(f, *a, **k))[1])
    import fedhype.io as fio
    real_load = fio.load_file
    monkeypatch.setattr(fio, "load_file", lambda f, *a, **k: (opened.append(str(f)), real_load(f, *a, **k))[1])
    synthesize(tmp_path / "run", "neutral", per_class=5, seed=0)
    assert opened and all(p.endswith("model.safetensors") for p in opened), opened


def test_train_exit_codes(files, tmp_path):
    runner = CliRunner()
    base = ["train", "--store", str(files / "emb.safetensors"), "--partition", str(files / "part.json"), "--json"]
    r = runner.invoke(app, base + ["--out", str(tmp_path / "a"), "--delta", "0.5", *SMALL])
    err = _json(r)["error"]
    assert r.exit_code == 2 and ("δ" in err or "delta" in err), err
    r = runner.invoke(app, base + ["--out", str(tmp_path / "b"), "--noise-multiplier", "0.5", "--max-epsilon", "1", *SMALL])
    assert r.exit_code == 3 and _json(r)["epsilon"] > 1
    (tmp_path / "bad.safetensors").write_bytes(b"not a store")
    r = runner.invoke(app, ["train", "--store", str(tmp_path / "bad.safetensors"), "--partition",
                            str(files / "part.json"), "--out", str(tmp_path / "c"), "--json"])
    assert r.exit_code == 4
    r = runner.invoke(app, base + ["--out", str(tmp_path / "d"), "--rounds", "0"])
    assert r.exit_code == 2


def test_run_end_to_end_and_resume(tmp_path):
    runner = CliRunner()
    args = ["run", "--out", str(tmp_path / "job"), "--json",
            "--set", f"data.limit={REAL_STORE['limit']}", "--set", f"data.image_size={REAL_STORE['image_size']}",
            "--set", f"data.cache_dir=\"{TEST_CACHE / 'embeddings'}\"", "--set", "train.rounds=2",
            "--set", "train.batch_size=32", "--set", "train.seed=0", "--set", "evaluate.permutations=20",
            *SMALL_MODEL_SET]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    rep = _json(r)
    assert {"epsilon", "delta", "mmd2", "tstr_accuracy", "trtr_accuracy", "report"} <= set(rep)
    assert 0.9 < rep["epsilon"] <= 1.0 and rep["delta"] == 1e-4 and rep["private"] is True
    assert rep["trtr_accuracy"] > 0.5
    # ε per client is keyed by the client names of "clients"; the ledger ids stay in "client_epsilons"
    assert list(rep["epsilon_per_client"]) == rep["clients"] == ["mnist", "optdigits", "mnist-m", "rotated-mnist"]
    assert [(c["id"], c["name"]) for c in rep["client_epsilons"]] == list(zip("0123", rep["clients"]))
    assert max(rep["epsilon_per_client"].values()) == pytest.approx(rep["epsilon"])
    md = (tmp_path / "job" / "report.md").read_text()
    assert "| optdigits | 1 |" in md and "PCA fit on the held-out real test records" in md
    glance = md[md.index("## At a glance"):md.index("## Details")]  # first section: cost and usefulness in words
    assert f"(ε = {rep['epsilon']:.4g}, δ = 0.0001)-differential privacy" in glance
    assert f"scores {rep['tstr_accuracy']:.3f} on held-out real data" in glance
    assert f"constant guess (the most frequent class) scores {rep['majority_share']:.3f}" in glance
    assert 0.1 <= rep["majority_share"] < 0.15  # ten digit classes, near balanced in the test split
    # progress: one plain line per stage and per round on a non-terminal stderr
    assert "run: embed → partition → train (2 rounds)" in r.stderr and "train: round 2/2" in r.stderr
    assert "train: 4 clients release their DP class statistics, then 2 DP-SGD rounds (latent size L = " in r.stderr
    # a private job's words (a no_dp job says the opposite: tests/pipeline/test_job_interrupted.py)
    assert "train: checking the privacy plan (σ calibrated for the target ε)" in r.stderr
    assert f"release: {tmp_path / 'job' / 'release'} holds the DP model, ledger, synthetic embeddings and privacy.json, " \
           "but the noise was seeded (train.seed)" in r.stderr  # the job is seeded: not "what may be shared"
    assert "- **What to share: nothing, as private data, while the noise is seeded.** `release/` holds the DP model" \
        in glance  # seeded job; an unseeded one says "- **What to share.** `release/` (the DP model, its ledger"
    # the job is seeded (train.seed=0): its release says it may not leave the site as private data, not "may leave"
    readme = (tmp_path / "job" / "release" / "README.md").read_text()
    assert readme.startswith("# fedhype release (seeded noise: not to be shared as private)\n\nThis folder is the "
                             "output of DP mechanisms") and "nothing here may leave the site as private data" in readme
    assert "Everything in this folder may leave the site" not in readme
    job = tmp_path / "job"
    for f in ("report.md", "report.json", "plots/projection.png", "plots/training.png", "synthetic.safetensors",
              "evaluation.json", "partition.json", "config.toml", "run/ledger.json"):
        assert (job / f).exists(), f
    rel = sorted(p.name for p in (job / "release").iterdir())
    assert rel == ["README.md", "checkpoint.json", "config.json", "ledger.json", "model.safetensors", "privacy.json",
                   "synthetic.safetensors"]  # the shareable folder: no real store, partition, report or client state
    assert json.loads((job / "release" / "privacy.json").read_text())["epsilon"] == pytest.approx(rep["epsilon"])
    ledger = (job / "run" / "ledger.json").read_bytes()
    # rerunning the same command resumes: nothing is trained (or charged) again
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert (job / "run" / "ledger.json").read_bytes() == ledger
    # and says so: a resumed job said "4 clients release their DP class statistics" although it released nothing
    # (a probe's rerun of a finished job read "resuming … a release or round that was interrupted is charged again")
    done = "train: the job finished training before (2 rounds): nothing is released, trained or charged again"
    assert done in r.stderr and "resuming" not in r.stderr and "clients release" not in r.stderr
    rerun = _json(r)
    assert rerun["epsilon"] == pytest.approx(rep["epsilon"])
    # the report keeps the first run's stage timings beside the rerun's (a probe: the rerun's replaced them)
    assert rep["timings_earlier_s"] == [] and rerun["timings_earlier_s"] == [rep["timings_s"]]
    md = (job / "report.md").read_text()
    assert "- this run: embed " in md and "- earlier run 1: embed " in md
    # a setting the job left out, given now at its default, is the same setting: the job resumes (it was refused,
    # "train.min_records: None → 20") and charges nothing
    from fedhype.federated.config import TrainConfig

    r = runner.invoke(app, args + ["--set", f"train.min_records={TrainConfig.min_records}", "--set",
                                   f"train.lr_server={TrainConfig.lr_server}"])
    assert r.exit_code == 0, r.output
    assert (job / "run" / "ledger.json").read_bytes() == ledger and done in r.stderr
    # a different configuration into the same folder is refused, naming the setting
    r = runner.invoke(app, args + ["--set", "train.epsilon=4"])
    assert r.exit_code == 2 and "different configuration" in _json(r)["error"]
    assert "train.epsilon: 1.0 → 4" in _json(r)["error"]
    r = runner.invoke(app, args + ["--set", f"train.min_records={TrainConfig.min_records + 1}"])
    assert r.exit_code == 2 and f"train.min_records: {TrainConfig.min_records} → {TrainConfig.min_records + 1}" \
        in _json(r)["error"]
    # a training setting changed with a later one is refused, naming both (the trained model is the old settings')
    r = runner.invoke(app, args + ["--set", "train.epsilon=4", "--set", "synthesis.per_class=20"])
    err = _json(r)["error"]
    assert r.exit_code == 2 and "config.json: train.epsilon: 1.0 → 4); use another --out" in err
    assert "(the 1 [synthesis]/[evaluate] difference from the job's settings beside it would be allowed alone" in err
    # the refused settings come first, whatever the later ones (a probe's six changes listed five allowed ones and
    # cut the refused one)
    many = [f"evaluate.{k}" for k in ("k=4", "permutations=30", "max_samples=1000", "seed=1", "interpolation=false")]
    r = runner.invoke(app, args + [x for kv in many for x in ("--set", kv)] + ["--set", "train.epsilon=4"])
    err = _json(r)["error"]
    assert r.exit_code == 2 and "config.json: train.epsilon: 1.0 → 4); use" in err and "the 5 [synthesis]/[evaluate] " \
        "differences from the job's settings beside it would be allowed alone" in err and "evaluate.k" not in err
    # the stages after training may change (a probe: a job could not switch its code × domain matrix off, or draw
    # another synthetic set, without a new --out and a second ε): the model is kept, nothing is charged
    assert "code_domain" in json.loads((job / "evaluation.json").read_text())
    r = runner.invoke(app, args + ["--set", "synthesis.per_class=20", "--set", "evaluate.code_domain=false",
                                   "--set", "evaluate.dp_linear=false"])
    assert r.exit_code == 0, r.output
    assert (job / "run" / "ledger.json").read_bytes() == ledger and done in r.stderr
    assert "the stages after training only (evaluate.code_domain: True → False; evaluate.dp_linear: True → False; " \
        "synthesis.per_class: 'auto' → 20): the training keeps its settings" in r.stderr
    later = _json(r)
    assert later["epsilon"] == pytest.approx(rep["epsilon"]) and later["n_synthetic"] == 20 * 10
    assert "code_domain" not in json.loads((job / "evaluation.json").read_text())
    # the report no longer presents the DP linear reference, whose model stays in the folder: the audit agrees (a
    # probe's audit failed: "report.json: dp_fedavg_linear_epsilon" against the model's ledger)
    assert later["dp_fedavg_linear_epsilon"] is None
    # ... but it still names the model left in dp_linear/, a second DP model of the same records, with its ε (a new
    # user's report dropped it while the audit warned of it)
    assert rep["dp_fedavg_linear_epsilon"] and later["dp_linear_kept_epsilon"] == pytest.approx(
        rep["dp_fedavg_linear_epsilon"])
    assert (f"`dp_linear/` still holds the DP linear reference an earlier run of this job trained on the same records "
            f"(its own ε = {rep['dp_fedavg_linear_epsilon']:.3g}; ") in " ".join((job / "report.md").read_text().split())
    a = runner.invoke(app, ["audit", "--run", str(job), "--json"])
    assert a.exit_code == 0, a.output
    assert "does not present this reference (a rerun with evaluate.dp_linear = false)" in a.output
    names = {row["name"] for row in json.loads(a.stdout)["checked"]}
    assert any(n.endswith(": dp_linear_kept_epsilon") for n in names), names  # the ε the report names is checked
    assert {f"{job / 'report.json'}: class_stats_epsilon", f"{job / 'report.json'}: target_epsilon",
            f"{job / 'report.md'}: sha256 (report.json report_md_sha256)"} <= names
    # an auditor's probe: the report's release ε and its report.md text could be edited and pass
    import shutil

    for what in ("class_stats_epsilon", "report.md", "target_epsilon"):
        bad = tmp_path / f"forged-{what.replace('.', '-')}"
        shutil.copytree(job, bad)
        if what == "report.md":
            (bad / "report.md").write_text((bad / "report.md").read_text().replace("ε = ", "ε = 0.0"))
        else:
            forged = json.loads((bad / "report.json").read_text())
            if what == "target_epsilon":  # a second probe: a removed key turned its check off
                forged.pop("target_epsilon")
            else:
                forged["class_stats_epsilon"] /= 4
            (bad / "report.json").write_text(json.dumps(forged))
        f = runner.invoke(app, ["audit", "--run", str(bad), "--json"])
        assert f.exit_code == 4 and (what in _json(f)["error"]), f.output
    assert json.loads((job / "config.json").read_text())["synthesis"]["per_class"] == 20
    assert len(later["timings_earlier_s"]) == 3  # the history is kept: the same job, rerun
    # and back: the job's own settings again, another rerun of the later stages
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and (job / "run" / "ledger.json").read_bytes() == ledger, r.output
    r = runner.invoke(app, ["run", "--out", str(tmp_path / "x"), "--set", "train.nonsense=1", "--json"])
    assert r.exit_code == 2 and "unknown key" in _json(r)["error"]


def test_run_min_records_names_the_job_keys(tmp_path):
    args = ["run", "--out", str(tmp_path / "job"), "--json",
            "--set", f"data.limit={REAL_STORE['limit']}", "--set", f"data.image_size={REAL_STORE['image_size']}",
            "--set", f"data.cache_dir=\"{TEST_CACHE / 'embeddings'}\"", "--set", "train.min_records=10000"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    err = _json(r)["error"]
    assert "fewer than train.min_records 10000" in err and "lower train.min_records" in err
    assert "partition.min_records = 10000" in err


def test_bad_values_are_refused_before_anything_is_written(files, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["run", "--out", str(tmp_path / "job"), "--set", "train.epsilon=\"abc\"", "--json"])
    assert r.exit_code == 2 and "train.epsilon must be a number" in _json(r)["error"]
    assert not (tmp_path / "job").exists()
    r = runner.invoke(app, ["train", "--store", str(files / "emb.safetensors"), "--partition", str(files / "part.json"),
                            "--out", str(tmp_path / "typo"), "--resume", "--json", *SMALL])
    assert r.exit_code == 2 and "no run to resume" in _json(r)["error"]
    assert not (tmp_path / "typo" / "ledger.json").exists()


def test_a_job_refused_before_training_leaves_its_folder_reusable(tmp_path):
    """δ ≥ 1/n for a client is refused (exit 2) before the job writes anything (no folder is left);
    the corrected command then runs in the same --out."""
    runner = CliRunner()
    base = ["run", "--out", str(tmp_path / "job"), "--json",
            "--set", f"data.limit={REAL_STORE['limit']}", "--set", f"data.image_size={REAL_STORE['image_size']}",
            "--set", f"data.cache_dir=\"{TEST_CACHE / 'embeddings'}\"", "--set", "train.rounds=1",
            "--set", "train.batch_size=32", "--set", "train.seed=0", "--set", "evaluate.permutations=20",
            "--set", "evaluate.interpolation=false", "--set", "evaluate.dp_linear=false", *SMALL_MODEL_SET]
    r = runner.invoke(app, base + ["--set", "train.delta=0.05"])
    assert r.exit_code == 2 and "delta = 0.05 is not below 1/n" in _json(r)["error"], r.output
    assert not (tmp_path / "job").exists()
    r = runner.invoke(app, base + ["--secure-aggregation", "--dropout-tolerance", "4"])  # t ≥ m = 4 clients
    assert r.exit_code == 2 and "dropout" in _json(r)["error"].lower(), r.output
    assert not (tmp_path / "job").exists()
    r = runner.invoke(app, base)
    assert r.exit_code == 0, r.output
    assert _json(r)["delta"] == 1e-4


def test_run_refuses_no_dp_over_a_config_files_epsilon_naming_both(tmp_path):
    """A probe's `fedhype run --config job.toml --set train.no_dp=true` (job.toml: epsilon = 2.0) ran the whole job
    non-private without a word; it is refused before anything is written, naming both sources."""
    (tmp_path / "job.toml").write_text("[train]\nepsilon = 2.0\n")
    r = CliRunner().invoke(app, ["run", "--config", str(tmp_path / "job.toml"), "--set", "train.no_dp=true",
                                 "--out", str(tmp_path / "jr0"), "--json"])
    assert r.exit_code == 2, r.output
    err = _json(r)["error"]
    assert err.startswith(f"{tmp_path / 'job.toml'} sets train.epsilon = 2.0 and --set train.no_dp=true turns DP off: "
                          "a job is never silently run without the privacy it asks for (nothing was done)")
    assert "--set train.epsilon=none" in err and "for a private run drop --set train.no_dp=true" in err
    assert not (tmp_path / "jr0").exists()


def test_run_into_a_folder_it_cannot_write_is_refused_before_embedding(tmp_path, monkeypatch):
    """A probe's `fedhype run` into a read-only --out embedded and partitioned, then failed at train with
    "Read-only file system". /proc takes no new file (even for root); a read-only mount is simulated (the tests may
    run as root, for whom permission bits do not stop a write), as tests/cli/test_out_overwrite.py does."""
    from read_only import simulate_read_only  # tests/read_only.py

    import fedhype.pipeline.job as job

    def no_embedding(*a, **k):
        raise AssertionError("embedded before the --out folder was checked")

    monkeypatch.setattr(job, "_embed_store", no_embedding)
    r = CliRunner().invoke(app, ["run", "--out", "/proc/fedhype-job", "--json"])
    assert r.exit_code == 2 and _json(r)["error"].startswith("--out /proc/fedhype-job: cannot write into /proc ("), r.output
    assert not __import__("os").path.exists("/proc/fedhype-job")

    simulate_read_only(monkeypatch, tmp_path)
    (tmp_path / "ro").mkdir()
    for out, above in ((tmp_path / "ro" / "jr0", tmp_path / "ro"), (tmp_path / "ro", tmp_path / "ro")):
        r = CliRunner().invoke(app, ["run", "--out", str(out), "--json"])
        assert r.exit_code == 2, r.output
        assert _json(r)["error"] == (f"--out {out}: cannot write into {above} (Read-only file system); give an --out "
                                     "in a folder you can write to (nothing was done)")
        assert "embed:" not in r.stderr
    assert list((tmp_path / "ro").iterdir()) == []


def test_run_names_the_partition_field_at_fault(tmp_path):
    """A probe's `--set 'partition.fractions=[0.5,0.5]'` printed "error:  (scheme = 'domain', clients = 0): …": the
    label "[partition]" was eaten as console markup, and no client count had been asked."""
    r = CliRunner().invoke(app, ["run", "--set", "partition.fractions=[0.5,0.5]", "--out", str(tmp_path / "jr0")])
    assert r.exit_code == 2
    assert ("error: partition.fractions = [0.5, 0.5]: give three fractions, train, val and test, each ≥ 0 with train "
            "> 0, summing to 1 (e.g. [0.6, 0.2, 0.2]); nothing was embedded") in " ".join(r.output.split()), r.output
    assert "clients = 0" not in r.output and not (tmp_path / "jr0").exists()


@pytest.mark.parametrize("no_dp", [True, False])
def test_an_interrupted_run_speaks_of_charges_only_when_private(tmp_path, monkeypatch, no_dp):
    import fedhype.pipeline.job as job
    from fedhype.cli.common import INTERRUPTED_TRAINING
    from fedhype.cli.run_cmd import INTERRUPTED_NON_PRIVATE

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "run_job", ctrl_c)
    r = CliRunner().invoke(app, ["run", "--out", str(tmp_path / "jr0"), "--json",
                                 *(["--set", "train.no_dp=true"] if no_dp else [])])
    assert r.exit_code == 130, r.output
    err = _json(r)["error"]
    assert err == (INTERRUPTED_NON_PRIVATE if no_dp else INTERRUPTED_TRAINING)
    assert ("charged again" in err) is not no_dp and ("nothing is charged" in err) is no_dp


def test_a_statistics_only_job_says_what_it_ran_and_which_settings_did_nothing(tmp_path):
    """A new user's probe of `--method no-dp-sgd`: `fedhype run` had no --method, announced "train (5 rounds)" and ran
    none, took --set train.rounds=5 / clip_norm silently, drew empty training curves and named the method dp-gaussian."""
    args = ["run", "--out", str(tmp_path / "job"), "--json", "--method", "no-dp-sgd",
            "--set", f"data.limit={REAL_STORE['limit']}", "--set", f"data.image_size={REAL_STORE['image_size']}",
            "--set", f"data.cache_dir=\"{TEST_CACHE / 'embeddings'}\"", "--set", "train.rounds=5",
            "--set", "train.clip_norm=0.7", "--set", "train.seed=0", "--set", "evaluate.permutations=10",
            "--set", "evaluate.prototypes=false", "--set", "evaluate.dp_linear=false", *SMALL_MODEL_SET]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    rep = _json(r)
    assert rep["method"] == "no-dp-sgd" and rep["rounds"] == 0 and 0.99 < rep["epsilon"] <= 1.0
    # no round ran: no clipping norm C (given 0.7 here) and no per-round traffic claimed
    assert rep["clip_norm"] is None and rep["dp_sgd_stage_off"] is None
    assert rep["traffic"]["upload_bytes_per_round"] == 0 == rep["traffic"]["download_bytes_per_round"]
    assert rep["traffic"]["note"].startswith("no DP-SGD round ran") and rep["traffic"]["generated_parameters_per_client"] > 0
    assert "run: embed → partition → train (the statistics release, no DP-SGD round) → synthesize" in r.stderr
    assert ("train: warning: train.method = 'no-dp-sgd' runs no DP-SGD round (the statistics release takes the whole "
            "ε): train.rounds, train.clip_norm have no effect") in r.stderr
    assert "train: 4 clients release their DP class statistics (latent size L = 8)" in r.stderr
    md = (tmp_path / "job" / "report.md").read_text()
    assert "no DP-SGD round: the model is the release itself (no-dp-sgd)" in md and "(dp-gaussian)" not in md
    assert ("for what `release/` holds — the statistics release alone, no DP-SGD round (`--method no-dp-sgd`). "
            in md.split("## Details")[0])  # At a glance
    assert "training.png" not in md and "Per-round −ELBO" not in md and "floor a trained generator" not in md
    assert not (tmp_path / "job" / "plots" / "training.png").exists()
    assert rep["plots"] == [str(tmp_path / "job" / "plots" / "projection.png")]
    # the DP linear reference switched on after training: the job says it is a release of its own, at its own ε
    ledger = (tmp_path / "job" / "run" / "ledger.json").read_bytes()
    r = CliRunner().invoke(app, [a if a != "evaluate.dp_linear=false" else "evaluate.dp_linear=true" for a in args])
    assert r.exit_code == 0, r.output
    assert "(evaluate.dp_linear: False → True): the training keeps its settings" in r.stderr
    assert "evaluate.dp_linear trains the DP linear reference now, a separate release at its own ε" in r.stderr
    assert (tmp_path / "job" / "run" / "ledger.json").read_bytes() == ledger
    assert 0.9 < _json(r)["dp_fedavg_linear_epsilon"] <= 1.0 and (tmp_path / "job" / "dp_linear" / "ledger.json").exists()
    # --method and --set train.method name the same setting: the flag is the shortcut, as --secure-aggregation
    bad = CliRunner().invoke(app, ["run", "--out", str(tmp_path / "x"), "--method", "no_dp_sgd"])
    assert bad.exit_code == 2 and "no-dp-sgd" in bad.output and not (tmp_path / "x").exists()


def test_train_of_a_statistics_only_method_names_the_sigma_it_released_at(files, tmp_path):
    """A probe: `--method no-dp-sgd --noise-multiplier 2 --class-stats-noise-multiplier 5` said "σ = 2" and released
    at σ₀ = 5; the ledger is the judge."""
    r = CliRunner().invoke(app, ["train", "--store", str(files / "emb.safetensors"), "--partition",
                                 str(files / "part.json"), "--out", str(tmp_path / "run"), "--method", "dp-gaussian",
                                 "--noise-multiplier", "2", "--class-stats-noise-multiplier", "5", "--seed", "0"])
    assert r.exit_code == 0, r.output
    assert "(dp-gaussian, release σ₀ = 5, δ = 0.0001)" in r.stderr and "σ = 2" not in r.stderr
    assert "train.noise_multiplier has no effect" in r.stderr
    assert "release σ₀" in r.stdout and "upload bytes/round" not in r.stdout  # no round: no per-round traffic
    from fedhype.privacy.ledger import PrivacyLedger

    sigmas = {e.mechanism: e.noise_multiplier for e in PrivacyLedger.load(tmp_path / "run" / "ledger.json").events}
    assert sigmas["dp-class-stats"] > 5.0 and "dp-sgd" not in sigmas  # σ₀ = 5 split with the centre step


def test_train_json_of_a_run_without_a_round_claims_no_clip_norm_and_no_round_traffic(files, tmp_path):
    """`fedhype train --json` (the TrainResult) of a run with no DP-SGD round carried C = 1.5 (here the 0.7 given) and
    the model's bytes per round, where report.json already said none: the result itself says none now."""
    from fedhype.federated.result import NO_ROUND_TRAFFIC

    r = CliRunner().invoke(app, ["train", "--store", str(files / "emb.safetensors"), "--partition",
                                 str(files / "part.json"), "--out", str(tmp_path / "run"), "--method", "no-dp-sgd",
                                 "--clip-norm", "0.7", "--seed", "0", "--json"])
    assert r.exit_code == 0, r.output
    res = _json(r)
    assert res["rounds"] == 0 == res["rounds_planned"] and res["method"] == "no-dp-sgd"
    assert res["clip_norm"] is None and res["noise_multiplier"] is None
    assert res["traffic"]["upload_bytes_per_round"] == 0 == res["traffic"]["download_bytes_per_round"]
    assert res["traffic"]["note"] == NO_ROUND_TRAFFIC and res["traffic"]["generated_parameters_per_client"] > 0
    assert "train.clip_norm has no effect" in r.stderr


def test_the_default_job_on_small_clients_runs_without_the_dp_sgd_stage_and_says_why(tmp_path, monkeypatch):
    """The shipped rule (docs/method.md, decision 22): the default method on clients whose median has fewer than
    train.dp_sgd_min_records training records runs the no-dp-sgd model; run, train's log and the report say why."""
    from conftest import SHIPPED_DP_SGD_MIN_RECORDS

    from fedhype.federated import config

    monkeypatch.setattr(config, "DEFAULT_DP_SGD_MIN_RECORDS", SHIPPED_DP_SGD_MIN_RECORDS)
    args = ["run", "--out", str(tmp_path / "job"), "--json",
            "--set", f"data.limit={REAL_STORE['limit']}", "--set", f"data.image_size={REAL_STORE['image_size']}",
            "--set", f"data.cache_dir=\"{TEST_CACHE / 'embeddings'}\"", "--set", "train.rounds=3",
            "--set", "train.seed=0", "--set", "evaluate.permutations=10",
            "--set", "evaluate.prototypes=false", "--set", "evaluate.dp_linear=false", *SMALL_MODEL_SET]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    rep = _json(r)
    assert rep["method"] == "no-dp-sgd" and rep["rounds"] == 0 and 0.99 < rep["epsilon"] <= 1.0
    k = f"{SHIPPED_DP_SGD_MIN_RECORDS:,}"
    assert (f"train (3 rounds if the median client has ≥ {k} training records, else the statistics release alone)"
            in r.stderr)
    why = f"the median client has 108 training records, fewer than train.dp_sgd_min_records = {k}"
    assert f"train: {why}" in r.stderr
    assert ("train: warning: no DP-SGD round runs (the median client is below train.dp_sgd_min_records" in r.stderr
            and "train.rounds has no effect" in r.stderr)
    assert rep["dp_sgd_stage_off"].startswith(why)
    assert rep["clip_norm"] is None and rep["traffic"]["upload_bytes_per_round"] == 0
    assert rep["traffic"]["download_bytes_per_round"] == 0 and rep["traffic"]["note"].startswith("no DP-SGD round ran")
    md = (tmp_path / "job" / "report.md").read_text()
    assert f"This model is the one-shot statistics release itself, with no DP-SGD round: {why}" in md
    glance_md = md.split("## Details")[0]  # At a glance says it too, shortly
    assert f"for what `release/` holds — the statistics release alone, no DP-SGD round ({why}). " in glance_md
    assert "decision 22" not in glance_md
    assert json.loads((tmp_path / "job" / "config.json").read_text())["train"]["method"] == "fedhypevae"
    assert json.loads((tmp_path / "job" / "run" / "config.json").read_text())["train"]["method"] == "no-dp-sgd"


def test_run_without_dp_announces_no_training_round(tmp_path, monkeypatch):
    """Without DP ours trains no round (docs/method.md, decision 25): run's plan line says so, not the DP rule's
    "3 rounds if the median client has ≥ 1,500 training records"."""
    import fedhype.pipeline.job as job
    from fedhype.errors import ValidationError

    def stop(*a, **k):
        raise ValidationError("stopped after the plan line")

    monkeypatch.setattr(job, "run_job", stop)
    r = CliRunner().invoke(app, ["run", "--out", str(tmp_path / "job"), "--set", "train.no_dp=true",
                                 "--set", "train.epsilon=none", "--set", "train.dp_sgd_min_records=1500"])
    assert r.exit_code == 2 and "stopped after the plan line" in r.output
    assert "run: embed → partition → train (the exact statistics, no training round) → synthesize" in r.stderr
    assert "if the median client" not in r.stderr


def test_train_and_budget_name_the_stage_rule(files, tmp_path, monkeypatch):
    r = CliRunner().invoke(app, ["train", "--store", str(files / "emb.safetensors"), "--partition",
                                 str(files / "part.json"), "--out", str(tmp_path / "run"), "--epsilon", "4",
                                 "--dp-sgd-min-records", "100000", "--seed", "0"])
    assert r.exit_code == 0, r.output
    assert "train: the statistics release alone (no DP-SGD round) over" in r.stderr and "(no-dp-sgd, target ε = 4" in r.stderr
    assert "fewer than train.dp_sgd_min_records = 100,000" in r.stderr
    from fedhype.privacy.ledger import PrivacyLedger

    assert "dp-sgd" not in {e.mechanism for e in PrivacyLedger.load(tmp_path / "run" / "ledger.json").events}
    # the resume of that run under the same flag finds it finished; budget plans DP-SGD rounds and says train's
    # default would not run them for these sizes
    again = CliRunner().invoke(app, ["train", "--store", str(files / "emb.safetensors"), "--partition",
                                     str(files / "part.json"), "--out", str(tmp_path / "run"), "--epsilon", "4",
                                     "--dp-sgd-min-records", "100000", "--seed", "0", "--resume"])
    assert again.exit_code == 0 and "is finished (its statistics release" in again.stderr, again.output
    from conftest import SHIPPED_DP_SGD_MIN_RECORDS

    from fedhype.federated import config

    monkeypatch.setattr(config, "DEFAULT_DP_SGD_MIN_RECORDS", SHIPPED_DP_SGD_MIN_RECORDS)
    b = CliRunner().invoke(app, ["budget", "--client-sizes", "900,1000,800", "--epsilon", "1", "--json"])
    assert b.exit_code == 0, b.output
    (w,) = [w for w in json.loads(b.stdout)["warnings"] if "no DP-SGD round" in w]
    assert w.startswith("with these sizes `fedhype train` runs no DP-SGD round by default: the median client has 900")
    # the σ₀ it names is the one train releases at (the run above: ε = 4 on the partition's sizes)
    b = CliRunner().invoke(app, ["budget", "--partition", str(files / "part.json"), "--epsilon", "4", "--json"])
    (w,) = [w for w in json.loads(b.stdout)["warnings"] if "no DP-SGD round" in w]
    s0 = float(w.split("releases the statistics alone at σ₀ = ")[1].split(" ")[0])
    ran = json.loads((tmp_path / "run" / "config.json").read_text())["privacy_plan"]["class_stats_noise_multiplier"]
    assert s0 == pytest.approx(ran, rel=1e-3)
    # and the run it makes comes first, with its ε (a probe read the DP-SGD plan's σ and steps as the run's)
    dflt = json.loads(b.stdout)["default_run"]
    assert dflt["statistics_only"] is True and dflt["class_stats_noise_multiplier"] == pytest.approx(ran, rel=1e-6)
    assert 3.99 < dflt["epsilon"] <= 4.0
    b = CliRunner().invoke(app, ["budget", "--partition", str(files / "part.json"), "--epsilon", "4"])
    head = " ".join(b.output.split())
    assert head.startswith("by default `fedhype train` runs no DP-SGD round with these sizes: it releases the class "
                           f"statistics alone at σ₀ = {dflt['class_stats_noise_multiplier']:.4g}")
    assert "the DP-SGD stage's plan (--dp-sgd-min-records 0): privacy budget per client" in head
    b = CliRunner().invoke(app, ["budget", "--client-sizes", "4000,5000,3000", "--epsilon", "1", "--json"])
    assert not [w for w in json.loads(b.stdout)["warnings"] if "no DP-SGD round" in w]
    assert "default_run" not in json.loads(b.stdout)
    # budget takes train's --dp-sgd-min-records: 0 plans the stage without the note, a lower bound keeps the stage,
    # and the plan's rows do not change with it (the same σ and ε as with the note)
    noted = json.loads(CliRunner().invoke(app, ["budget", "--client-sizes", "900,1000,800", "--epsilon", "1",
                                                "--json"]).stdout)
    for value in ("0", "850"):
        b = CliRunner().invoke(app, ["budget", "--client-sizes", "900,1000,800", "--epsilon", "1",
                                     "--dp-sgd-min-records", value, "--json"])
        out = json.loads(b.stdout)
        assert b.exit_code == 0 and "default_run" not in out, (value, b.output)
        assert not [w for w in out["warnings"] if "no DP-SGD round" in w]
        assert (out["noise_multiplier"], out["epsilon"]) == (noted["noise_multiplier"], noted["epsilon"])
    b = CliRunner().invoke(app, ["budget", "--client-sizes", "900,1000,800", "--epsilon", "1",
                                 "--dp-sgd-min-records", "901", "--json"])
    assert "train.dp_sgd_min_records = 901" in json.loads(b.stdout)["default_run"]["reason"]
    b = CliRunner().invoke(app, ["budget", "--client-sizes", "900,1000,800", "--epsilon", "1",
                                 "--dp-sgd-min-records", "-1"])
    assert b.exit_code == 2 and "--dp-sgd-min-records must be an integer ≥ 0" in " ".join(b.output.split()), b.output
