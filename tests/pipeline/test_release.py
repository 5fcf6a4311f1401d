"""The release folder holds only DP outputs and public bookkeeping, and a recipient can audit it."""

from __future__ import annotations

import json
import os

import pytest
import torch

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, ValidationError
from fedhype.eval.audit_ledger import audit_run
from fedhype.eval.audit_ledger import audit_run as audit_run_fn
from fedhype.io import DIGEST_KEY, load_tensors
from fedhype.pipeline.release import write_release
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.synthesis import synthesize


@pytest.fixture
def released(audit_run, tmp_path):
    run, _ = audit_run
    syn = synthesize(run, "neutral", per_class=20, seed=1)
    syn.save(tmp_path / "syn.safetensors")
    return run, write_release(run, tmp_path / "release", synthetic=tmp_path / "syn.safetensors")


def test_release_holds_exactly_the_shareable_files_and_recomputes_epsilon(released):
    run, rel = released
    assert sorted(os.listdir(rel)) == ["README.md", "checkpoint.json", "config.json", "ledger.json", "model.safetensors",
                                       "privacy.json", "synthetic.safetensors"]
    priv = json.loads((rel / "privacy.json").read_text())
    eps = PrivacyLedger.load(run / "ledger.json").epsilons()
    assert priv["epsilon"] == pytest.approx(max(eps.values())) and priv["private"] is True
    assert sorted(priv["epsilon_per_client"].values()) == pytest.approx(sorted(eps.values()))
    # no figure computed on real records outside the DP path
    assert not {"tstr_accuracy", "mmd2", "trtr_accuracy", "diagnostics_not_dp"} & set(priv)
    assert "metrics.json" not in os.listdir(rel) and not (rel / "clients").exists()
    assert set(priv["files"]) == {"model.safetensors", "ledger.json", "config.json", "checkpoint.json", "synthetic.safetensors"}
    # the test run is seeded: the release says it must not be shared as private
    assert priv["noise_seeded"] and "must not be shared as private" in priv["warning"]
    assert "must not be shared as private" in (rel / "README.md").read_text()


def test_nothing_in_the_release_equals_a_real_embedding(released, real_store):
    _, rel = released
    real = torch.nn.functional.normalize(real_store.embeddings, dim=-1)
    syn = EmbeddingStore.load(rel / "synthetic.safetensors").embeddings
    tensors = [syn] + [t.reshape(-1, t.shape[-1]) for t in load_tensors(rel / "model.safetensors", what="model").values()
                       if t.ndim >= 2 and t.shape[-1] == real.shape[1]]
    for t in tensors:
        cos = torch.nn.functional.normalize(t.float(), dim=-1) @ real.T
        assert float(cos.max()) < 0.999  # no row of the release is a real record


def test_a_recipient_can_audit_the_release(released):
    _, rel = released
    res = audit_run(rel, synthetic=[rel / "synthetic.safetensors"])
    assert res["consistent"] and res["ledger_ok"] and res["mismatches"] == []


def test_release_refuses_what_it_must_not_overwrite_or_copy(released, audit_run, tmp_path, real_store):
    run, rel = released
    with pytest.raises(ValidationError, match="exists"):
        write_release(run, rel)
    (tmp_path / "other").mkdir()
    with pytest.raises(ValidationError, match="not a fedhype release"):
        write_release(run, tmp_path / "other", overwrite=True)
    assert write_release(run, rel, overwrite=True) == rel and not (rel / "synthetic.safetensors").exists()
    real_store.save(tmp_path / "real.safetensors")
    with pytest.raises(ArtifactError, match="not a synthetic store drawn from"):
        write_release(run, tmp_path / "r2", synthetic=tmp_path / "real.safetensors")
    assert not (tmp_path / "r2").exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # nothing half-written beside the releases


def _audit_cli(rel, *extra):
    from typer.testing import CliRunner

    from fedhype.cli.main import app

    out = CliRunner().invoke(app, ["audit", "--run", str(rel), "--json", *extra])
    return out.exit_code, json.loads(out.stdout)


