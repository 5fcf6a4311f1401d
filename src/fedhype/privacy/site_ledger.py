"""A site's own ledger across runs: every charge against its records, composed, under its lifetime cap.

A run's ledger (``run/ledger.json``) proves what *that run* spent. A hospital's records, though, take
part in many runs — a first federation, a rerun with more rounds, another consortium's — and their
privacy loss composes across all of them (sequential composition holds for adaptively chosen
mechanisms: Dwork & Roth 2014, Theorem 3.16; the PRV accountant composes the heterogeneous (σ, q,
steps) of every event exactly as within one run, Gopi et al. 2021). So a site folder written by
``fedhype site`` keeps ``site-ledger.json``: a :class:`~fedhype.privacy.ledger.PrivacyLedger` (hash-chained,
tamper-evident) whose events are every event any run charged to this site's client, renamed to the
site and noted with the run's key (``run <key>``). Its ε at its own δ is the site's lifetime spend,
over every run on this machine that was given the site folder.

The cap (``max_epsilon`` in the ledger's meta, set by ``fedhype site --max-epsilon`` or
``fedhype budget --site DIR --max-epsilon``) is enforced write-ahead: a charge that would take the
site's composed ε past it raises before anything is recorded or run (:class:`SiteCharger`), and
``fedhype train --site`` refuses a fresh run whose whole plan would (:func:`refuse_plan`). Without a
cap the site ledger still records every charge: a site always knows what its records have paid.

Where it is charged: in one process (``fedhype train --site``), the run's ledger mirrors each client's
charges to its site's ledger (:attr:`PrivacyLedger.mirrors`); on Flower, a site's SuperNode charges its
site folder's ledger beside its per-run node ledger (:mod:`fedhype.federated.flower.node_budget`). Only
events the run's rerun rule charges are mirrored (:func:`fedhype.privacy.ledger.pending_charges`): a seeded
resume that replays its noise costs the site nothing again, an unseeded rerun is charged again.

Concurrent runs on one machine serialise on ``site-ledger.json.lock`` (an advisory ``fcntl`` lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from fedhype.errors import ArtifactError, BudgetExceededError, ValidationError
from fedhype.privacy.ledger import LedgerEvent, PrivacyLedger, charge

#: the site's ledger across runs, in the site folder beside ``site.json`` (private to the site)
SITE_LEDGER = "site-ledger.json"
_WHAT = "every charge against this site's records, across runs"
_RUN = "run "


def ledger_path(folder: str | os.PathLike) -> Path:
    """``<folder>/site-ledger.json`` (``folder``: a site folder, or its ``site.json``)."""
    folder = Path(folder)
    return (folder.parent if folder.suffix == ".json" else folder) / SITE_LEDGER


@contextlib.contextmanager
def _locked(folder: str | os.PathLike) -> Iterator[None]:
    path = ledger_path(folder).with_suffix(".json.lock")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock (one run at a time per site)
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def load_site_ledger(folder: str | os.PathLike) -> PrivacyLedger | None:
    """The site's ledger, or None where none was written yet.

    Raises:
        ArtifactError: the file is corrupt, truncated or edited (its hash chain names the first bad event).
    """
    path = ledger_path(folder)
    return PrivacyLedger.load(path) if path.exists() else None


def cap_of(ledger: PrivacyLedger | None) -> float | None:
    """The site's lifetime ε cap (None: no cap, the ledger only records)."""
    v = None if ledger is None else ledger.meta.get("max_epsilon")
    return None if v is None else float(v)


def site_of(ledger: PrivacyLedger) -> str:
    """The site's name, as its events carry it."""
    return str(ledger.meta.get("site", ""))


def run_of(event: LedgerEvent) -> str:
    """The key of the run that charged ``event`` (from its note, ``run <key>[; …]``)."""
    head = event.note.split(";", 1)[0]
    return head[len(_RUN):] if head.startswith(_RUN) else "?"


def spent(ledger: PrivacyLedger | None) -> float:
    """The site's composed ε over every run at the ledger's δ (0 without a ledger)."""
    return 0.0 if ledger is None else ledger.epsilon(site_of(ledger))


def by_run(ledger: PrivacyLedger) -> dict[str, float]:
    """ε of each run's events alone at the site ledger's δ, in the order the runs first charged."""
    site, out = site_of(ledger), {}
    for key in dict.fromkeys(run_of(e) for e in ledger.events):
        alone = PrivacyLedger(ledger.delta)
        for e in ledger.events:
            if run_of(e) == key:
                alone.record(e)
        out[key] = alone.epsilon(site)
    return out


def report(ledger: PrivacyLedger | None, folder: str | os.PathLike, site: str) -> dict:
    """JSON-ready summary: the site, its δ, cap, composed ε over every run, what is left, and each run's ε alone.

    ``left`` (cap − spent) is a guide only: ε does not add up across runs (the accountant composes their events,
    and at one δ a run's ε alone can fit under it or not); :func:`refuse_plan` composes a next run's plan exactly.
    """
    cap = cap_of(ledger)
    eps = spent(ledger)
    runs = by_run(ledger) if ledger is not None else {}
    counts = {k: sum(1 for e in ledger.events if run_of(e) == k) for k in runs} if ledger is not None else {}
    return {"site": site, "ledger": str(ledger_path(folder)), "delta": None if ledger is None else ledger.delta,
            "max_epsilon": cap, "epsilon": eps, "left": None if cap is None else max(cap - eps, 0.0),
            "runs": [{"run": k, "epsilon": v, "events": counts[k]} for k, v in runs.items()]}


