"""Privacy accountants: ε of a history of Poisson-subsampled Gaussian steps, and σ for a target ε.

A *history* is Opacus's plain-data format: a list of ``(noise_multiplier σ, sample_rate q, steps)``
events, each meaning ``steps`` compositions of the Poisson-subsampled Gaussian mechanism with
sampling rate ``q`` and noise standard deviation ``σ·C`` on a sum clipped to norm ``C``
(DP-SGD; Abadi et al., CCS 2016, Alg. 1). Neighbouring datasets differ by adding or removing
one record, as in Opacus and dp-accounting's default.

Accountants (``accountant=``):

* ``"best"`` — **the reported figure** (the default everywhere): the smaller of the two upper
  bounds below, PRV and RDP. Both bound the true ε from above, so their minimum does too. PRV is
  normally the tighter (RDP is 5–30 % looser, several times looser at ε ≪ 1); RDP wins only
  where PRV's discretised composition fails numerically, which depends on the machine: with
  σ = 4, q = 0.00033, 10,000 steps PRV gave 0.061 / 0.48 / 0.061 at δ = 1.1e-12 / 1e-12 / 9e-13
  on one machine (RDP: 0.365), and 2.15 at σ = 4.2, δ = 1e-12 on another — Opacus finds ε by a
  binary search on the composed δ(ε) curve, which is no longer monotone where float64 FFT noise
  is comparable to δ. :func:`epsilon_report` records both figures and flags such a disagreement
  (:func:`cross_check`).
* ``"prv"`` — Opacus ``PRVAccountant``: numerical composition of privacy loss random variables
  (Gopi, Lee & Wutschitz, NeurIPS 2021, Alg. 1 with the domain of Remark 5.6). We return
  Opacus's ``eps_upper`` (an upper bound, not the point estimate) with
  ``delta_error = δ/1000`` (Opacus's default) and ``eps_error = 0.01`` (Opacus's default):
  ``eps_upper = ε̂(δ − δ_err) + eps_error`` bounds the true ε from above and exceeds it by at most
  about ``2·eps_error`` = 0.02. When the discretisation grid for that accuracy would
  exceed :data:`PRV_MAX_POINTS` points (large ε, or ≳ 40,000 steps), ``eps_error`` is raised just
  enough to fit, which only loosens the upper bound (never makes it optimistic).
* ``"rdp"`` — Opacus ``RDPAccountant`` (Mironov, CSF 2017; subsampled Gaussian of Mironov,
  Talwar & Zhang 2019), orders 1.1…63; an upper bound, usually looser than PRV.
* ``"pld"`` — dp-accounting's ``PLDAccountant`` (Koskela et al. 2020; Doroshenko et al. 2022)
  with its default pessimistic discretisation 1e-4; a cross-check (optional dependency).

Degenerate events: an event with ``steps = 0`` or ``q = 0`` touches no record and costs nothing;
an event with ``σ = 0``, ``q > 0`` and ``steps > 0`` releases unnoised data: ε = ∞. The empty
history has ε = 0. Results are memoised on the canonical history (equal ``(σ, q)`` events merged:
composition is commutative), so repeated queries (ledger reports, plans with equal clients) are
free. Measured on 2 cores (σ 1.1, q 256/60000, 10,000 steps): PRV ≈ 0.35 s, RDP ≈ 0.01 s, PLD ≈ 0.5 s;
the first call also imports Opacus (≈ 4 s, it imports torch).
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from typing import Callable

import numpy as np

from fedhype.errors import FedhypeError, ValidationError

History = list[tuple[float, float, int]]

ACCOUNTANTS = ("best", "prv", "rdp", "pld")

#: The accountant of every reported ε: the smaller of the PRV and RDP upper bounds.
REPORTED = "best"

#: :func:`cross_check`: PRV and PLD (two tight numerical accountants) differing by more than this
#: fraction of the smaller, beyond PRV's own resolution 2·eps_error, is flagged.
CROSS_CHECK_RTOL = 0.1

#: Opacus's default accuracy of the PRV ε upper bound (absolute ε units).
PRV_EPS_ERROR = 0.01
#: Largest PRV discretisation grid (points × distinct events) we allow (peak memory ≈ 0.5 GB).
PRV_MAX_POINTS = 1_000_000
#: the RDP ε above which the reported figure is the RDP bound alone: PRV's grid spans the privacy loss's range,
#: which grows as 1/σ², so a tiny σ asked for 76 GiB (a probe's ``budget --noise-multiplier 1e-3``; σ = 0.05 took
#: 23 s and 2 GB) — and at such ε the tighter figure changes nothing a user decides
PRV_MAX_RDP_EPSILON = 50.0


# --------------------------------------------------------------------------- validation
# Each validator returns the value as a plain Python number or raises ValidationError naming ``field``.
def validate_delta(delta: float, field: str = "delta") -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not (0.0 < float(delta) < 1.0):
        raise ValidationError(f"{field} must be in (0, 1), got {delta!r}")
    return float(delta)


def validate_sample_rate(q: float, field: str = "sample_rate", allow_zero: bool = False) -> float:
    ok = isinstance(q, numbers.Real) and math.isfinite(q) and (0.0 <= q <= 1.0 if allow_zero else 0.0 < q <= 1.0)
    if not ok:
        raise ValidationError(f"{field} must be in {'[0, 1]' if allow_zero else '(0, 1]'}, got {q!r}")
    return float(q)


def validate_steps(steps: int, field: str = "steps") -> int:
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise ValidationError(f"{field} must be an integer ≥ 0, got {steps!r}")
    return int(steps)


def validate_noise_multiplier(sigma: float, field: str = "noise_multiplier") -> float:
    if not isinstance(sigma, numbers.Real) or not math.isfinite(sigma) or sigma < 0:
        raise ValidationError(f"{field} must be a finite number ≥ 0, got {sigma!r}")
    return float(sigma)


def validate_target_epsilon(target_epsilon: float, field: str = "target ε (--epsilon)") -> float:
    if not isinstance(target_epsilon, numbers.Real) or not (0 < target_epsilon < math.inf):
        raise ValidationError(f"{field} must be a finite number > 0, got {target_epsilon!r}")
    return float(target_epsilon)


def validate_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValidationError(f"accountant must be one of {', '.join(ACCOUNTANTS)}; got {accountant!r}")
    if accountant == "pld" and not pld_available():
        raise ValidationError("accountant 'pld' needs dp-accounting: pip install 'fedhype[pld]'")
    return accountant


def check_delta(delta: float, n_records: int, where: str) -> None:
    """Refuse a δ that is not below ``1 / n_records`` (it would allow publishing one record outright).

    Args:
        delta: target δ, in (0, 1).
        n_records: number of records the mechanism runs over (a client's training set size).
        where: what the records are (e.g. ``"client 3"``), named in the message.

    Raises:
        ValidationError: δ outside (0, 1), ``n_records`` < 1, or δ ≥ 1/n_records.
    """
    delta = validate_delta(delta)
    if isinstance(n_records, bool) or not isinstance(n_records, numbers.Integral) or n_records < 1:
        raise ValidationError(f"{where}: number of records must be an integer ≥ 1, got {n_records!r}")
    if delta >= 1.0 / n_records:
        raise ValidationError(
            f"{where}: delta = {delta:g} is not below 1/n = {1.0 / n_records:g} for n = {n_records} records; "
            f"choose delta < 1/n (commonly delta ≤ {0.1 / n_records:.1g})"
        )


#: the largest n·δ a plan passes without a warning (δ ≪ 1/n is the usual advice; δ < 1/n is only what
#: :func:`check_delta` enforces): a mechanism that publishes one record with probability δ is (0, δ)-DP, and
#: n·δ is then the expected number of records it publishes outright (Dwork & Roth 2014, Sec. 2.3)
DELTA_ADVICE = 0.1


def delta_advice(delta: float, sizes: "dict[str, int]") -> str | None:
    """A warning when δ is below 1/n for every client (:func:`check_delta` passed) but not well below it.

    Args:
        delta: δ, in (0, 1).
        sizes: client name → training-set size n_i.

    Returns:
        None when n_i·δ ≤ :data:`DELTA_ADVICE` for every client, or when some n_i·δ ≥ 1 (:func:`check_delta`
        refuses that plan, and its error is the message: a warning saying "below 1/n" would contradict it);
        else one sentence naming the largest n_i·δ, its client and the δ that would meet the advice.
    """
    if not sizes:
        return None
    name, n = max(sizes.items(), key=lambda kv: kv[1])
    if n * delta <= DELTA_ADVICE or n * delta >= 1.0:
        return None
    return (f"delta = {delta:g} is below 1/n for every client but n·delta reaches {n * delta:.3g} ({name!r}, "
            f"n = {n}); the usual advice is delta well below 1/n, e.g. ≤ {DELTA_ADVICE / n:.2g} here "
            f"(n·delta ≤ {DELTA_ADVICE:g})")


def subsampling_advice(batch_size: int, sizes: "dict[str, int]", flag: str = "--batch-size") -> str | None:
    """A warning when the batch size B is at least some client's training-set size n_i: q_i = min(1, B/n_i) = 1,
    so every step uses every record and gets no amplification by subsampling (Abadi et al. 2016, Sec. 3.1: the
    privacy of a step is amplified by q). None when q_i < 1 for every client.

    Args:
        batch_size: B (expected Poisson batch size). sizes: client name → n_i. flag: how the user set B.
    """
    from fedhype.errors import listed

    full = [f"{name} ({n})" for name, n in sizes.items() if n <= batch_size]
    if not full:
        return None
    return (f"{flag} {batch_size} is at least the training-set size of {listed(full)}: q = 1, every step uses every "
            "record and gets no privacy amplification by subsampling; a batch well below n costs far less ε per step")


def canonical_history(history: History) -> tuple[tuple[float, float, int], ...]:
    """Validate ``history`` and return it canonical: costless events dropped, equal (σ, q) merged, sorted.

    Raises:
        ValidationError: an event is not ``(σ ≥ 0, q ∈ [0, 1], steps ≥ 0 integer)``.
    """
    merged: dict[tuple[float, float], int] = {}
    for i, event in enumerate(history):
        if not isinstance(event, (tuple, list)) or len(event) != 3:
            raise ValidationError(f"history[{i}] must be (noise_multiplier, sample_rate, steps), got {event!r}")
        sigma = validate_noise_multiplier(event[0], f"history[{i}].noise_multiplier")
        q = validate_sample_rate(event[1], f"history[{i}].sample_rate", allow_zero=True)
        steps = validate_steps(event[2], f"history[{i}].steps")
        if steps and q:
            merged[(sigma, q)] = merged.get((sigma, q), 0) + steps
    return tuple(sorted((s, q, t) for (s, q), t in merged.items()))


# --------------------------------------------------------------------------- ε
def pld_available() -> bool:
    """Whether dp-accounting (the PLD cross-check) is importable."""
    try:
        import dp_accounting.pld  # noqa: F401
    except ImportError:
        return False
    return True


def epsilon(history: History, delta: float, accountant: str = REPORTED) -> float:
    """ε spent by ``history`` at ``delta`` (see the module docstring for the accountants).

    Args:
        history: ``[(σ, q, steps), ...]`` (Opacus's ``accountant.history`` format).
        delta: target δ in (0, 1).
        accountant: ``"best"`` (the reported figure: min of PRV and RDP; RDP alone where PRV's numerics
            fail), ``"prv"``, ``"rdp"`` or ``"pld"``.

    Returns:
        ε ≥ 0 (``inf`` if an event has σ = 0 with q > 0 and steps > 0; 0 for no costly event).

    Raises:
        ValidationError: bad δ, event or accountant name (or ``"pld"`` without dp-accounting).
    """
    delta = validate_delta(delta)
    validate_accountant(accountant)
    return _epsilon_cached(canonical_history(history), delta, accountant)


@functools.lru_cache(maxsize=4096)
def _epsilon_cached(canon: tuple[tuple[float, float, int], ...], delta: float, accountant: str) -> float:
    if not canon:
        return 0.0
    if any(sigma == 0.0 for sigma, _, _ in canon):
        return math.inf
    if accountant == REPORTED:  # both are upper bounds: the smaller is one too
        rdp = _epsilon_cached(canon, delta, "rdp")
        if rdp > PRV_MAX_RDP_EPSILON:  # no meaningful privacy either way; PRV's grid would not fit (epsilon_report)
            return rdp
        try:
            return min(_epsilon_cached(canon, delta, "prv"), rdp)
        except ValidationError:  # PRV's numerics failed (tiny σ, huge ε): RDP still bounds ε (epsilon_report says so)
            return rdp
    with warnings.catch_warnings():  # q = 1 and extreme orders make numpy/RDP warn; results are checked below
        warnings.simplefilter("ignore")
        try:
            eps = float(_ACCOUNTANT_FNS[accountant](list(canon), delta))
        except (ValueError, RuntimeError, OverflowError) as exc:  # e.g. PRV: "Floating point errors will dominate"
            raise ValidationError(
                f"{accountant} accountant cannot evaluate history {list(canon)} at delta={delta:g} ({exc}); "
                "use a larger delta, fewer steps or more noise"
            ) from None
    if math.isnan(eps):
        raise FedhypeError(f"{accountant} accountant returned NaN for history {list(canon)} at delta={delta:g}")
    return max(eps, 0.0)


def _prv(history: History, delta: float) -> float:
    return _prv_accountant_cls()(history).get_epsilon(delta)


@functools.lru_cache(maxsize=1)
def _prv_accountant_cls() -> type:
    """Opacus's PRV accountant subclass, built on first use (importing Opacus takes seconds)."""
    from opacus.accountants import PRVAccountant
    from opacus.accountants.analysis.prv import Domain, PoissonSubsampledGaussianPRV, compute_safe_domain_size

    class CappedPRVAccountant(PRVAccountant):
        """Opacus's PRV accountant with ``eps_error`` raised only when the grid would be too large.

        The safe domain half-width ``L = max(L_rdp, eps_error) + 3`` (Opacus ``compute_safe_domain_size``)
        is computed once and reused by ``_get_domain`` (same formula as Opacus), halving the cost.
        """

        def __init__(self, history: History):
            super().__init__()
            self.history = list(history)

        def choose_eps_error(self, delta: float) -> float:
            """Opacus's default 0.01, raised so that the grid has at most ``PRV_MAX_POINTS`` points."""
            delta_error = delta / 1000
            steps = [t for _, _, t in self.history]
            prvs = [PoissonSubsampledGaussianPRV(q, s) for s, q, _ in self.history]
            self._l_rdp = compute_safe_domain_size(prvs, steps, PRV_EPS_ERROR, delta_error) - 3
            points = 2 * (self._l_rdp + 3) * math.sqrt(sum(steps) * math.log(12 / delta_error) / 2)
            points *= len(self.history) / PRV_EPS_ERROR
            return max(PRV_EPS_ERROR, PRV_EPS_ERROR * points / PRV_MAX_POINTS)

        def get_epsilon(self, delta: float, **_: object) -> float:
            eps_error = self.choose_eps_error(delta)
            return super().get_epsilon(delta, eps_error=eps_error, delta_error=delta / 1000)

        def _get_domain(self, prvs, num_self_compositions, eps_error, delta_error):  # noqa: ANN001 - Opacus's
            half_width = max(self._l_rdp, eps_error) + 3
            mesh_size = eps_error / np.sqrt(sum(num_self_compositions) * np.log(12 / delta_error) / 2)
            return Domain.create_aligned(-half_width, half_width, mesh_size)

    return CappedPRVAccountant


def prv_eps_error(history: History, delta: float) -> float:
    """The PRV ``eps_error`` used for ``history`` (0.01 unless the grid would be too large).

    Grid size follows Opacus's ``PRVAccountant._get_domain``: ``2L / mesh`` per distinct event with
    ``mesh = eps_error / sqrt(T·log(12/δ_err)/2)``, ``δ_err = δ/1000`` and ``L`` its safe domain size.
    """
    return _prv_eps_error_cached(canonical_history(history), validate_delta(delta))


@functools.lru_cache(maxsize=1024)
def _prv_eps_error_cached(canon: tuple[tuple[float, float, int], ...], delta: float) -> float:
    if not canon or any(sigma == 0.0 for sigma, _, _ in canon):
        return PRV_EPS_ERROR
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _prv_accountant_cls()(list(canon)).choose_eps_error(delta)


def _rdp(history: History, delta: float) -> float:
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = history
    return acc.get_epsilon(delta)


def _pld(history: History, delta: float) -> float:
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    acc = PLDAccountant()
    events = [
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s)), t)
        for s, q, t in history
    ]
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return acc.get_epsilon(delta)


