"""The statistics release under secure aggregation across machines: integer vectors, Skellam noise, SecAgg+.

In process, ``fedhype train --secure-aggregation`` plays the aggregation protocol with real-valued
Gaussian shares (:mod:`fedhype.privacy.secure_agg`). A deployment whose clients are other machines
sums integers modulo 2⁶⁴ with SecAgg+ (:mod:`fedhype.federated.flower.secagg`), so its release is
the integer-domain mechanism of :mod:`fedhype.privacy.skellam`. When the clients offer a
``secure_session`` (:meth:`fedhype.federated.flower.grid_transport.RemoteClient.secure_session`, or
:func:`attach_local_session` in process), :func:`fedhype.federated.class_stats.run_class_stats_stage`
hands the release over to :func:`run_integer_release`:

for each step of the release (the centre, then the class statistics around it; or the statistics
alone), in this order —

1. ``session.open(step)``: SecAgg+'s key agreement. It touches no record; if fewer than m − t
   clients take part it raises, and nothing of this step is charged or released;
2. the ledger is charged, write-ahead, for the clients that go on (:func:`~fedhype.privacy.events.skellam_release_events`:
   only those, so a client that dropped out before it computed anything is not charged);
3. ``session.release(step, plan, …)``: every such client computes its integer share, SecAgg+ sums
   the masked shares and unmasks the sum of ≥ m − t of them (else it raises: the write-ahead charge
   stays, as for any mechanism whose records were touched);

then the model is set from the aggregate as in process. The sum of each step is saved the moment it arrives
(``ckpt/release-outputs.safetensors``, :func:`fedhype.federated.release_outputs.save_secure_outputs`: public DP
outputs); a run interrupted after both and before the model was saved resumes from them, charged and released
once; one interrupted between the steps reuses the centre's sum and runs the statistics step alone (charged again
if its charge had been written, unless seeded). The noise of each step is the Gaussian
plan's σ times the factor of :func:`fedhype.privacy.skellam.calibrate_factor`, so that the RDP
accounting of the Skellam releases keeps every client's ε at or below the planned one.

With reproducible (seeded) noise a rerun replays the same shares and is not charged again; if its
set of contributors differs from the first attempt's, the two sums differ by the shares of the
clients that joined or left — seeded runs are for tests ("not secure: reproducible noise").
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

from fedhype.errors import ValidationError
from fedhype.privacy.secure_agg import DistributedNoise, PrivatizedAggregate
from fedhype.privacy.skellam import Layout, SkellamPlan, calibrate_factor, integer_secure_sum


class SecureSession(Protocol):
    """A secure-aggregation session over the clients (see the module docstring).

    Attributes:
        delta: the run's δ. tails: each client's planned DP-SGD history (for :func:`release_plans`).
    """

    delta: float
    tails: list

    def open(self, stage: str) -> list[int]:
        """Key agreement for ``stage``; the indices of the clients that go on (≥ m − t), else raise."""

    def release(self, stage: str, plan: SkellamPlan, *, n_classes: int, weights, centring) -> PrivatizedAggregate:
        """The aggregate of the clients' integer shares of ``stage`` (≥ m − t of them), else raise."""


def release_plans(noise: DistributedNoise, steps: Sequence[tuple[float, float, int]], layouts: Sequence[Layout],
                  delta: float, tails: Sequence) -> list[SkellamPlan]:
    """The Skellam plan of each release step: γ from its layout, σ = k × the Gaussian plan's σ (k ≥ 1 from
    :func:`~fedhype.privacy.skellam.calibrate_factor`: the planned ε, by RDP)."""
    scales = [SkellamPlan.for_layout(lay, noise, s).scale for lay, (s, _, _) in zip(layouts, steps)]
    k = calibrate_factor(steps, [(g, lay.record_dim) for g, lay in zip(scales, layouts)], tails, delta)
    return [SkellamPlan.for_layout(lay, noise, k * s, scale=g) for lay, (s, _, _), g in zip(layouts, steps, scales)]