@pytest.mark.parametrize("edit", ["privacy.json epsilon", "privacy.json seed note", "config.json", "README.md warning",
                                  "missing checkpoint", "privacy.json rounds", "privacy.json mechanisms",
                                  "privacy.json method", "privacy.json accountant", "privacy.json extra claim",
                                  "privacy.json {}", "privacy.json []", "real store as synthetic"])
def test_fedhype_audit_refuses_a_release_whose_own_files_were_edited(released, tmp_path, edit, real_store):
    """A new user's probe: a release with privacy.json's ε lowered, its seeded-noise note removed, config.json edited
    or the README's warning deleted passed `fedhype audit` (exit 0, consistent). privacy.json lists every file's
    SHA-256 and is recomputed from the model and ledger, and the README is the text the release writes: each edit
    now exits 4 naming what changed. The untouched release audits clean, with the seeded-noise warning."""
    import shutil

    _, rel = released
    code, res = _audit_cli(rel)
    assert code == 0 and res["consistent"] and res["release"] and res["noise_seeded"]
    assert any("the noise was seeded" in w for w in res["warnings"])
    names = {r["name"] for r in res["checked"]}
    assert {"privacy.json: epsilon", "privacy.json: files[config.json] sha256", "README.md"} <= names
    bad = tmp_path / "edited"
    shutil.copytree(rel, bad)
    priv = json.loads((bad / "privacy.json").read_text())
    if edit == "privacy.json epsilon":
        priv["epsilon"] = 0.05
        priv["epsilon_per_client"] = {c: 0.05 for c in priv["epsilon_per_client"]}
        (bad / "privacy.json").write_text(json.dumps(priv))
        want = "privacy.json: epsilon"
    elif edit == "privacy.json seed note":
        priv["noise_seeded"] = False
        priv.pop("warning")
        (bad / "privacy.json").write_text(json.dumps(priv))
        want = "privacy.json: noise_seeded"
    elif edit == "config.json":
        conf = json.loads((bad / "config.json").read_text())
        conf["train"]["seed"] = None
        (bad / "config.json").write_text(json.dumps(conf))
        want = "config.json: edited after it was written"  # its seal (config_sha256), before any other check
    elif edit == "README.md warning":
        text = (bad / "README.md").read_text()
        (bad / "README.md").write_text("\n".join(x for x in text.splitlines() if "must not be shared" not in x))
        want = "README.md"
    elif edit == "missing checkpoint":
        (bad / "checkpoint.json").unlink()
        want = "privacy.json: files[checkpoint.json] sha256"
    elif edit == "real store as synthetic":
        # a new user's probe: the real embeddings copied over synthetic.safetensors, its SHA-256 updated in the
        # (unsigned) privacy.json: a real store carries no ε, its checks had nothing to compare, and the audit passed
        import hashlib

        real_store.save(tmp_path / "real.safetensors")  # (store.save refuses a release folder: copied in by hand)
        (tmp_path / "real.safetensors").replace(bad / "synthetic.safetensors")
        priv["files"]["synthetic.safetensors"] = hashlib.sha256((bad / "synthetic.safetensors").read_bytes()).hexdigest()
        (bad / "privacy.json").write_text(json.dumps(priv))
        want = f"synthetic {bad / 'synthetic.safetensors'}: kind"
    elif edit.startswith("privacy.json ") and edit.split()[1] in ("{}", "[]"):
        # an auditor's probe: privacy.json replaced by {} turned every release check off (exit 0, "release False")
        (bad / "privacy.json").write_text(edit.split()[1])
        (bad / "notes.txt").write_text("patient_0042_scan.png")
        want = "privacy.json: format"
    else:  # a privacy auditor's probe: these keys were written but never checked (exit 0 with rounds 1, one mechanism)
        key = edit.split()[1]
        forged = {"rounds": 1, "mechanisms": ["dp-release-centre"], "method": "dp-gaussian", "accountant": "exact",
                  "extra": "audited by X: ε = 0.1"}[key]
        priv["epsilon_note" if key == "extra" else key] = forged
        (bad / "privacy.json").write_text(json.dumps(priv))
        want = f"privacy.json: {'epsilon_note' if key == 'extra' else key}"
    code, res = _audit_cli(bad)
    if edit == "config.json":  # refused where the file is read (exit 4, naming it)
        assert code == 4 and res["exit_code"] == 4 and want in res["error"], res
        conf.pop("config_sha256")  # a release written before the seal: the file digests privacy.json lists
        (bad / "config.json").write_text(json.dumps(conf))
        code, res = _audit_cli(bad)
        want = "privacy.json: files[config.json] sha256"
    assert code == 4 and not res["consistent"] and res["exit_code"] == 4
    assert want in {m["name"] for m in res["mismatches"]}, res["mismatches"]
    assert want in res["error"]


