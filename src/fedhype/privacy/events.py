"""The one list of mechanism names, and the builders of the ledger events a mechanism is charged as.

Every :class:`~fedhype.privacy.ledger.LedgerEvent` of fedhype is built here, by
:func:`dp_sgd_events` (rounds of Poisson-subsampled DP-SGD steps, or one subsampled release per
call) or :func:`release_events` (the un-subsampled releases before round 0), and charged write-ahead
with :func:`fedhype.privacy.ledger.charge` (after :func:`~fedhype.privacy.ledger.pending_charges`,
the rerun rule). Mechanism names are the strings below; a ledger's reader (the audit, the report)
tells mechanisms apart by them.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from fedhype.privacy.centring import MECHANISM as RELEASE_CENTRE
from fedhype.privacy.ledger import LedgerEvent

#: DP-SGD steps of a federated client in one round (:class:`fedhype.privacy.dp_step.LocalDPSession`)
DP_SGD = "dp-sgd"
#: the one-shot class statistics before round 0 (:func:`fedhype.privacy.dp_step.privatize_class_sums`)
RELEASE = "dp-class-stats"
#: the DP linear reference's DP-SGD FedAvg steps (:mod:`fedhype.prototypes.dp_linear`)
DP_LINEAR = "dp-fedavg-linear"
#: the DP linear reference's own class statistics (its centring and start)
DP_LINEAR_RELEASE = "dp-linear-class-stats"
#: one release of class-wise head gradients for prototype matching
#: (:func:`fedhype.privacy.class_gradients.privatize_class_gradients`)
PROTOTYPE_GRADIENT = "hyperprototype-dp-gradient"
#: every mechanism fedhype records (RELEASE_CENTRE = "dp-release-centre", :mod:`fedhype.privacy.centring`)
MECHANISMS = (DP_SGD, RELEASE_CENTRE, RELEASE, DP_LINEAR, DP_LINEAR_RELEASE, PROTOTYPE_GRADIENT)


def dp_sgd_events(round: int, clients: Iterable[tuple[str, float, int]], noise_multiplier: float, clip_norm: float,
                  *, mechanism: str = DP_SGD, note: str = "") -> list[LedgerEvent]:
    """One event per client of ``steps`` Poisson-subsampled Gaussian steps in ``round``.

    Args:
        round: the round (≥ 0; −1 outside rounds).
        clients: ``[(client id, q_i, steps_i), …]`` in charging order (public sizes only).
        noise_multiplier: σ. clip_norm: C (units of the clipped gradient).
        mechanism: one of :data:`MECHANISMS`. note: free text kept in every event.

    Raises:
        ValidationError: a bad field (from :class:`~fedhype.privacy.ledger.LedgerEvent`).
    """
    return [LedgerEvent(client=str(c), round=int(round), mechanism=mechanism, noise_multiplier=float(noise_multiplier),
                        sample_rate=float(q), steps=int(k), clip_norm=float(clip_norm), note=note)
            for c, q, k in clients]


def release_events(clients: Iterable[str], steps: Sequence[tuple[float, float, int]], mechanisms: Sequence[str],
                   clip_norm: float, notes: Sequence[str] | None = None) -> list[LedgerEvent]:
    """The round −1 events of a release before training: for each client, one event per release step.

    Args:
        clients: client ids in charging order.
        steps: the release's accountant steps ``[(σ, q, steps), …]`` (e.g.
            :func:`fedhype.privacy.centring.release_steps`), composed in this order.
        mechanisms: the mechanism name of each step (same length as ``steps``).
        clip_norm: the release's L2 sensitivity (e.g. :data:`fedhype.privacy.dp_step.RELEASE_SENSITIVITY`).
        notes: free text per step (default empty).

    Raises:
        ValidationError: ``mechanisms``/``notes`` of another length than ``steps``, or a bad field.
    """
    from fedhype.errors import ValidationError

    notes = [""] * len(steps) if notes is None else list(notes)
    if len(mechanisms) != len(steps) or len(notes) != len(steps):
        raise ValidationError(f"release_events: {len(steps)} steps need as many mechanism names and notes, got "
                              f"{len(mechanisms)} and {len(notes)}")
    return [LedgerEvent(client=str(c), round=-1, mechanism=m, noise_multiplier=float(s), sample_rate=float(q),
                        steps=int(k), clip_norm=float(clip_norm), note=n)
            for c in clients for (s, q, k), m, n in zip(steps, mechanisms, notes)]


def skellam_release_events(clients: Iterable[str], plan, mechanism: str, note: str = "") -> list[LedgerEvent]:
    """The round −1 events of one integer-domain release (:class:`fedhype.privacy.skellam.SkellamPlan`), one per client.

    Recorded with ``noise = "skellam"``, σ = √μ/γ, γ and d, q = 1, one step and the release's L2
    sensitivity 1 (real units), so the accountant composes the Skellam RDP bound of the plan
    (:func:`fedhype.privacy.accountant.epsilon_discrete`).

    Args:
        clients: client ids in charging order. plan: the release's SkellamPlan.
        mechanism: one of :data:`MECHANISMS` (the centre or the class statistics). note: kept in every event.
    """
    from fedhype.privacy.dp_step import RELEASE_SENSITIVITY

    return [LedgerEvent(client=str(c), round=-1, mechanism=mechanism, sample_rate=1.0, steps=1,
                        clip_norm=float(RELEASE_SENSITIVITY), note=note, **plan.event_fields())
            for c in clients]


def release_claims(events: Sequence[LedgerEvent], delta: float, sigma0: float | None = None) -> dict:
    """What a run's report says of its statistics release, recomputed from its ledger's events: the ε of one
    client's release alone (its first release as recorded: the centre, when centred, and the statistics; one step
    of ``sigma0`` where the ledger has none) and the most times a client was charged for it.

    Returns:
        ``{"class_stats_epsilon": float | None, "class_stats_releases": int}`` (None without a release or σ₀).
    """
    from fedhype.privacy.accountant import epsilon

    pre = [e for e in events if e.round == -1]
    per_client: dict[str, int] = {}
    for e in pre:
        if e.mechanism == RELEASE:
            per_client[e.client] = per_client.get(e.client, 0) + 1
    first = pre[0].client if pre else None
    steps, seen = [], set()
    for e in pre:
        if e.client == first and e.mechanism not in seen:
            seen.add(e.mechanism)
            steps.append((float(e.noise_multiplier), float(e.sample_rate), int(e.steps)))
    if not steps and not sigma0:
        return {"class_stats_epsilon": None, "class_stats_releases": 0}
    return {"class_stats_epsilon": epsilon(steps or [(float(sigma0), 1.0, 1)], delta),
            "class_stats_releases": max(per_client.values()) if per_client else 0}