def run_integer_release(session: SecureSession, clients, server, n_classes: int, dp, ledger, ledger_path: Path | None, *,
                        seeded: bool, weights, distributed: DistributedNoise, centre_share: float,
                        radius: float, budget_check=None, outputs: Path | None = None,
                        reuse_outputs: bool = False) -> None:
    """The release before round 0 over ``session`` (module docstring); sets ``server.hnet`` from the aggregate.

    Returns None (the server sees no client's own counts), as the in-process secure path does.

    ``budget_check`` (``train.max_epsilon`` on a resume that releases again): called once, before anything is
    charged, with the pending events of every step for every client (those who drop out at a step are not
    charged for it, so the check may price more than is spent, never less); it raises to refuse.

    ``outputs``: where the sums the server received are saved as each step arrives, before the post-processing;
    with ``reuse_outputs`` (a resume of a run whose release was charged) sums of these clients under this noise plan
    already there are post-processed again instead of opening a session: nothing is released or charged; a centre's
    sum alone (interrupted between the steps) is reused and only the statistics step runs.

    Raises:
        ValidationError: a local-cvae server or a non-private release. Whatever ``session`` raises
        (a dropout beyond t, a client that refused the protocol): nothing after the failing step is
        charged or released.
    """
    from fedhype.federated.class_stats import (MECHANISM, apply_class_stats, clip_rescale_factor, pooled_stats, release_notes)
    from fedhype.federated.release_outputs import load_secure_outputs, save_secure_outputs
    from fedhype.privacy import centring as centring_mod
    from fedhype.privacy.dp_step import RELEASE_SENSITIVITY, DPConfig
    from fedhype.privacy.events import skellam_release_events
    from fedhype.privacy.ledger import charge, pending_charges

    if getattr(server, "servers", None) is not None:
        raise ValidationError("secure aggregation pools the clients' statistics; local-cvae needs each client's own")
    if not dp.enabled:
        raise ValidationError("secure aggregation adds the noise of a private release; it has no non-private mode")
    centred = centre_share > 0
    steps = centring_mod.release_steps(float(dp.noise_multiplier), centre_share if centred else 0.0)
    dim = int(server.hnet.cfg.dim)
    layouts = ([Layout.centre(dim)] if centred else []) + [Layout.statistics(n_classes, dim, weights)]
    mechanisms = ([centring_mod.MECHANISM] if centred else []) + [MECHANISM]
    plans = release_plans(distributed, steps, layouts, session.delta, session.tails)
    for p in plans:
        p.check_range(sum(int(c.n) for c in clients))
    what = {"centre": "sum and count of the unit records (the release's centre)",
            "statistics": "class sums, counts" + (" and second moments" if layouts[-1].second_moment else "")
            + f"; weights (a, b, c) = {[round(w, 6) for w in weights.as_list()]}"
            + (f"; centred, clip radius {radius:g} × the DP spread" if centred else "")}
    kept = load_secure_outputs(outputs, clients, distributed) if reuse_outputs else None
    saved_steps = [] if kept is None else list(kept) if centred else list(kept[1:])  # aligned with plans
    if kept is not None and (centred != (kept[0] is not None)
                             or any(a is not None and not _same_sigma(a, p) for a, p in zip(saved_steps, plans))):
        kept = None  # not this release's sums (centred or not, or another noise plan: e.g. the in-process Gaussian one's)
    cen_sum, agg = kept if kept is not None else (None, None)  # a resume: the sums received before (charged then)
    cen = centring_mod.centring_from(cen_sum, radius) if cen_sum is not None else None
    # the steps still to run: both, or (interrupted between them) the statistics step alone around the kept centre
    todo = [(lay, plan, mech) for lay, plan, mech in zip(layouts, plans, mechanisms)
            if agg is None and not (lay.kind == "centre" and cen_sum is not None)]
    if todo and budget_check is not None:
        every = [e for layout, plan, mechanism in todo
                 for e in skellam_release_events([c.id for c in clients], plan, mechanism, what[layout.kind])]
        budget_check(pending_charges(ledger, every, replays=lambda e: seeded))
    for layout, plan, mechanism in todo:
        live = session.open(layout.kind)  # no record touched yet: a failure here charges nothing
        events = skellam_release_events([clients[i].id for i in live], plan, mechanism,
                                        f"{what[layout.kind]}; {plan.describe()}")
        charge(ledger, pending_charges(ledger, events, replays=lambda e: seeded), ledger_path)
        out = session.release(layout.kind, plan, n_classes=n_classes, weights=weights, centring=cen)
        if layout.kind == "centre":
            cen_sum, cen = out, centring_mod.centring_from(out, radius)
        else:
            agg = out
        if outputs is not None:  # saved the moment each arrives, before the post-processing: a resume reuses them
            save_secure_outputs(outputs, cen_sum, agg)
    dp_stats = DPConfig(plans[-1].noise_multiplier, RELEASE_SENSITIVITY, enabled=True)
    g = clip_rescale_factor(agg, cen) if getattr(server.cfg, "clip_rescale", False) else 1.0
    stats = pooled_stats(agg, dp_stats, weights, server.cfg.latent, cen, server.cfg.residual, server.cfg.located_share, g)
    apply_class_stats(server.hnet, stats)
    server.release_notes = release_notes(stats)
    return None


