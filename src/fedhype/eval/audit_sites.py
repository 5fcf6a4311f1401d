"""A run's ledger against the sites' own ledgers across runs (``fedhype audit --run R --site DIR``).

The coordinator writes a run's ``ledger.json``, ``config.json`` and model; whoever controls the coordinator could
rewrite them all consistently (a ledger's hash chain catches an edit, not a ledger rebuilt from scratch), and
``fedhype audit --run`` alone would then pass. Each site's ``site-ledger.json`` (:mod:`fedhype.privacy.site_ledger`)
is written by the site — by ``train --site`` charging it write-ahead, or by the site's own SuperNode — with the
run's key on every event it charged for that run. So the site's ledger is evidence the coordinator does not hold:
the ε of the site's events for the run, composed at the run ledger's δ (:func:`fedhype.privacy.site_ledger.composed`),
must not exceed the ε the run's ledger reports for the site's client. Post-processing of ledgers only (no ε).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedhype.errors import ValidationError


def compare_site(run_dir: str | Path, site_dir: str | Path, tolerance: float = 1e-6) -> dict[str, Any]:
    """The run's ε for a site's client against the site's own ledger's events for the run.

    Args:
        run_dir: a run directory (its ``ckpt/run-key.json`` names the run in the sites' ledgers; ``ledger.json``), its
            release folder (``config.json``'s ``run_key``: what a site receives), or the folder of a DP linear reference over sites (``prototypes dp-linear --site --out``: its ``ledger.json``
            names the run's key and sites).
        site_dir: the site folder (``fedhype site``) whose ``site-ledger.json`` is read.
        tolerance: allowed ε difference (rounding only).

    Returns:
        An audit row: ``name``, ``claimed`` (the run ledger's ε for the site's client), ``recomputed`` (the site's
        events for the run, at the run's δ; ∞ is None with ``"infinite": true``: a seeded or non-private run),
        ``difference``, ``ok`` (the run does not report less than the site recorded), ``site``, ``run_key``,
        ``events`` (the site's events for the run).

    Raises:
        ValidationError: the run has no key (not a ``--site`` run, or a release written before releases kept it), or
            the site is not one of the run's sites (a site whose ledger holds no event of the run gets a row, ok, with
            a note). ArtifactError: an unreadable or edited ledger.
    """
    from fedhype.data.sites import Site
    from fedhype.eval.audit_mia import run_sites
    from fedhype.federated.rundir import RunDir
    from fedhype.privacy.ledger import PrivacyLedger
    from fedhype.privacy.site_ledger import NO_DP, composed, load_site_ledger, run_of

    run = RunDir(Path(run_dir))
    key, sites = _identity(run, run_dir)
    if key is None or not sites:
        raise ValidationError(f"--site: {run_dir} is not the folder of a run trained over sites (`train --site`, a "
                              "Flower run, or `prototypes dp-linear --site --out`): it has no run key "
                              "(ckpt/run-key.json, a release's config.json run_key — releases written before "
                              "2026-12-08 lack it: audit the run folder, or write the release again —, or its "
                              "ledger.json's meta) naming it in the sites' ledgers")
    site = Site.load(site_dir)
    if site.name not in sites:
        raise ValidationError(f"--site {site_dir}: site {site.name!r} is not one of the run's sites {sites}")
    unstarted = not run.ledger.exists() and not run.model.exists() and not run.checkpoint.exists()
    own = load_site_ledger(site.folder, expected=True, site=site.name)
    run_ledger = (PrivacyLedger(own.delta if own is not None else 1e-5) if unstarted else PrivacyLedger.load(run.ledger))
    events = [e for e in (own.events if own is not None else ()) if run_of(e) == key]
    client = site.name if site.name in run_ledger.clients() else str(sites.index(site.name))
    if not events and not unstarted:
        # a helper's Flower node killed before its first charge: the site spent nothing on the run, and the audit
        # stopped with a usage error (exit 2) instead of a row; the same holds for a release naming a run key the site
        # never saw, which no comparison by key can tell apart, so the note points to the site's whole record
        claimed = run_ledger.epsilon(client)
        return {"name": f"ledger.json: client {client}'s ε vs site {site.name!r}'s own ledger for run {key}",
                "claimed": claimed, "recomputed": 0.0, "infinite": False, "difference": claimed, "ok": True,
                "site": site.name, "run_key": key, "events": 0,
                "note": (f"the site's ledger holds no event of run {key}: as far as the site recorded, this run used "
                         "none of its records (its node stopped before its first charge, or the site ledger was "
                         "started after the run), so the run's figure is the conservative one. A release that names "
                         "another run's key would read the same: `fedhype budget --site` lists every run the site's "
                         "records took part in, with its ε")}
    claimed = run_ledger.epsilon(client)
    recomputed = composed(events, run_ledger.delta)
    infinite = math.isinf(recomputed)
    note = None
    if unstarted:  # a stop right after the sites' charge, before the run's ledger was written: nothing ran
        return {"name": f"ledger.json: client {client}'s ε vs site {site.name!r}'s own ledger for run {key}",
                "claimed": None, "recomputed": None if infinite else recomputed, "infinite": infinite,
                "difference": None, "ok": True, "site": site.name, "run_key": key, "events": len(events),
                "note": ("the run stopped after the site was charged and before its own ledger was written, so nothing "
                         "ran and the run claims no ε; the site keeps the charge as spent, and resuming the run "
                         "(`--resume`) takes it over instead of charging again")}
    if infinite:
        # the site counts a seeded run (or one without DP) as ε = ∞; the run's ledger reports the accountant's
        # figure beside its seeded-noise warning. Compared on the same footing, not failed as a tampering (a probe)
        finite = composed(events, run_ledger.delta, seeded_infinite=False)
        if not math.isinf(finite):
            recomputed, note = finite, ("a seeded run: the site counts it as ε = ∞ (its noise can be regenerated from "
                                        "the seed); compared at the accountant's figure, as the run reports it")
        elif any(e.mechanism == NO_DP for e in events) and _no_dp(run):
            note = "a run without DP: the site recorded ε = ∞ and the run claims no guarantee"
    if note is None and not infinite and claimed > recomputed + max(tolerance, 1e-9):
        # a helper's Flower run charged a killed node's requests write-ahead: the run reported more than the site held,
        # "ok" without a word
        note = (f"the run's ledger charges this client more (ε = {claimed:.6g}) than the site's own ledger holds for the "
                f"run ({recomputed:.6g}): requests the server charged before asking (write-ahead) that the site never "
                "ran or never recorded — a node stopped before it charged them, or a release it was not summed in. The "
                "run's figure is the conservative one; the site's is what its records were used for")
    if note is None:
        ok = (not infinite) and claimed >= recomputed - tolerance
    elif math.isinf(recomputed):
        ok = True
    else:
        ok = claimed >= recomputed - tolerance
    shown = None if math.isinf(recomputed) else recomputed
    return {"name": f"ledger.json: client {client}'s ε vs site {site.name!r}'s own ledger for run {key}",
            "claimed": claimed, "recomputed": shown, "infinite": infinite,
            "difference": None if shown is None else claimed - shown, "ok": bool(ok), "site": site.name,
            "run_key": key, "events": len(events),
            **({"note": note} if note else {}),
            **({} if ok else {"reason": (f"the run's ledger reports ε = {claimed:.6g} for the site's client, less than "
                                         f"the site's own ledger records for this run"
                                         + (f" ({shown:.6g})" if shown is not None else " (ε = ∞: seeded or without DP)")
                                         + ": the run's ledger lacks charges the site recorded — edited, or "
                                           "another copy of this run's folder (the same run key, e.g. a backup "
                                           "resumed beside it) also trained on the site's records")})}


def _identity(run, run_dir) -> tuple[str | None, list[str] | None]:
    """The run's key and sites: a generator's run folder names them in ``ckpt/run-key.json`` and ``config.json``, its
    release folder (``release/``, ``synthesize --release``) in its ``config.json`` (``run_key``, ``store.sites``); a
    DP linear reference over sites (``prototypes dp-linear --site --out``) in its ``ledger.json``'s meta
    (:mod:`fedhype.prototypes.dp_linear_sites`). (None, None) when neither does."""
    from fedhype.eval.audit_mia import run_sites
    from fedhype.io import read_json
    from fedhype.privacy.events import DP_LINEAR

    key, sites = run.run_key(), run_sites(run_dir)
    if key is None and run.config.is_file() and (run.root / "privacy.json").is_file():  # a release folder
        named = read_json(run.config, "release config").get("run_key")
        key = named if isinstance(named, str) and named else None
    if key is None and run.ledger.is_file() and not run.config.exists():
        meta = read_json(run.ledger, "privacy ledger").get("meta") or {}
        if (isinstance(meta, dict) and meta.get("mechanism") == DP_LINEAR and isinstance(meta.get("run_key"), str)
                and isinstance(meta.get("sites"), list) and meta["sites"]):
            key, sites = meta["run_key"], [str(x) for x in meta["sites"]]
    return key, sites


def _no_dp(run) -> bool:
    """Whether the run's config.json says it trained without DP."""
    from fedhype.io import read_json

    return bool((read_json(run.config, "run config").get("train") or {}).get("no_dp")) if run.config.is_file() else False
