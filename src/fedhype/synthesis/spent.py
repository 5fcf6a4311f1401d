"""The ε a synthetic store carries: the model's figure checked against the run's ledger (no ε spent).

A model file's metadata says what ε its run had spent when it was written (``epsilon``), but its content digest
covers only the tensors, so that number alone is not evidence: one edit of it would stamp every store drawn from the
model with a smaller ε. The run's ``ledger.json`` (hash-chained, :class:`fedhype.privacy.ledger.PrivacyLedger`)
beside the model is the record of what was spent, so the store carries the larger of the two figures:

* ledger ε > model ε: an interrupted run (the next round's write-ahead charges are in the ledger; the model is
  the last committed one: those records were released to the server all the same) or an edited model; the ledger's
  figure is the records' cost;
* model ε > ledger ε: the ledger lacks what the model says was spent (an older or edited ledger): the model's.

Where they differ, a note says so (:func:`checked_epsilon`). A model with no ledger beside it (a model file copied
alone) keeps its own figure, marked unverified. A ledger that fails its own checks (edited, truncated, a void that
withdraws no charge) raises.
"""

from __future__ import annotations

import math
from pathlib import Path

#: relative tolerance between the model's ε and the ledger's (both come from the same accountant)
REL_TOL = 1e-6


def checked_epsilon(run_dir: str | Path, meta: dict) -> tuple[float | None, str, str | None]:
    """``(ε the store carries, where it comes from, a note or None)`` for a model's metadata ``meta``.

    Args:
        run_dir: the folder holding ``model.safetensors`` (a run or a release folder); its ``ledger.json`` is read.
        meta: the model's metadata (``epsilon``, ``private``).

    Returns:
        ε: None for a non-private model; the larger of the model's and the ledger's (module docstring).
        source: ``"ledger"`` (equal, or the ledger's larger), ``"model"`` (the model's larger), ``"model (unverified:
        no ledger.json beside the model)"``, or ``"none"`` (non-private).

    The note goes into the store's metadata, which may be shared: it names ``ledger.json``, never the run folder's
    path (a folder named after a study is the site's, not the recipient's).

    Raises:
        ArtifactError: the ledger is corrupt, edited or otherwise invalid (:meth:`PrivacyLedger.load`).
    """
    from fedhype.privacy.ledger import PrivacyLedger

    model_eps = meta.get("epsilon")
    if not meta.get("private"):
        return None, "none", None
    path = Path(run_dir) / "ledger.json"
    if not path.is_file():
        return model_eps, "model (unverified: no ledger.json beside the model)", None
    ledger_eps = PrivacyLedger.load(path).worst()[1]
    if model_eps is None:
        return ledger_eps, "ledger", None
    m, led = float(model_eps), float(ledger_eps)
    if math.isclose(m, led, rel_tol=REL_TOL, abs_tol=1e-12):
        return m, "ledger", None
    if led > m:
        return led, "ledger", (f"the run's ledger.json records ε = {led:.6g}, more than the model's metadata says "
                               f"({m:.6g}: an interrupted run's next round, or an edited model); the store carries "
                               "the ledger's figure")
    return m, "model", (f"the model's metadata says ε = {m:.6g}, more than its run's ledger.json records "
                        f"({led:.6g}: an older or edited ledger); the store carries the model's figure — run "
                        "`fedhype audit --run` on the run")