_ACCOUNTANT_FNS: dict[str, Callable[[History, float], float]] = {"prv": _prv, "rdp": _rdp, "pld": _pld}


def cross_check(prv: float, rdp: float, pld: float | None, delta: float, eps_error: float = PRV_EPS_ERROR) -> list[str]:
    """Warnings for accountants that disagree more than their known errors allow (``[]``: none).

    * PRV above RDP by more than ``2·eps_error``: PRV's bound is normally the tighter, so this is
      a numerical failure of its discretisation (the reported ε, their minimum, is then RDP's).
    * PRV and PLD (both numerically tight) more than ``2·eps_error + CROSS_CHECK_RTOL·min(PRV, PLD)``
      apart: one of the two numerical compositions is off.

    Args:
        prv / rdp / pld: ε of the same history at ``delta`` (``pld`` None without dp-accounting);
            infinite values are not compared.
        eps_error: PRV's ``eps_error`` for this history (:func:`prv_eps_error`; its ``eps_upper``
            exceeds the true ε by at most about twice this).
    """
    out = []
    slack = 2 * eps_error
    if math.isfinite(prv) and math.isfinite(rdp) and prv > rdp + slack:
        out.append(f"PRV ε {prv:.4g} is above the RDP bound {rdp:.4g} at δ = {delta:g} (PRV is normally the tighter: "
                   "a numerical failure of its discretisation); the RDP figure is reported")
    if pld is not None and math.isfinite(prv) and math.isfinite(pld) and \
            abs(prv - pld) > slack + CROSS_CHECK_RTOL * min(prv, pld):
        out.append(f"PRV ε {prv:.4g} and PLD ε {pld:.4g} disagree at δ = {delta:g} by more than their tolerance "
                   f"({slack:g} + {CROSS_CHECK_RTOL:.0%}); the reported ε is the smaller of PRV and RDP, "
                   f"{min(prv, rdp):.4g}")
    return out