def set_cap(folder: str | os.PathLike, site: str, max_epsilon: float | None, delta: float | None = None) -> PrivacyLedger:
    """Set (or lift, with None) the site's lifetime ε cap; create the ledger if there is none.

    The events are kept (re-recorded under the new header: the chain is rebuilt, each event unchanged).

    Args:
        folder: the site folder. site: its name. max_epsilon: the cap (> 0) or None.
        delta: the site's δ (default: the ledger's, or 1e-5 for a new one); ε is recomputed at it.
    Raises:
        ValidationError: a cap ≤ 0 or a δ outside (0, 1); a cap below what the site already spent.
        ArtifactError: an existing ledger that is corrupt, or kept by another site.
    """
    if max_epsilon is not None and not (isinstance(max_epsilon, (int, float)) and math.isfinite(max_epsilon)
                                        and max_epsilon > 0):
        raise ValidationError(f"--max-epsilon must be a finite number > 0, got {max_epsilon!r}")
    with _locked(folder):
        old = load_site_ledger(folder)
        if old is not None and site_of(old) != site:
            raise ArtifactError(f"{ledger_path(folder)} is the ledger of site {site_of(old)!r}, not {site!r}")
        new = PrivacyLedger(delta if delta is not None else (old.delta if old else 1e-5),
                            {"site": site, "max_epsilon": max_epsilon, "what": _WHAT})
        for e in (old.events if old else ()):
            new.record(e)
        now = spent(new)
        if max_epsilon is not None and now > max_epsilon:
            raise ValidationError(f"site {site!r} has already spent ε = {now:.4f} at δ = {new.delta:g} over its runs "
                                  f"({ledger_path(folder)}): a cap of {max_epsilon:g} is below it; give a larger one")
        new.save(ledger_path(folder))
        return new


@dataclasses.dataclass(frozen=True)
class SiteCharger:
    """What a run holds for one site: charge its ledger across runs, write-ahead, or refuse.

    Args:
        folder: the site folder. site: the site's name. run_key: this run's key (kept in each event's note).
        delta: δ of a ledger created by the first charge (the run's; a cap set earlier fixed the site's own).
    """

    folder: Path
    site: str
    run_key: str
    delta: float

    def _open(self) -> PrivacyLedger:
        led = load_site_ledger(self.folder)
        if led is None:
            return PrivacyLedger(self.delta, {"site": self.site, "max_epsilon": None, "what": _WHAT})
        if site_of(led) != self.site:
            raise ArtifactError(f"{ledger_path(self.folder)} is the ledger of site {site_of(led)!r}, not {self.site!r}")
        return led

    def mirrored(self, events: Iterable[LedgerEvent]) -> list[LedgerEvent]:
        """``events`` (one client's, from a run's ledger) as this site's: renamed, noted with the run key."""
        note = f"{_RUN}{self.run_key}"
        return [dataclasses.replace(e, client=self.site, note=f"{note}; {e.note}" if e.note else note) for e in events]

    def refusal(self, events: Sequence[LedgerEvent]) -> BudgetExceededError | None:
        """The error a charge of ``events`` would raise, or None where it fits under the site's cap."""
        led = self._open()
        cap = cap_of(led)
        if cap is None or not events:
            return None
        mine = self.mirrored(events)
        over = led.would_exceed(mine, cap * (1 + 1e-9))
        if not over:
            return None
        eps = over[self.site]
        e = events[0]
        what = "the statistics release" if e.round < 0 else f"round {e.round + 1}"
        return BudgetExceededError(
            f"site {self.site!r}: {e.mechanism} ({what}) would take its records to ε = {eps:.4f} at δ = {led.delta:g} "
            f"over all its runs, past the site's cap of {cap:g} (already spent: {spent(led):.4f}; "
            f"{ledger_path(self.folder)}); nothing was charged or run. The site's operator raises the cap with "
            f"`fedhype budget --site {self.folder} --max-epsilon E`", epsilon=eps, limit=cap)

    def charge(self, events: Sequence[LedgerEvent]) -> None:
        """Record ``events`` (already charged to the run's ledger by its rerun rule) in the site's ledger.

        Raises:
            BudgetExceededError: the site's composed ε would pass its cap (nothing is recorded).
            ArtifactError: the site's ledger is corrupt or another site's.
        """
        if not events:
            return
        with _locked(self.folder):
            if (err := self.refusal(events)) is not None:
                raise err
            led = self._open()
            charge(led, self.mirrored(events), ledger_path(self.folder))


def refuse_plan(charger: SiteCharger, planned: Sequence[tuple[float, float, int]], clip_norm: float = 1.0) -> None:
    """Refuse (exit 3) a fresh run whose whole plan — ``(σ, q, steps)`` terms, the release and every planned
    round — would take the site past its cap; nothing is charged either way.

    Raises:
        BudgetExceededError: naming the site, its spend, the plan's and the cap.
    """
    events = [LedgerEvent(charger.site, -1, "planned", float(s), float(q), int(n), clip_norm) for s, q, n in planned if n]
    err = charger.refusal(events)
    if err is not None:
        led = charger._open()
        alone = PrivacyLedger(led.delta)
        for e in charger.mirrored(events):
            alone.record(e)
        raise BudgetExceededError(
            f"site {charger.site!r}: this run's plan (ε = {alone.epsilon(charger.site):.4f} alone) would take its "
            f"records to ε = {err.epsilon:.4f} at δ = {led.delta:g} over all its runs, past the site's cap of "
            f"{err.limit:g} (already spent: {spent(led):.4f}; {ledger_path(charger.folder)}); nothing was run. "
            f"Lower the run's --epsilon, or the site's operator raises the cap with "
            f"`fedhype budget --site {charger.folder} --max-epsilon E`", epsilon=err.epsilon, limit=err.limit)
