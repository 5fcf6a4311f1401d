"""A site's own ledger across runs: every charge against its records, composed, under its lifetime cap.

A run's ledger (``run/ledger.json``) proves what *that run* spent. A hospital's records, though, take
part in many runs — a first federation, a rerun with more rounds, another consortium's — and their
privacy loss composes across all of them (sequential composition holds for adaptively chosen
mechanisms: Dwork & Roth 2014, Theorem 3.16; the PRV accountant composes the heterogeneous (σ, q,
steps) of every event exactly as within one run, Gopi et al. 2021). So a site folder written by
``fedhype site`` keeps ``site-ledger.json``: a :class:`~fedhype.privacy.ledger.PrivacyLedger` (hash-chained,
tamper-evident) whose events are every event any run charged to this site's client, renamed to the
site and noted with the run's key (``run <key>``). Its ε at the site's δ (set by ``fedhype site --delta``)
is the site's lifetime spend over every run given this site folder; composition does not depend on the
order of the mechanisms, so events of equal (σ, q) are pooled before the accountant runs (exact, and
the cost stays flat in the number of runs). A run without DP (``--no-dp``) is recorded as ε = ∞.

A seeded run (``--seed`` / ``train.seed``: its noise drawn from the run seed, reproducible and "not secure")
counts as ε = ∞ for the site too: the seed is in the run's and the release's ``config.json``, so whoever holds
a seeded release can regenerate its noise and remove it, and two runs with the same seed reuse one noise draw
(their releases, solved together, give the records' exact statistics; a probe recovered a site's record count).
The accountant's ε assumes noise nobody can reproduce, so it is no guarantee here: the site's ledger keeps the
seeded events as they ran (``"seeded": true``) and composes them as ε = ∞ (:func:`composed`), a capped site
refuses a seeded run like a run without DP, and :func:`report` lists the seeded runs (:data:`SEEDED_NOTE`).

The cap (``max_epsilon`` in the ledger's meta, set by ``fedhype site --max-epsilon`` or
``fedhype budget --site DIR --max-epsilon``) is enforced write-ahead: a charge that would take the
site's composed ε past it raises before anything is recorded or run (:class:`SiteCharger`), and
``fedhype train --site`` refuses a fresh run whose whole plan would (:func:`refuse_plan`). Without a
cap the site ledger still records every charge: a site always knows what its records have paid.

Where it is charged: in one process (``fedhype train --site``), the run's ledger mirrors each client's
charges to its site's ledger (:attr:`PrivacyLedger.mirrors`), the site's first; on Flower, a site's
SuperNode charges its site folder's ledger before its per-run node ledger
(:mod:`fedhype.federated.flower.node_budget`). Only events the run's rerun rule charges are mirrored
(:func:`fedhype.privacy.ledger.pending_charges`), and a seeded event the site already holds for the same
run, round and mechanism is not recorded twice (a stop between the two ledgers' writes, then a seeded
resume, replays the same noise): a seeded resume is recorded once (the run is ε = ∞ for the site anyway), an
unseeded rerun is charged again. A charge the site holds and the run's ledger lacks (a stop between the two writes:
its mechanism never ran) is taken over by the resume only where the run's folder made it — each charge's token is
written to the folder (:attr:`SiteCharger.tokens`) before the site's write — so a copy of a run folder resumed beside
the original is charged for every round it runs. Before a run writes anything, ``train --site`` also checks that every site's
ledger can be written (:func:`check_writable`), so a read-only ledger does not leave a half-started run folder.

A site folder started by ``fedhype site`` says so in ``site.json`` (``"site_ledger"``): its ledger missing is
then an error (a deleted ledger would reset the site's spend), not a fresh start. Concurrent runs on one
machine serialise on ``site-ledger.json.lock`` (an advisory ``fcntl`` lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
import math
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from fedhype.data.sites import SITE_LEDGER_FILE
from fedhype.errors import ArtifactError, BudgetExceededError, ValidationError
from fedhype.privacy.ledger import CHARGE_FIELDS, LEDGER_ADVICE, LedgerEvent, PrivacyLedger, charge

_WHAT = "every charge against this site's records, across runs"
_RUN = "run "
#: the tag of one charge in a site event's note (``run <key>; charge <token>[; …]``): the token the charging folder
#: keeps (:attr:`SiteCharger.tokens`), so that a later attempt from *that* folder can tell its own unfinished charge
_CHARGE = "charge "
#: beside a site's ledger: the charge tokens a resume has taken over as its own unfinished charge (each is reused at
#: most once: two copies of a run folder made at a stop between the site's write and the run's both held that token)
CLAIMS_FILE = "site-claims.json"
#: the mechanism recorded for a run without DP on the site's records (σ = 0: ε = ∞)
NO_DP = "no-dp-training"
#: ``set_site_ledger``'s default: leave the cap as it is
KEEP = object()
#: what a seeded run means for the site's records (``fedhype budget --site`` prints it)
SEEDED_NOTE = ("a seeded run (--seed / train.seed) drew its noise from the run seed, which its config.json and any "
               "release of it carry: whoever holds the release can regenerate the noise and remove it, and runs with "
               "the same seed reuse the same noise draw. Its ε is therefore ∞ for the site (no guarantee for these "
               "records, like a run without DP), whatever the run's own ledger computed; train without --seed for "
               "private runs")


def eps_text(eps: float) -> str:
    """ε for a message: 4 decimals, or ∞ (a seeded run counts as ε = ∞; a probe read "ε = inf")."""
    return "∞" if math.isinf(eps) else f"{eps:.4f}"


def ledger_path(folder: str | os.PathLike) -> Path:
    """``<folder>/site-ledger.json`` (``folder``: a site folder, or its ``site.json``)."""
    folder = Path(folder)
    return (folder.parent if folder.suffix == ".json" else folder) / SITE_LEDGER_FILE


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


def load_site_ledger(folder: str | os.PathLike, *, expected: bool = False, site: str | None = None) -> PrivacyLedger | None:
    """The site's ledger, or None where none was written yet.

    Args:
        expected: the site's ``site.json`` says ``fedhype site`` started one (a missing file is then an error).
        site: the site's name, checked against the ledger's.
    Raises:
        ArtifactError: the file is missing though expected, corrupt, truncated, edited (its hash chain names the
            first bad event) or another site's.
    """
    path = ledger_path(folder)
    keep = ("restore it from a backup: it is the only record of what the site's records have spent, and "
            "deleting or re-creating it would reset that spend")
    if not path.exists():
        if expected:
            raise ArtifactError(f"{path} is missing, though the site's site.json says `fedhype site` started it; {keep}")
        return None
    try:
        led = PrivacyLedger.load(path)
    except ArtifactError as exc:
        raise ArtifactError(f"the site's ledger across runs: {str(exc).split('; ' + LEDGER_ADVICE)[0]}; {keep}") from None
    if site is not None and site_of(led) != site:
        raise ArtifactError(f"{path} is the ledger of site {site_of(led)!r}, not {site!r} (copied from another site "
                            "folder?); put this site's own ledger back")
    return led


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


def charge_of(event: LedgerEvent) -> str | None:
    """The token of the charge that recorded ``event`` (its note's ``charge <token>``), or None (older events)."""
    parts = event.note.split("; ")
    return parts[1][len(_CHARGE):] if len(parts) > 1 and parts[1].startswith(_CHARGE) else None


def composed(events: Iterable[LedgerEvent], delta: float, accountant: str | None = None, *,
             seeded_infinite: bool = True) -> float:
    """ε at ``delta`` of every event together, those of equal (σ, q) pooled first (composition is order-free).

    The reported accountant of :meth:`PrivacyLedger.epsilon` (min of PRV and RDP; RDP alone with Skellam
    releases), or ``accountant`` (``"rdp"``: the fast upper bound a cap check tries first); ∞ with an event
    without noise, and with a seeded event (its noise can be regenerated from the seed: :data:`SEEDED_NOTE`).
    ``seeded_infinite=False``: the accountant's figure as if the seeded noise were secret (what the run's own
    ledger reports; no guarantee for the site).
    """
    from fedhype.privacy.accountant import epsilon, epsilon_discrete

    events = list(events)
    if seeded_infinite and any(e.seeded for e in events):
        return math.inf
    steps: dict[tuple[float, float], int] = {}
    terms = []
    for e in events:
        if e.discrete:
            if e.steps and e.sample_rate:
                terms.append((e.noise_multiplier, e.scale, e.record_dim, e.steps))
        elif e.steps and e.sample_rate:
            if e.noise_multiplier == 0:
                return math.inf
            steps[(e.noise_multiplier, e.sample_rate)] = steps.get((e.noise_multiplier, e.sample_rate), 0) + e.steps
    history = [(s, q, n) for (s, q), n in sorted(steps.items())]
    if terms:
        return epsilon_discrete(history, terms, delta)
    if not history:
        return 0.0
    return epsilon(history, delta) if accountant is None else epsilon(history, delta, accountant)


def spent(ledger: PrivacyLedger | None) -> float:
    """The site's composed ε over every run at the ledger's δ (0 without a ledger; ∞ after a run without DP)."""
    return 0.0 if ledger is None else composed(ledger.events, ledger.delta)


def by_run(ledger: PrivacyLedger, *, seeded_infinite: bool = True) -> dict[str, float]:
    """ε of each run's events alone at the site ledger's δ, in the order the runs first charged (∞ for a seeded
    run, unless ``seeded_infinite=False``: see :func:`composed`)."""
    keys = list(dict.fromkeys(run_of(e) for e in ledger.events))
    return {k: composed((e for e in ledger.events if run_of(e) == k), ledger.delta, seeded_infinite=seeded_infinite)
            for k in keys}


def seeded_runs(ledger: PrivacyLedger | None) -> list[str]:
    """The keys of the runs that charged seeded events (ε = ∞ for the site: :data:`SEEDED_NOTE`), in order."""
    return [] if ledger is None else list(dict.fromkeys(run_of(e) for e in ledger.events if e.seeded))


def _finite(v: float | None) -> float | None:
    return None if v is None or math.isinf(v) else v


def report(ledger: PrivacyLedger | None, folder: str | os.PathLike, site: str) -> dict:
    """JSON-ready summary: the site, its δ, cap, composed ε over every run, what is left, and each run's ε alone.

    ``left`` (cap − spent) is a guide only: ε does not add up across runs (the accountant composes their events,
    and at one δ a run's ε alone can fit under it or not); :func:`refuse_plan` composes a next run's plan exactly.
    An infinite ε (a run without DP, or a seeded run) is ``null`` with ``"epsilon_infinite": true`` (strict JSON has
    no ∞). Each run says whether it was ``"seeded"`` and ``"no_dp"``; ``"seeded_runs"`` lists the seeded ones, with
    ``"seeded_note"`` (:data:`SEEDED_NOTE`) where there are any.
    """
    cap = cap_of(ledger)
    eps = spent(ledger)
    runs = by_run(ledger) if ledger is not None else {}
    counts = {k: sum(1 for e in ledger.events if run_of(e) == k) for k in runs} if ledger is not None else {}
    seeded = seeded_runs(ledger)
    no_dp = {run_of(e) for e in ledger.events if e.mechanism == NO_DP} if ledger is not None else set()
    out = {"site": site, "ledger": str(ledger_path(folder)), "delta": None if ledger is None else ledger.delta,
           "max_epsilon": cap, "epsilon": _finite(eps), "epsilon_infinite": math.isinf(eps),
           "left": None if cap is None else max(cap - eps, 0.0),
           "runs": [{"run": k, "epsilon": _finite(v), "epsilon_infinite": math.isinf(v), "events": counts[k],
                     "seeded": k in seeded, "no_dp": k in no_dp} for k, v in runs.items()],
           "seeded_runs": seeded}
    if seeded:
        out["seeded_note"] = SEEDED_NOTE
    return out


def infinite_reason(ledger: PrivacyLedger) -> str:
    """Why the site's composed ε is ∞: a run without DP, or a seeded run (naming them)."""
    seeded = seeded_runs(ledger)
    no_dp = list(dict.fromkeys(run_of(e) for e in ledger.events if e.mechanism == NO_DP))
    parts = ([f"a run without DP used its records ({', '.join(no_dp)})"] if no_dp else []) + (
        [f"seeded run(s) {', '.join(seeded)} drew their noise from a seed their config.json carries (whoever holds "
         "the release can remove it)"] if seeded else [])
    return "; ".join(parts) or "a run added no noise"


def check_delta_change(ledger: PrivacyLedger | None, delta: float | None, max_epsilon=KEEP,
                       flag: str = "--delta") -> None:
    """Refuse raising a capped site's δ without restating its cap in the same command.

    ε at a larger δ is smaller, so the same cap would admit more runs over the same records: a change of the
    site's policy that only its operator may make, by giving the cap again (``--max-epsilon``) with the new δ.

    Raises:
        ValidationError: naming the δ's, the spend at each and what to do.
    """
    cap = cap_of(ledger)
    if ledger is None or cap is None or delta is None or max_epsilon is not KEEP or not delta > ledger.delta:
        return
    before, after = spent(ledger), composed(ledger.events, delta)
    raise ValidationError(
        f"{flag} {delta:g} raises site {site_of(ledger)!r}'s δ from {ledger.delta:g}, under its cap of {cap:g}: ε at a "
        f"larger δ is smaller (spent so far: {before:.4g} at δ = {ledger.delta:g}, {after:.4g} at δ = {delta:g}), so "
        f"the same cap would admit more runs on these records. Nothing was changed; if the site's policy is ε ≤ E at "
        f"δ = {delta:g}, restate the cap in the same command ({flag} {delta:g} --max-epsilon E)")


def check_writable(folder: str | os.PathLike, site: str) -> None:
    """Refuse a site folder whose ledger across runs cannot be written (a read-only ``site-ledger.json``, a
    read-only folder), before a run writes anything: a run charges the ledger before its first mechanism.

    A ledger with no write bit at all (``chmod a-w``) counts as read-only even for root.

    Raises:
        ArtifactError: naming the site and the path.
    """
    import stat
    import tempfile

    path = ledger_path(folder)
    fix = (f"site {site!r}: its ledger across runs, {path}, {{what}}; a run charges it before its first mechanism, so "
           "nothing was run or written. Make it writable (e.g. `chmod u+w`) and run the same command again")
    if path.exists():
        mode = path.stat().st_mode
        if not (mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) or not os.access(path, os.W_OK):
            raise ArtifactError(fix.format(what="is read-only"))
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ArtifactError(fix.format(what=f"cannot be written in its folder ({exc.strerror or exc})")) from None


def check_delta(delta: float, n_train: int | None, flag: str = "--delta") -> float:
    """δ of a site's ledger: in (0, 1) and below 1/n of the site's training records (as a run's δ).

    Raises:
        ValidationError: naming ``flag``.
    """
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValidationError(f"{flag} must be a number in (0, 1), got {delta!r}")
    if n_train and delta * n_train >= 1:
        raise ValidationError(f"{flag} {delta:g} is not below 1/n = {1 / n_train:.3g} for the site's {n_train} training "
                              "records: a δ that large allows releasing a record outright; give a smaller one (δ ≪ 1/n)")
    return float(delta)


def set_site_ledger(folder: str | os.PathLike, site: str, *, max_epsilon=KEEP, delta: float | None = None,
                    expected: bool = False) -> PrivacyLedger:
    """Start the site's ledger, or change its cap (a number, or None to lift it) or δ; the events are kept
    (re-recorded under the new header: the chain is rebuilt, each event unchanged).

    Args:
        folder: the site folder. site: its name. max_epsilon: the cap (> 0), None (no cap) or :data:`KEEP`.
        delta: the site's δ (default: the ledger's; a new ledger needs it); ε is recomputed at it.
        expected: ``site.json`` says a ledger was started (see :func:`load_site_ledger`).
    Raises:
        ValidationError: a cap ≤ 0 or not finite; a cap below what the site already spent; a new ledger without δ;
            a larger δ for a capped site without the cap restated (:func:`check_delta_change`).
        ArtifactError: an existing ledger that is corrupt, or kept by another site.
    """
    if max_epsilon is not KEEP and max_epsilon is not None and not (
            isinstance(max_epsilon, (int, float)) and math.isfinite(max_epsilon) and max_epsilon > 0):
        raise ValidationError(f"--max-epsilon must be a finite number > 0, got {max_epsilon!r}")
    with _locked(folder):
        old = load_site_ledger(folder, expected=expected, site=site)
        if old is None and delta is None:
            raise ValidationError(f"site {site!r} has no ledger yet: give its δ")
        check_delta_change(old, delta, max_epsilon)
        cap = cap_of(old) if max_epsilon is KEEP else max_epsilon
        new = PrivacyLedger(delta if delta is not None else old.delta, {"site": site, "max_epsilon": cap, "what": _WHAT})
        for e in (old.events if old else ()):
            new.record(e)
        now = spent(new)
        if cap is not None and math.isinf(now):
            raise ValidationError(f"site {site!r}: {infinite_reason(new)} ({ledger_path(folder)}: ε = ∞), so no "
                                  "finite cap can hold; the site can only record further runs (no cap)")
        if cap is not None and now > cap:
            raise ValidationError(f"site {site!r} has already spent ε = {eps_text(now)} at δ = {new.delta:g} over its runs "
                                  f"({ledger_path(folder)}): a cap of {cap:g} is below it; give a larger one")
        new.save(ledger_path(folder))
        return new


def _signature(e: LedgerEvent) -> tuple:
    """What makes two events the same charge at a site (client, note and time aside): the ledger's
    :data:`~fedhype.privacy.ledger.CHARGE_FIELDS` but the client (a run's client id is the site's name here)."""
    return tuple(getattr(e, f) for f in CHARGE_FIELDS if f != "client")


@dataclasses.dataclass
class SiteCharger:
    """What a run holds for one site: charge its ledger across runs, write-ahead, or refuse.

    Args:
        folder: the site folder. site: the site's name. run_key: this run's key (kept in each event's note).
        delta: δ of a ledger created by the first charge (a site folder of an earlier version; ``fedhype site``
            starts it at the site's own δ).
        expected: the site's ``site.json`` says its ledger was started (a missing one is an error).
        tokens: a JSON file in the charging run's own folder (``ckpt/site-charges.json``, or a SuperNode's run state
            folder) holding, per site, the token of the last charge made from that folder, written before the site is
            charged. A charge at the site that the run's ledger lacks is reused by a resume only if it carries that
            token (:meth:`_orphans`): a copy of the run folder (a backup restored and resumed beside the original)
            shares the run key but not the original's later tokens, so what the original ran is not taken for its
            own unfinished charge. None: no charge is reused (every charge is made).
    """

    folder: Path
    site: str
    run_key: str
    delta: float
    expected: bool = False
    tokens: Path | None = None
    _memo: tuple | None = dataclasses.field(default=None, repr=False, compare=False)

    def _tokens_held(self) -> dict:
        """``{site: token}`` of :attr:`tokens` (empty where there is none, or it is unreadable)."""
        if self.tokens is None or not Path(self.tokens).is_file():
            return {}
        import json

        try:
            raw = json.loads(Path(self.tokens).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return dict(raw["sites"]) if isinstance(raw, dict) and isinstance(raw.get("sites"), dict) else {}

    def _last_token(self) -> str | None:
        """The token of the last charge this run's folder made at this site (None: none recorded, or unreadable)."""
        tok = self._tokens_held().get(self.site)
        return tok if isinstance(tok, str) and tok else None

    def _new_token(self) -> str | None:
        """Draw this charge's token and record it in :attr:`tokens` (atomic) before the site is charged."""
        if self.tokens is None:
            return None
        import secrets

        from fedhype.io import atomic_write_json

        path = Path(self.tokens)
        sites = self._tokens_held()
        sites[self.site] = tok = secrets.token_hex(6)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"what": "per site, the token of the last charge this folder made on its ledger "
                                         "across runs (a resume reuses only its own unfinished charge)",
                                 "sites": sites})
        return tok

    def _claims(self) -> Path:
        """``site-claims.json`` beside the site's ledger (:data:`CLAIMS_FILE`)."""
        return ledger_path(self.folder).with_name(CLAIMS_FILE)

    def _taken_tokens(self) -> set[str] | None:
        """The tokens in the site's claims file (empty where there is none; None where it cannot be read)."""
        path = self._claims()
        if not path.exists():
            return set()
        import json

        try:
            return set(map(str, json.loads(path.read_text(encoding="utf-8"))["taken"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _taken(self, token: str) -> bool:
        """Whether a resume already took over the site's charge ``token`` as its own unfinished charge. An unreadable
        claims file counts every token as taken: no charge is reused, so at worst a step is charged twice."""
        taken = self._taken_tokens()
        return taken is None or token in taken

    def _claim(self, token: str) -> None:
        """Record (atomically, under the site's lock) that this resume took over the site's charge ``token``."""
        from fedhype.io import atomic_write_json

        taken = self._taken_tokens() or set()  # unreadable: every token counted as taken until this rewrite
        atomic_write_json(self._claims(), {"what": "the charge tokens of this site's ledger that a resumed run took "
                                                   "over as its own unfinished charge (a stop between the site's write "
                                                   "and the run's); each is reused once. Keep it beside site-ledger.json",
                                           "taken": sorted(taken | {token})})

    def _open(self) -> PrivacyLedger:
        led = load_site_ledger(self.folder, expected=self.expected, site=self.site)
        if led is None:
            return PrivacyLedger(self.delta, {"site": self.site, "max_epsilon": None, "what": _WHAT})
        return led

    def mirrored(self, events: Iterable[LedgerEvent], token: str | None = None) -> list[LedgerEvent]:
        """``events`` (one client's, from a run's ledger) as this site's: renamed, noted with the run key (and the
        charge's ``token``)."""
        note = f"{_RUN}{self.run_key}" + (f"; {_CHARGE}{token}" if token else "")
        return [dataclasses.replace(e, client=self.site, note=f"{note}; {e.note}" if e.note else note) for e in events]

    def _orphans(self, led: PrivacyLedger, recorded: Sequence[LedgerEvent] | None, last: str | None) -> Counter:
        """This run's events in the site's ledger that the run's own ledger does not hold (``recorded``: the run
        ledger's events of this site's client), by :func:`_signature`, made by the last charge of this run's folder
        (the token in :attr:`tokens`). The site is charged first and the run's ledger next, and a mechanism runs
        only once both are written (:func:`fedhype.privacy.ledger.charge`), so such an event is a charge whose
        mechanism never ran: a stop (Ctrl-C, SIGTERM, kill -9) between the two writes. Events of this run key with
        another token were charged from another folder of the run — a copy resumed beside the original (a probe's
        copied run folder trained 20 rounds on the sites uncharged, each taken for its own unfinished charge) — and
        are never reused. A token a resume already took over (:meth:`_taken`, recorded under the site's lock when
        it reused that charge) is not reused again: two copies of the folder made at that stop both hold the token, and
        the second to resume charges its step afresh. ``last``: that token (:meth:`_last_token`). None of
        ``recorded``, or no token: not known (no orphans are reused)."""
        if recorded is None or last is None or self._taken(last):
            return Counter()
        have = Counter(_signature(e) for e in recorded)
        out: Counter = Counter()
        for e in led.events:
            if run_of(e) != self.run_key:
                continue
            k = _signature(e)
            if have[k] > 0:
                have[k] -= 1
            elif charge_of(e) == last:
                out[k] += 1
        return out

    def others(self, led: PrivacyLedger, recorded: Sequence[LedgerEvent] | None = None) -> list[LedgerEvent]:
        """The site's events that are not this run folder's: other runs', and — with ``recorded`` (the run ledger's
        events of this site's client) — this run key's events that its ledger does not hold and that are not its
        own unfinished charge (:meth:`_orphans`): another copy of the run folder charged them. Without ``recorded``
        every event of the run key counts as this run's."""
        if recorded is None:
            return [e for e in led.events if run_of(e) != self.run_key]
        have = Counter(_signature(e) for e in recorded)
        orphans = self._orphans(led, recorded, self._last_token())
        out = []
        for e in led.events:
            if run_of(e) == self.run_key:
                k = _signature(e)
                if have[k] > 0:
                    have[k] -= 1
                    continue
                if orphans[k] > 0:
                    orphans[k] -= 1
                    continue
            out.append(e)
        return out

    def _new(self, led: PrivacyLedger, events: Sequence[LedgerEvent],
             recorded: Sequence[LedgerEvent] | None = None, token: str | None = None,
             last: str | None = None, reused: list | None = None) -> list[LedgerEvent]:
        """The mirrored events not already in the site's ledger: a seeded event of the same run, round and
        mechanism as a recorded seeded one replays it (a stop between the site's write and the run's); any other
        event equal to an orphan of this run (:meth:`_orphans`: charged at the site, never recorded by the run, so
        never run) is that charge, now run — not charged twice (a probe's stop between the two writes left the
        site with a charge the run's resume made again, and ``audit --site`` failed the honest run)."""
        held = {(e.round, e.mechanism) for e in led.events if e.seeded and run_of(e) == self.run_key}
        held |= {(e.round, e.mechanism) for e in led.events if e.mechanism == NO_DP and run_of(e) == self.run_key}
        orphans = self._orphans(led, recorded, self._last_token() if last is None else last)
        out = []
        for e in self.mirrored(events, token):
            if (e.seeded or e.mechanism == NO_DP) and (e.round, e.mechanism) in held:
                continue
            if orphans[k := _signature(e)] > 0:
                orphans[k] -= 1
                if reused is not None:
                    reused.append(e)
                continue
            out.append(e)
        return out

    def refusal(self, events: Sequence[LedgerEvent], *, instead_of_own: bool = False,
                recorded: Sequence[LedgerEvent] | None = None) -> BudgetExceededError | None:
        """The error a charge of ``events`` would raise, or None where it fits under the site's cap.

        ``instead_of_own``: ``events`` are this run's whole plan, composed with the other runs' events only (what
        this run already charged, before a stop, is part of its plan; with ``recorded``, only what this folder
        charged: :meth:`others`). ``recorded``: as for :meth:`charge`.
        """
        led = self._open()
        cap = cap_of(led)
        if instead_of_own:
            others = PrivacyLedger(led.delta, led.meta)
            for e in self.others(led, recorded):
                others.record(e)
            led, recorded = others, None
        mine = self._new(led, events, recorded)
        if cap is None or not mine:
            return None
        key = (len(led), led.state_dict()["checksum"] if len(led) else "", tuple(e.to_dict().__repr__() for e in mine), cap)
        if self._memo is not None and self._memo[0] == key:  # the pre-check, then the charge: one accountant run
            eps = self._memo[1]
        else:  # RDP's ε bounds the reported one (the min of PRV and RDP): under the cap, it fits without PRV
            eps = composed([*led.events, *mine], led.delta, "rdp")
            if eps > cap * (1 + 1e-9):
                eps = composed([*led.events, *mine], led.delta)
            self._memo = (key, eps)
        if eps <= cap * (1 + 1e-9):
            return None
        e = mine[0]
        what = "the statistics release" if e.round < 0 else f"round {e.round + 1}"
        if math.isinf(before := spent(led)):  # seeded or no-DP events from before this version's rule, under a cap
            return BudgetExceededError(
                f"site {self.site!r}: {infinite_reason(led)}, so its records have no finite guarantee left (ε = ∞) under "
                f"its cap of {cap:g} ({ledger_path(self.folder)}); nothing was charged or run. The site's operator "
                f"decides: lift the cap with `fedhype budget --site {self.folder} --no-cap`", epsilon=before, limit=cap)
        if any(x.seeded for x in mine):
            return BudgetExceededError(
                f"site {self.site!r}: a seeded run (--seed / train.seed) gives its records no guarantee (ε = ∞ for the "
                f"site: its noise is drawn from a seed its config.json and release carry, so it can be regenerated "
                f"and removed, and runs with the same seed reuse one noise draw), and the site has a cap of {cap:g} "
                f"({ledger_path(self.folder)}); nothing was charged or run. Train without --seed (noise from OS "
                f"entropy), or the site's operator lifts the cap with `fedhype budget --site {self.folder} --no-cap`",
                epsilon=eps, limit=cap)
        if e.mechanism == NO_DP:
            return BudgetExceededError(
                f"site {self.site!r}: a run without DP gives its records no guarantee (ε = ∞), and the site has a cap "
                f"of {cap:g} ({ledger_path(self.folder)}); nothing was run. Train with DP, or the site's operator lifts "
                f"the cap with `fedhype budget --site {self.folder} --no-cap`", epsilon=eps, limit=cap)
        return BudgetExceededError(
            f"site {self.site!r}: {e.mechanism} ({what}) would take its records to ε = {eps_text(eps)} at δ = {led.delta:g} "
            f"over all its runs, past the site's cap of {cap:g} (already spent: {eps_text(spent(led))}; "
            f"{ledger_path(self.folder)}); nothing was charged or run. The site's operator raises the cap with "
            f"`fedhype budget --site {self.folder} --max-epsilon E`; then resume this run with --resume (its folder "
            "is kept), or delete its folder", epsilon=eps, limit=cap)

    def charge(self, events: Sequence[LedgerEvent], recorded: Sequence[LedgerEvent] | None = None) -> None:
        """Record ``events`` (charged to the run's ledger by its rerun rule) in the site's ledger, first.

        ``recorded``: the run ledger's events of this site's client so far (before ``events``): where given, an
        event the site holds for this run and the run's ledger does not (:meth:`_orphans`) is reused, not charged
        again.

        Raises:
            BudgetExceededError: the site's composed ε would pass its cap (nothing is recorded).
            ArtifactError: the site's ledger is missing though started, corrupt, or another site's.
        """
        if not events:
            return
        with _locked(self.folder):
            if (err := self.refusal(events, recorded=recorded)) is not None:
                raise err
            led = self._open()
            last, reused = self._last_token(), []
            mine = self._new(led, events, recorded, last=last, reused=reused)
            if mine:  # this charge's token, in the folder before the site's write
                mine = self._new(led, events, recorded, self._new_token(), last=last)
            if reused:  # this folder's own unfinished charge, taken over once: a copy of the folder can't take it too
                self._claim(last)
            if mine:
                charge(led, mine, ledger_path(self.folder))

    def charge_no_dp(self) -> None:
        """Record that this run trains on the site's records without DP (ε = ∞), once per run, or refuse under a cap.

        Raises:
            BudgetExceededError: the site has a cap (nothing is recorded or run).
        """
        self.charge([LedgerEvent(self.site, -1, NO_DP, 0.0, 1.0, 1, 0.0, note="trained without differential privacy")])


def refuse_plan(charger: SiteCharger, planned: Sequence[tuple[float, float, int]], clip_norm: float = 1.0,
                recorded: Sequence[LedgerEvent] | None = None) -> None:
    """Refuse (exit 3) a fresh run whose whole plan — ``(σ, q, steps)`` terms, the release and every planned
    round — would take the site past its cap; nothing is charged either way. ``recorded``: a resumed run's ledger
    events of this site's client (what it charged is part of its plan; a copy of its folder's charges are not:
    :meth:`SiteCharger.others`).

    Raises:
        BudgetExceededError: naming the site, its spend, the plan's and the cap.
    """
    events = [LedgerEvent(charger.site, -1, "planned", float(s), float(q), int(n), clip_norm) for s, q, n in planned if n]
    err = charger.refusal(events, instead_of_own=True, recorded=recorded)
    if err is not None:
        if math.isinf(err.epsilon):  # a seeded run (ε = ∞): no lower ε nor larger finite cap helps; err says why
            raise err
        led = charger._open()
        led_others = charger.others(led, recorded)
        raise BudgetExceededError(
            f"site {charger.site!r}: this run's plan (ε = {composed(events, led.delta):.4f} alone) would take its "
            f"records to ε = {eps_text(err.epsilon)} at δ = {led.delta:g} over all its runs, past the site's cap of "
            f"{err.limit:g} (spent by its other runs: {eps_text(composed(led_others, led.delta))}; "
            f"{ledger_path(charger.folder)}); nothing was run. "
            f"Lower the run's --epsilon, or the site's operator raises the cap with "
            f"`fedhype budget --site {charger.folder} --max-epsilon E`", epsilon=err.epsilon, limit=err.limit)
