"""Empirical ε lower bounds from one training run (Steinke, Nasr & Jagielski, NeurIPS 2023).

"Privacy Auditing with One (1) Training Run" (arXiv 2305.08846). Setup: ``m`` canaries, each
included independently with probability 1/2 (the random pattern S ∈ {±1}^m); after the run the
auditor scores every canary from what the run released, guesses "in" for the ``k₊`` highest
scores and "out" for the ``k₋`` lowest (abstaining on the rest), and counts the ``v`` correct
guesses among ``r = k₊ + k₋``.

* ε-DP (their main theorem, δ = 0): the number of correct guesses W is stochastically
  dominated by Binomial(r, e^ε / (1 + e^ε)), so ``P[W ≥ v] ≤ P[Binomial(r, q_ε) ≥ v]``.
* (ε, δ)-DP (the δ > 0 case, computed as in their Algorithm 2 / the code of their appendix):
  the tail gets an additive term, ``p(ε, δ) = P[Binomial(r, q_ε) ≥ v] + 2·m·δ·α`` with
  ``α = max_{1≤i≤v} P[v − i ≤ Binomial(r, q_ε) < v] / i``.

The lower bound at confidence ``1 − β`` is the largest ε with ``p(ε, δ) < β``: a mechanism that
were (ε, δ)-DP would produce ``v`` or more correct guesses with probability below β. The
guarantee holds only when ``k₊, k₋`` are fixed before the scores are seen (no maximum over
choices without a correction: :func:`epsilon_lower_bound` takes ``beta / n_choices`` for a
Bonferroni correction if the caller tries several).

Resolution: the bound cannot exceed its all-correct value, e.g. 3.20 for m = 1000 canaries,
k₊ = 100 "in" guesses, δ = 1e-4, β = 0.05 (3.49 at δ = 0): a claimed ε above that cannot be
refuted with that design; more guesses (more canaries) raise the ceiling, about log(r / log(1/β)).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from fedhype.errors import ValidationError

#: Default fraction of the canaries guessed "in" (highest scores) and "out" (lowest scores).
#: "In" guesses only by default: under Poisson subsampling an included canary that was never
#: sampled looks exactly like an excluded one, so "out" guesses are weak evidence (our choice).
GUESS_IN = 0.1
GUESS_OUT = 0.0


def _check_counts(m: int, r: int, v: int) -> tuple[int, int, int]:
    for name, val in (("m", m), ("r", r), ("v", v)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise ValidationError(f"{name} must be an integer, got {val!r}")
    if not 0 <= v <= r <= m:
        raise ValidationError(f"need 0 ≤ correct (v={v}) ≤ guesses (r={r}) ≤ canaries (m={m})")
    return int(m), int(r), int(v)


def _check_delta_beta(delta: float, beta: float) -> None:
    if not (0.0 <= float(delta) <= 1.0):
        raise ValidationError(f"delta must be in [0, 1], got {delta!r}")
    if not (0.0 < float(beta) < 1.0):
        raise ValidationError(f"beta (1 − --confidence) must be in (0, 1), got {beta!r}")


def p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """Upper bound on P[≥ v correct of r guesses] for an (ε, δ)-DP mechanism with m canaries.

    Steinke et al. 2023, Algorithm 2 (δ > 0 case): ``min(1, P[Bin(r, q) ≥ v] + 2mδ·α)`` with
    ``q = e^ε / (1 + e^ε)`` and ``α = max_{1≤i≤v} P[v − i ≤ Bin(r, q) < v] / i`` (α = 0 if δ = 0).

    Raises:
        ValidationError: unless ``0 ≤ v ≤ r ≤ m``, ε ≥ 0 and δ ∈ [0, 1].
    """
    m, r, v = _check_counts(m, r, v)
    if not (epsilon >= 0) or math.isnan(epsilon):
        raise ValidationError(f"epsilon must be ≥ 0, got {epsilon!r}")
    _check_delta_beta(delta, 0.5)
    q = 1.0 / (1.0 + math.exp(-epsilon)) if epsilon < 700 else 1.0
    tail = float(binom.sf(v - 1, r, q))  # P[Bin(r, q) ≥ v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    alpha = float((np.cumsum(binom.pmf(v - i, r, q)) / i).max())
    return min(tail + alpha * float(delta) * 2.0 * m, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float = 0.0, beta: float = 0.05, *,
                        tol: float = 1e-6) -> float:
    """The largest ε (to ``tol``) with ``p_value(m, r, v, ε, δ) < β``; 0 if even ε = 0 is not rejected.

    With δ = 0 and all guesses correct (v = r) this is the closed form
    ``log(β^{1/r} / (1 − β^{1/r}))`` (when positive).

    Args:
        m: canaries (each included with probability 1/2); r: guesses; v: correct guesses.
        delta: δ of the claim being tested (the run's δ).
        beta: 1 − confidence.

    Returns:
        ε ≥ 0 (float). The mechanism is not (ε', δ)-DP for any ε' below it, at confidence 1 − β.
    """
    m, r, v = _check_counts(m, r, v)
    _check_delta_beta(delta, beta)

    def rejected(eps: float) -> bool:
        return p_value(m, r, v, eps, delta) < beta

    if not rejected(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while rejected(hi):
        lo, hi = hi, hi * 2.0
        if hi > 1e3:  # cannot happen for finite r (q → 1 gives p → 1 unless v = 0)
            return math.inf
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rejected(mid) else (lo, mid)
    return lo


def guess_counts(m: int, guess_in: float = GUESS_IN, guess_out: float = GUESS_OUT) -> tuple[int, int]:
    """``(k₊, k₋)`` = (round(guess_in·m), round(guess_out·m)), fixed before any score is seen.

    Raises:
        ValidationError: fractions outside [0, 1], summing above 1, or no guess at all.
    """
    for name, f in (("--guess-in", guess_in), ("--guess-out", guess_out)):
        if not (0.0 <= f <= 1.0):
            raise ValidationError(f"{name} must be a fraction in [0, 1], got {f!r}")
    k_in, k_out = int(round(guess_in * m)), int(round(guess_out * m))
    if k_in + k_out > m:
        raise ValidationError(f"--guess-in + --guess-out = {guess_in + guess_out:g} exceeds 1")
    if k_in + k_out == 0:
        raise ValidationError(f"no guesses: --guess-in {guess_in:g} and --guess-out {guess_out:g} of --n-canaries {m} "
                              "both round to 0; raise --guess-in or --n-canaries")
    return k_in, k_out


def score_guesses(scores: np.ndarray, included: np.ndarray, k_in: int, k_out: int,
                  rng: np.random.Generator) -> dict:
    """Guess "in" for the ``k_in`` highest and "out" for the ``k_out`` lowest scores; count correct.

    Ties are broken by a random permutation from ``rng`` (so equal scores never favour an order).

    Args:
        scores: float ``[m]`` (higher = more likely included).
        included: bool ``[m]``, the true membership pattern.

    Returns:
        ``{"guesses": r, "correct": v, "guesses_in", "guesses_out", "correct_in", "correct_out"}``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValidationError(f"scores {scores.shape} and membership {included.shape} must be equal 1-D shapes")
    if not np.isfinite(scores).all():
        raise ValidationError("canary scores contain NaN or Inf")
    perm = rng.permutation(len(scores))
    order = perm[np.argsort(-scores[perm], kind="stable")]
    top, bottom = order[:k_in], order[len(order) - k_out:] if k_out else order[:0]
    c_in, c_out = int(included[top].sum()), int((~included[bottom]).sum())
    return {"guesses": k_in + k_out, "correct": c_in + c_out, "guesses_in": k_in, "guesses_out": k_out,
            "correct_in": c_in, "correct_out": c_out}


def audit_from_scores(scores: np.ndarray, included: np.ndarray, *, delta: float, claimed_epsilon: float | None,
                      confidence: float = 0.95, guess_in: float = GUESS_IN, guess_out: float = GUESS_OUT,
                      seed: int = 0) -> dict:
    """One-run audit result: guesses, correct, the ε lower bound, and whether it exceeds the claim.

    Returns:
        ``{"n_canaries", "n_included", "guesses", "correct", ..., "confidence", "delta",
        "empirical_epsilon_lower_bound", "claimed_epsilon", "exceeds_claim"}``. ``exceeds_claim``
        is True when the lower bound is above the claimed ε: at confidence ``confidence`` the
        mechanism is not as private as claimed.
    """
    if not (0.0 < confidence < 1.0):
        raise ValidationError(f"--confidence must be in (0, 1), got {confidence!r}")
    m = int(np.asarray(included).shape[0])
    k_in, k_out = guess_counts(m, guess_in, guess_out)
    g = score_guesses(scores, included, k_in, k_out, np.random.default_rng(seed))
    bound = epsilon_lower_bound(m, g["guesses"], g["correct"], delta, 1.0 - confidence)
    exceeds = claimed_epsilon is not None and bound > claimed_epsilon
    return {"n_canaries": m, "n_included": int(np.asarray(included).sum()), **g, "confidence": confidence,
            "delta": float(delta), "empirical_epsilon_lower_bound": bound, "claimed_epsilon": claimed_epsilon,
            "exceeds_claim": bool(exceeds)}
