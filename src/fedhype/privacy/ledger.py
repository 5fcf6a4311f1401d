"""The privacy ledger: every mechanism run on private data, as plain data; ε is always recomputed.

In the style of Opacus's accountants (``opacus/accountants/accountant.py``): the state is a list of
events, ``state_dict`` / ``load_state_dict`` (or ``from_state_dict``) round-trip it, and loading says
exactly what is wrong.
The ledger is append-only. Each event is one Poisson-subsampled Gaussian mechanism run
``steps`` times (σ, q, C as in DP-SGD, Abadi et al. 2016, Alg. 1); ε per client comes from
:func:`fedhype.privacy.accountant.epsilon` (the reported figure: the smaller of the PRV and RDP
upper bounds) on that client's events. An event with ``noise = "skellam"`` is an un-subsampled
integer-domain release instead (:mod:`fedhype.privacy.skellam`: secure aggregation across machines;
its ``scale`` γ and ``record_dim`` d with σ give the Skellam variance and sensitivities); a client
with such an event is accounted by RDP alone (:func:`fedhype.privacy.accountant.epsilon_discrete`),
whichever accountant is asked for. Gaussian events are written without these two fields, and
unseeded events without ``seeded`` (true where the noise came from the run seed, the fact the rerun
rule of :func:`pending_charges` needs), so older ledgers and their hashes are unchanged.

A write-ahead charge whose mechanism provably did not run — a Flower node refused the request before touching its
records (:func:`void`) — stays in the file and is withdrawn by a later *void* event: the same client, round,
mechanism and numbers, ``voids`` = :func:`event_digest` of the charge, and a note saying why. Neither counts in ε:
:attr:`PrivacyLedger.events` (what every ε, the rerun rule and the audit read) holds the charges in force;
:attr:`PrivacyLedger.recorded` holds every line. A void must name an earlier charge of its ledger that is not void yet,
with the same client, round, mechanism and numbers (checked on load: a void that withdraws anything else is an
invalid ledger). Only a ledger started with ``meta["refusals"] = true`` takes voids (a Flower coordinator's, whose
nodes can refuse; :attr:`PrivacyLedger.takes_voids`): a void in any other ledger — a site's or a node's, an in-process
run's — is refused as an edit. Events without ``voids`` are written without it.

File format ``fedhype-ledger/1`` (JSON, written atomically)::

    {"format": "fedhype-ledger/1", "delta": δ, "meta": {...},
     "events": [<event>, ...],            # one canonical JSON object per line
     "chain": ["<sha256 hex>", ...],      # chain[i] = sha256(chain[i-1] + canonical(event i))
     "checksum": "<sha256 hex>"}          # sha256 of the canonical JSON of everything above

``chain[-1]`` (the genesis) is the sha256 of the canonical header ``{"format", "delta", "meta"}``,
so editing δ or meta breaks every link. This is tamper *evidence* against edits and truncation,
not a signature: someone who recomputes all hashes can forge a ledger.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from fedhype.errors import ArtifactError, ValidationError
from fedhype.io import atomic_write_text, read_json
from fedhype.privacy.accountant import (
    REPORTED,
    History,
    epsilon_discrete,
    validate_accountant,
    validate_delta,
    validate_sample_rate,
    validate_noise_multiplier,
    validate_steps,
    epsilon,
    epsilon_report,
)

FORMAT = "fedhype-ledger/1"
#: what to do about a ledger that is not JSON: it is the only record of what was spent, so it is restored, never
#: re-created (a probe was told "re-create it", which would reset the spend)
LEDGER_ADVICE = ("restore it from a backup or from the copy in a release folder made from this run (release/ledger.json): it is the "
                 "only record of the ε already spent, and re-creating or deleting it would reset that spend")
#: the noise of an event: the Gaussian mechanism (every event but one kind) or an integer-domain Skellam release
GAUSSIAN, SKELLAM = "gaussian", "skellam"
NOISES = (GAUSSIAN, SKELLAM)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class LedgerEvent:
    """One mechanism run on one client's private records.

    Attributes:
        client: client id (str).
        round: federated round (int ≥ 0), or -1 for a mechanism outside rounds.
        mechanism: what ran, e.g. ``"dp-sgd"``, ``"hyperprototype-dp-gradient"``, ``"canary-audit"``.
        noise_multiplier: σ ≥ 0 (noise std / clip norm); 0 with q > 0 means no DP (ε = ∞).
        sample_rate: Poisson sampling rate q ∈ [0, 1] (0: no record touched).
        steps: number of compositions (int ≥ 0).
        clip_norm: clipping norm C ≥ 0 (L2, in the units of the clipped quantity).
        note: free text (optional).
        noise: ``"gaussian"`` (default) or ``"skellam"`` (an integer-domain release, q = 1:
            :mod:`fedhype.privacy.skellam`; σ is then √μ/γ).
        scale: γ of a Skellam release (0 for Gaussian noise).
        record_dim: d of a Skellam release, the most coordinates one record touches (0 for Gaussian noise).
        seeded: the mechanism drew its noise (and sampling) from the run seed, so a rerun with the same
            seed replays it exactly (:func:`pending_charges`); written to JSON only when true, so ledgers
            of unseeded runs and of earlier versions keep their form and hashes.
        voids: "" for a charge; for a *void*, :func:`event_digest` of the earlier charge of the ledger it
            withdraws (the mechanism did not run: :func:`void`); written to JSON only when set.
        time: ISO 8601 timestamp (UTC now by default).

    Raises:
        ValidationError: on construction, naming the bad field.
    """

    client: str
    round: int
    mechanism: str
    noise_multiplier: float
    sample_rate: float
    steps: int
    clip_norm: float
    note: str = ""
    noise: str = GAUSSIAN
    scale: float = 0.0
    record_dim: int = 0
    seeded: bool = False
    voids: str = ""
    time: str = dataclasses.field(default_factory=_now)

    def __post_init__(self) -> None:
        for name in ("client", "mechanism", "note", "time"):
            if not isinstance(getattr(self, name), str):
                raise ValidationError(f"LedgerEvent.{name} must be a string, got {getattr(self, name)!r}")
        if not self.client or not self.mechanism:
            raise ValidationError("LedgerEvent.client and LedgerEvent.mechanism must be non-empty")
        if isinstance(self.round, bool) or not isinstance(self.round, numbers.Integral) or self.round < -1:
            raise ValidationError(f"LedgerEvent.round must be an integer ≥ -1, got {self.round!r}")
        # normalise numeric types (numpy/torch scalars → Python) so JSON and hashes are stable
        set_ = object.__setattr__
        set_(self, "round", int(self.round))
        set_(self, "noise_multiplier", validate_noise_multiplier(self.noise_multiplier, "LedgerEvent.noise_multiplier"))
        set_(self, "sample_rate", validate_sample_rate(self.sample_rate, "LedgerEvent.sample_rate", allow_zero=True))
        set_(self, "steps", validate_steps(self.steps, "LedgerEvent.steps"))
        set_(self, "clip_norm", validate_noise_multiplier(self.clip_norm, "LedgerEvent.clip_norm"))
        set_(self, "scale", validate_noise_multiplier(self.scale, "LedgerEvent.scale"))
        set_(self, "record_dim", validate_steps(self.record_dim, "LedgerEvent.record_dim"))
        if not isinstance(self.seeded, bool):
            raise ValidationError(f"LedgerEvent.seeded must be true or false, got {self.seeded!r}")
        if not isinstance(self.voids, str) or (self.voids and (len(self.voids) != 64 or self.voids.strip(
                "0123456789abcdef"))):
            raise ValidationError(f"LedgerEvent.voids must be \"\" or the sha256 (64 hex digits) of the charge it "
                                  f"withdraws, got {self.voids!r}")
        if self.noise not in NOISES:
            raise ValidationError(f"LedgerEvent.noise must be one of {NOISES}, got {self.noise!r}")
        if self.noise == GAUSSIAN and (self.scale or self.record_dim):
            raise ValidationError("LedgerEvent.scale and record_dim belong to a Skellam release (noise = 'skellam')")
        if self.noise != GAUSSIAN and (self.scale < 1 or self.record_dim < 1 or self.sample_rate not in (0.0, 1.0)):
            raise ValidationError(f"a Skellam LedgerEvent needs scale ≥ 1, record_dim ≥ 1 and sample_rate 1 (an "
                                  f"un-subsampled release), got scale {self.scale}, record_dim {self.record_dim}, "
                                  f"sample_rate {self.sample_rate}")

    @property
    def discrete(self) -> bool:
        """Whether this is an integer-domain (Skellam) release, accounted by RDP alone."""
        return self.noise != GAUSSIAN

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready); a Gaussian event has no ``noise``, ``scale``, ``record_dim`` keys, an
        unseeded one no ``seeded`` key, a charge no ``voids`` key."""
        d = dataclasses.asdict(self)
        if not self.seeded:
            d.pop("seeded")
        if not self.voids:
            d.pop("voids")
        if not self.discrete:
            for k in ("noise", "scale", "record_dim"):
                d.pop(k)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LedgerEvent":
        """Inverse of :meth:`to_dict`; unknown or missing fields raise :class:`ValidationError`."""
        if not isinstance(data, dict):
            raise ValidationError(f"an event must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
        if extra := sorted(set(data) - names):
            raise ValidationError(f"unknown event field(s) {extra}")
        if missing := sorted(required - set(data)):
            raise ValidationError(f"missing event field(s) {missing}")
        return cls(**data)


def event_digest(event: LedgerEvent) -> str:
    """SHA-256 (hex) of ``event``'s canonical JSON (:meth:`LedgerEvent.to_dict`): how a void names its charge."""
    return _sha256(_canonical(event.to_dict()))


#: the ledger meta key that lets a ledger hold void events (:attr:`PrivacyLedger.takes_voids`); part of its genesis
#: hash, so it cannot be added to a ledger after its start without rewriting every hash
REFUSALS = "refusals"

#: the fields that make two events the same charge (note and time aside): what a void repeats from the charge it
#: withdraws, and — without ``client`` — what a site ledger matches a run's event by (:mod:`fedhype.privacy.site_ledger`)
CHARGE_FIELDS = ("client", "round", "mechanism", "noise_multiplier", "sample_rate", "steps", "clip_norm", "noise",
                 "scale", "record_dim", "seeded")


def _history_of(events: Iterable[LedgerEvent]) -> History:
    """The Gaussian events of one client as an Opacus history, consecutive equal (σ, q) events merged."""
    out: History = []
    for e in events:
        if e.discrete:
            continue
        if out and out[-1][:2] == (e.noise_multiplier, e.sample_rate):
            out[-1] = (e.noise_multiplier, e.sample_rate, out[-1][2] + e.steps)
        else:
            out.append((e.noise_multiplier, e.sample_rate, e.steps))
    return out


def _terms_of(events: Iterable[LedgerEvent]) -> list[tuple[float, float, int, int]]:
    """The integer-domain (Skellam) releases of one client as accountant terms ``(σ, γ, d, steps)``."""
    return [(e.noise_multiplier, e.scale, e.record_dim, e.steps) for e in events if e.discrete and e.steps and e.sample_rate]


class PrivacyLedger:
    """Append-only record of mechanism events at one δ; ε per client recomputed from the events.

    Args:
        delta: the run's δ in (0, 1).
        meta: JSON-ready run metadata (e.g. run id, config hash); fixed at creation.
    """

    def __init__(self, delta: float, meta: dict | None = None):
        self.delta = validate_delta(delta)
        self.meta = dict(meta or {})
        try:
            header = _canonical({"format": FORMAT, "delta": self.delta, "meta": self.meta})
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"ledger meta must be JSON-serialisable ({exc})") from None
        self._genesis = _sha256(header)
        self._events: list[LedgerEvent] = []
        self._chain: list[str] = []
        self._voided: dict[int, int] = {}  # index of a withdrawn charge → index of its void
        self._in_force: tuple[LedgerEvent, ...] | None = None  # cache of :attr:`events`
        #: client id → a site's ledger across runs (:class:`fedhype.privacy.site_ledger.SiteCharger`) that
        #: :func:`charge` charges with that client's events first, or is refused by; not saved
        self.mirrors: dict[str, Any] = {}

    # ------------------------------------------------------------------ recording
    def record(self, event: LedgerEvent) -> None:
        """Append ``event`` (never rewrites earlier events).

        Raises:
            ValidationError: a void (``event.voids`` set) that names no earlier charge of this ledger in force, or
                one whose client, round, mechanism or numbers differ from that charge's (nothing is recorded).
        """
        if not isinstance(event, LedgerEvent):
            raise ValidationError(f"record() takes a LedgerEvent, got {type(event).__name__}")
        target = self._void_target(event) if event.voids else None
        prev = self._chain[-1] if self._chain else self._genesis
        self._chain.append(_sha256(prev + _canonical(event.to_dict())))
        self._events.append(event)
        if target is not None:
            self._voided[target] = len(self._events) - 1
        self._in_force = None

    @property
    def takes_voids(self) -> bool:
        """Whether this ledger may hold void events: only a ledger started with ``meta[REFUSALS] = True`` (a Flower
        coordinator's, whose nodes can refuse a request before touching their records). A site's or node's ledger,
        and an in-process run's, never does, so a void appended to one is refused on load (tampering)."""
        return bool(self.meta.get(REFUSALS))

    def _void_target(self, event: LedgerEvent) -> int:
        """Index of the charge in force that the void ``event`` withdraws (the latest one with its digest)."""
        if not self.takes_voids:
            raise ValidationError("a void event in a ledger whose run cannot have refused requests (only a Flower "
                                  f"coordinator's ledger, started with meta {REFUSALS!r}, takes voids): the file was "
                                  "edited")
        voids = set(self._voided.values())
        for i in range(len(self._events) - 1, -1, -1):
            x = self._events[i]
            if i in self._voided or i in voids or x.voids or event_digest(x) != event.voids:
                continue
            differ = [f for f in CHARGE_FIELDS if getattr(x, f) != getattr(event, f)]
            if differ:
                raise ValidationError(f"a void must repeat the charge it withdraws (event {i}); its {differ} differ")
            return i
        raise ValidationError(f"a void must name an earlier charge of this ledger that is still in force (voids = "
                              f"{event.voids[:12]}…: no such charge)")

    @property
    def genesis(self) -> str:
        """SHA-256 of the ledger's header (format, δ, meta): the first link of its hash chain, fixed at creation."""
        return self._genesis

    @property
    def events(self) -> tuple[LedgerEvent, ...]:
        """The charges in force, in recording order (read-only): every recorded event but the voids and the charges
        they withdraw (:func:`void`). Every ε, the rerun rule and the audit read these; :attr:`recorded` has all."""
        if self._in_force is None:
            out = set(self._voided) | set(self._voided.values())
            self._in_force = tuple(e for i, e in enumerate(self._events) if i not in out)
        return self._in_force

    @property
    def recorded(self) -> tuple[LedgerEvent, ...]:
        """Every recorded event in recording order, the voids and the charges they withdraw included (read-only)."""
        return tuple(self._events)

    def voided(self) -> list[tuple[LedgerEvent, LedgerEvent]]:
        """``[(charge, void), ...]``: the write-ahead charges withdrawn by a void (:func:`void`), in recording order."""
        return [(self._events[c], self._events[v]) for c, v in sorted(self._voided.items())]

    def clients(self) -> list[str]:
        """Client ids in order of first appearance (among the charges in force)."""
        return list(dict.fromkeys(e.client for e in self.events))

    # ------------------------------------------------------------------ ε
    def history(self, client: str, extra: Iterable[LedgerEvent] = ()) -> History:
        """``client``'s Gaussian events as an Opacus history, consecutive equal (σ, q) events merged
        (its Skellam releases are :meth:`discrete_terms`).

        ``extra`` events (planned, not recorded) are appended first; other clients' are ignored.
        A client without events has the empty history (ε = 0).
        """
        return _history_of(e for e in [*self.events, *extra] if e.client == client)

    def discrete_terms(self, client: str, extra: Iterable[LedgerEvent] = ()) -> list[tuple[float, float, int, int]]:
        """``client``'s integer-domain (Skellam) releases as accountant terms ``(σ, γ, d, steps)``."""
        return _terms_of(e for e in [*self.events, *extra] if e.client == client)

    def _epsilon(self, client: str, extra: Iterable[LedgerEvent] = (), accountant: str = REPORTED) -> float:
        extra = list(extra)
        return self._epsilon_of(self.history(client, extra), self.discrete_terms(client, extra), accountant)

    def _epsilon_of(self, history: History, terms: list, accountant: str) -> float:
        if terms:  # a Skellam release: RDP alone, whatever accountant is asked for (PRV and PLD model Gaussians)
            validate_accountant(accountant)
            return epsilon_discrete(history, terms, self.delta)
        return epsilon(history, self.delta, accountant)

    def epsilon(self, client: str, accountant: str = REPORTED) -> float:
        """ε spent by ``client`` at the ledger's δ (0 for a client with no events); ``accountant`` as in
        :func:`fedhype.privacy.accountant.epsilon` (default: the reported figure, min of PRV and RDP).
        A client with a Skellam release gets the RDP figure of
        :func:`~fedhype.privacy.accountant.epsilon_discrete` for every accountant."""
        return self._epsilon(client, (), accountant)

    def epsilons(self, accountant: str = REPORTED) -> dict[str, float]:
        """ε per client (order of first appearance), equal to :meth:`epsilon` of each.

        The events are grouped by client in one pass and clients with the same history share one
        accountant call: linear in the ledger, not (clients × events) plus one accountant per client
        (at 1,000 clients a round's commit computed ε a thousand times over the whole ledger).
        """
        by_client: dict[str, list[LedgerEvent]] = {}
        for e in self.events:
            by_client.setdefault(e.client, []).append(e)
        memo: dict[tuple, float] = {}
        out = {}
        for c, evs in by_client.items():
            history, terms = _history_of(evs), _terms_of(evs)
            key = (tuple(history), tuple(terms))
            if key not in memo:
                memo[key] = self._epsilon_of(history, terms, accountant)
            out[c] = memo[key]
        return out

    def worst(self) -> tuple[str | None, float]:
        """``(client, ε)`` of the client with the largest reported ε; ``(None, 0.0)`` for an empty ledger."""
        eps = self.epsilons()
        if not eps:
            return None, 0.0
        client = max(eps, key=lambda c: eps[c])
        return client, eps[client]

    def report(self) -> dict[str, Any]:
        """Per-client ε by each accountant, total steps and event count; the worst client; δ."""
        clients = {}
        for c in self.clients():
            if self.discrete_terms(c):
                eps = self.epsilon(c)
                rep = {"epsilon": eps, "accountant": "rdp", "epsilon_prv": None, "epsilon_rdp": eps, "epsilon_pld": None,
                       "delta": self.delta, "steps": sum(e.steps for e in self.events if e.client == c),
                       "warnings": [], "note": "integer-domain (Skellam) release: accounted by RDP alone"}
            else:
                rep = epsilon_report(self.history(c), self.delta)
            rep["events"] = sum(1 for e in self.events if e.client == c)
            clients[c] = rep
        worst, worst_eps = self.worst()
        return {"delta": self.delta, "accountant": REPORTED, "clients": clients,
                "worst_client": worst, "worst_epsilon": worst_eps, "events": len(self._events)}

    def would_exceed(self, planned: list[LedgerEvent], max_epsilon: float) -> dict[str, float]:
        """ε each client would reach with ``planned`` added, for the clients that would exceed ``max_epsilon``.

        Call it before spending (e.g. before each round) and refuse with exit 3 if non-empty.
        Returns ``{}`` when every client stays within ``max_epsilon``.
        """
        if not isinstance(max_epsilon, numbers.Real) or not max_epsilon > 0:
            raise ValidationError(f"max_epsilon must be > 0, got {max_epsilon!r}")
        planned = list(planned)
        for i, e in enumerate(planned):
            if not isinstance(e, LedgerEvent):
                raise ValidationError(f"planned[{i}] must be a LedgerEvent, got {type(e).__name__}")
        out = {}
        for c in dict.fromkeys(e.client for e in planned):
            eps = self._epsilon(c, planned)
            if eps > max_epsilon:
                out[c] = eps
        return out

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Plain-data state: ``{"format", "delta", "meta", "events", "chain", "checksum"}``."""
        body = {"format": FORMAT, "delta": self.delta, "meta": self.meta,
                "events": [e.to_dict() for e in self._events], "chain": list(self._chain)}
        return {**body, "checksum": _sha256(_canonical(body))}

    @classmethod
    def from_state_dict(cls, state: Any, source: str = "ledger") -> "PrivacyLedger":
        """Rebuild a ledger, verifying format, every event, every chain link and the checksum.

        Raises:
            ArtifactError: naming ``source`` and the first thing wrong, e.g.
                ``"ledger tampered: event 7 hash mismatch"``.
        """
        if not isinstance(state, dict):
            raise ArtifactError(f"{source}: expected a JSON object, got {type(state).__name__}")
        if state.get("format") != FORMAT:
            raise ArtifactError(f"{source}: format is {state.get('format')!r}, expected {FORMAT!r}")
        for key in ("delta", "meta", "events", "chain", "checksum"):
            if key not in state:
                raise ArtifactError(f"{source}: missing key {key!r} (truncated or not a fedhype ledger)")
        events, chain = state["events"], state["chain"]
        if not isinstance(events, list) or not isinstance(chain, list) or not isinstance(state["meta"], dict):
            raise ArtifactError(f"{source}: 'events' and 'chain' must be lists and 'meta' an object")
        if len(chain) != len(events):
            raise ArtifactError(f"{source}: chain has {len(chain)} hashes for {len(events)} events (truncated or edited)")
        try:
            ledger = cls(state["delta"], state["meta"])
        except ValidationError as exc:
            raise ArtifactError(f"{source}: bad header: {exc}") from None
        for i, (data, link) in enumerate(zip(events, chain)):
            try:
                event = LedgerEvent.from_dict(data)
            except (ValidationError, TypeError) as exc:
                raise ArtifactError(f"{source}: event {i} is invalid: {exc}") from None
            try:
                ledger.record(event)
            except ValidationError as exc:  # a void that withdraws no charge of this ledger
                raise ArtifactError(f"{source}: event {i} is invalid: {exc}") from None
            if ledger._chain[-1] != link:
                raise ArtifactError(f"ledger tampered: event {i} hash mismatch ({source})"
                                    + ("; or its header (δ, meta) was edited" if i == 0 else ""))
        body = {k: state[k] for k in ("format", "delta", "meta", "events", "chain")}
        if _sha256(_canonical(body)) != state["checksum"]:
            raise ArtifactError(f"ledger tampered: checksum mismatch ({source})")
        return ledger

    def load_state_dict(self, state: Any) -> None:
        """Fill this (empty) ledger from ``state`` (Opacus-style), verifying it as :meth:`from_state_dict`.

        Raises:
            ValidationError: this ledger already has events (loading would rewrite them).
            ArtifactError: ``state`` is invalid or tampered, or its δ differs from this ledger's.
        """
        if self._events:
            raise ValidationError(f"load_state_dict into a ledger with {len(self)} events would rewrite them")
        other = PrivacyLedger.from_state_dict(state)
        if other.delta != self.delta:
            raise ArtifactError(f"ledger state has delta={other.delta:g}, this run uses delta={self.delta:g}")
        self.meta, self._genesis, self._events, self._chain = other.meta, other._genesis, other._events, other._chain
        self._voided, self._in_force = other._voided, None

    def save(self, path: str | Path) -> Path:
        """Write the ledger atomically to ``path`` (JSON; one event per line, earlier lines never change)."""
        state = self.state_dict()
        lines = ["{", f'  "format": {json.dumps(FORMAT)},', f'  "delta": {json.dumps(self.delta)},',
                 f'  "meta": {_canonical(self.meta)},', '  "events": [']
        lines += [f"    {_canonical(e)}," for e in state["events"]]
        if state["events"]:
            lines[-1] = lines[-1][:-1]
        lines += ["  ],", '  "chain": [', *[f'    "{h}",' for h in state["chain"]]]
        if state["chain"]:
            lines[-1] = lines[-1][:-1]
        lines += ["  ],", f'  "checksum": "{state["checksum"]}"', "}", ""]
        return atomic_write_text(path, "\n".join(lines))

    @classmethod
    def load(cls, path: str | Path) -> "PrivacyLedger":
        """Read and verify a ledger file (see :meth:`from_state_dict`); ArtifactError if bad."""
        try:
            return cls.from_state_dict(read_json(path, what="privacy ledger", advice=LEDGER_ADVICE), source=str(path))
        except ArtifactError as exc:  # edited, truncated or missing: every case gets the advice (a probe saw it only
            if LEDGER_ADVICE in str(exc):  # for a file that was not JSON)
                raise
            raise type(exc)(f"{exc}; {LEDGER_ADVICE}") from None

    def __len__(self) -> int:
        return len(self._events)

    def __repr__(self) -> str:
        return f"PrivacyLedger(delta={self.delta:g}, events={len(self._events)}, clients={len(self.clients())})"


def audit_consistency(ledger: PrivacyLedger, claims: dict[str, float], tol: float = 1e-6) -> list[dict[str, Any]]:
    """Claimed ε figures that disagree with the ε recomputed (the reported figure) from the ledger's events.

    Args:
        ledger: the run's ledger.
        claims: name → claimed ε; a name is a client id, or ``"worst"`` for the worst client's ε.
        tol: allowed absolute difference in ε.

    Returns:
        ``[{"name", "claimed", "recomputed", "difference"}, ...]`` for each mismatch (``recomputed``
        None and a ``"reason"`` when the name is unknown); ``[]`` when all claims hold.
    """
    known = set(ledger.clients())
    out = []
    for name, claimed in claims.items():
        if name == "worst":
            recomputed = ledger.worst()[1]
        elif name in known:
            recomputed = ledger.epsilon(name)
        else:
            out.append({"name": name, "claimed": claimed, "recomputed": None, "difference": None,
                        "reason": f"no events for {name!r} in the ledger"})
            continue
        ok = isinstance(claimed, numbers.Real) and (
            claimed == recomputed or abs(float(claimed) - recomputed) <= tol)
        if not ok:
            diff = float(claimed) - recomputed if isinstance(claimed, numbers.Real) else None
            out.append({"name": name, "claimed": claimed, "recomputed": recomputed,
                        "difference": None if diff is not None and math.isnan(diff) else diff})
    return out


# ---------------------------------------------------------------------- write-ahead charging
def recharged_events(ledger: PrivacyLedger) -> list[LedgerEvent]:
    """The events a resumed run charged again (fresh noise after an interruption: :func:`as_rerun`'s note)."""
    return [e for e in ledger.events if "charged again" in str(e.note or "")]


def charged_again_clause(what: str) -> str:
    """``"<what> was/were charged again on resume"`` for :func:`recharged_text`'s words."""
    return f"{what} {'were' if ' and ' in what or 'rounds ' in what else 'was'} charged again on resume"


def recharged_text(ledger: PrivacyLedger) -> str | None:
    """What a resumed run charged again (fresh noise after an interruption, :func:`as_rerun`), in words: ``"the
    statistics release before round 0"``, ``"round(s) [3] (counted from 1)"`` or both; None when nothing was.

    A probe's resume ended at ε = 1.416 against a target of 1 and was told "an interrupted round was charged again"
    (a round costs about 0.006 there): it was the release, most of ε (all of it in a run with no DP-SGD event:
    ``dp-gaussian``, ``no-dp-sgd``).
    """
    again = recharged_events(ledger)
    if not again:
        return None
    rounds = sorted({e.round + 1 for e in again if e.round >= 0})
    share = "most of ε" if any(e.round >= 0 for e in ledger.events) else "all of the ε spent"  # no DP-SGD round
    parts = ([f"the statistics release before round 0 ({share})"] if any(e.round < 0 for e in again) else []) \
        + ([f"round{'s' if len(rounds) > 1 else ''} {', '.join(map(str, rounds))} (counted from 1)"] if rounds else [])
    return " and ".join(parts)


def already_recorded(ledger: PrivacyLedger, event: LedgerEvent) -> bool:
    """Whether ``ledger`` holds an event of the same (client, round, mechanism) as ``event``."""
    return any(x.client == event.client and x.round == event.round and x.mechanism == event.mechanism
               for x in ledger.events)


def as_rerun(event: LedgerEvent) -> LedgerEvent:
    """``event`` marked as a rerun after an interruption with fresh noise (charged again)."""
    return dataclasses.replace(event, note="rerun after an interruption with fresh noise: charged again", time=_now())


def pending_charges(ledger: PrivacyLedger, events: Iterable[LedgerEvent], replays=lambda e: False) -> list[LedgerEvent]:
    """The events a (re)run must charge before its mechanisms run — the one rerun rule of fedhype.

    ``replays(event)``: whether this run draws the event's noise from the run seed (a client's or
    node's report *now*). Every event charged here carries that answer in ``seeded``.

    An event already in the ledger (same client, round, mechanism) comes from a run that was
    interrupted after charging it. It is not charged again only if the rerun replays seeded noise *and*
    an attempt already charged was recorded as seeded — then the rerun releases exactly what that
    attempt did. Otherwise (fresh noise now, or a first attempt whose noise came from OS entropy and
    cannot be replayed, whatever a node reports today) it is a new release, charged again and marked
    by :func:`as_rerun`. Events not yet recorded are charged as they are. A charge withdrawn by a void (:func:`void`:
    its node refused before running anything) is no earlier attempt: only the charges in force count.
    """
    out = []
    for e in events:
        seeded = bool(replays(e))
        prev = [x for x in ledger.events
                if x.client == e.client and x.round == e.round and x.mechanism == e.mechanism]
        if prev and seeded and any(x.seeded for x in prev):
            continue  # the same seeded noise as a charged attempt: nothing new is released
        e = dataclasses.replace(e, seeded=seeded)
        out.append(as_rerun(e) if prev else e)
    return out


def void(ledger: PrivacyLedger, charges: Iterable[LedgerEvent], reason, path: str | Path | None = None
         ) -> list[LedgerEvent]:
    """Withdraw write-ahead ``charges`` whose mechanisms provably did not run, and save the ledger atomically to
    ``path``: each gets a void event (its client, round, mechanism and numbers, ``voids`` = its digest, the note
    ``"void: <reason>"``). Only for a charge whose records were not touched — a node's explicit refusal, sent before
    it ran anything (:func:`fedhype.federated.transport.void_refused`) — never for a missing reply, a time-out or a
    crash, where the mechanism may have run.

    Args:
        charges: events recorded in ``ledger`` and in force (the ones :func:`charge` recorded for the request).
        reason: text, or ``reason(charge) -> text``.

    Returns:
        The void events recorded.

    Raises:
        ValidationError: a charge that is not in force in ``ledger``, or a client with a site ledger across runs in
            :attr:`PrivacyLedger.mirrors` (its charge there is not withdrawn; nothing is recorded).
    """
    charges = list(charges)
    mirrored = sorted({e.client for e in charges} & set(ledger.mirrors))
    if mirrored:
        raise ValidationError(f"client(s) {mirrored} charge a site's ledger across runs: their charges are not voided")
    voids = [dataclasses.replace(e, voids=event_digest(e), time=_now(),
                                 note=f"void: {reason(e) if callable(reason) else reason}") for e in charges]
    trial = PrivacyLedger(ledger.delta, ledger.meta)  # every void must be valid before any is recorded
    trial._events, trial._chain, trial._voided = list(ledger._events), list(ledger._chain), dict(ledger._voided)
    for v in voids:
        trial.record(v)
    for v in voids:
        ledger.record(v)
    if path is not None and voids:
        ledger.save(path)
    return voids


def charge(ledger: PrivacyLedger, events: Iterable[LedgerEvent], path: str | Path | None = None) -> None:
    """Write-ahead: record ``events`` (from :func:`pending_charges`) and save the ledger atomically to
    ``path`` — call it *before* the mechanisms touch the records.

    A client with a site ledger in :attr:`PrivacyLedger.mirrors` has its events charged there first
    (:mod:`fedhype.privacy.site_ledger`); every site is asked before any is charged.

    Raises:
        BudgetExceededError: a site's composed ε over its runs would pass its cap (nothing is recorded).
    """
    events = list(events)
    # each site also sees what the run's ledger holds of its client: a charge the site holds and the run does not
    # (a stop between the two writes, before the mechanism ran) is reused, not made twice (SiteCharger._orphans)
    mirrored = [(m, mine, [e for e in ledger.events if e.client == c])
                for c, m in ledger.mirrors.items() if (mine := [e for e in events if e.client == c])]
    for m, mine, recorded in mirrored:
        if (err := m.refusal(mine, recorded=recorded)) is not None:
            raise err
    for m, mine, recorded in mirrored:
        m.charge(mine, recorded=recorded)
    for e in events:
        ledger.record(e)
    if path is not None:
        ledger.save(path)
