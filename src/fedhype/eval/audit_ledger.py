"""Ledger consistency: every ε a run reports, checked against ε recomputed from its ledger.

The ledger (:mod:`fedhype.privacy.ledger`) is verified (hash chain and checksum) and ε is
recomputed from its events with the accountants of :mod:`fedhype.privacy.accountant`: the
reported figure is the smaller of Opacus PRV (Gopi et al. 2021) and RDP (Mironov 2017), both
upper bounds; a PRV figure above RDP (a numerical failure of PRV) is a warning. The claims checked:

* ``model.safetensors`` metadata ``epsilon`` (and ``delta``, ``private``);
* ``metrics.json``, every round r: ``epsilon`` and ``epsilon_per_client`` against the ledger
  truncated to the events with ``0 ≤ round ≤ r`` plus the DP class statistics released before
  round 0 — the last round against the full ledger;
* ``report.json``, if present: ``epsilon``, ``client_epsilons`` (by ledger id),
  ``epsilon_per_client`` (by client name) and ``delta`` — in the run directory, or the job's one
  when the run is the ``run/`` folder of a ``fedhype run`` output;
* synthetic stores given by the caller (and a job's ``synthetic.safetensors``): their
  ``meta["epsilon"]`` and ``meta["delta"]``.

ε is recomputed from the ledger's charges in force: a write-ahead charge withdrawn by a void (a Flower node
refused the request before touching its records, :func:`fedhype.privacy.ledger.void`) counts for nothing, and
each one is named in the warnings (``voided_charges``: how many).

``run_dir`` may be a run directory or a ``fedhype run`` output directory (``out/run/`` is audited).

A run trained with ``--no-dp`` claims no ε: any ε figure it reports is a mismatch. A ledger that
fails verification makes every claim unverifiable (``ledger_ok`` False). The caller (``fedhype
audit``) exits 4 unless ``consistent``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, ValidationError
from fedhype.federated.rundir import RunDir, ledger_rounds, load_model, model_digest, model_run_mismatches
from fedhype.io import read_json
from fedhype.privacy.ledger import PrivacyLedger, audit_consistency, recharged_events
from fedhype.privacy.plan import above_target

#: ε computed by PRV is an upper bound within ~2·eps_error of the truth, RDP a looser upper bound:
#: PRV above RDP by more than this is reported as a warning (the reported ε is then RDP's).
CROSS_CHECK_SLACK = 0.05



def committed_ledger(ledger: PrivacyLedger, rounds_done: int) -> PrivacyLedger:
    """The events of ``ledger`` up to its ``rounds_done`` committed rounds (``checkpoint.json``): the releases before
    round 0 and DP-SGD rounds 0 … rounds_done − 1 — what a model written after those rounds was trained under. An
    interrupted run's ledger also holds the next round's write-ahead charges, which the full ledger counts."""
    return _truncated(ledger, rounds_done - 1)


def _truncated(ledger: PrivacyLedger, last_round: int) -> PrivacyLedger:
    out = PrivacyLedger(ledger.delta, ledger.meta)
    for e in ledger.events:  # the releases before round 0 (round −1: the centre and the class statistics) count too
        if e.round <= last_round:
            out.record(e)
    return out


def _tamper_detail(path: Path, message: str) -> str:
    """Add the content of the event named in a verification error (client, round, σ, q, steps)."""
    m = re.search(r"event (\d+)", message)
    if not m:
        return message
    try:
        ev = json.loads(path.read_text(encoding="utf-8"))["events"][int(m.group(1))]
        return (f"{message}: event {m.group(1)} = client {ev.get('client')!r}, round {ev.get('round')}, "
                f"mechanism {ev.get('mechanism')!r}, σ={ev.get('noise_multiplier')}, q={ev.get('sample_rate')}, "
                f"steps={ev.get('steps')} (edited after it was recorded)")
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return message


def _check(ledger: PrivacyLedger, name: str, key: str, claimed: Any, tol: float) -> dict[str, Any]:
    """One claim against ``ledger`` (``key``: ``"worst"`` or a client id), as a checked row."""
    bad = audit_consistency(ledger, {key: claimed}, tol=tol)
    recomputed = ledger.worst()[1] if key == "worst" else (ledger.epsilon(key) if key in ledger.clients() else None)
    row = {"name": name, "claimed": claimed, "recomputed": recomputed,
           "difference": (float(claimed) - recomputed) if isinstance(claimed, (int, float)) and recomputed is not None
           and not isinstance(claimed, bool) else None, "ok": not bad}
    if bad and bad[0].get("reason"):
        row["reason"] = bad[0]["reason"]
    return row


def _check_committed(ledger: PrivacyLedger, spent: PrivacyLedger, name: str, claimed: Any, tol: float) -> dict[str, Any]:
    """A model's or synthetic store's ε claim in a run whose ``spent`` ledger may hold write-ahead charges past the
    committed rounds (``ledger``): the committed figure, or the full one — ``fedhype synthesize`` stamps the larger of
    the model's and the ledger's ε (:mod:`fedhype.synthesis.spent`), and a release's model says its ledger's
    (:mod:`fedhype.pipeline.release`). Neither understates what the artifact cost; anything else fails."""
    row = _check(ledger, name, "worst", claimed, tol)
    if not row["ok"] and spent is not ledger:
        full = _check(spent, name, "worst", claimed, tol)
        if full["ok"]:
            return {**full, "note": "the full ledger's figure (the interrupted round's write-ahead charges included)"}
    return row


def _equal(name: str, claimed: Any, expected: Any, tol: float = 0.0) -> dict[str, Any]:
    if isinstance(expected, float) and isinstance(claimed, (int, float)) and not isinstance(claimed, bool):
        ok = abs(float(claimed) - expected) <= tol * max(1.0, abs(expected))
    else:
        ok = claimed == expected
    return {"name": name, "claimed": claimed, "recomputed": expected, "difference": None, "ok": bool(ok)}


def _no_claim(name: str, claimed: Any) -> dict[str, Any]:
    row = {"name": name, "claimed": claimed, "recomputed": None, "difference": None, "ok": claimed is None}
    if claimed is not None:
        row["reason"] = "a non-private (--no-dp) run claims an ε"
    return row


#: Files of a run directory (:class:`~fedhype.federated.rundir.RunDir`); a job folder has them in ``run/``.
_RUN_FILES = ("model.safetensors", "ledger.json", "checkpoint.json", "metrics.json")


def is_job_dir(path: str | Path) -> bool:
    """Whether ``path`` is a ``fedhype run`` output folder: no run files of its own, a run in ``run/``.

    A job folder has its own ``config.json`` (the job configuration), so that file alone does not
    make a run directory; ``run/`` counts as a run when it holds any run file or its ``config.json``.
    """
    path = Path(path)
    if any((path / f).exists() for f in _RUN_FILES):
        return False
    return (path / "run").is_dir() and any((path / "run" / f).exists() for f in (*_RUN_FILES, "config.json"))


def run_directory(path: str | Path) -> Path:
    """The training run directory of ``path``: ``path/run`` for a ``fedhype run`` output folder, else ``path``."""
    path = Path(path)
    return path / "run" if is_job_dir(path) else path


def locate(path: str | Path) -> tuple[Path, Path | None, list[Path]]:
    """``(run directory, report.json or None, synthetic stores of a job)`` for a run or job directory."""
    path = Path(path)
    if is_job_dir(path):
        report = path / "report.json"
        syn = path / "synthetic.safetensors"
        return path / "run", report if report.exists() else None, [syn] if syn.exists() else []
    for report in (path / "report.json", path.parent / "report.json"):
        if report.exists() and (report.parent == path or (path.name == "run" and (report.parent / "run") == path)):
            return path, report, []
    return path, None, []


def audit_run(run_dir: str | Path, synthetic: list[str | Path] = (), tol: float = 1e-6) -> dict[str, Any]:
    """Check every ε the run (and the given synthetic stores) report against its ledger.

    A job folder's DP-SGD linear reference (``dp_linear/``, a second DP model of the same records) is audited
    with it (:func:`fedhype.eval.audit_dp_linear.audit_dp_linear`: its rows are checked too, ``dp_linear`` says
    its ε and a warning says how the two compose); a ``dp_linear/`` folder given alone is audited alone.

    Args:
        run_dir: a run directory written by ``fedhype train``.
        synthetic: paths of synthetic stores drawn from this run.
        tol: allowed absolute difference in ε (recomputation is deterministic: differences are edits).

    Returns:
        ``{"run", "private", "ledger_ok", "ledger_error", "epsilon", "delta", "epsilon_rdp",
        "worst_client", "epsilon_per_client", "epsilon_rdp_per_client", "events", "checked",
        "mismatches", "warnings", "consistent", "client_names"}`` (``client_names``: ledger id → the
        client's name, as privacy.json and the report key it) and, for a private run, ``target_epsilon``
        (``train.epsilon``; None with an explicit σ), ``above_target`` and ``recharged_events`` (events
        charged again after an interruption, each also named in ``warnings``); each mismatch is ``{"name", "claimed",
        "recomputed", "difference"[, "reason"]}``.

    Raises:
        ArtifactError: the run directory or its model/metrics/config are missing or unreadable, or
            a synthetic store is unreadable.
    """
    from fedhype.eval.audit_dp_linear import audit_dp_linear, is_dp_linear

    if not Path(run_dir).is_dir():
        raise ArtifactError(f"run directory not found: {run_dir}")
    if is_dp_linear(run_dir):
        return audit_dp_linear(run_dir, tol)
    res = _audit_run(run_dir, synthetic, tol)
    lin = Path(run_dir) / "dp_linear"
    if is_job_dir(run_dir) and not lin.exists():
        # a probe deleted dp_linear/ and the second model's ε left the audit without a word, while the report
        # still presented it: the report's figure must have its model and ledger beside it
        report_path = Path(run_dir) / "report.json"
        report = read_json(report_path, "run report") if report_path.exists() else None
        claimed = report.get("dp_fedavg_linear_epsilon") if isinstance(report, dict) else None
        if claimed is not None:
            _finish(res, res["checked"] + [{
                "name": f"{report_path}: dp_fedavg_linear_epsilon (dp_linear/)", "claimed": claimed,
                "recomputed": "missing", "difference": None, "ok": False,
                "reason": f"the report presents the DP-SGD linear reference at ε = {claimed}, but {lin} is missing: "
                          "that second DP model of the same records, and its ledger, were removed; its ε was spent all "
                          "the same (put the folder back to audit it)"}])
    if is_job_dir(run_dir) and is_dp_linear(lin):
        report_path = Path(run_dir) / "report.json"
        report = read_json(report_path, "run report") if report_path.exists() else None
        sub = audit_dp_linear(lin, tol, report, str(report_path))
        res["dp_linear"] = {k: sub[k] for k in ("epsilon", "delta", "private", "ledger_ok", "consistent")}
        if sub["private"] and sub["epsilon"] is not None:
            both = (f"; shared too, a record in both would have spent both: ε ≤ {res['epsilon'] + sub['epsilon']:.4g}, "
                    f"δ ≤ {res['delta'] + sub['delta']:g} (sequential composition)"
                    if isinstance(res.get("epsilon"), float) and isinstance(res.get("delta"), float) else "")
            res["warnings"].append(
                f"the job also trained the DP-SGD linear reference (the job setting evaluate.dp_linear) on the same training records: "
                f"dp_linear/ is a separate DP model at its own ε = {sub['epsilon']:.4g} (δ = {sub['delta']:g}, "
                "recomputed from dp_linear/ledger.json); it stays in the run folder — release/ does not hold it"
                + both + "; `--set evaluate.dp_linear=false` trains none")
        if sub.get("report_note"):
            res["warnings"].append(sub["report_note"])
        if sub.get("noise_seeded"):  # a second probe: a seeded dp_linear/ was said so only when audited alone
            res["warnings"].append("the noise of dp_linear/ (the DP-SGD linear reference) was seeded: whoever knows the "
                                   "seed can regenerate and remove it, so its ε holds only while the seed stays secret")
        _finish(res, res["checked"] + sub["checked"])
    return res


def _class_names_row(name: str, claimed: Any, recorded: list[str]) -> dict[str, Any]:
    row = _equal(name, claimed, recorded)
    if not row["ok"]:
        row["reason"] = ("the class names (label i is the i-th name) differ from those the run recorded in config.json "
                         "when it trained: edited, or another run's; a relabelled release would name each synthetic "
                         "class wrongly")
    return row


def _class_name_rows(config: dict, stores: list) -> list[dict[str, Any]]:
    """Every synthetic store names the classes as the run's ``config.json`` does (a helper relabelled a model's
    metadata by hand and its release and audit passed; the model's own names: :func:`model_run_mismatches`)."""
    recorded = config.get("class_names")
    if not isinstance(recorded, list):  # a run written before config.json recorded them
        return []
    recorded = [str(c) for c in recorded]
    return [_class_names_row(f"synthetic {path}: class_names vs config.json", list(s.class_names), recorded)
             for path, s in stores if s.kind == "synthetic"]


def _audit_run(run_dir: str | Path, synthetic: list[str | Path], tol: float) -> dict[str, Any]:
    """:func:`audit_run` of the run (or job) folder itself."""
    root, report_path, job_synthetic = locate(run_dir)
    run = RunDir(root)
    if not run.model.exists() and run.config.exists():  # interrupted before its first commit: the ledger alone
        return _audit_unstarted(run, read_json(run.config, "run config"))
    _, _, meta = load_model(run.model)
    config = read_json(run.config, "run config")
    metrics = read_json(run.metrics, "metrics") if run.metrics.exists() else []
    report = read_json(report_path, "run report") if report_path is not None else None
    given = list(dict.fromkeys(Path(p).resolve() for p in [*job_synthetic, *synthetic]))  # a store given twice: once
    stores = [(str(p), EmbeddingStore.load(p)) for p in given]
    stores, found = _folder_stores(run.root, stores, model_digest(run.model) if run.model.exists() else None)
    private = bool(meta.get("private"))
    ids = [str(c) for c in meta.get("clients") or []]
    res: dict[str, Any] = {"client_names": dict(zip(ids, [str(n) for n in (meta.get("client_names") or ids)])),
                           "run": str(run.root), "report": None if report_path is None else str(report_path),
                           "private": private, "ledger_ok": None, "ledger_error": None,
                           "epsilon": None, "delta": meta.get("delta"), "epsilon_rdp": None, "worst_client": None,
                           "epsilon_per_client": {}, "epsilon_rdp_per_client": {}, "events": 0, "warnings": list(found)}
    rows: list[dict[str, Any]] = _stripped_release_rows(run.root, config)
    # only synthetic embeddings are released: a real store in a release (or given as synthetic) carries no ε, so its
    # ε / δ / model rows had nothing to compare and the release passed (a probe copied the real embeddings over a
    # release's synthetic store, updated privacy.json's SHA-256, and the audit said consistent)
    rows += [{"name": f"synthetic {path}: kind", "claimed": s.kind, "recomputed": "synthetic", "difference": None,
              "ok": False, "reason": f"a {s.kind!r} embeddings store, not synthetic: no mechanism of this run released "
                                     "it, and real embeddings must never leave the site"}
             for path, s in stores if s.kind != "synthetic"]
    no_dp = bool(config.get("train", {}).get("no_dp"))
    rows.append(_equal("config.json: train.no_dp vs model private flag", no_dp, not private))
    rows += _class_name_rows(config, stores)
    if not private:
        rows.append(_no_claim("model.safetensors: epsilon", meta.get("epsilon")))
        for m in metrics:
            rows.append(_no_claim(f"metrics.json: round {m.get('round')} epsilon", m.get("epsilon")))
        if report is not None:
            rows.append(_no_claim(f"{report_path}: epsilon", report.get("epsilon")))
        for path, s in stores:
            rows.append(_no_claim(f"synthetic {path}: meta.epsilon", s.meta.get("epsilon")))
        if run.ledger.exists():
            res["warnings"].append("a non-private run has a ledger.json; its events are not part of any claim")
    else:
        ledger = _load_ledger(run, res, rows)
        if ledger is None:
            return _finish(res, rows)
        _note_seeded(res, meta.get("seed"), ledger)
        worst_client, worst = ledger.worst()
        # the run's target (train.epsilon, unless an explicit σ was given) and the events a resumed run
        # charged again (fresh noise after an interruption; privacy.ledger.as_rerun): why ε can exceed it
        target = _target(config)
        rerun = recharged_events(ledger)
        res.update(target_epsilon=target, above_target=above_target(worst, target), recharged_events=len(rerun))
        _note_voids(ledger, res)
        if rerun:
            res["warnings"].append(
                f"{len(rerun)} ledger event(s) were charged again after an interruption (fresh noise on resume: "
                + ("the statistics release, " if any(e.round < 0 for e in rerun) else "")
                + (f"round(s) {sorted({e.round + 1 for e in rerun if e.round >= 0})} counted from 1 as train's progress "
                   "lines count them, " if any(e.round >= 0 for e in rerun) else "")
                + f"client(s) {sorted({str(e.client) for e in rerun})}); "
                "they count in ε" + (f", which is above the target {target:g}" if res["above_target"] else ""))
        rdp = ledger.epsilons("rdp")
        try:
            prv = ledger.epsilons("prv")
        except ValidationError as exc:  # PRV's numerics fail (e.g. very large ε): the reported ε is RDP's, as in train
            prv = {}
            res["warnings"].append(f"the PRV accountant could not evaluate this ledger ({exc}); the reported ε is the "
                                   "RDP upper bound, as `fedhype train` reported it")
        res.update(ledger_ok=True, epsilon=worst, delta=ledger.delta, worst_client=worst_client,
                   epsilon_per_client=ledger.epsilons(), epsilon_rdp_per_client=rdp,
                   epsilon_rdp=max(rdp.values()) if rdp else 0.0, events=len(ledger))
        for c in prv:
            if prv[c] > rdp[c] + CROSS_CHECK_SLACK:
                res["warnings"].append(f"client {c}: PRV ε {prv[c]:.4g} exceeds the RDP upper bound {rdp[c]:.4g} "
                                       "(a numerical failure of PRV); the RDP figure is the reported one")
        # An interrupted run has write-ahead events for rounds it never committed: they are spent
        # (the report's ε is the full ledger's), but the committed artifacts predate them.
        done = run.committed_round()
        pending = [e for e in ledger.events if e.round >= done]
        spent = ledger
        if pending:
            ledger = _truncated(ledger, done - 1)
            res["interrupted"] = True
            res["warnings"].append(
                f"interrupted run: {len(pending)} ledger event(s) of round(s) ≥ {done + 1} (counted from 1 as train's "
                f"progress counts them; in ledger.json and metrics.json, which count from 0, round {done + 1} is {done}) were "
                f"written ahead and are "
                f"charged (ε spent {worst:.4g}), but the model, metrics and synthetic stores predate them "
                f"(ε {ledger.worst()[1]:.4g}); resume the run to bring the claims up to date")
        rows += _plan_rows(spent, config, metrics, ids, done)
        rows += _calibration_rows(config)
        rows.append(_check_committed(ledger, spent, "model.safetensors: epsilon", meta.get("epsilon"), tol))
        rows.append(_equal("model.safetensors: delta", meta.get("delta"), ledger.delta))
        rows.append(_equal("config.json: train.delta", config.get("train", {}).get("delta"), ledger.delta))
        last = max((m.get("round", -1) for m in metrics), default=None)
        for m in metrics:
            r = m.get("round")
            lg = ledger if r == last else _truncated(spent, r if isinstance(r, int) else -1)
            rows.append(_check(lg, f"metrics.json: round {r} epsilon", "worst", m.get("epsilon"), tol))
            for c, e in (m.get("epsilon_per_client") or {}).items():
                rows.append(_check(lg, f"metrics.json: round {r} epsilon_per_client[{c}]", str(c), e, tol))
        if report is not None:
            rows.append(_check(ledger, f"{report_path}: epsilon", "worst", report.get("epsilon"), tol))
            rows += _report_client_rows(ledger, report, str(report_path), tol)
            if "delta" in report:
                rows.append(_equal(f"{report_path}: delta", report.get("delta"), ledger.delta))
            rows += _report_release_rows(spent, report, str(report_path), config, tol, res["warnings"])
        for path, s in stores:
            rows.append(_check_committed(ledger, spent, f"synthetic {path}: meta.epsilon", s.meta.get("epsilon"), tol))
            rows.append(_equal(f"synthetic {path}: meta.delta", s.meta.get("delta"), ledger.delta))
            if s.meta.get("model_digest") is not None:  # a probe: a store of another run with the same ε passed
                row = _equal(f"synthetic {path}: meta.model_digest (the model it was drawn from)",
                             s.meta["model_digest"], model_digest(run.model))
                if not row["ok"]:
                    row["reason"] = ("drawn from another model than this folder's model.safetensors (another run's, or "
                                     "this run's before it was resumed): draw it again from this model")
                rows.append(row)
    # the model is this run's: trained on its partition, for the rounds its checkpoint and ledger record (a probe's
    # model of another run, copied in, passed under this ledger)
    rows += [{**m, "difference": None, "ok": False} for m in model_run_mismatches(
        meta, config, run.committed_round() if run.checkpoint.exists() else None,
        ledger_rounds(spent) if private else None)]
    return _finish(res, rows)


def _folder_stores(root: Path, stores: list[tuple[str, EmbeddingStore]],
                   digest: str | None) -> tuple[list[tuple[str, EmbeddingStore]], list[str]]:
    """The audited folder's own ``*.safetensors`` files besides its model, and what the audit says of them.

    In a release folder (it holds ``privacy.json``) every synthetic store is checked as if given with ``--synthetic``:
    its ``model_digest`` ties the model's tensors to it (a probe swapped another run's model into a release and passed
    an audit without ``--synthetic``); a file the release does not list fails in
    :func:`fedhype.pipeline.release.check_release`. In a run folder — private, never shared — a synthetic store drawn
    from this model is checked; one drawn from another model (an earlier state of this run, before a resume, or another
    run), a real store or a file that is no store gets a warning: no claim covers it (a probe's store drawn before a
    resume, and a backup copy of the model, failed the audit of an honest run folder).

    Returns ``(stores to check — the given ones first, each file once —, warnings)``.
    """
    release = (root / "privacy.json").is_file()
    given = {Path(p).resolve() for p, _ in stores}
    out, notes = list(stores), []
    for f in sorted(root.glob("*.safetensors")):
        if f.name == "model.safetensors" or f.resolve() in given:
            continue
        try:
            store = EmbeddingStore.load(f)
        except (ArtifactError, ValidationError):
            if not release:
                notes.append(f"{f.name} in the run folder is neither its model nor an embeddings store: no claim "
                             "covers it (the run folder is private; a copy of a release is what may leave the site)")
            continue
        if release or (store.kind == "synthetic" and store.meta.get("model_digest") in (None, digest)):
            out.append((str(f), store))  # a release's every store is checked, a real one fails (its kind)
        elif store.kind == "synthetic":
            notes.append(f"{f.name} in the run folder was drawn from another model (this run's before it was resumed, "
                         "or another run's): its claims are not checked against this ledger; draw it again from this "
                         "run (`fedhype synthesize`) before it is shared")
        elif not release:
            notes.append(f"{f.name} in the run folder holds {store.kind} embeddings, which no mechanism of this run "
                         "released: the run folder is private and must not leave the site")
    return out, notes


def _stripped_release_rows(root: Path, config: dict) -> list[dict[str, Any]]:
    """A failing row for a release folder without its ``privacy.json`` (none otherwise).

    A release's ``config.json`` is the run's without the store digest (:func:`fedhype.pipeline.release.public_config`
    writes ``store.digest_note`` in its place); a run's keeps the digest. Without ``privacy.json`` such a folder would
    be audited as a run folder, whose extra files are not checked (a probe deleted a release's ``privacy.json`` and
    README, copied the real embeddings in and passed).
    """
    store = config.get("store") if isinstance(config.get("store"), dict) else {}
    if "digest_note" not in store or (root / "privacy.json").is_file():
        return []
    return [{"name": "privacy.json", "claimed": None, "recomputed": "missing", "difference": None, "ok": False,
             "reason": f"{root} holds a release's config.json but no privacy.json: a release folder whose privacy.json "
                       "was removed, which cannot be checked for what else it holds; ask for the folder as it was "
                       "released"}]


def _plan_rows(ledger: PrivacyLedger, config: dict, metrics: list, ids: list[str], done: int) -> list[dict[str, Any]]:
    """The ledger against what the run says it ran: config.json's ``privacy_plan`` and metrics.json's rounds.

    ε recomputed from the ledger checks the claims against the ledger; these rows check the ledger against
    the run, so that events deleted from it (with the claims rewritten to match) do not pass. For every
    client of the plan (``privacy_plan.plan``: its sampling rate q_i and DP-SGD steps over all rounds;
    ``privacy_plan.prefix``: the (σ, q, steps) of each statistics-release event before round 0):

    * the release events of round −1 are the prefix's (σ, q = 1, one step each), in any order;
    * in each committed round (``checkpoint.json``) the client took part in (metrics.json's
      ``participants``), its DP-SGD events have the plan's σ and q_i and add up to its steps per round
      (its plan's steps / ``train.rounds``).

    Events a resumed run charged again (their note says so) are extra spending, not part of the plan:
    they are left out here and counted in ε. Rows are added only where config.json has a per-client plan
    (a run trained by this version); a secure-aggregation run's statistics release is not per client and
    its prefix is not checked.
    """
    pp = config.get("privacy_plan") if isinstance(config.get("privacy_plan"), dict) else {}
    plan, prefix, sigma = pp.get("plan"), pp.get("prefix") or [], pp.get("noise_multiplier")
    train = config.get("train", {}) if isinstance(config.get("train"), dict) else {}
    if not isinstance(plan, list) or len(plan) != len(ids) or not ids:
        return []
    rounds = train.get("rounds")
    events = [e for e in ledger.events if "charged again" not in str(e.note or "")]
    rows: list[dict[str, Any]] = []
    if not train.get("secure_aggregation"):
        want = sorted((float(sg), float(q), int(k)) for sg, q, k in prefix)
        for cid in ids:
            got = sorted((float(e.noise_multiplier), float(e.sample_rate), int(e.steps)) for e in events
                         if e.round == -1 and str(e.client) == cid)
            same = len(got) == len(want) and all(abs(a[0] - b[0]) <= 1e-9 * max(1.0, b[0]) and a[1:] == b[1:]
                                                 for a, b in zip(got, want))
            row = {"name": f"ledger.json: client {cid}'s statistics release (round −1) vs config.json's privacy_plan",
                   "claimed": [list(g) for g in got], "recomputed": [list(w) for w in want], "difference": None,
                   "ok": same}
            if not same:
                row["reason"] = "the ledger's release events are not the planned ones (missing, extra or another σ)"
            rows.append(row)
    rounds_listed = {m.get("round"): m.get("participants") for m in metrics if isinstance(m, dict)}
    for i, cid in enumerate(ids):
        q_i, steps_total = float(plan[i][0]), int(plan[i][1])
        per_round = steps_total // rounds if isinstance(rounds, int) and rounds > 0 and steps_total % rounds == 0 else None
        # a round metrics.json does not list (a release folder has no metrics.json): every client took part,
        # unless clients were sampled (train.participation < 1), where that round's steps are not checked
        full = float(train.get("participation", 1.0) or 1.0) >= 1.0
        took_part = [r for r in range(done) if (cid in [str(c) for c in rounds_listed[r]] if rounds_listed.get(r) is not None
                                                else full)]
        sgd = [e for e in events if e.mechanism == "dp-sgd" and str(e.client) == cid and 0 <= e.round < done]
        wrong = [e.round for e in sgd if sigma is not None and (abs(float(e.noise_multiplier) - float(sigma)) >
                 1e-9 * max(1.0, float(sigma)) or abs(float(e.sample_rate) - q_i) > 1e-12)]
        steps = {r: sum(int(e.steps) for e in sgd if e.round == r) for r in took_part}
        short = sorted(r for r, k in steps.items() if (k != per_round if per_round is not None else k == 0))
        ok = not wrong and not short
        row = {"name": f"ledger.json: client {cid}'s DP-SGD events in the committed rounds vs the plan",
               "claimed": sum(steps.values()), "recomputed": None if per_round is None else per_round * len(took_part),
               "difference": None, "ok": ok}
        if not ok:
            row["reason"] = (f"round(s) {sorted({r + 1 for r in wrong})} (counted from 1) have another σ or q than "
                             "config.json's privacy_plan; " if wrong else "") + \
                (f"round(s) {[r + 1 for r in short]} (counted from 1; metrics.json lists the client) have "
                 f"{[steps[r] for r in short]} steps where the plan "
                 f"gives {per_round if per_round is not None else '> 0'}" if short else "")
        rows.append(row)
    return rows


#: how far below its target a calibrated plan may compose: σ is calibrated to within 0.5 % of the target
#: (:func:`fedhype.privacy.accountant.calibrate_noise`, ``rtol``), with room for a bracket that stopped shrinking
CALIBRATION_SLACK = 0.05


def _calibration_rows(config: dict) -> list[dict[str, Any]]:
    """``config.json``'s privacy plan against its own settings: what :func:`_plan_rows` checks the ledger against.

    * the release's steps (``privacy_plan.prefix``) are :func:`fedhype.privacy.centring.release_steps` of its σ₀
      (``privacy_plan.class_stats_noise_multiplier``) and ``train.centre_share``;
    * a plan calibrated for ``train.epsilon`` (``privacy_plan.calibrated``) composes to it: the worst client's ε of the
      prefix and its DP-SGD steps (:func:`fedhype.privacy.plan.worst_epsilon`) lies in
      [(1 − :data:`CALIBRATION_SLACK`)·target, target].

    A privacy auditor's probe multiplied the release's σ in the ledger and in the plan's prefix by 1.5 and the audit
    reported ε = 0.696 for a run calibrated for ε = 1. Consistency only: a forger who also rewrites the target and σ₀
    passes (README, "What the audit cannot show"). No rows for a run without a calibrated plan of this version.
    """
    from fedhype.privacy.centring import release_steps
    from fedhype.privacy.plan import worst_epsilon

    pp = config.get("privacy_plan") if isinstance(config.get("privacy_plan"), dict) else {}
    train = config.get("train", {}) if isinstance(config.get("train"), dict) else {}
    plan, prefix = pp.get("plan"), [tuple(x) for x in pp.get("prefix") or []]
    if not isinstance(plan, list) or train.get("no_dp") or "calibrated" not in pp:
        return []
    rows: list[dict[str, Any]] = []
    s0 = pp.get("class_stats_noise_multiplier")
    if prefix and isinstance(s0, (int, float)) and s0 > 0:
        try:
            want = release_steps(float(s0), float(train.get("centre_share") or 0.0)) if len(prefix) > 1 else [(float(s0), 1.0, 1)]
        except (ValidationError, TypeError, ValueError):
            want = None
        ok = want is not None and len(want) == len(prefix) and all(
            abs(float(a[0]) - b[0]) <= 1e-9 * max(1.0, b[0]) and float(a[1]) == b[1] and int(a[2]) == b[2]
            for a, b in zip(prefix, want))
        rows.append({"name": "config.json: privacy_plan.prefix vs its σ₀ and train.centre_share",
                     "claimed": [list(x) for x in prefix], "recomputed": want and [list(x) for x in want],
                     "difference": None, "ok": ok,
                     **({} if ok else {"reason": "the release's steps are not those of the plan's σ₀ split by the "
                                                 "centre share (an edited σ)"})})
    target = train.get("epsilon")
    sigma = pp.get("noise_multiplier")
    if pp.get("calibrated") and isinstance(target, (int, float)) and target > 0:
        try:
            got = worst_epsilon([(float(q), int(k)) for q, k in plan], float(train.get("delta")),
                                None if sigma is None else float(sigma), prefix)
        except (ValidationError, TypeError, ValueError) as exc:
            got, why = None, f"the plan cannot be accounted ({exc})"
        else:
            why = (f"a plan calibrated for ε = {target:g} composes to ε = {got:.6g}: its σ or its target was edited")
        ok = got is not None and (1 - CALIBRATION_SLACK) * target <= got <= target * (1 + 1e-6)
        rows.append({"name": "config.json: privacy_plan composes to train.epsilon (calibrated)", "claimed": target,
                     "recomputed": got, "difference": None if got is None else got - target, "ok": ok,
                     **({} if ok else {"reason": why})})
    return rows


def _report_client_rows(ledger: PrivacyLedger, report: dict, where: str, tol: float) -> list[dict[str, Any]]:
    """report.json's per-client ε claims as checked rows.

    ``client_epsilons`` (``[{"id", "name", "epsilon"}]``) is checked by ledger id, and
    ``epsilon_per_client`` (client name → ε) through the names it lists; a report without
    ``client_epsilons`` (written before names were used) keys ``epsilon_per_client`` by ledger id.
    """
    listed = report.get("client_epsilons")
    if not isinstance(listed, list):
        return [_check(ledger, f"{where}: epsilon_per_client[{c}]", str(c), e, tol)
                for c, e in (report.get("epsilon_per_client") or {}).items()]
    rows, ids = [], {}
    for item in listed:
        cid, name = str(item.get("id")), str(item.get("name"))
        ids[name] = ids[f"{name} [{cid}]"] = cid
        rows.append(_check(ledger, f"{where}: client_epsilons[{cid}] ({name})", cid, item.get("epsilon"), tol))
    for name, e in (report.get("epsilon_per_client") or {}).items():
        if name in ids:
            rows.append(_check(ledger, f"{where}: epsilon_per_client[{name}]", ids[name], e, tol))
        else:
            rows.append({"name": f"{where}: epsilon_per_client[{name}]", "claimed": e, "recomputed": None,
                         "difference": None, "ok": False, "reason": f"client {name!r} is not in client_epsilons"})
    return rows


def _load_ledger(run: RunDir, res: dict[str, Any], rows: list[dict[str, Any]]) -> PrivacyLedger | None:
    """The run's verified ledger, or None after recording why it fails verification in ``res`` and ``rows``."""
    try:
        return PrivacyLedger.load(run.ledger)
    except ArtifactError as exc:
        res.update(ledger_ok=False, ledger_error=_tamper_detail(run.ledger, str(exc)))
        rows.append({"name": "ledger.json", "claimed": None, "recomputed": None, "difference": None, "ok": False,
                     "reason": res["ledger_error"]})
        return None


def _report_release_rows(ledger: PrivacyLedger, report: dict, where: str, config: dict,
                         tol: float, notes: list[str]) -> list[dict[str, Any]]:
    """A job report's other privacy figures (a probe's edits of them passed): the release's own ε and charge count
    (:func:`fedhype.privacy.events.release_claims` of the ledger), the target ε (``config.json``'s), and its
    ``report.md`` (the SHA-256 the report recorded of the text written beside it)."""
    import hashlib

    from fedhype.privacy.events import release_claims

    rows = []
    if "tstr_accuracy" in report:  # a job's report writes these keys: one removed turned its check off (a probe)
        gone = [k for k in ("class_stats_epsilon", "target_epsilon") if k not in report]
        if gone:
            rows.append({"name": f"{where}: {', '.join(gone)}", "claimed": "missing", "recomputed": None,
                         "difference": None, "ok": False,
                         "reason": "a job's report.json writes these keys: removed; rerun the job's evaluation "
                                   "(`fedhype run` again) to write it whole"})
        if "report_md_sha256" not in report:  # reports written before 2026-12-07 have none
            notes.append(f"{where} records no report_md_sha256 (a report written before the audit checked report.md, "
                         "or the key was removed): report.md is not checked; rerun the job (`fedhype run` again) to "
                         "write both")
    if report.get("class_stats_epsilon") is not None:
        plan = config.get("privacy_plan") if isinstance(config.get("privacy_plan"), dict) else {}
        want = release_claims(ledger.events, ledger.delta, plan.get("class_stats_noise_multiplier"))
        rows.append(_equal(f"{where}: class_stats_epsilon", report["class_stats_epsilon"], want["class_stats_epsilon"],
                           tol))
        if report.get("class_stats_releases") is not None:
            rows.append(_equal(f"{where}: class_stats_releases", report["class_stats_releases"],
                               want["class_stats_releases"]))
    if "target_epsilon" in report:
        rows.append(_equal(f"{where}: target_epsilon", report["target_epsilon"], _target(config)))
    digest = report.get("report_md_sha256")
    md = Path(where).with_name("report.md")
    if digest is not None:
        now = hashlib.sha256(md.read_bytes()).hexdigest() if md.is_file() else None
        row = _equal(f"{md}: sha256 (report.json report_md_sha256)", digest, now)
        if not row["ok"]:
            row["reason"] = ("report.md is not the text written with report.json (edited, replaced or removed): "
                             "rerun the job's evaluation (`fedhype run` again) to write it")
        rows.append(row)
    return rows


def _note_seeded(res: dict[str, Any], seed: Any, ledger: PrivacyLedger) -> None:
    """``res["noise_seeded"]`` and its warning: the run's seed (``train.seed``), or the ledger's events drawn from a
    node's own seed."""
    if seed is not None:
        res["noise_seeded"] = True
        res["warnings"].append(f"the noise was seeded (train.seed = {seed}): whoever knows the seed can "
                               "regenerate and remove it, so the ε below holds only while the seed stays secret; "
                               "a run to be shared as private is trained without a seed")
        return
    seeded = list(dict.fromkeys(e.client for e in ledger.events if e.seeded))
    if seeded:  # a Flower SuperNode started with seed=: reproducible noise although train.seed is unset
        res["noise_seeded"] = True
        res["warnings"].append(f"the noise of client(s) {seeded} was seeded (their SuperNode's seed= node "
                               "config, recorded in the ledger): whoever knows the seed can regenerate and "
                               "remove it, so their ε holds only while the seed stays secret; run those nodes "
                               "without seed=")


def _target(config: dict) -> float | None:
    """The run's target ε: ``train.epsilon``, unless an explicit σ was given."""
    train_conf = config.get("train") or {}
    return train_conf.get("epsilon") if train_conf.get("noise_multiplier") is None else None


def _audit_unstarted(run: RunDir, config: dict) -> dict[str, Any]:
    """:func:`audit_run` of a run interrupted before its first round was committed (no model yet): its ledger's
    write-ahead events (the statistics release, the first round) are spent; nothing else claims an ε."""
    names = [str(n) for n in (config.get("partition") or {}).get("clients") or []]
    no_dp = bool((config.get("train") or {}).get("no_dp"))
    res: dict[str, Any] = {"client_names": {str(i): n for i, n in enumerate(names)}, "run": str(run.root),
                           "report": None, "private": not no_dp, "ledger_ok": None, "ledger_error": None,
                           "epsilon": None, "delta": (config.get("train") or {}).get("delta"), "epsilon_rdp": None,
                           "worst_client": None, "epsilon_per_client": {}, "epsilon_rdp_per_client": {}, "events": 0,
                           "interrupted": True, "warnings": []}
    rows: list[dict[str, Any]] = []
    if not no_dp and run.ledger.exists():
        ledger = _load_ledger(run, res, rows)
        if ledger is None:
            return _finish(res, rows)
        worst_client, worst = ledger.worst()
        rdp = ledger.epsilons("rdp")
        res.update(ledger_ok=True, epsilon=worst, delta=ledger.delta, worst_client=worst_client,
                   epsilon_per_client=ledger.epsilons(), epsilon_rdp_per_client=rdp,
                   epsilon_rdp=max(rdp.values()) if rdp else 0.0, events=len(ledger))
        rows.append(_equal("config.json: train.delta", (config.get("train") or {}).get("delta"), ledger.delta))
        _note_voids(ledger, res)
        # as for a committed run: a seeded run's audit says so (a probe's stop before round 1 read noise_seeded false)
        _note_seeded(res, (config.get("train") or {}).get("seed"), ledger)
        target = _target(config)
        rerun = recharged_events(ledger)
        res.update(target_epsilon=target, above_target=above_target(worst, target), recharged_events=len(rerun))
        charges = len(ledger.events)
    else:
        charges = 0
    if not no_dp and not run.ledger.exists():
        res["epsilon"] = 0.0
    res["warnings"].append(
        f"interrupted before its first round was committed: no model was written; the ledger's {charges} "
        f"event(s) were written ahead and are spent (ε {res['epsilon'] or 0:.4g}), and nothing else claims an ε; "
        "resume the run (fedhype train --resume, or resume=true on Flower) to continue it")
    return _finish(res, rows)


def _note_voids(ledger: PrivacyLedger, res: dict[str, Any]) -> None:
    """``res["voided_charges"]``, and a warning naming each write-ahead charge a void withdrew (client, step, why)."""
    pairs = ledger.voided()
    res["voided_charges"] = len(pairs)
    if pairs:
        names = res.get("client_names") or {}
        what = "; ".join(f"client {c.client!r}" + (f" ({names[c.client]})" if names.get(c.client) not in (None, c.client)
                                                   else "")
                         + (f", the statistics release ({c.mechanism})" if c.round < 0 else f", round {c.round + 1}")
                         + f": {v.note.removeprefix('void: ')}" for c, v in pairs)
        res["warnings"].append(f"{len(pairs)} write-ahead charge(s) were voided in the ledger and do not count in ε "
                               f"(each void names its charge by digest): {what}")


#: keys every audit result holds, whatever the run's state (a script reading ``--json`` met a KeyError for an
#: interrupted run): their values where the run did not set them
STABLE_KEYS: dict[str, Any] = {"target_epsilon": None, "above_target": False, "recharged_events": 0,
                               "interrupted": False, "noise_seeded": False, "release": False}


def _finish(res: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    for k, v in STABLE_KEYS.items():
        res.setdefault(k, v)
    for r in rows:
        if isinstance(r.get("difference"), float) and math.isnan(r["difference"]):
            r["difference"] = None
    res["checked"] = rows
    res["mismatches"] = [{k: v for k, v in r.items() if k != "ok"} for r in rows if not r["ok"]]
    res["consistent"] = not res["mismatches"]
    return res