def epsilon_report(history: History, delta: float) -> dict:
    """ε of ``history`` by every accountant; the reported ``"epsilon"`` is the smaller of PRV and RDP.

    Returns:
        ``{"epsilon", "accountant", "epsilon_prv", "epsilon_rdp", "epsilon_pld", "delta", "steps",
        "warnings"}``: ``accountant`` is the one whose figure is reported (``"prv"``, or ``"rdp"``
        where it is below PRV), ``epsilon_pld`` is None without dp-accounting, ``steps`` the total
        number of steps and ``warnings`` the :func:`cross_check` findings (``[]`` when PRV, RDP
        and PLD agree within their tolerances).

    Where PRV's numerics fail (tiny σ, very large ε) or the RDP bound is above :data:`PRV_MAX_RDP_EPSILON`,
    ``epsilon_prv`` and ``epsilon_pld`` are None
    (PLD only cross-checks PRV, and its grid would take minutes there), the RDP bound is reported and
    ``warnings`` says so.

    Raises:
        ValidationError: bad δ or event; or RDP cannot be evaluated either.
    """
    rdp = epsilon(history, delta, "rdp")
    try:
        if rdp > PRV_MAX_RDP_EPSILON:
            raise ValidationError(f"RDP ε {rdp:.4g} > {PRV_MAX_RDP_EPSILON:g}: no meaningful privacy, and PRV's grid "
                                  "would not fit in memory; not evaluated")
        prv, failed = epsilon(history, delta, "prv"), None
    except ValidationError as exc:  # PRV's numerics failed: the RDP bound is reported, and said so
        prv, failed = None, str(exc)
    # PLD cross-checks PRV; where PRV failed (tiny σ) PLD's grid is huge (minutes), so it is skipped
    pld = epsilon(history, delta, "pld") if pld_available() and failed is None else None
    warnings_ = (cross_check(prv, rdp, pld, float(delta), prv_eps_error(history, delta)) if failed is None else
                 [] if rdp == float("inf") else  # σ = 0: ε = ∞ is the answer, not an accountant's failure (a probe)
                 [f"the PRV accountant could not evaluate this history ({failed}); the RDP bound {rdp:.4g} is reported"])
    return {
        "epsilon": rdp if prv is None else min(prv, rdp),
        "accountant": "rdp" if prv is None or rdp < prv else "prv",
        "epsilon_prv": prv,
        "epsilon_rdp": rdp,
        "epsilon_pld": pld,
        "delta": float(delta),
        "steps": sum(int(t) for _, _, t in history),
        "warnings": warnings_,
    }


