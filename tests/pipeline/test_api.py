"""The high-level Python API (fedhype.FedHypeVAE, embed, partition, evaluate): the README's notebook block runs."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REAL_STORE, TEST_CACHE

import fedhype
from fedhype.errors import ValidationError

ROOT = Path(__file__).resolve().parents[2]


def readme_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python API"):text.index("## Privacy model")]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_notebook_block_runs_and_reports_the_accountants_epsilon(tmp_path, monkeypatch, real_store):
    code = readme_block()
    assert 'fedhype.embed("digits-domains")' in code and "FedHypeVAE(epsilon=4.0, seed=0)" in code
    # the same block on the shared 800-image test store (already embedded), everything else as written
    code = code.replace('fedhype.embed("digits-domains")',
                        f'fedhype.embed("digits-domains", limit={REAL_STORE["limit"]}, image_size={REAL_STORE["image_size"]}, '
                        f'cache_dir={str(TEST_CACHE / "embeddings")!r}, progress=False)')
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "README.md", "exec"), ns)
    out = buf.getvalue()
    gen, syn = ns["gen"], ns["syn"]
    spent = gen.privacy_spent()
    # ε is the ledger's, recomputed by the accountant, at the target for the steps run
    from fedhype.privacy.ledger import PrivacyLedger

    ledger = PrivacyLedger.load(gen.run_dir_ / "ledger.json")
    assert spent.epsilon == pytest.approx(max(ledger.epsilons().values()))
    assert 3.9 <= spent.epsilon <= 4.0 and spent.private and spent.delta == 1e-4
    assert set(spent.mechanisms) == {"dp-release-centre", "dp-class-stats", "dp-sgd"} and len(spent.per_client) == 4
    assert f"ε = {spent.epsilon:.3f}" in out
    # seed=0: the API says what the release's privacy.json and the audit say (a probe saw only the claim)
    assert spent.noise_seeded and "SEEDED noise" in out and "not to be shared as private" in str(spent)
    tstr = float(re.search(r"TSTR accuracy ([0-9.]+)", out).group(1))
    assert tstr > 0.25  # chance 0.10 over the 10 digits
    assert len(syn) == 300 * 10 and syn.meta["private"] and syn.meta["epsilon"] == pytest.approx(spent.epsilon)
    # only the shareable files leave the run directory
    saved = tmp_path / "shared" / "model"
    assert sorted(os.listdir(saved)) == ["README.md", "checkpoint.json", "config.json", "ledger.json", "model.safetensors",
                                     "privacy.json"]
    # a temporary run keeps no private client state, checkpoints or non-DP diagnostics once trained
    assert not (gen.run_dir_ / "clients").exists() and not (gen.run_dir_ / "ckpt").exists()
    assert not (gen.run_dir_ / "metrics.json").exists() and (gen.run_dir_ / "ledger.json").is_file()
    back = fedhype.FedHypeVAE.load(saved)
    assert back.privacy_spent() == spent
    from fedhype.eval.audit_ledger import audit_run

    assert audit_run(saved)["consistent"]  # the recipient can check the claim
    again = back.sample(per_class=5, seed=3)
    assert again.embeddings.shape == (50, real_store.dim)
    assert (gen.sample(per_class=5, seed=3).embeddings == again.embeddings).all()  # the same model
    # the temporary run folder goes with its object (CI's /tmp collected one per run); what save() wrote stays
    temporary = gen.run_dir_.parent
    assert temporary.name.startswith("fedhype-run-") and temporary.is_dir()
    del gen, ns
    gc.collect()
    assert not temporary.exists() and (saved / "model.safetensors").is_file()


def test_defaults_are_fedhype_runs():
    from fedhype.pipeline.config import resolve, train_config

    assert fedhype.FedHypeVAE().train_config == train_config(resolve())
    g = fedhype.FedHypeVAE(epsilon=8.0, rounds=3, train={"local_epochs": 1.0}, model={"latent": 32})
    assert (g.train_config.epsilon, g.train_config.rounds, g.train_config.local_epochs) == (8.0, 3, 1.0)
    assert g.train_config.model["latent"] == 32
    assert fedhype.FedHypeVAE(noise_multiplier=2.0).train_config.epsilon is None  # σ given: ε is reported, not targeted


def test_bad_arguments_are_refused_with_the_name():
    with pytest.raises(ValidationError, match="FedHypeVAE: epochs"):
        fedhype.FedHypeVAE(train={"epochs": 3})
    with pytest.raises(ValidationError, match="rounds must be a number"):
        fedhype.FedHypeVAE(rounds="8")
    with pytest.raises(ValidationError, match="asks for privacy but train.no_dp"):
        fedhype.FedHypeVAE(no_dp=True, epsilon=4.0)
    with pytest.raises(ValidationError, match="method"):
        fedhype.FedHypeVAE(method="gan")
    for seed in ("abc", 1.5, 2 ** 70, -1):  # a probe: these crashed inside torch after config.json was written
        with pytest.raises(ValidationError, match="train.seed must be a whole number"):
            fedhype.FedHypeVAE(seed=seed)
        with pytest.raises(ValidationError, match="train.seed must be a whole number"):
            fedhype.FedHypeVAE(train={"seed": seed})
    g = fedhype.FedHypeVAE()
    with pytest.raises(ValidationError, match="call fit"):
        g.sample()
    with pytest.raises(ValidationError, match="call fit"):
        g.privacy_spent()


def test_save_refuses_an_existing_folder_and_leaves_nothing_half_written(audit_run, tmp_path):
    run, _ = audit_run
    g = fedhype.FedHypeVAE.load(run)
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValidationError, match="exists"):
        g.save(tmp_path / "taken")
    assert g.save(tmp_path / "new").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "taken"]  # no temporary folder left
    assert fedhype.FedHypeVAE.load(tmp_path / "new").privacy_spent().epsilon == pytest.approx(
        g.privacy_spent().epsilon)


def test_privacy_spent_does_not_take_a_cheaper_ledger_put_beside_the_model(audit_run, tmp_path):
    """A helper copied another run's ledger.json (ε = 2) into a release of an ε = 8 model: privacy_spent() said
    ε = 2 without a word, while sample() warned. A valid ledger that records less than the model's metadata now
    gives the model's figure, with a warning naming both."""
    from fedhype.errors import FedhypeWarning
    from fedhype.privacy.ledger import PrivacyLedger

    run, _ = audit_run
    g = fedhype.FedHypeVAE.load(run)
    full = g.privacy_spent().epsilon
    rel = g.save(tmp_path / "rel")
    led = PrivacyLedger.load(rel / "ledger.json")
    cheap = PrivacyLedger(led.delta, led.meta)
    for e in led.events[: len(led.events) // 2]:  # a shorter, valid chain: another (cheaper) run's record
        cheap.record(e)
    (rel / "ledger.json").unlink()
    cheap.save(rel / "ledger.json")
    assert max(cheap.epsilons().values()) < full * 0.9
    with pytest.warns(FedhypeWarning, match="the model's metadata says ε = .* more than its run's ledger.json"):
        spent = fedhype.FedHypeVAE.load(rel).privacy_spent()
    assert spent.epsilon == pytest.approx(full, rel=1e-6)


def test_evaluation_is_typed_and_keeps_every_metric(real_store):
    part = fedhype.partition(real_store, scheme="iid", clients=2)
    test, train = part.split_store(real_store, "test"), part.split_store(real_store, "train")
    with pytest.warns(fedhype.errors.FedhypeWarning, match="synthetic= is marked kind='real', not 'synthetic'"):
        ev = fedhype.evaluate(test, train, real_train=train, permutations=0)  # a real-vs-real reference, said so
    assert isinstance(ev, fedhype.Evaluation)
    # chance is the best constant guess, the test split's majority-class share, as the job's report gives it (a
    # helper read 0.200 = 1/K here and 0.264 in the report)
    import torch

    assert ev.chance == pytest.approx(float(torch.bincount(test.labels.long()).max()) / len(test))
    assert ev.tstr_accuracy == ev.trtr_accuracy > 0.6
    # the whole store, test records included, as the synthetic side: refused (a helper read TSTR 1.000 under a warning)
    with pytest.raises(fedhype.errors.ValidationError, match=f"holds {len(test)} of the {len(test)} records of real_test="):
        fedhype.evaluate(test, real_store, permutations=0)
    # ... and the same records under other names, as a re-embedded renamed copy is (a helper's TSTR 1.000)
    import dataclasses

    renamed = dataclasses.replace(test, sample_ids=[f"copy/{i}" for i in test.sample_ids],
                                  embeddings=test.embeddings * (1 + 1e-7))
    with pytest.raises(fedhype.errors.ValidationError, match="the same images embedded again"):
        fedhype.evaluate(test, renamed, permutations=0)
    # the test split given as the training one too (a helper read TRTR 1.0 without a word)
    with pytest.warns(fedhype.errors.FedhypeWarning, match=f"share {len(test)} of the test's {len(test)} records"):
        fedhype.evaluate(test, train, real_train=test, permutations=0)
    keep = [i for i, y in enumerate(test.labels.tolist()) if y == 0 or i % 2 == 0]  # class 0 whole, the others halved
    uneven = test.subset(keep)
    with pytest.warns(fedhype.errors.FedhypeWarning):
        ev2 = fedhype.evaluate(uneven, train, permutations=0)
    share = float(torch.bincount(uneven.labels.long()).max()) / len(uneven)
    assert share > 0.1 and ev2.chance == pytest.approx(share)
    d = ev.to_dict()
    assert d["tstr_accuracy"] == ev.tstr_accuracy and d["chance"] == ev.chance and "per_domain" in d
    assert ev.mmd2_p_value is None and "TSTR accuracy" in str(ev)


def test_import_is_light_and_the_package_is_typed():
    r = subprocess.run([sys.executable, "-c", "import fedhype, sys; print('torch' in sys.modules, sorted(dir(fedhype)))"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("False")  # the API is imported on first use
    assert "FedHypeVAE" in r.stdout and "evaluate" in r.stdout
    assert (Path(fedhype.__file__).parent / "py.typed").is_file()
    with pytest.raises(AttributeError):
        fedhype.no_such_thing  # noqa: B018


def test_a_resume_with_a_partition_drawn_again_says_so(real_store, tmp_path):
    """A probe: an API script rebuilding its partition after an interruption was told only that the configuration
    differs (partition.keys): ``fedhype.partition`` draws new random keys on every call."""
    kw = dict(epsilon=4.0, rounds=1, out=str(tmp_path / "run"), train={"local_steps": 1, "batch_size": 16},
              model={"hidden": 16, "latent": 4})
    first = fedhype.partition(real_store, scheme="iid", clients=2)
    first.save(tmp_path / "part.json")
    fedhype.FedHypeVAE(**kw).fit(real_store, first)
    with pytest.raises(ValidationError, match="drawn again.*Partition.load"):
        fedhype.FedHypeVAE(**kw).fit(real_store, fedhype.partition(real_store, scheme="iid", clients=2), resume=True)
    from fedhype.data.partition import Partition

    again = fedhype.FedHypeVAE(**kw).fit(real_store, Partition.load(tmp_path / "part.json"), resume=True)
    assert again.privacy_spent().epsilon == pytest.approx(fedhype.FedHypeVAE.load(tmp_path / "run").privacy_spent().epsilon)


def test_the_api_warns_what_the_cli_prints(real_store, tmp_path):
    """A probe's notebook got none of the CLI's warnings: a batch at or above every client's training set (q = 1, no
    amplification by subsampling), classes the release cannot tell from absent, an ε above its target. The API raises
    them as :class:`fedhype.errors.FedhypeWarning`."""
    import warnings

    from fedhype.errors import FedhypeWarning
    from fedhype.pipeline.api import _above_target_note

    clients = fedhype.partition(real_store, scheme="iid", clients=2, seed=0)
    n = max(len(c.train) for c in clients.clients)
    g = fedhype.FedHypeVAE(epsilon=1.0, rounds=1, seed=0, train={"local_steps": 1, "batch_size": n},
                           model={"hidden": 16, "latent": 4})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g.fit(real_store, clients)
        syn = g.sample(per_class=5)
    said = [str(x.message) for x in w if issubclass(x.category, FedhypeWarning)]
    assert any(s.startswith(f"batch_size={n} is at least the training-set size") for s in said), said
    # at ε = 1 on 2 clients of ~240 records several classes are not told from absent: the store's note, warned
    assert syn.meta.get("absent_classes") and any("cannot tell from absent" in s for s in said), said

    class Result:
        epsilon = 1.0061

    cfg = g.train_config
    assert "above the target 1" in _above_target_note(Result(), cfg)
    Result.epsilon = 0.9998
    assert _above_target_note(Result(), cfg) is None


def test_the_api_warns_of_round_settings_a_statistics_only_method_ignores(real_store, tmp_path):
    """A probe's `FedHypeVAE(method="no-dp-sgd", rounds=5)` fitted silently with 0 rounds."""
    import warnings

    from fedhype.errors import FedhypeWarning

    clients = fedhype.partition(real_store, scheme="iid", clients=2, seed=0)
    g = fedhype.FedHypeVAE(epsilon=4.0, rounds=5, seed=0, method="no-dp-sgd", model={"hidden": 16, "latent": 4})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g.fit(real_store, clients)
    said = [str(x.message) for x in w if issubclass(x.category, FedhypeWarning)]
    assert [s for s in said if "train.rounds has no effect" in s] and g.privacy_spent().epsilon <= 4.0
    assert not [s for s in said if "is at least the training-set size" in s]  # q = 1 does not apply without rounds


def test_a_loaded_run_keeps_its_model_settings_and_resumes(real_store, tmp_path):
    """A helper: FedHypeVAE.load(run) of an interrupted run with model={"latent": 32} lost the [model] settings, so
    fit(..., resume=True) — what the refusal of a plain fit advises — was refused as another configuration."""
    part = fedhype.partition(real_store, scheme="iid", clients=2)
    kw = dict(epsilon=4.0, rounds=2, out=str(tmp_path / "run"), train={"local_steps": 1, "batch_size": 16,
                                                                       "dp_sgd_min_records": 0},
              model={"hidden": 16, "latent": 4})

    def stop(m):  # interrupted once the first round is committed
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fedhype.FedHypeVAE(**kw).fit(real_store, part, progress=stop)
    g = fedhype.FedHypeVAE.load(tmp_path / "run")
    assert g.config["model"]["latent"] == 4 and g.config["model"]["hidden"] == 16
    with pytest.raises(ValidationError, match="resume=True"):
        g.fit(real_store, part)
    g.fit(real_store, part, resume=True)
    assert g.result_["complete"] and json.loads((tmp_path / "run" / "checkpoint.json").read_text())["rounds_done"] == 2
