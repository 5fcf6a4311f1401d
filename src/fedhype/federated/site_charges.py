"""What a run over sites charges to each site's ledger across runs (:mod:`fedhype.privacy.site_ledger`).

``fedhype train --site`` (:func:`fedhype.federated.engine.train_sites`) checks a fresh run's whole plan against
every site's cap before anything is written (:func:`refuse_site_plans`), then mirrors each client's charges to
its site's ledger (:func:`attach_site_ledgers`). A site's SuperNode charges its own
(:mod:`fedhype.federated.flower.node_budget`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from fedhype.data.sites import Site
from fedhype.federated.config import TrainConfig


def refuse_site_plans(cfg: TrainConfig, sizes: Sequence[int], sites: Sequence[Site], key: str | None = None,
                      run_root: Path | None = None) -> None:
    """Refuse a fresh run whose whole plan — the statistics release and every planned round — would take a
    site past the cap of its ledger across runs (client i is site i; a site made in memory, without a folder,
    has no ledger); a run without DP, and a seeded run (``cfg.seed``: its noise can be regenerated from the seed,
    ε = ∞ for the site, :data:`fedhype.privacy.site_ledger.SEEDED_NOTE`), is refused on any site with a cap. A site
    whose ledger cannot be written (read-only) is refused too. Nothing is written or charged. ``key``: the run's key
    where it exists (a resume: what the run charged before its stop is part of its plan, composed with the site's
    other runs only). ``run_root``: the run's folder (its ledger and its charges' tokens: a copy of the folder
    resumed beside the original is priced with the original's charges as another run's).

    Raises:
        BudgetExceededError: naming the site, what it already spent, the plan's ε and the cap.
        ArtifactError: a site's ledger is missing though started, corrupt, another site's, or read-only.
    """
    from fedhype.federated.run_plan import plan_privacy
    from fedhype.federated.secure_release import planned_tails
    from fedhype.privacy.site_ledger import refuse_plan

    tokens = None if run_root is None else Path(run_root) / "ckpt" / SITE_CHARGES_FILE
    chargers = _site_chargers(sites, key or "planned", cfg, tokens)
    refuse_unbounded(chargers.values(), no_dp=cfg.no_dp, seeded=cfg.seed is not None)
    if cfg.no_dp:
        return
    recorded: dict[int, list] = {}
    if key is not None and run_root is not None and (Path(run_root) / "ledger.json").is_file():
        from fedhype.privacy.ledger import PrivacyLedger

        events = PrivacyLedger.load(Path(run_root) / "ledger.json").events
        recorded = {i: [e for e in events if e.client in (str(i), s.name)] for i, s in enumerate(sites)}
    prefix, tails = list(plan_privacy(cfg, list(sizes))["prefix"]), planned_tails(cfg, list(sizes))
    for i, ch in chargers.items():
        refuse_plan(ch, prefix + tails[i], recorded=recorded.get(i))


def site_stores(sites: Sequence[Site]) -> list:
    """Each site's store (:meth:`~fedhype.data.sites.Site.store`), refusing two sites that hold the same store: one
    client per set of records, so that each site's ledger counts its records once.

    Raises:
        ValidationError: naming the two sites.
    """
    from fedhype.errors import ValidationError

    stores = [s.store() for s in sites]
    seen: dict[str, str] = {}
    for s, st in zip(sites, stores):
        if (other := seen.setdefault(st.digest(), s.name)) != s.name:
            raise ValidationError(f"sites {other!r} and {s.name!r} hold the same records (the same store): their "
                                  "privacy loss would compose across the two clients, which neither site's ledger "
                                  "sees; give each set of records once")
    return stores


def refuse_unbounded(chargers, *, no_dp: bool, seeded: bool) -> None:
    """Refuse, before anything is written, a run whose loss a capped site cannot bound, and a site ledger that
    cannot be written: every charger's folder must be writable; a run without DP, or a seeded one (its noise can be
    regenerated from the seed: ε = ∞ for the site, :data:`fedhype.privacy.site_ledger.SEEDED_NOTE`), is refused on
    any site with a cap. ``chargers``: :class:`fedhype.privacy.site_ledger.SiteCharger` of the run's sites.

    Raises:
        BudgetExceededError: a capped site, naming it. ArtifactError: a read-only or unusable site ledger.
    """
    from fedhype.privacy.ledger import LedgerEvent
    from fedhype.privacy.site_ledger import NO_DP, check_writable

    chargers = list(chargers)
    for ch in chargers:  # before the run folder is written: a failed charge would leave it behind
        check_writable(ch.folder, ch.site)
    if no_dp or seeded:
        for ch in chargers:
            mark = (LedgerEvent(ch.site, -1, NO_DP, 0.0, 1.0, 1, 0.0) if no_dp else
                    LedgerEvent(ch.site, -1, "planned", 1.0, 1.0, 1, 1.0, seeded=True))
            if (err := ch.refusal([mark])) is not None:
                raise err


def start_site_ledgers(sites: Sequence[Site], delta: float) -> None:
    """Start the ledger across runs of a site folder written before site ledgers existed, and mark its site.json
    (:func:`mark_site_ledger`); sites made in memory (no folder) and sites whose ledger exists are left alone."""
    from fedhype.privacy.site_ledger import load_site_ledger, set_site_ledger

    for s in sites:
        if s.folder is not None and not s.ledger:
            if load_site_ledger(s.folder, site=s.name) is None:
                set_site_ledger(s.folder, s.name, delta=float(delta))
            mark_site_ledger(s)


#: per site, the token of the last charge a run folder made on the site's ledger (:attr:`SiteCharger.tokens`)
SITE_CHARGES_FILE = "site-charges.json"


def _site_chargers(sites: Sequence[Site], key: str, cfg: TrainConfig, tokens: Path | None = None) -> dict:
    from fedhype.privacy.site_ledger import SiteCharger

    return {i: SiteCharger(Path(s.folder), s.name, key, float(cfg.delta), expected=s.ledger, tokens=tokens)
            for i, s in enumerate(sites) if s.folder is not None}


def attach_site_ledgers(state, sites: Sequence[Site], key: str) -> None:
    """Charge each site's ledger across runs with its client's events, write-ahead (client i is site i):
    :func:`fedhype.privacy.ledger.charge` then asks every site first and refuses past a site's cap. A run
    without DP is recorded on each site's ledger now, as ε = ∞ (once per run). Not for a site made in memory.

    Args:
        state: the opened run (:class:`fedhype.federated.engine.RunState`). key: the run's key
            (:meth:`fedhype.federated.rundir.RunDir.run_key`), noted on each site's events.
    """
    start_site_ledgers(sites, state.plan.cfg.delta)
    # the token of each site's last charge from this run folder (a resume reuses only its own unfinished charge)
    chargers = _site_chargers(sites, key, state.plan.cfg, state.run.root / "ckpt" / SITE_CHARGES_FILE)
    if state.plan.cfg.no_dp:
        for ch in chargers.values():
            ch.charge_no_dp()
        return
    state.ledger.mirrors.update({state.clients[i].id: ch for i, ch in chargers.items()})


def mark_site_ledger(site: Site) -> None:
    """Record in the site's ``site.json`` (``"site_ledger"``) that its ledger across runs was started, so a missing
    ledger is an error from now on; only where that file is this split's (its key)."""
    from fedhype.data.sites import SITE_FILE, SITE_LEDGER_FILE
    from fedhype.io import atomic_write_json, read_json

    path = Path(site.folder) / SITE_FILE
    raw = read_json(path, "site file") if path.is_file() else None
    if isinstance(raw, dict) and raw.get("key") == site.key and not raw.get("site_ledger"):
        atomic_write_json(path, {**raw, "site_ledger": SITE_LEDGER_FILE})
    site.ledger = True