# --------------------------------------------------------------------------- integer-domain releases
#: one integer-domain (Skellam) release term: ``(σ = √μ/γ, scale γ, record_dim d, count)``
DiscreteTerm = tuple[float, float, int, int]


def epsilon_discrete(history: History, terms: list[DiscreteTerm], delta: float) -> float:
    """ε of Gaussian steps ``history`` composed with integer-domain Skellam releases ``terms``, by RDP.

    The Skellam releases of :mod:`fedhype.privacy.skellam` (secure aggregation across machines) have
    an RDP bound at integer orders only (:func:`fedhype.privacy.skellam.skellam_rdp`); PRV and PLD
    model Gaussian noise. So a history with such a release is accounted by RDP alone: the subsampled
    Gaussian RDP of Mironov, Talwar & Zhang 2019 (Opacus ``compute_rdp``) plus the Skellam bound, at
    the integer orders 2…256, converted to (ε, δ) as Opacus's RDP accountant does (Balle et al. 2020).
    With no term this is the RDP accountant at integer orders.

    Returns:
        ε ≥ 0 (``inf`` for an event or term with σ = 0).

    Raises:
        ValidationError: bad δ, event or term.
    """
    delta = validate_delta(delta)
    canon = canonical_history(history)
    clean = []
    for i, t in enumerate(terms):
        if not isinstance(t, (tuple, list)) or len(t) != 4:
            raise ValidationError(f"terms[{i}] must be (noise_multiplier, scale, record_dim, count), got {t!r}")
        s = validate_noise_multiplier(t[0], f"terms[{i}].noise_multiplier")
        g = validate_noise_multiplier(t[1], f"terms[{i}].scale")
        d, c = validate_steps(t[2], f"terms[{i}].record_dim"), validate_steps(t[3], f"terms[{i}].count")
        if g < 1 or d < 1:
            raise ValidationError(f"terms[{i}]: scale ≥ 1 and record_dim ≥ 1 needed, got {t!r}")
        if c:
            clean.append((s, g, d, c))
    return _epsilon_discrete_cached(canon, tuple(sorted(clean)), delta)


