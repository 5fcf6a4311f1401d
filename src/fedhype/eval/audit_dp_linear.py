"""The audit of a job's DP-SGD linear reference (``dp_linear/``): a second DP model of the same records.

``fedhype run`` with ``[evaluate] dp_linear = true`` (the default) also trains the DP-SGD FedAvg linear
classifier of :mod:`fedhype.prototypes.dp_linear` on the clients' real training records, with its own
ledger (``dp_linear/ledger.json``) and its own ε. It is a separate release of the same records: it stays in
the run folder (it is not in ``release/``), and if it is shared as well, a record in both has spent both —
sequential composition (Dwork & Roth 2014, Theorem 3.16): at most (ε₁ + ε₂, δ₁ + δ₂).

:func:`audit_dp_linear` recomputes its ε from that ledger (the chain is verified on load,
:meth:`fedhype.privacy.ledger.PrivacyLedger.load`) and checks the model's and the job report's claims against
it; :func:`fedhype.eval.audit_ledger.audit_run` calls it for a job folder, and ``fedhype audit --run
RUN/dp_linear`` audits the folder alone. The model's metadata is read from its safetensors header (format
``fedhype-dp-linear/1``) without importing the later ``prototypes`` stage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedhype.errors import ArtifactError
from fedhype.io import tensor_metadata
from fedhype.privacy.ledger import PrivacyLedger

#: the DP linear model's format (:mod:`fedhype.prototypes.dp_linear_model`)
DP_LINEAR_FORMAT = "fedhype-dp-linear/1"


def _privacy_record(folder: Path) -> dict[str, Any] | None:
    """The model's ``privacy`` record, or None where ``folder`` holds no DP linear model."""
    file = folder / "model.safetensors"
    if not file.is_file():
        return None
    try:
        meta = json.loads(tensor_metadata(file).get("fedhype") or "{}")
    except (ArtifactError, json.JSONDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != DP_LINEAR_FORMAT:
        return None
    privacy = meta.get("privacy")
    if not isinstance(privacy, dict):
        raise ArtifactError(f"{file}: a DP linear model without its privacy record (metadata 'privacy')")
    return privacy


def is_dp_linear(folder: str | Path) -> bool:
    """Whether ``folder`` holds a DP linear model (``model.safetensors`` of format ``fedhype-dp-linear/1``)."""
    try:
        return _privacy_record(Path(folder)) is not None
    except ArtifactError:
        return True  # its format says so; the audit then names what is wrong


def audit_dp_linear(folder: str | Path, tol: float = 1e-6, report: dict | None = None,
                    report_name: str = "report.json") -> dict[str, Any]:
    """Check a DP linear model's ε claims (and a job report's) against its own ledger.

    Args:
        folder: a folder holding the model (``model.safetensors``) and its ``ledger.json``.
        tol: allowed absolute difference in ε (recomputation is deterministic: differences are edits).
        report: the job's ``report.json`` (its ``dp_fedavg_linear_epsilon`` is checked too), or None.
        report_name: how the checked rows name the report.

    Returns:
        the keys of :func:`fedhype.eval.audit_ledger.audit_run` (``run``, ``private``, ``ledger_ok``,
        ``ledger_error``, ``epsilon``, ``delta``, ``worst_client``, ``epsilon_per_client``, ``events``, ``checked``,
        ``mismatches``, ``warnings``, ``consistent``) and ``dp_linear: True``.

    Raises:
        ArtifactError: ``folder`` holds no DP linear model, or its metadata is unreadable.
    """
    from fedhype.eval.audit_ledger import _check, _equal, _finish, _no_claim

    folder = Path(folder)
    privacy = _privacy_record(folder)
    if privacy is None:
        raise ArtifactError(f"{folder}: no DP linear model (model.safetensors of format {DP_LINEAR_FORMAT!r}) here")
    private = bool(privacy.get("private"))
    res: dict[str, Any] = {"run": str(folder), "report": None, "private": private, "dp_linear": True,
                           "ledger_ok": None, "ledger_error": None, "epsilon": None, "delta": privacy.get("delta"),
                           "epsilon_rdp": None, "worst_client": None, "epsilon_per_client": {},
                           "epsilon_rdp_per_client": {}, "events": 0, "client_names": {},
                           "warnings": ["this is a DP-SGD linear classifier (the job's reference, the setting evaluate.dp_linear), "
                                        "not a generator: a separate DP model of the same training records with its "
                                        "own ledger; shared together with the job's release, a record in both has "
                                        "spent both (sequential composition: the two ε add up, and the two δ)"]}
    rows: list[dict[str, Any]] = []
    name = "dp_linear/model.safetensors" if folder.name == "dp_linear" else "model.safetensors"
    if not private:
        rows.append(_no_claim(f"{name}: privacy.epsilon", privacy.get("epsilon")))
        return _finish(res, rows)
    try:
        ledger = PrivacyLedger.load(folder / "ledger.json")
    except (ArtifactError, OSError) as exc:
        res.update(ledger_ok=False, ledger_error=str(exc))
        rows.append({"name": f"{folder / 'ledger.json'}", "claimed": None, "recomputed": None, "difference": None,
                     "ok": False, "reason": str(exc)})
        return _finish(res, rows)
    worst_client, worst = ledger.worst()
    per, rdp = ledger.epsilons(), ledger.epsilons("rdp")
    res.update(ledger_ok=True, epsilon=worst, delta=ledger.delta, worst_client=worst_client, epsilon_per_client=per,
               epsilon_rdp_per_client=rdp, epsilon_rdp=max(rdp.values()) if rdp else 0.0, events=len(ledger),
               client_names={c: c for c in per})
    rows.append(_check(ledger, f"{name}: privacy.epsilon", "worst", privacy.get("epsilon"), tol))
    rows.append(_equal(f"{name}: privacy.delta", privacy.get("delta"), ledger.delta))
    claimed = privacy.get("epsilon_per_client") or {}
    for c in sorted(set(claimed) | set(per)):
        rows.append(_check(ledger, f"{name}: privacy.epsilon_per_client[{c}]", str(c), claimed.get(c), tol))
    if privacy.get("noise_seeded"):
        res["noise_seeded"] = True
        res["warnings"].append("its noise was seeded: whoever knows the seed can regenerate and remove it")
    presented = report is not None and any(report.get(f"dp_fedavg_linear_{k}") is not None
                                           for k in ("accuracy", "epsilon", "delta"))
    if report is not None and not presented:  # a rerun with evaluate.dp_linear = false: the report states no figure
        kept = report.get("dp_linear_kept_epsilon")
        res["report_note"] = (f"{report_name} does not present this reference (a rerun with evaluate.dp_linear = "
                              "false)" + (": it names the model left in the folder, and its ε (checked)"
                                          if kept is not None else
                                          ": nothing of it to check there; the model and its ε are still in the folder"))
        res["warnings"].append(res["report_note"])
        if kept is not None:  # the report names the model left in the folder: its ε must be the ledger's
            rows.append(_check(ledger, f"{report_name}: dp_linear_kept_epsilon", "worst", kept, tol))
    if presented:  # the report presents the reference: its ε must be the ledger's (a missing one is a mismatch)
        rows.append(_check(ledger, f"{report_name}: dp_fedavg_linear_epsilon", "worst",
                           report.get("dp_fedavg_linear_epsilon"), tol))
        if report.get("dp_fedavg_linear_delta") is not None:
            rows.append(_equal(f"{report_name}: dp_fedavg_linear_delta", report.get("dp_fedavg_linear_delta"),
                               ledger.delta))
    return _finish(res, rows)
