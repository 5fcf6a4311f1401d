"""The covariance the DP release gives: the within-class part, the class means' signal-to-noise, and the
low-rank-plus-isotropic estimate that initialises the decoder's linear path (docs/method.md, decisions 14 and 16).

Post-processing of the pooled moments of :func:`fedhype.federated.class_stats._moments` (public DP outputs): the
eigenvalues of the noisy covariance above the Wigner noise edge are located and debiased (spiked Wigner model),
the rest of the variance goes where ``model.residual`` / ``model.located_share`` say.
"""

from __future__ import annotations

import math

import torch

from fedhype.errors import ValidationError
from fedhype.models.config import (AUTO_LOCATED_FRACTION, AUTO_LOCATED_SHARE, AUTO_SHARE_MAX_LOCATED,
                                   AUTO_SHARE_MIN_SNR, DEFAULT_RESIDUAL, DP_LATENT, RESIDUALS)

#: floor of the total variance 1 − ‖μ‖² used for the scale s (DINOv2-S digits: 0.24)
MIN_TOTAL_VARIANCE = 0.05


def _gaussian(mo: dict, max_rank: int | None, residual: str = DEFAULT_RESIDUAL,
              located_share: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The low-rank-plus-isotropic covariance of moments ``mo`` (:func:`_within_class`, :func:`covariance_estimate`)."""
    cov, tr = _within_of(mo)
    return covariance_estimate(cov, tr, mo["offdiag_var"], max_rank=max_rank, residual=residual,
                               located_share=located_share)


def _within_of(mo: dict) -> tuple[torch.Tensor, float]:
    """:func:`_within_class` of moments ``mo``: the covariance its class-conditional samples get, and its trace."""
    m64 = mo["mean"].to(torch.float64)
    return _within_class(mo["cov"], float(mo["var"]), mo["class_means"].to(torch.float64) - m64,
                         mo["counts"].to(torch.float64), mo["sums_noise_var"])


#: the James–Stein factor of the class means above which the between-class scatter is subtracted
#: from the total covariance (:func:`_within_class`; chosen on the digits validation split)
WITHIN_CLASS_MIN_SNR = 0.9


def _within_class(cov: torch.Tensor, total_variance: float, deviations: torch.Tensor, counts: torch.Tensor,
                  sum_noise_var: float) -> tuple[torch.Tensor, float]:
    """The covariance the class-conditional samples get: within-class when the class means are precise.

    With the between-class scatter B = Σ_k w_k d_k d_kᵀ of the DP class-mean deviations d_k (weights
    w_k ∝ noisy counts) and t² = Σ_k w_k · (noise variance per coordinate of class mean k), the
    James–Stein factor f = 1 − D·t²/tr B (Efron & Morris 1973) measures how much of B is signal. For
    f ≥ :data:`WITHIN_CLASS_MIN_SNR` the debiased between-class scatter f·(B − t² I) is subtracted
    (within-class covariance, as a Gaussian fit on exact statistics would); below it the total
    covariance is kept: subtracting a noisy B removes variance in directions where only noise
    separates the classes, and a classifier trained on such samples relies on that noise. Digits
    validation split, 3 seeds (benchmarks/results/release_defaults.md, "within-class threshold"):
    always subtracting gives TSTR 0.568 / 0.619 at ε = 4 / 8 against 0.570 / 0.628 with this
    threshold, and never subtracting 0.786 without DP against 0.849.

    When the debiased scatter would leave less than :data:`MIN_TOTAL_VARIANCE` of the total variance
    (a small client's noisy class means at small ε), the total covariance is kept as below the threshold.

    Returns ``(covariance [D, D], its trace)`` float64.
    """
    sub = _between_part(deviations, counts, sum_noise_var)
    if sub is None:
        return cov, total_variance
    within = total_variance - float(torch.trace(sub))
    if within < MIN_TOTAL_VARIANCE * total_variance:  # the noisy scatter holds (nearly) all the variance: a small
        return cov, total_variance  # client's noise, not its classes; a negative trace had made log σ² NaN
    return cov - sub, within


def _between_snr(deviations: torch.Tensor, counts: torch.Tensor, sum_noise_var) -> tuple[torch.Tensor, float, float]:
    """The between-class scatter B [D, D] float64, t² and the James–Stein factor f = 1 − D·t²/tr B (:func:`_within_class`)."""
    dim = deviations.shape[1]
    w = counts / counts.sum()
    between = (deviations.T * w) @ deviations
    t2 = float((w * sum_noise_var / counts ** 2).sum())
    tb = float(torch.trace(between))
    return between, t2, (1.0 - dim * t2 / tb if tb > 0 else 0.0)


def _between_part(deviations: torch.Tensor, counts: torch.Tensor, sum_noise_var) -> "torch.Tensor | None":
    """What :func:`_within_class` subtracts: f·(B − t² I) [D, D] float64, or None below the threshold."""
    between, t2, f = _between_snr(deviations, counts, sum_noise_var)
    if f < WITHIN_CLASS_MIN_SNR:
        return None
    return f * (between - t2 * torch.eye(between.shape[0], dtype=between.dtype))


def class_mean_snr(mo: dict) -> float:
    """The James–Stein factor F = 1 − D·t²/tr B of the DP class means of moments ``mo`` (:func:`fedhype.federated.class_stats._moments`).

    B = Σ_k w_k d_k d_kᵀ is the scatter of the class means' deviations d_k from the mean (w_k ∝ the noisy
    counts) and t² = Σ_k w_k · (noise variance per coordinate of class mean k), so F estimates the share of
    the class means' spread that is signal (Efron & Morris 1973): 1 without DP noise, lower as the noise
    grows (digits: 0.37 / 0.89 / 0.96 at ε = 1 / 4 / 8). Clipped at 0, the positive-part estimator: a release
    whose noise exceeds the spread of its class means (tiny clients at ε = 1) has F = 0, not a negative share.
    Computed from released statistics only (post-processing, no ε). The threshold of :func:`_within_class` and
    of :func:`resolve_located_share`.
    """
    m64 = mo["mean"].to(torch.float64)
    return max(0.0, float(_between_snr(mo["class_means"].to(torch.float64) - m64, mo["counts"].to(torch.float64),
                                       mo["sums_noise_var"])[2]))


def resolve_located_share(share, mo: dict, max_rank: int | None = None) -> float:
    """``model.located_share`` as a number: itself, or for ``"auto"`` the rule below on moments ``mo``.

    ``"auto"`` is :data:`~fedhype.models.config.AUTO_LOCATED_SHARE` (0.8) where the release is noisy (under
    DP), its class means are precise — :func:`class_mean_snr` F ≥ :data:`~fedhype.models.config.AUTO_SHARE_MIN_SNR`
    (0.94) —, it locates at most :data:`~fedhype.models.config.AUTO_SHARE_MAX_LOCATED` (20) covariance directions
    (:func:`located_rank`); 0 otherwise. Why (docs/method.md, decision
    16; validation splits, benchmarks/results/release_defaults.md, "located share, auto"): s = 0.8 lifts precision
    and coverage from ≈ 0.01 to 0.3–0.5 where it applies, at no TSTR cost; it costs TSTR where the class means are
    noisy (digits ε = 4 per client, F ≈ 0.89) and where the release already locates many directions (Fashion-MNIST
    with secure aggregation at ε = 8, r = 27). On all 70,000 Fashion-MNIST images the rule turns it on only at ε = 1
    with 10 clients (F 0.988, r 11-13: ours +0.004) and at ε = 4 with 100 clients (F 0.989, r 12-14: level; the
    release alone +0.003) ("located share, scale"). Post-processing of DP outputs (no ε);
    every client's Gaussian takes the pool's share (``mo`` = the pooled moments).

    Args:
        share: ``"auto"`` or s ∈ [0, 1]. mo: :func:`fedhype.federated.class_stats._moments` of the pooled release. max_rank: the latent size L
            (caps r as :func:`covariance_estimate` does).

    Returns:
        the share s ∈ [0, 1] (float).
    """
    if share != "auto":
        return float(share)
    noisy = float(torch.as_tensor(mo["sums_noise_var"], dtype=torch.float64).max()) > 0
    if not noisy or mo.get("cov") is None:
        return 0.0
    if class_mean_snr(mo) < AUTO_SHARE_MIN_SNR:
        return 0.0
    cov, _ = _within_of(mo)
    return AUTO_LOCATED_SHARE if located_rank(cov, mo["offdiag_var"], max_rank) <= AUTO_SHARE_MAX_LOCATED else 0.0


def located_rank(cov: torch.Tensor, noise_var: float, max_rank: int | None = None, margin: float = 1.05) -> int:
    """r: the eigenvalues of the noisy covariance ``cov`` [D, D] above the Wigner noise edge 2√(vD) × ``margin``,
    at most ``max_rank`` (default D − 1); D − 1 (or ``max_rank``) without noise (:func:`covariance_estimate`)."""
    lam = torch.linalg.eigvalsh((cov + cov.T) / 2) if noise_var > 0 else None
    return _spikes(lam, noise_var, cov.shape[0], max_rank, margin)[0]


def _spikes(lam: "torch.Tensor | None", noise_var: float, dim: int, max_rank: int | None,
            margin: float) -> tuple[int, int, float]:
    """``(r, cap, edge)``: the eigenvalues ``lam`` above ``margin`` × the Wigner edge 2√(vD), at most the cap
    (``max_rank``, default D − 1); the cap itself without noise."""
    edge = 2.0 * math.sqrt(max(noise_var, 0.0) * dim)
    cap = dim - 1 if max_rank is None else max(0, min(int(max_rank), dim - 1))
    rank = min(int((lam > margin * edge).sum()), cap) if noise_var > 0 else cap
    return rank, cap, edge


def covariance_estimate(cov: torch.Tensor, total_variance: float, noise_var: float, *,
                        max_rank: int | None = None, margin: float = 1.05,
                        residual: str = DEFAULT_RESIDUAL,
                        located_share: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Low-rank-plus-isotropic covariance from a noisy covariance matrix (unit-sphere space).

    ``C = M/N − m mᵀ`` (minus the between-class scatter, :func:`_within_class`) carries symmetric
    Gaussian noise with off-diagonal variance v per entry: its eigenvalues spread over a semicircle
    of radius 2√(vD) (Wigner), so only eigenvalues above that edge (× ``margin``) are signal. Each
    kept eigenvalue λ is debiased to the spike strength θ = (λ + √(λ² − 4vD))/2 (spiked Wigner
    model, Benaych-Georges & Nadakuditi 2011, Sec. 3.1: a spike θ > √(vD) appears at λ = θ + vD/θ).
    The remaining variance U = ``total_variance − Σθ`` (the trace of C is known from the unit norms:
    tr C = 1 − ‖m‖²) is the variance the release cannot locate. ``residual`` says where it goes:

    * ``"isotropic"``: spread evenly over the other D − r directions (probabilistic PCA's isotropic
      residual, Tipping & Bishop 1999, eq. 8);
    * ``"latent"`` (with ``max_rank`` = the model's latent size L): into the model's L − r free latent
      directions first, along the next eigenvectors u_j (j = r … L − 1) of the noisy C, each with
      variance ∝ max(λ_j, 0) and at most λ_j; only what is left (nothing, under DP noise, where those
      λ_j sum to more than U) spreads evenly over the last D − L directions. The trace is kept either
      way. Ours (docs/method.md, decision 14): below the edge an eigenvector's overlap with the signal
      is small but not zero at finite D, and the unlocated variance put along those directions instead
      of all D − r gave, on the validation splits (3 seeds; benchmarks/results/release_defaults.md,
      "unlocated variance"), TSTR −0.010 / +0.013 / +0.018 at ε = 1 / 4 / 8 for the release alone
      (dp-gaussian) and −0.001 / +0.006 / +0.015 for ours on digits, +0.009 / +0.011 / +0.005 and
      +0.003 / +0.004 / −0.004 on Fashion-MNIST. It does not raise precision or coverage: the samples
      still leave the few located directions.

    * ``"located"``: into the r located spikes, each scaled by (Σθ + U)/Σθ, the residual at its floor
      (isotropic where no spike is located). Every sample then lies near the few directions the release
      resolved: precision and coverage rise (digits test split, ε = 4: 0.006 / 0.010 → see
      benchmarks/results/residual_located.md) at a cost in recall and TSTR. An option for users who need
      samples on the data's manifold, not the default.

    Without noise (v = 0) r = ``max_rank`` (every direction is located) and ``"latent"`` and
    ``"isotropic"`` agree (``"located"`` moves the last D − L directions' variance into the L).

    * ``located_share`` s > 0 (``model.located_share``) with ``"latent"`` (explicit or from ``"auto"``): a
      share s of U first goes on the located spikes (each scaled by (Σθ + sU)/Σθ), the rest as
      ``"latent"``; s = 1 is ``"located"``. Ours at s = 0.95, digits test split, 3 seeds
      (benchmarks/results/located_share_test.md): precision / coverage 0.008 / 0.012 → 0.366 / 0.499 at
      ε = 4 and 0.018 / 0.032 → 0.645 / 0.813 at ε = 8, TSTR −0.018 / −0.005, recall 0.87 / 0.91 →
      0.44 / 0.40 (the release alone: TSTR −0.050 / −0.004). ``model.located_share = "auto"`` (the default)
      is s = 0.8 where the class means are precise and few directions are located, else 0
      (:func:`resolve_located_share`, docs/method.md decision 16); this function takes the resolved number.

    * ``"auto"`` (the default): ``"located"`` when the release resolves at least half the latent
      directions (r ≥ :data:`fedhype.models.config.AUTO_LOCATED_FRACTION` · ``max_rank``; always without DP, where r =
      ``max_rank``), ``"latent"`` below. Without DP the located rule gave ours validation TSTR 0.848 →
      0.864 (digits) and 0.808 → 0.814 (Fashion-MNIST), the release alone 0.850 → 0.847 and 0.808 → 0.806
      (3 seeds; benchmarks/results/release_defaults.md, "unlocated variance, no DP"). Under DP the
      release resolves r = 4 / 10 / 14 of L = 64 directions on digits and 4 / 7 / 11 on Fashion-MNIST
      (10,000 images) at ε = 1 / 4 / 8, where ``"latent"`` is the better rule, and 11 / 35 / 55 on all
      70,000 Fashion-MNIST images (42,000 training records), where ``"located"`` gave the release alone
      0.774 → 0.776 / 0.781 → 0.796 / 0.781 → 0.799 ("unlocated variance, scale"). The located rule
      holds for L ≤ :data:`fedhype.models.config.DP_LATENT` = 64 only: with the larger latent of a
      large training set (L = 128, :data:`fedhype.models.config.SCALE_LATENT`) ``"latent"`` scored at or
      above ``"located"`` in all 6 validation cells on all 70,000 images, also where the secure-
      aggregation release resolves ≥ 64 directions (0.804 vs 0.793 and 0.803 vs 0.789 at ε = 4 / 8;
      benchmarks/results/release_scale.md, "where the unlocated variance goes"), so ``"auto"`` is
      ``"latent"`` there.

    Args:
        cov: float64 [D, D] (symmetrised here). total_variance: its trace as known from the release.
        noise_var: v, the variance of the noise on each off-diagonal entry of ``cov`` (0 without DP).
        max_rank: largest number of factor columns (the model's latent size; default D − 1).
        residual: ``"auto"``, ``"latent"``, ``"isotropic"`` or ``"located"`` (:data:`fedhype.models.config.RESIDUALS`).
        located_share: s ∈ [0, 1], used where the rule is ``"latent"`` (explicit or from ``"auto"``).

    Returns:
        ``(factor [D, k], residual []), r`` in unit-sphere units with covariance ``factor·factorᵀ +
        residual·I`` (factor columns are u_j·√(θ_j − residual)), float64; r ≤ k: the located spikes.

    Raises:
        ValidationError: an unknown ``residual``.
    """
    if residual not in RESIDUALS:
        raise ValidationError(f"model.residual must be one of {list(RESIDUALS)}, got {residual!r}")
    auto = residual == "auto"
    dim = cov.shape[0]
    c = cov
    lam, vec = torch.linalg.eigh((c + c.T) / 2)
    lam, vec = lam.flip(0), vec.flip(1)
    rank, cap, edge = _spikes(lam, noise_var, dim, max_rank, margin)
    share = float(located_share)
    if auto:  # located once the release resolves at least half of an L ≤ 64 latent (always without DP)
        located = noise_var <= 0 or (cap <= DP_LATENT and rank >= AUTO_LOCATED_FRACTION * cap)
        residual = "located" if located else "latent"
    kept = lam[:rank]
    theta = (kept + (kept ** 2 - 4.0 * noise_var * dim).clamp_min(0).sqrt()) / 2 if noise_var > 0 else kept.clamp_min(0)
    floor = 1e-3 * max(float(total_variance), MIN_TOTAL_VARIANCE) / dim  # > 0 whatever the noisy trace
    unlocated = float(total_variance) - float(theta.sum())
    cols = rank
    def onto_spikes(amount: float) -> torch.Tensor:  # the located spikes scaled up to carry ``amount`` more
        return theta * (1.0 + amount / max(float(theta.sum()), 1e-300))

    if residual == "located" and rank > 0:  # all of it along the located spikes, in proportion to them
        theta = onto_spikes(max(unlocated, 0.0))
        unlocated = 0.0
    elif residual == "latent" and cap > rank:
        if share > 0 and rank > 0:  # a share of it along the located spikes first (model.located_share)
            moved = share * max(unlocated, 0.0)
            theta = onto_spikes(moved)
            unlocated -= moved
        free = lam[rank:cap].clamp_min(0)
        theta = torch.cat([theta, free * min(1.0, max(unlocated, 0.0) / max(float(free.sum()), 1e-300))])
        unlocated -= float(theta[rank:].sum())
        cols = cap
    resid = max(unlocated / max(dim - cols, 1), floor)
    factor = vec[:, :cols] * (theta - resid).clamp_min(0).sqrt()
    return factor, torch.tensor(resid, dtype=torch.float64), rank