@functools.lru_cache(maxsize=4096)
def _epsilon_discrete_cached(canon, terms, delta: float) -> float:
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    from fedhype.privacy.skellam import ORDERS, skellam_rdp

    if not canon and not terms:
        return 0.0
    if any(s == 0.0 for s, _, _ in canon) or any(s == 0.0 for s, _, _, _ in terms):
        return math.inf
    orders = [float(a) for a in ORDERS]
    rdp = np.zeros(len(orders))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s, q, t in canon:
            rdp = rdp + np.asarray(compute_rdp(q=q, noise_multiplier=s, steps=t, orders=orders), dtype=np.float64)
        for s, g, d, c in terms:
            rdp = rdp + c * skellam_rdp(ORDERS, s, g, d)
        eps, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    if math.isnan(eps):
        raise FedhypeError(f"RDP accountant returned NaN for history {list(canon)} with Skellam terms {list(terms)}")
    return max(float(eps), 0.0)


# --------------------------------------------------------------------------- σ for a target ε
def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = REPORTED,
    rtol: float = 0.005,
    prefix: History = (),
) -> float:
    """Smallest σ (up to ``rtol``) whose ε over ``steps`` steps at rate ``q`` is ≤ ``target_epsilon``.

    ``prefix``: events already spent by the same records (e.g. the DP class statistics); the ε
    checked is that of ``prefix + [(σ, q, steps)]`` composed.

    Bracketing starts from the σ calibrated on Opacus's RDP accountant (cheap, within 1 %) and is
    refined on ``accountant`` by bracketed secant steps on log ε vs log σ (Illinois rule). The
    returned σ is one the accountant was evaluated at, with ε(σ) ≤ target verified; ε(σ) ≥
    (1 − rtol)·target unless the bracket shrank below 1e-4 relative width first. Typically 3–5
    accountant calls (PRV and RDP, 10,000 steps: ≈ 1.5 s).

    Returns:
        σ ≥ 0 (0.0 when ``steps == 0``: nothing is spent).

    Raises:
        ValidationError: target ε ≤ 0, δ ∉ (0, 1), q ∉ (0, 1], steps < 0, or σ > 1e6 would be needed
            (messages name the CLI flags: --epsilon, --noise-multiplier).
    """
    target = validate_target_epsilon(target_epsilon)
    delta, q, steps = validate_delta(delta), validate_sample_rate(sample_rate), validate_steps(steps)
    validate_accountant(accountant)
    if steps == 0:
        return 0.0

    prefix = list(prefix)
    if prefix and epsilon(prefix, delta, accountant) >= target:
        raise ValidationError(f"the earlier release (e.g. the DP class statistics) already spends ε ≥ the target "
                              f"{target:g} (--epsilon); nothing is left for DP-SGD — raise --epsilon or spend less on "
                              "the earlier release (--class-stats-share)")

    def f(sigma: float) -> float:
        return epsilon(prefix + [(sigma, q, steps)], delta, accountant)

    guess = _rdp_sigma(target, delta, q, steps)
    hi, lo = guess, guess
    while (eps_hi := f(hi)) > target:
        lo, hi = hi, hi * 1.25
        if hi > 1e6:
            raise ValidationError(f"target ε {target:g} (--epsilon) needs σ (--noise-multiplier) > 1e6; raise --epsilon")
    while lo == hi or (eps_lo := f(lo)) <= target:
        hi, eps_hi, lo = lo, f(lo), lo * 0.8
        if lo < 1e-4:
            raise ValidationError(f"target ε {target:g} (--epsilon) is met even by σ (--noise-multiplier) < 1e-4; "
                                  "lower --epsilon")
    return _secant(f, target, lo, eps_lo, hi, eps_hi, rtol)


