"""How the server pools the clients' released class sums into class means (``model.pooling``; post-processing, no ε).

Without secure aggregation each client's release carries its own noise: client i's class sum S_ik = n_ik·m_ik + e_ik
with e_ik ~ N(0, σ²R_i² I) (σ the per-entry noise std of the sums, R_i the radius its statistics are mapped back
with, :func:`fedhype.federated.class_stats._unit_sphere`). The plain sum Σ_i S_ik / Σ_i n_ik carries σ²·Σ_i R_i² of
noise per coordinate whatever share of class k a client holds; under label skew most clients hold few records of a
class, and their sums are mostly noise. The estimators here weight client i's class mean m̂_ik = S_ik / n_ik by

    a_ik = (τ_k²·π_ik + c_k) / (τ_k² + v_ik),   v_ik = σ²R_i²/n_ik²,   π_ik = n_ik / Σ_j n_jk,   Σ_i a_ik = 1,

the weights that minimise the mean squared error τ_k²·Σ_i (a_ik − π_ik)² + Σ_i a_ik²·v_ik about the pooled class
mean Σ_i π_ik·m_ik when the clients' class means scatter about a common one with variance τ_k² per coordinate (the
random-effects model of meta-analysis; DerSimonian & Laird 1986, Eq. 1–3). ``"inverse-variance"`` takes τ² = 0 —
a_ik ∝ 1/v_ik ∝ n_ik²/R_i², the fixed-effect inverse-variance weighted mean (Cochran 1954) — right for clients of
one population (label skew), whose class means differ only by sampling; ``"random-effects"`` estimates τ_k² from
the releases by the DerSimonian–Laird moment estimator (Q, the weighted scatter of the clients' class means about
the fixed-effect mean, against its expectation D·(m_k − 1) without scatter), which leaves the weights at
inverse-variance where the clients agree and moves them toward the plain sum's π_ik as their class means differ
(distinct domains, where inverse-variance weights would pull each class toward the clients that hold most of it).
Everything is computed from the released (noisy) counts and sums: post-processing of DP outputs (no ε). A client
whose noisy count of a class is ≤ 0 gets weight 0 for it; a class no client counts positively keeps the plain sum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from fedhype.models.config import POOLINGS  # the plain sum, inverse-variance weights (τ² = 0), random-effects weights

Release = tuple[torch.Tensor, torch.Tensor, float]  # class sums [K, D], noisy counts [K] (float64), radius R_i


def _tau2(releases: Iterable[Release], sigma2: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DerSimonian–Laird τ_k² [K] (clipped at 0), Q_k [K] and the positive-count clients m_k [K] (float64).

    With W_i = n_i²/(σ²R_i²) (the inverse variance of client i's class mean per coordinate) and the fixed-effect mean
    μ = Σ W_i m̂_i / Σ W_i, Q = Σ_i W_i‖m̂_i − μ‖² = Σ_i ‖S_i − n_i μ‖²/(σ²R_i²), summed over the D coordinates;
    E[Q] = D(m − 1) + D·τ²·(ΣW − ΣW²/ΣW) (DerSimonian & Laird 1986, Eq. 3, per coordinate). One pass of running sums
    (memory flat in the number of clients): ΣW m̂ = Σ n_i S_i/(σ²R_i²), Σ‖S_i‖²/R_i², ΣW and ΣW².
    """
    ws = w = w2 = a = m = None
    for s, n, r in releases:
        s, n = s.to(torch.float64), n.to(torch.float64).clamp_min(0)
        r2 = r * r
        on = (n > 0).to(torch.float64)
        terms = (n[:, None] * s / r2, n * n / r2, (n * n / r2) ** 2, on * s.pow(2).sum(1) / r2, on)
        if ws is None:
            ws, w, w2, a, m = (t.clone() for t in terms)
        else:
            for acc, t in zip((ws, w, w2, a, m), terms):
                acc.add_(t)
    dim = ws.shape[1]
    safe = w.clamp_min(1e-300)
    mu = ws / safe[:, None]
    q = (a - 2.0 * (ws * mu).sum(1) + w * mu.pow(2).sum(1)) / sigma2  # Σ_i ‖S_i − n_i μ‖² / (σ²R_i²)
    big_w, big_w2 = w / sigma2, w2 / sigma2 ** 2
    spread = big_w - big_w2 / big_w.clamp_min(1e-300)
    # one client holding the class: spread is 0 up to rounding (no scatter to measure), τ² = 0 there
    resolved = (m > 1) & (spread > 1e-12 * big_w)
    tau2 = torch.where(resolved, (q / dim - (m - 1.0)) / spread.clamp_min(1e-300), torch.zeros_like(q))
    return tau2.clamp_min(0.0), q, m