def test_a_run_with_seeded_node_noise_is_flagged_by_the_release_and_the_audit(real_store, tmp_path):
    """A Flower SuperNode started with seed= draws reproducible noise although the server's train.seed is unset:
    its ledger events say ``seeded``; the release summary and the audit must flag it (a new user's probe found
    ``noise_seeded: false`` and no warning)."""
    import dataclasses

    from conftest import AUDIT_CFG
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.pipeline.release import privacy_summary

    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    run = tmp_path / "run"
    train(real_store, part, TrainConfig(**{**AUDIT_CFG, "seed": None, "rounds": 1, "local_steps": 1}), run,
          diagnostics=False)
    led = PrivacyLedger.load(run / "ledger.json")
    assert privacy_summary(run)["noise_seeded"] is False and "warning" not in privacy_summary(run)
    assert audit_run(run)["warnings"] == [] and not any(e.seeded for e in led.events)
    rebuilt = PrivacyLedger(led.delta, led.meta)
    for e in led.events:  # client 1's DP-SGD events as the server charges them for a seeded node
        rebuilt.record(dataclasses.replace(e, seeded=e.client == "1" and e.mechanism == "dp-sgd"))
    rebuilt.save(run / "ledger.json")
    s = privacy_summary(run)
    assert s["noise_seeded"] is True and s["seeded_clients"] == ["client-1"] and "client(s) client-1 was seeded" in s["warning"]
    res = audit_run(run)
    assert res["noise_seeded"] is True and any("client(s) ['1'] was seeded" in w for w in res["warnings"])


