"""A site node's own privacy ledger: every mechanism the server asks for is charged there first, and
refused past the ε that the plan of the site's own federation file gives it.

The server's ledger is the run's record; it is kept by the coordinator. Against a server that does not
run the plan it published (a malicious one: more rounds, more local steps, a larger sampling rate, a
smaller σ, the statistics release asked for twice), a site node has only what it runs itself. So a
site node (one with ``site=`` and ``federation=`` in its node config) keeps
``<state-dir>/<run key>/client-<id>/node-ledger.json`` (a :class:`~fedhype.privacy.ledger.PrivacyLedger`)
and, before it runs a DP-SGD round or a statistics release, charges the events of exactly what the
request makes it run — σ and C from the request, q = min(1, B/n) from its batch size and the node's own
n, the request's number of steps, the Skellam plan of a secure-aggregation release — with the one rerun
rule of fedhype (:func:`fedhype.privacy.ledger.pending_charges`). If the node's own ε after them would
exceed its **cap**, nothing runs and the server gets a :class:`~fedhype.federated.flower.handshake.NodeRefusal`.

The cap is the ε that the federation file's plan gives this site (:func:`site_cap`): the release
before round 0 (``privacy_plan.prefix``) and every planned round of DP-SGD steps
(:func:`fedhype.federated.secure_release.planned_tails`), composed by the reported accountant
(:func:`fedhype.privacy.accountant.epsilon`); ``train.max_epsilon``, where the federation sets one
above it, allows reruns up to that (:func:`fedhype.federated.run_plan.planned_epsilon_caps`, the function
the server prices a run's remaining rounds with before its first, so a resume that a node would stop
part-way is refused before anything is released). An honest run stays within the cap: the server charges the same
events and its plan is calibrated to it (under secure aggregation the Skellam release's ε is at most
the Gaussian prefix's, :mod:`fedhype.federated.secure_release`).

A node whose noise is seeded (node config ``seed=``) replays the same noise when asked the same round
again. That is free only for the same request: the node keeps the digest of each charged request in
the event's note, and refuses another request for a round (or release) it has already answered with
seeded noise — two answers with the same noise would release their difference without any.

A site node also charges its site folder's ledger across runs (``site-ledger.json``,
:mod:`fedhype.privacy.site_ledger`) with the same events, under the run's key, and refuses a request that
would take the site's records past that ledger's lifetime cap: every run this SuperNode serves with the
same site folder composes there.

The run key is the server's choice, so the node's ledger alone would give a coordinator the whole plan
again with every new run. A site node therefore **binds its federation file** (by its content digest,
:func:`~fedhype.federated.flower.handshake.own_federation`) to the first run key it serves, in
``<state-dir>/federation-runs.json`` (written atomically, under a lock; it survives node restarts):
a request under another run key with the same file is refused (:func:`bind_run`; at the identity
handshake already, :func:`check_run`). A resume of the bound run goes on; a new run needs a new
federation file from the coordinator, which the site accepts by restarting its SuperNode with it.

At the identity handshake, before anything is released anywhere, a site node also composes the whole plan
of its federation file for its client (the release and every planned round) with its site folder's ledger
across runs, and refuses the connection where the plan would pass the site's lifetime cap
(:func:`refuse_site_plan`, the check ``fedhype train --site`` makes before writing anything); the
per-request check above still runs.

Pooled-partition nodes (a simulation on one data holder's store) hold no federation file and keep no
ledger of their own; the data holder runs the server too.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from fedhype.federated.flower.handshake import NodeRefusal, NodeSettings, own_federation
from fedhype.federated.run_plan import at_least
from fedhype.privacy.ledger import LedgerEvent, PrivacyLedger, charge, pending_charges

#: the node's own ledger, in the client's private state folder (never on the wire)
LEDGER = "node-ledger.json"
_NOTE = "request sha256:"


def request_digest(content: Any) -> str:
    """SHA-256 of a Flower message content (every record, array bytes, shapes, dtypes and config values).

    Args:
        content: a ``flwr.app.RecordDict`` (array records of ``Array`` with ``data`` bytes, config records).
    Returns:
        64 hex digits; equal for two messages that carry the same request.
    """
    h = hashlib.sha256()
    for key in sorted(content):
        rec = content[key]
        h.update(json.dumps(["record", key]).encode())
        for name in sorted(rec):
            v = rec[name]
            if hasattr(v, "data") and hasattr(v, "shape") and hasattr(v, "dtype"):  # flwr Array
                h.update(json.dumps(["array", name, str(v.dtype), list(v.shape)]).encode())
                h.update(bytes(v.data))
            else:
                h.update(json.dumps(["value", name, v], sort_keys=True, default=repr).encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _cap(federation_digest: str, federation: Path, client: str) -> tuple[float, float] | None:
    from fedhype.federated.flower.federation import Federation
    from fedhype.federated.run_plan import planned_epsilon_caps

    fed = Federation.load(federation)
    caps = planned_epsilon_caps(fed.train, [c.n_train for c in fed.roster.clients])
    if caps is None:
        return None
    return caps[[str(c.id) for c in fed.roster.clients].index(client)], float(fed.train.delta)


def site_cap(node: NodeSettings, client: str) -> tuple[float, float] | None:
    """``(ε cap, δ)`` of client ``client`` under the plan of the node's federation file; None without DP
    (``train.no_dp``: the node's ``allow-no-dp`` governs) or for a pooled-partition node (no file).

    Raises:
        ArtifactError / ValidationError: the federation file is unreadable or its plan invalid.
        ValueError: ``client`` is not in its roster (the caller checked the node's place first).
    """
    if node.federation is None:
        return None
    return _cap(own_federation(node), node.federation, str(client))


def charge_request(node: NodeSettings, state_dir: Path, events: Sequence[LedgerEvent], digest: str) -> None:
    """Charge ``events`` (what this request makes the node run) to the node's own ledger, or refuse.

    Args:
        node: the node's settings (its federation file, its seed). state_dir: the client's private state
            folder of this run (the ledger lives there). events: the request's mechanisms, one client.
        digest: :func:`request_digest` of the request (kept in each charged event's note).

    Raises:
        NodeRefusal: another request for a round or release this node already answered with seeded
            noise, or the node's own ε would exceed :func:`site_cap` (nothing is charged or run).
    """
    if not events or node.federation is None:
        return
    cap = site_cap(node, events[0].client)
    if cap is None:
        return
    limit, delta = cap
    path = Path(state_dir) / LEDGER
    ledger = PrivacyLedger.load(path) if path.exists() else PrivacyLedger(delta, meta={"node": "site"})
    seeded = node.seed is not None
    note = f"{_NOTE}{digest}"
    for e in events:
        prev = [x for x in ledger.events if (x.client, x.round, x.mechanism) == (e.client, e.round, e.mechanism)]
        if seeded and any(x.seeded for x in prev) and not any(x.note.endswith(note) for x in prev):
            what = "the statistics release" if e.round < 0 else f"round {e.round + 1}"  # counted from 1, as the server
            raise NodeRefusal(f"this SuperNode already answered {what} ({e.mechanism}) of this run with seeded noise, "
                              "and the server now asks it with another request: both answers would carry the same "
                              "noise, so their difference would be released without any; refused (nothing was run)")
    pending = pending_charges(ledger, [dataclasses.replace(e, note=note) for e in events], replays=lambda e: seeded)
    pending = [p if p.note == note else dataclasses.replace(p, note=f"{p.note}; {note}") for p in pending]  # a rerun's
    if not pending:
        return
    over = ledger.would_exceed(pending, limit * (1 + 1e-9))
    if over:
        eps = max(over.values())
        e = pending[0]
        what = "the statistics release" if e.round < 0 else f"round {e.round + 1}"  # counted from 1, as the server
        raise NodeRefusal(f"this site's own ledger: the server's request ({e.mechanism}, {what}) would take it to "
                          f"ε = {eps:.4f}, over the ε = {limit:.4f} that the plan of "
                          f"its federation file gives it (rounds, steps, q, σ and the release as published); nothing "
                          f"was run. " + ("A rerun of an unseeded release is a new release" if e.round < 0 else
                                          "A rerun of an unseeded round is a new release")
                          + f": allow it with train.max_epsilon (at least {at_least(eps)}) in the federation file — a resume "
                          "accepts the changed file — give every node the new file, restart them and resume; or keep "
                          "the last committed round, whose ε is within the plan (docs/flower.md)")
    # the site's ledger across runs, first; a charge it holds that this node's ledger lacks (a stop between the two
    # writes: nothing ran) is reused, not made twice
    charge_site(node, state_dir, delta, lambda ch: ch.charge(pending, recorded=list(ledger.events)))
    charge(ledger, pending, path)


def charge_site(node: NodeSettings, state_dir: Path, delta: float, how) -> None:
    """``how(charger)`` on the site folder's ledger across runs (:class:`~fedhype.privacy.site_ledger.SiteCharger`,
    this run's key: the name of its folder under the state dir); nothing for a node without a site folder.

    Raises:
        NodeRefusal: the site's cap would be passed (nothing is charged or run).
    """
    if node.site is None:
        return
    from fedhype.data.sites import Site
    from fedhype.errors import BudgetExceededError
    from fedhype.federated.site_charges import SITE_CHARGES_FILE
    from fedhype.privacy.site_ledger import SiteCharger

    site = Site.load(node.site)
    try:
        how(SiteCharger(Path(site.folder), site.name, Path(state_dir).parent.name, float(delta), expected=site.ledger,
                        tokens=Path(state_dir) / SITE_CHARGES_FILE))
    except BudgetExceededError as err:  # the server gets the refusal, not the site's folder or its other runs' figures
        import logging

        logging.getLogger(__name__).warning("refused the server's request: %s", err)
        what = "a task without DP (ε = ∞)" if "without DP" in str(err) else "the request"
        raise NodeRefusal(f"this site's ledger across runs: {what} would pass the site's lifetime ε cap; nothing was "
                          "run (the figures stay at the site: its operator sees them in the node's log and with "
                          "`fedhype budget --site`)") from None


def charge_no_dp(node: NodeSettings, state_dir: Path) -> None:
    """A site node about to run a task without DP (``allow-no-dp``) records it on its site's ledger across runs as
    ε = ∞, once per run, or refuses where the site has a cap (:meth:`SiteCharger.charge_no_dp`)."""
    charge_site(node, state_dir, 1e-5, lambda ch: ch.charge_no_dp())


#: the node's binding of each federation file (its digest) to the one run it serves, in the node's state-dir
BINDINGS = "federation-runs.json"


def _bindings(node: NodeSettings) -> dict[str, str]:
    """``{federation digest: run key}`` of the node's state-dir ({} before its first run).

    Raises:
        ArtifactError: an unreadable bindings file (never treated as empty: that would free every file again).
    """
    from fedhype.errors import ArtifactError

    path = Path(node.state_dir) / BINDINGS
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        runs = {str(k): str(v["run"]) for k, v in raw["runs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArtifactError(f"{path} is unreadable ({exc}): it binds each federation file to the one run this node "
                            "serves; restore it from a backup (deleting it would let a server rerun a used plan)") from None
    return runs


def _used(bound: str) -> NodeRefusal:
    return NodeRefusal(f"this site's federation file was already used for run {bound}; a new run needs a new "
                       "federation file from the coordinator, accepted by the site (restart the SuperNode with it), "
                       f"or resume run {bound} (the same run-dir with resume=true); nothing was run")


def check_run(node: NodeSettings, run_key: str) -> None:
    """Refuse, at the identity handshake, a run other than the one the node's federation file is bound to
    (``run_key`` "": a new run, which has no key yet). Nothing for a node without a federation file.

    Raises:
        NodeRefusal: the file is bound to another run.
    """
    if node.federation is None:
        return
    bound = _bindings(node).get(own_federation(node))
    if bound is not None and bound != run_key:
        raise _used(bound)


def bind_run(node: NodeSettings, run_key: str) -> None:
    """Bind the node's federation file to ``run_key`` (the first run it serves), or refuse another run.

    Raises:
        NodeRefusal: the file is bound to another run (nothing is written).
    """
    if node.federation is None:
        return
    from fedhype.io import atomic_write_json

    digest = own_federation(node)
    state = Path(node.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    with _state_lock(state):
        runs = _bindings(node)
        bound = runs.get(digest)
        if bound == run_key:
            return
        if bound is not None:
            raise _used(bound)
        raw = json.loads((state / BINDINGS).read_text(encoding="utf-8")) if (state / BINDINGS).exists() else {}
        entries = dict(raw.get("runs") or {})
        entries[digest] = {"run": run_key, "federation": str(node.federation)}
        atomic_write_json(state / BINDINGS, {"what": "each federation file (sha256 of its canonical JSON) and the one "
                                                    "run this SuperNode serves with it", "runs": entries})


def _state_lock(state: Path):
    import contextlib

    @contextlib.contextmanager
    def locked():
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            yield
            return
        with open(state / (BINDINGS + ".lock"), "a+") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    return locked()


def refuse_site_plan(node: NodeSettings, client: str, run_key: str = "") -> None:
    """At the identity handshake: refuse the connection where the whole plan of the node's federation file for
    ``client`` — the release before round 0 and every planned round — composed with the site's ledger across runs
    would pass the site's lifetime cap (a plan without DP: wherever the site has a cap), as
    :func:`fedhype.federated.site_charges.refuse_site_plans` does for ``fedhype train --site``. ``run_key``: the
    run the server resumes ("" for a new run): what it charged the site before its stop is part of its plan.
    Nothing for a node without a site folder or a federation file.

    Raises:
        NodeRefusal: the plan would pass the cap (the figures go to the node's log only).
    """
    if node.site is None or node.federation is None:
        return
    from fedhype.data.sites import Site
    from fedhype.errors import BudgetExceededError
    from fedhype.federated.flower.federation import Federation
    from fedhype.federated.run_plan import plan_privacy
    from fedhype.federated.secure_release import planned_tails
    from fedhype.privacy.site_ledger import NO_DP, SiteCharger, refuse_plan

    fed = Federation.load(node.federation)
    cfg, site = fed.train, Site.load(node.site)
    sizes = [c.n_train for c in fed.roster.clients]
    i = [str(c.id) for c in fed.roster.clients].index(str(client))
    charger = SiteCharger(Path(site.folder), site.name, run_key or "planned", float(cfg.delta), expected=site.ledger)
    try:
        if cfg.no_dp:
            if (err := charger.refusal([LedgerEvent(site.name, -1, NO_DP, 0.0, 1.0, 1, 0.0)])) is not None:
                raise err
        elif node.seed is not None:  # a seeded node's noise can be regenerated: ε = ∞ for the site (site_ledger)
            if (err := charger.refusal([LedgerEvent(site.name, -1, "planned", 1.0, 1.0, 1, 1.0, seeded=True)])) is not None:
                raise err
        else:
            refuse_plan(charger, list(plan_privacy(cfg, sizes)["prefix"]) + planned_tails(cfg, sizes)[i])
    except BudgetExceededError as err:  # the server gets the refusal, not the site's folder or its figures
        import logging

        logging.getLogger(__name__).warning("refused the server's federation at the handshake: %s", err)
        what = ("a plan without DP (ε = ∞)" if cfg.no_dp else "a node with seeded noise (ε = ∞ for the site)"
                if node.seed is not None else "the federation's plan (the release and every planned round)")
        raise NodeRefusal(f"this site's ledger across runs: {what} would pass the site's lifetime ε cap; refused at "
                          "the handshake, before anything was released anywhere (the figures stay at the site: its "
                          "operator sees them in the node's log and with `fedhype budget --site`)") from None