def pooled_class_means(releases: Callable[[], Iterable[Release]], sigma: float, rule: str) -> dict[str, torch.Tensor]:
    """The pooled class means of the clients' releases under pooling ``rule`` (module docstring).

    Args:
        releases: called once per pass (two passes, three with ``"random-effects"``); yields, client by client, its
            class sums [K, D] and noisy counts [K] (computed in float64) on the unit sphere and the radius R_i they were
            mapped back with (1 for an uncentred release).
        sigma: the per-entry noise std σ of a release's class sums before the mapping (> 0).
        rule: ``"inverse-variance"`` or ``"random-effects"``.

    Returns:
        ``class_means`` [K, D], ``noise_var`` [K] (the noise variance per coordinate of each class mean:
        σ²·Σ_i a_ik²R_i²/n_ik²), ``tau2`` [K] (τ_k², 0 for ``"inverse-variance"``), ``pooled`` [K] (bool: the class
        had a client with a positive count; the others are NaN: keep the plain sum there), all float64.

    Raises:
        ValueError: an unknown ``rule`` or σ ≤ 0.
    """
    if rule not in POOLINGS[1:]:
        raise ValueError(f"pooling rule must be one of {list(POOLINGS[1:])}, got {rule!r}")
    if not sigma > 0:
        raise ValueError(f"pooling needs the release's noise std σ > 0, got {sigma!r}")
    sigma2 = float(sigma) ** 2
    tau2 = _tau2(releases(), sigma2)[0] if rule == "random-effects" else None
    # first pass: the positive pooled counts N_k (π_ik = n_ik / N_k) and the normaliser c_k of Σ_i a_ik = 1;
    # with den_ik = τ²n_ik² + σ²R_i²: a_ik = (τ²π_ik + c_k)·n_ik²/den_ik
    total = None
    for _, n, _ in releases():
        n = n.to(torch.float64).clamp_min(0)
        total = n.clone() if total is None else total.add_(n)
    t2 = torch.zeros_like(total) if tau2 is None else tau2
    safe_total = total.clamp_min(1e-300)
    g_pi = g_one = None  # Σ_i π_i n_i²/den_i, Σ_i n_i²/den_i
    for _, n, r in releases():
        n = n.to(torch.float64).clamp_min(0)
        den = t2 * n * n + sigma2 * r * r
        terms = (n.pow(3) / safe_total / den, n * n / den)
        g_pi, g_one = (terms[0].clone(), terms[1].clone()) if g_pi is None else (g_pi.add_(terms[0]), g_one.add_(terms[1]))
    c = (1.0 - t2 * g_pi) / g_one.clamp_min(1e-300)
    # second pass: Σ_i a_ik m̂_ik = Σ_i (τ²π_ik + c_k)·n_ik·S_ik/den_ik and its noise variance
    means = noise = None
    for s, n, r in releases():
        s, n = s.to(torch.float64), n.to(torch.float64).clamp_min(0)
        den = t2 * n * n + sigma2 * r * r
        coef = (t2 * n / safe_total + c) * n / den  # [K]: a_ik / n_ik
        terms = (coef[:, None] * s, coef * coef * sigma2 * r * r)
        means, noise = (terms[0].clone(), terms[1].clone()) if means is None else (means.add_(terms[0]), noise.add_(terms[1]))
    pooled = total > 0
    nan = torch.full_like(total, float("nan"))
    return {"class_means": torch.where(pooled[:, None], means, nan[:, None]), "noise_var": torch.where(pooled, noise, nan),
            "tau2": t2, "pooled": pooled}