def _same_sigma(agg, plan: SkellamPlan) -> bool:
    """Whether a saved sum carries this plan's noise multiplier (relative tolerance 1e-9)."""
    got = agg.noise_multiplier
    return got is not None and abs(float(got) - float(plan.noise_multiplier)) <= 1e-9 * float(plan.noise_multiplier)


class LocalIntegerSession:
    """SecAgg+'s ideal functionality in process: the integer shares of the clients, summed mod 2⁶⁴.

    The in-process reference of the Flower deployment (the same shares, the same sums: only the masks are
    missing, and they cancel). ``drop``: client indices that "drop out" at ``open`` (tests).
    """

    def __init__(self, clients, distributed: DistributedNoise, delta: float, tails: Sequence, drop: Sequence[int] = ()):
        self.clients, self.noise, self.delta, self.tails = list(clients), distributed, float(delta), list(tails)
        self.drop = set(int(i) for i in drop)
        self._live: list[int] = []

    def open(self, stage: str) -> list[int]:
        from fedhype.privacy.secure_agg import SecureAggregationError

        self._live = [i for i in range(len(self.clients)) if i not in self.drop]
        if len(self._live) < self.noise.min_contributions:
            raise SecureAggregationError(f"secure aggregation of the {stage}: {len(self._live)} of {self.noise.clients} "
                                         f"clients took part, fewer than m − t = {self.noise.min_contributions}; "
                                         "nothing was released")
        return list(self._live)

    def release(self, stage: str, plan: SkellamPlan, *, n_classes: int, weights, centring) -> PrivatizedAggregate:
        c0 = self.clients[0]
        dim = int(c0._raw.shape[1])
        layout = Layout.centre(dim) if stage == "centre" else Layout.statistics(n_classes, dim, weights)
        shares = [self.clients[i].release_integer(stage, plan, n_classes=n_classes, weights=weights, centring=centring)
                  for i in self._live]
        return integer_secure_sum(shares, layout)


def attach_local_session(clients, distributed: DistributedNoise, delta: float, tails: Sequence,
                         drop: Sequence[int] = ()) -> LocalIntegerSession:
    """Give in-process clients a ``secure_session`` (one :class:`LocalIntegerSession` shared by all), so that
    :func:`fedhype.federated.class_stats.run_class_stats_stage` releases through the integer path."""
    session = LocalIntegerSession(clients, distributed, delta, tails, drop)
    for c in clients:
        c.secure_session = lambda s=session: s
    return session


def planned_tails(cfg, sizes: Sequence[int]) -> list[list[tuple[float, float, int]]]:
    """Every client's planned DP-SGD history ``[(σ, q_i, steps_i)]`` (``[]`` for a statistics-only plan)."""
    from fedhype.federated.run_plan import plan_privacy

    privacy = plan_privacy(cfg, list(sizes))
    sigma = privacy["noise_multiplier"]
    if sigma is None:
        return [[] for _ in sizes]
    return [[(float(sigma), float(q), int(t))] if t else [] for q, t in privacy["plan"]]