def _model_meta(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


def _set_model_epsilon(run, eps):
    from safetensors.torch import save_file

    meta, tensors = _model_meta(run / "model.safetensors")
    fed = json.loads(meta["fedhype"])
    fed["epsilon"] = eps
    save_file(tensors, str(run / "model.safetensors"), metadata={**meta, "fedhype": json.dumps(fed)})


def test_the_released_model_says_the_ledger_s_epsilon(audit_run, tmp_path):
    """A probe: one number in a model file's metadata (its digest covers only the tensors) went into the release
    unchanged beside the ledger-checked privacy.json. The released model now says the ledger's ε where the ledger
    records more (tensors and digest unchanged), and a model saying more than its ledger is refused."""
    import shutil

    src, _ = audit_run
    run = tmp_path / "run"
    shutil.copytree(src, run)
    spent = PrivacyLedger.load(run / "ledger.json").worst()[1]
    honest = write_release(run, tmp_path / "honest")
    assert (honest / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()
    assert "model_epsilon_note" not in json.loads((honest / "privacy.json").read_text())

    _set_model_epsilon(run, 0.1)  # less than the ledger: an edited model (or an interrupted run's last model)
    rel = write_release(run, tmp_path / "rel")
    meta, tensors = _model_meta(rel / "model.safetensors")
    fed = json.loads(meta["fedhype"])
    assert fed["epsilon"] == pytest.approx(spent, rel=1e-9) and spent > 0.1 and "0.1" in fed["epsilon_note"]
    _, original = _model_meta(run / "model.safetensors")
    assert tensors.keys() == original.keys() and all(torch.equal(tensors[k], original[k]) for k in tensors)
    assert meta[DIGEST_KEY] == _model_meta(run / "model.safetensors")[0][DIGEST_KEY]
    load_tensors(rel / "model.safetensors", what="model")  # its digest still verifies
    priv = json.loads((rel / "privacy.json").read_text())
    assert priv["epsilon"] == pytest.approx(spent, rel=1e-9) and "0.1" in priv["model_epsilon_note"]
    assert priv["model_epsilon_note"] in (rel / "README.md").read_text()
    from fedhype.eval.audit_ledger import audit_run as audit

    res = audit(rel)
    assert res["consistent"] and res["ledger_ok"], res["mismatches"]

    _set_model_epsilon(run, 10 * spent)  # more than the ledger: the ledger lacks charges, refused
    with pytest.raises(ArtifactError, match="more than its run's ledger"):
        write_release(run, tmp_path / "rel2")
    assert not (tmp_path / "rel2").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_nothing_is_trained_into_a_release_folder(released, audit_run, real_store):  # noqa: F811
    """A probe: ``FedHypeVAE.load(release).fit(...)`` was refused ("already holds a run") but left ``.lock`` in the
    release, which then failed ``fedhype audit`` (a file privacy.json does not list). Every writer refuses a release
    folder before touching it."""
    import fedhype
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train

    _, rel = released
    _, part = audit_run
    before = sorted(p.name for p in rel.iterdir())
    with pytest.raises(ValidationError, match="is a release folder"):
        fedhype.FedHypeVAE.load(rel).fit(real_store, part)
    with pytest.raises(ValidationError, match="is a release folder"):
        train(real_store, part, TrainConfig(epsilon=1.0, rounds=1), rel, resume=True, diagnostics=False)
    assert sorted(p.name for p in rel.iterdir()) == before
    from fedhype.eval.audit_ledger import audit_run as audit_run_fn

    res = audit_run_fn(rel, synthetic=[rel / "synthetic.safetensors"])
    assert res["consistent"], res["mismatches"]


def test_a_release_whose_ledger_is_gone_is_still_called_a_release(released, tmp_path):
    """A recipient's probe: with ledger.json deleted the audit said release: false beside privacy.json (exit 4)."""
    import shutil

    _, rel = released
    bad = tmp_path / "no-ledger"
    shutil.copytree(rel, bad)
    (bad / "ledger.json").unlink()
    code, res = _audit_cli(bad)
    assert code == 4 and res["release"] is True and "privacy ledger not found" in res["error"]
    assert "ask its sender for the folder as released" in res["error"]  # not only a data holder's "restore it"


def test_a_model_of_another_run_is_neither_released_nor_audited_under_this_ledger(audit_run, tmp_path):
    """An auditor's probe: another run's model (trained on another partition, or for more rounds) copied into a run
    folder was released by `synthesize --release` and passed `fedhype audit` under this run's ledger."""
    import shutil

    run, _ = audit_run
    for change in ("data_keys", "rounds_done", "method", "seed"):
        other = tmp_path / change
        shutil.copytree(run, other)
        from fedhype.federated.rundir import load_model
        from fedhype.io import atomic_save_tensors, load_tensors, tensor_metadata

        meta = json.loads(tensor_metadata(other / "model.safetensors")["fedhype"])
        meta[change] = {"data_keys": ["0" * 32] * len(meta["data_keys"]), "rounds_done": meta["rounds_done"] + 5,
                        "method": "dp-gaussian", "seed": 12345}[change]
        atomic_save_tensors(other / "model.safetensors", load_tensors(other / "model.safetensors"),
                            metadata={"fedhype": json.dumps(meta)})
        assert load_model(other)[2][change] == meta[change]
        with pytest.raises(ArtifactError, match=rf"model.safetensors: {change} vs "):
            write_release(other, tmp_path / f"rel-{change}")
        assert not (tmp_path / f"rel-{change}").exists()
        res = audit_run_fn(other)
        assert not res["consistent"]
        assert any(m["name"].startswith(f"model.safetensors: {change} vs") for m in res["mismatches"]), res["mismatches"]
    assert audit_run_fn(run)["consistent"]


@pytest.mark.parametrize("cut", ["header", "empty"])
def test_a_corrupt_model_is_an_artifact_error_naming_it(released, tmp_path, cut):
    """An auditor's probe: a truncated, empty or garbage model.safetensors ended `fedhype audit` in "internal error:
    SafetensorError" (exit 1); it is exit 4 naming the file."""
    import shutil

    _, rel = released
    bad = tmp_path / "bad"
    shutil.copytree(rel, bad)
    raw = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(raw[:1000] if cut == "header" else b"")
    code, res = _audit_cli(bad)
    assert code == 4 and res["kind"] == "artifact", res
    assert str(bad / "model.safetensors") in res["error"]
