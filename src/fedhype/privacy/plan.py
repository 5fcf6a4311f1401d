"""The privacy plan: σ calibration for a run's steps and the max-ε check, for every command.

A *plan* is every client's DP-SGD steps as ``[(q_i, steps_i), …]`` (Poisson rate and number of
subsampled Gaussian steps, Abadi et al. 2016, Alg. 1), optionally preceded by a *prefix* of
un-subsampled release steps ``[(σ, 1, 1), …]`` that every client spends first (the statistics
release of :mod:`fedhype.privacy.centring`, the DP linear reference's class statistics). ε per
client is the accountant's over ``prefix + [(σ, q_i, steps_i)]``
(:func:`fedhype.privacy.accountant.epsilon`); the worst client binds.

Callers: ``fedhype train`` / ``run`` (:func:`fedhype.federated.engine.plan_privacy`),
``fedhype budget`` (:mod:`fedhype.cli.budget_cmd`) and the DP linear reference
(:mod:`fedhype.prototypes.dp_linear`) calibrate through :func:`plan_noise`; they and the prototype
matching (:mod:`fedhype.prototypes.classifier`) refuse an over-budget plan with :func:`check_max_epsilon`
before anything is touched.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from fedhype.errors import BudgetExceededError, ValidationError

Plan = Sequence[tuple[float, int]]
History = list[tuple[float, float, int]]


def release_noise_multiplier(share: float, delta: float, plan: Plan, *, target_epsilon: float | None = None,
                             noise_multiplier: float | None = None) -> float:
    """σ₀ of a one-shot release (one un-subsampled Gaussian step of sensitivity 1) that costs its share of ε.

    With ``target_epsilon``: the σ₀ whose release alone costs ``share × target_epsilon`` (the DP-SGD σ
    is then calibrated on top with the release as prefix, :func:`plan_noise`). With an explicit
    DP-SGD ``noise_multiplier``: the σ₀ costing ``share ×`` the worst ε of the DP-SGD ``plan`` alone
    (σ₀ = 1 when that ε is infinite).

    Raises:
        ValidationError: neither or a bad value (from the accountant).
    """
    from fedhype.privacy.accountant import calibrate_noise, epsilon

    if target_epsilon is not None:
        try:
            return calibrate_noise(share * target_epsilon, delta, 1.0, 1)
        except ValidationError as exc:  # the accountant saw share × ε: say what the user gave
            why = "needs σ > 1e6" if "> 1e6" in str(exc) else "is met even by σ < 1e-4" if "< 1e-4" in str(exc) else str(exc)
            raise ValidationError(
                f"target ε = {target_epsilon:g} (--epsilon) at δ = {delta:g} (--delta): the statistics release's share, "
                f"{share:g} × ε = {share * target_epsilon:g}, {why}; "
                + ("lower --epsilon" if "< 1e-4" in str(exc) else
                   "raise --epsilon, or --delta if it is far below 1/n (a tiny δ makes every ε expensive)")) from None
    if noise_multiplier is None:
        raise ValidationError("release_noise_multiplier needs a target ε or the DP-SGD noise multiplier")
    eps_sgd = max(epsilon([(float(noise_multiplier), q, t)], delta) for q, t in plan)
    if not math.isfinite(eps_sgd):
        return 1.0
    try:
        return calibrate_noise(share * eps_sgd, delta, 1.0, 1)
    except ValidationError as exc:  # the accountant saw share × the DP-SGD steps' ε: say what the user gave
        if "> 1e6" not in str(exc):
            raise
        raise ValidationError(
            f"σ = {float(noise_multiplier):g} (--noise-multiplier) makes the DP-SGD steps cost only ε = {eps_sgd:.3g}; "
            f"the statistics release, whose σ₀ is set to cost {share:g} × that, would need σ₀ > 1e6: give its σ₀ with "
            "--class-stats-noise-multiplier (train.class_stats_noise_multiplier) or a smaller --noise-multiplier") from None


def plan_noise(plan: Plan, delta: float, *, target_epsilon: float | None = None,
               noise_multiplier: float | None = None, release_share: float = 0.0,
               release_sigma: float | None = None, centre_share: float = 0.0,
               release_only: bool = False, release_follows_sigma: bool = False) -> dict[str, Any]:
    """σ of the DP-SGD steps and σ₀ of the release before them, for a target ε or a given σ.

    Args:
        plan: ``[(q_i, steps_i)]`` per client (public sizes only).
        delta: δ.
        target_epsilon: calibrate σ (and σ₀) so every client's ε ≤ this; or
        noise_multiplier: σ given (ε is whatever the accountant says).
        release_share: share of ε the release costs alone (0: no release; then no prefix).
        release_sigma: σ₀ given directly (overrides the share's calibration; 0 counts as not given).
        centre_share: s of the centred release (:func:`fedhype.privacy.centring.release_steps`; 0:
            one uncentred step).
        release_only: a statistics-only method (dp-gaussian): no DP-SGD step; σ₀ =
            ``release_sigma`` or ``noise_multiplier`` or calibrated to the whole target.
        release_follows_sigma: with a given σ, use it as σ₀ too (the DP linear reference's rule)
            instead of :func:`release_noise_multiplier`'s share of the plan's ε.

    Returns:
        ``{"noise_multiplier": σ or None, "class_stats_noise_multiplier": σ₀ or None, "prefix":
        [(σ, 1, 1), …], "calibrated": bool}`` (``calibrated``: σ, or σ₀ of a release-only plan, came
        from the target).

    Raises:
        ValidationError: no target and no σ, a release that spends the whole target, a bad value.
    """
    from fedhype.privacy.accountant import calibrate_noise, calibrate_noise_plan
    from fedhype.privacy.centring import release_steps

    plan = list(plan)
    if release_only:
        s0 = release_sigma or noise_multiplier or calibrate_noise(target_epsilon, delta, 1.0, 1)
        if target_epsilon is not None and (release_sigma or noise_multiplier):
            # a σ₀ given beside a target: the release is the whole run, so σ₀ alone sets its ε (a probe's --epsilon 1
            # --class-stats-noise-multiplier 1 spent ε = 3.81, explained afterwards as a charge after an interruption)
            from fedhype.privacy.accountant import epsilon_report

            spent = epsilon_report(release_steps(float(s0), centre_share), delta)["epsilon"]
            if spent > target_epsilon * (1 + 1e-6):
                need = calibrate_noise(target_epsilon, delta, 1.0, 1)
                raise ValidationError(
                    f"the statistics release at σ₀ = {float(s0):g} (--class-stats-noise-multiplier) spends ε = "
                    f"{spent:.4g} > the target ε = {target_epsilon:g}: with no DP-SGD round the release is the whole "
                    f"run, so give --epsilon alone (σ₀ is calibrated to it: {need:.4g}) or a σ₀ of at least {need:.4g}")
        return {"noise_multiplier": None, "class_stats_noise_multiplier": float(s0),
                "prefix": release_steps(float(s0), centre_share),
                "calibrated": noise_multiplier is None and release_sigma is None}
    if noise_multiplier is None and target_epsilon is None:
        raise ValidationError("give a target ε (--epsilon) or a noise multiplier (--noise-multiplier)")
    s0 = None
    if release_share > 0:
        if release_sigma:
            s0 = float(release_sigma)
        elif noise_multiplier is not None and release_follows_sigma:
            s0 = float(noise_multiplier)
        else:
            s0 = release_noise_multiplier(release_share, delta, plan, noise_multiplier=noise_multiplier,
                                          target_epsilon=target_epsilon if noise_multiplier is None else None)
    if s0 is None:
        prefix = []
    else:  # one uncentred step (σ₀ = 0 allowed: an explicit σ = 0 of the DP linear reference, ε = ∞), or two
        prefix = [(float(s0), 1.0, 1)] if not centre_share else release_steps(float(s0), centre_share)
    if noise_multiplier is not None:
        return {"noise_multiplier": float(noise_multiplier), "class_stats_noise_multiplier": s0, "prefix": prefix,
                "calibrated": False}
    sigma = calibrate_noise_plan(target_epsilon, delta, plan, prefix=prefix)
    return {"noise_multiplier": float(sigma), "class_stats_noise_multiplier": s0, "prefix": prefix,
            "calibrated": True}


def single_noise(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest σ whose reported ε over ``steps`` Poisson steps at rate q is ≤ ``target_epsilon``
    (:func:`fedhype.privacy.accountant.calibrate_noise`; ``fedhype budget``'s single mechanism)."""
    from fedhype.privacy.accountant import calibrate_noise

    return calibrate_noise(target_epsilon, delta, sample_rate, steps)


def worst_epsilon(plan: Plan, delta: float, noise_multiplier: float | None, prefix: History = ()) -> float:
    """The largest client ε of ``prefix + [(σ, q_i, steps_i)]`` over the plan (only the prefix when σ is None)."""
    from fedhype.privacy.accountant import epsilon

    prefix = list(prefix)
    if noise_multiplier is None:
        return epsilon(prefix, delta)
    return max(epsilon(prefix + [(float(noise_multiplier), q, s)], delta) for q, s in plan)


#: the ε above which fedhype says a run protects no record in practice (`fedhype train`'s summary, `fedhype run`'s log)
MEANINGLESS_EPSILON = 50.0


def check_max_epsilon(plan: Plan, delta: float, noise_multiplier: float | None, max_epsilon: float | None, *,
                      prefix: History = (), what: str = "the planned run", flag: str = "--max-epsilon",
                      after: str = "nothing was trained", show_delta: bool = True) -> float | None:
    """Refuse a plan whose worst client ε (:func:`worst_epsilon`) exceeds ``max_epsilon`` (None: no check).

    Returns:
        the worst ε (None when not checked).

    Raises:
        BudgetExceededError: ``"<what> would reach ε = … > <flag> …; <after>"`` (exit 3), carrying
            ``epsilon`` and ``limit``.
    """
    if max_epsilon is None:
        return None
    worst = worst_epsilon(plan, delta, noise_multiplier, prefix)
    if worst > max_epsilon:
        at = f" (δ = {delta})" if show_delta else ""
        raise BudgetExceededError(f"{what} would reach ε = {worst:.4g} > {flag} {max_epsilon}{at}; {after}",
                                  epsilon=worst, limit=max_epsilon)
    return worst


def above_target(epsilon: float | None, target: float | None) -> bool:
    """True when the accountant's ε exceeds the target ε (a resumed run recharged an interrupted round)."""
    return bool(target is not None and epsilon is not None and epsilon > target * (1 + 1e-9))


def epsilon_text(epsilon: float, target: float | None = None) -> str:
    """ε with 4 significant digits, or as many more (up to 12) as it takes to print it apart from ``target``
    when it is above it (:func:`above_target`: a resumed run at 2.0000024 printed "ε = 2 is above the target 2")."""
    for digits in range(4, 13):
        text = f"{epsilon:.{digits}g}"
        if not above_target(epsilon, target) or text != f"{target:.{digits}g}":
            return text
    return text