def _rdp_sigma(target: float, delta: float, q: float, steps: int) -> float:
    """σ whose RDP ε (integer orders only: ~10 ms a call) is ≤ target, within 1 % (bisection on log σ)."""
    from opacus.accountants import RDPAccountant

    def f(sigma: float) -> float:
        acc = RDPAccountant()
        acc.history = [(sigma, q, steps)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return acc.get_epsilon(delta, alphas=_GUESS_ORDERS)

    lo, hi = 0.5, 1.0
    while f(hi) > target:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ValidationError(f"target ε {target:g} (--epsilon) needs σ (--noise-multiplier) > 1e6; raise --epsilon")
    while f(lo) <= target and lo > 1e-3:
        hi, lo = lo, lo / 2
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
    return hi


_GUESS_ORDERS = [*range(2, 64), 80, 128, 256]


def _secant(f, target, lo, eps_lo, hi, eps_hi, rtol, max_iter: int = 40) -> float:
    """Illinois regula falsi on g(x) = log f(e^x) − log target, with ε(lo) > target ≥ ε(hi); returns σ_hi."""
    log_t = math.log(target)

    def g(eps: float) -> float:
        return math.log(eps) - log_t if 0 < eps < math.inf else (50.0 if eps == math.inf else -50.0)

    xl, gl, xh, gh, side = math.log(lo), g(eps_lo), math.log(hi), g(eps_hi), 0
    for _ in range(max_iter):
        if eps_hi >= (1 - rtol) * target or (xh - xl) < 1e-4:
            break
        x = xh - gh * (xh - xl) / (gh - gl) if gl != gh else 0.5 * (xl + xh)
        sigma = math.exp(min(max(x, xl + 0.01 * (xh - xl)), xh - 0.01 * (xh - xl)))
        eps = f(sigma)
        if eps <= target:  # new upper end: σ_hi is always a σ that was evaluated and met the target
            hi, eps_hi, xh, gh = sigma, eps, math.log(sigma), g(eps)
            gl, side = (gl / 2 if side == -1 else gl), -1
        else:
            xl, gl = math.log(sigma), g(eps)
            gh, side = (gh / 2 if side == 1 else gh), 1
    return hi


def calibrate_noise_plan(
    target_epsilon: float,
    delta: float,
    plan: list[tuple[float, int]],
    accountant: str = REPORTED,
    rtol: float = 0.005,
    prefix: History = (),
) -> float:
    """Smallest common σ such that every client's ``(q_i, steps_i)`` has ε ≤ ``target_epsilon``.

    ``prefix``: events every client has already spent (composed before each client's steps).

    ε grows as σ falls, so the common σ is the largest per-client calibrated σ: the worst client
    binds. Clients are tried in order of their RDP-calibrated σ (cheap) and the running σ is
    raised only when a client's ε at it exceeds the target, so usually one client is calibrated.

    Raises:
        ValidationError: an empty plan, or a bad value (the message names ``plan[i]``).
    """
    if not plan:
        raise ValidationError("plan must list at least one (sample_rate, steps) pair")
    target_epsilon, delta = validate_target_epsilon(target_epsilon), validate_delta(delta)
    validate_accountant(accountant)
    checked = []
    for i, item in enumerate(plan):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValidationError(f"plan[{i}] must be (sample_rate, steps), got {item!r}")
        checked.append((validate_sample_rate(item[0], f"plan[{i}].sample_rate"),
                        validate_steps(item[1], f"plan[{i}].steps")))
    unique = sorted({p for p in checked if p[1] > 0})
    if not unique:
        return 0.0
    unique.sort(key=lambda p: _rdp_sigma(target_epsilon, delta, *p), reverse=True)
    sigma = 0.0
    prefix = list(prefix)
    for q, steps in unique:
        if sigma == 0.0 or epsilon(prefix + [(sigma, q, steps)], delta, accountant) > target_epsilon:
            sigma = max(sigma, calibrate_noise(target_epsilon, delta, q, steps, accountant, rtol, prefix))
    # ε falls as σ grows, so earlier clients still hold; verify anyway (a discretised bound may wobble)
    while any(epsilon(prefix + [(sigma, q, t)], delta, accountant) > target_epsilon for q, t in unique):
        sigma *= 1.001
    return sigma
