"""The DP linear reference over a federation of sites (``fedhype prototypes dp-linear --site``): one client per site.

As ``fedhype train --site`` (:func:`fedhype.federated.engine.train_sites`): client *i* reads only site *i*'s
training records, labels renumbered by name to the federation's classes (the
:class:`~fedhype.data.roster.Roster` of the sites' public cards: the sorted union of their classes, or
``classes``), and the reference is evaluated on the union of the sites' held-out ``test`` splits. Its clients
are named by the sites (the run's ``ledger.json`` and the per-client results say ``hospital_a``, not ``0``).

Each site's ledger across runs (``site-ledger.json``, :mod:`fedhype.privacy.site_ledger`) is charged with what
the run spends on that site's records, as ``train --site`` charges it
(:mod:`fedhype.federated.site_charges`):

* before anything is charged, run or written, the whole plan — the σ₀ statistics release and the R·K_i
  DP-SGD steps at σ, q_i = B/n_i, the accountant terms :func:`~fedhype.prototypes.dp_linear.fit_dp_fedavg_linear`
  settles — is composed with the site's other runs and refused past its cap
  (:func:`~fedhype.privacy.site_ledger.refuse_plan`; exit 3), and a site ledger that cannot be written is refused;
* a seeded run (``seed``: noise that whoever holds the seed can regenerate) is ε = ∞ for a site
  (:data:`~fedhype.privacy.site_ledger.SEEDED_NOTE`): refused on a capped site, recorded as seeded events
  otherwise; a run without DP is recorded as ε = ∞ (refused on a capped site);
* then every event is charged to the site's ledger first, write-ahead
  (:attr:`~fedhype.privacy.ledger.PrivacyLedger.mirrors`, :func:`fedhype.privacy.ledger.charge`), each noted
  with the run's key (``run dp-linear-<hex>``, also in the run's ledger's meta): the site's ledger holds exactly
  the events the run's ledger holds for its client, so its ε for this run is the accountant's for the steps
  actually run on its records (at the site's δ).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from fedhype.errors import ValidationError
from fedhype.privacy.events import DP_LINEAR as MECHANISM
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.prototypes.dp_linear import DPLinearConfig, fit_dp_fedavg_linear


def dp_linear_sites(sites: Sequence[Any], cfg: DPLinearConfig | None = None, *, out: str | Path | None = None,
                    classes: Sequence[str] | None = None, test_split: str = "test",
                    on_accepted: Callable[[], None] | None = None) -> dict[str, Any]:
    """Train the DP linear reference over ``sites`` (client *i* is site *i*'s ``train`` split), charging each
    site's ledger across runs (module docstring), and evaluate it on the sites' ``test_split`` records.

    Args:
        sites: the sites (:class:`~fedhype.data.sites.Site`, from ``fedhype site``); a site made in memory
            (no folder) has no ledger and is charged nothing.
        cfg: settings (:class:`~fedhype.prototypes.dp_linear.DPLinearConfig`).
        out: if given, the model and the run's ``ledger.json`` are written there (after training).
        classes: the federation's class names in label order (default: the sorted union of the sites').
        test_split: the held-out split of every site the reference is scored on.
        on_accepted: called once every site accepted the plan, before anything is trained (e.g. to say so).

    Returns:
        As :func:`~fedhype.prototypes.dp_linear.dp_linear_downstream` (``per_client`` by site, ``per_domain`` by
        the sites' domain names), plus ``"sites"`` (names), ``"class_names"``, ``"run_key"`` and
        ``"site_ledgers"``: each site's :func:`fedhype.privacy.site_ledger.report` after the run.

    Raises:
        BudgetExceededError: a site's cap (or ``cfg.max_epsilon``) would be exceeded; nothing was charged, run
            or written.
        ValidationError: two sites holding the same records, sites embedded differently, a site class outside
            ``classes``, δ ≥ 1/n_i; ArtifactError: a missing, corrupt or read-only site ledger or store.
    """
    from fedhype.data.roster import Roster
    from fedhype.eval.utility import classification_metrics
    from fedhype.federated.site_charges import refuse_unbounded, site_stores, start_site_ledgers
    from fedhype.privacy.site_ledger import SiteCharger, load_site_ledger, refuse_plan, report

    t0 = time.perf_counter()
    cfg = cfg or DPLinearConfig()
    sites = list(sites)
    if out is not None and (Path(out) / "model.safetensors").exists():  # before any site is charged
        raise ValidationError(f"{out} already holds a model; choose another output folder")
    stores = site_stores(sites)  # one client per set of records (two sites of one store are refused)
    roster = Roster.from_cards([s.public_card(st) for s, st in zip(sites, stores)], classes)
    names = list(roster.class_names)
    train = {s.name: s.records("train", names, st) for s, st in zip(sites, stores)}
    clients = {n: (tr.embeddings, tr.labels) for n, tr in train.items()}
    tests = [s.records(test_split, names, st) for s, st in zip(sites, stores)]
    if not sum(len(t) for t in tests):  # before anything is spent: there would be nothing to score the model on
        raise ValidationError(f"the sites hold no {test_split} records (their splits: `fedhype site --fractions`): the "
                              "reference is evaluated on the sites' held-out records")
    key = f"dp-linear-{secrets.token_hex(8)}"
    chargers = {s.name: SiteCharger(Path(s.folder), s.name, key, float(cfg.delta), expected=s.ledger)
                for s in sites if s.folder is not None}
    ledger = PrivacyLedger(cfg.delta, meta={"mechanism": MECHANISM, "run_key": key, "sites": [s.name for s in sites]})

    def on_plan(terms: dict[str, list[tuple[float, float, int]]]) -> None:
        # the whole plan against every site first: nothing is charged, trained or written before all fit
        refuse_unbounded(chargers.values(), no_dp=cfg.no_dp, seeded=cfg.seed is not None)  # ε = ∞: any cap refuses
        if not cfg.no_dp:
            for name, ch in chargers.items():
                refuse_plan(ch, terms[name], cfg.clip_norm)
        start_site_ledgers(sites, cfg.delta)  # a site folder written before site ledgers
        if cfg.no_dp:
            for ch in chargers.values():
                ch.charge_no_dp()
        else:  # every event of a site's client is charged to its ledger first (write-ahead)
            ledger.mirrors.update(chargers)
        if on_accepted is not None:
            on_accepted()

    model, ledger = fit_dp_fedavg_linear(clients, len(names), cfg, ledger=ledger, on_plan=on_plan)
    x = torch.cat([t.embeddings for t in tests])
    y = np.concatenate([t.labels.numpy() for t in tests]).astype(np.int64)
    pred = model.predict(x)
    site_of = np.concatenate([np.full(len(t), s.name, dtype=object) for s, t in zip(sites, tests)])
    domain_of = np.concatenate([np.array([t.domain_names[d] for d in t.domains.tolist()], dtype=object)
                                for t in tests])

    def by(groups: np.ndarray) -> dict[str, dict]:
        return {g: {"n": int((groups == g).sum()), **classification_metrics(y[groups == g], pred[groups == g])}
                for g in dict.fromkeys(groups.tolist())}

    if out is not None:
        model.save(out, ledger if model.privacy["private"] else None)
    ledgers = {ch.site: report(load_site_ledger(ch.folder, site=ch.site), ch.folder, ch.site)
               for ch in chargers.values()}
    return {**classification_metrics(y, pred), "per_domain": by(domain_of), "per_client": by(site_of),
            **model.privacy, "rounds": model.config["rounds"], "n_train": sum(len(t) for t in train.values()),
            "n_test": int(len(y)), "model": None if out is None else str(out), "reused": False,
            "sites": [s.name for s in sites], "class_names": names, "run_key": key, "site_ledgers": ledgers,
            "seconds": time.perf_counter() - t0}
