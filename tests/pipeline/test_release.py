"""The release folder holds only DP outputs and public bookkeeping, and a recipient can audit it."""

from __future__ import annotations

import json
import os

import pytest
import torch

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, ValidationError
from fedhype.eval.audit_ledger import audit_run
from fedhype.io import load_tensors
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
