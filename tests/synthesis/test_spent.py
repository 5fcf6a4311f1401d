"""The ε a synthetic store carries is checked against the run's ledger (:mod:`fedhype.synthesis.spent`).

A probe edited one number in a model file's metadata (``epsilon`` 0.9991 → 0.1: the model's content digest covers
only its tensors) and every store drawn from it said ε = 0.1. The store now carries the larger of the model's figure
and the ledger's, and says where they differ.
"""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from fedhype.errors import ArtifactError
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.synthesis import synthesize


def _set_model_epsilon(run, eps):
    path = run / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    fed = json.loads(meta["fedhype"])
    fed["epsilon"] = eps
    save_file(tensors, str(path), metadata={**meta, "fedhype": json.dumps(fed)})


def test_the_store_carries_the_ledger_s_epsilon_not_an_edited_model_s(audit_run, tmp_path):
    src, _ = audit_run
    run = tmp_path / "run"
    shutil.copytree(src, run)
    spent = PrivacyLedger.load(run / "ledger.json").worst()[1]
    honest = synthesize(run, per_class=5, seed=0)
    assert honest.meta["epsilon"] == pytest.approx(spent, rel=1e-6) and honest.meta["epsilon_source"] == "ledger"
    assert "epsilon" not in {n["kind"] for n in honest.meta.get("notes") or []}

    _set_model_epsilon(run, 0.1)  # the probe's edit
    forged = synthesize(run, per_class=5, seed=0)
    assert forged.meta["epsilon"] == pytest.approx(spent, rel=1e-6) and spent > 0.1
    (note,) = [n["text"] for n in forged.meta["notes"] if n["kind"] == "epsilon"]
    assert f"{spent:.6g}" in note and "0.1" in note
    # the store's metadata may be shared: the note names ledger.json, not the run folder's path (a privacy probe
    # read /…/studies/hospitalA_hiv_cohort_2025/ledger.json in a released store)
    assert "ledger.json" in note and str(run.parent) not in note

    _set_model_epsilon(run, 10 * spent)  # a model saying more than its ledger: the larger figure, and a note
    more = synthesize(run, per_class=5, seed=0)
    assert more.meta["epsilon"] == pytest.approx(10 * spent) and more.meta["epsilon_source"] == "model"

    (run / "ledger.json").write_text((run / "ledger.json").read_text().replace('"steps":2', '"steps":1', 1))
    with pytest.raises(ArtifactError, match="ledger"):  # an edited ledger is refused, not trusted
        synthesize(run, per_class=5, seed=0)

    (run / "ledger.json").unlink()  # a model file alone: its own figure, marked unverified
    alone = synthesize(run, per_class=5, seed=0)
    assert alone.meta["epsilon"] == pytest.approx(10 * spent) and alone.meta["epsilon_source"].startswith("model (unverified")
