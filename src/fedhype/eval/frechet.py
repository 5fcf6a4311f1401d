"""Fréchet distance (FD) between Gaussian fits of real and synthetic embeddings.

Source: Heusel et al., "GANs Trained by a Two Time-Scale Update Rule Converge to a Local Nash
Equilibrium", NeurIPS 2017, eq. 6 (the Fréchet / 2-Wasserstein distance of two Gaussians, Dowson &
Landau 1982)::

    FD = ‖μ₁ − μ₂‖² + Tr(Σ₁ + Σ₂ − 2 (Σ₁ Σ₂)^{1/2})

Matrix square root: ``Σ₁Σ₂`` is similar to the symmetric PSD matrix ``Σ₁^{1/2} Σ₂ Σ₁^{1/2}``
(conjugate by ``Σ₁^{1/2}``), so ``Tr((Σ₁Σ₂)^{1/2}) = Σᵢ √λᵢ(Σ₁^{1/2} Σ₂ Σ₁^{1/2})``. We compute it
with two symmetric eigen-decompositions (``numpy.linalg.eigh``, float64), clipping rounding-level
negative eigenvalues to 0. Unlike ``scipy.linalg.sqrtm`` of the non-symmetric product, this needs
no ``eps·I`` retry, has no complex part, and is exact for singular covariances (N ≤ D), where it
equals the continuous extension of the formula.

Covariances are the unbiased sample covariances (``ddof = 1``). With N ≤ D the covariance of that
set is singular and FD is biased upwards; it is still computed, with a warning in the result.
"""

from __future__ import annotations

import numpy as np
import torch

from fedhype.errors import ValidationError


def _psd_sqrt(s: np.ndarray) -> np.ndarray:
    """Symmetric square root of a symmetric PSD matrix (negative rounding eigenvalues → 0)."""
    w, v = np.linalg.eigh((s + s.T) / 2.0)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def trace_sqrt_product(sigma1: np.ndarray, sigma2: np.ndarray) -> float:
    """``Tr((Σ₁ Σ₂)^{1/2})`` for symmetric PSD ``Σ₁, Σ₂`` (float64 ``[D, D]``), via eigh.

    Raises:
        ValidationError: if the shapes differ or are not square.
    """
    if sigma1.shape != sigma2.shape or sigma1.ndim != 2 or sigma1.shape[0] != sigma1.shape[1]:
        raise ValidationError(f"covariances must be square and of equal shape, got {sigma1.shape} and {sigma2.shape}")
    r = _psd_sqrt(np.asarray(sigma1, dtype=np.float64))
    m = r @ np.asarray(sigma2, dtype=np.float64) @ r
    w = np.linalg.eigvalsh((m + m.T) / 2.0)
    return float(np.sqrt(np.clip(w, 0.0, None)).sum())


def fd_from_moments(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """Fréchet distance (Heusel et al. 2017, eq. 6) of N(μ₁, Σ₁) and N(μ₂, Σ₂).

    Args:
        mu1, mu2: means ``[D]``.
        sigma1, sigma2: symmetric PSD covariances ``[D, D]``.

    Returns:
        FD ≥ 0 (float; squared units of the embeddings). Negative rounding residue is clipped to 0.
    """
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    s1, s2 = np.asarray(sigma1, np.float64), np.asarray(sigma2, np.float64)
    if mu1.shape != mu2.shape or s1.shape != (mu1.shape[0],) * 2:
        raise ValidationError(
            f"means/covariances have inconsistent shapes: {mu1.shape}, {mu2.shape}, {s1.shape}, {s2.shape}"
        )
    diff = mu1 - mu2
    fd = float(diff @ diff) + float(np.trace(s1) + np.trace(s2)) - 2.0 * trace_sqrt_product(s1, s2)
    return max(fd, 0.0)


def _moments(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    a = x.detach().cpu().double().numpy()
    return a.mean(0), np.cov(a, rowvar=False, ddof=1).reshape(a.shape[1], a.shape[1])


def frechet_distance(real: torch.Tensor, synthetic: torch.Tensor) -> dict:
    """FD between the Gaussian fits (mean, unbiased covariance) of two embedding sets.

    Args:
        real: float ``[N₁, D]``.
        synthetic: float ``[N₂, D]``.

    Returns:
        ``{"fd", "fd_mean_term", "fd_n_real", "fd_n_synthetic", "fd_warning"}``; ``fd_warning`` is
        ``None`` or a sentence saying which set has N ≤ D (singular covariance, FD biased up).

    Raises:
        ValidationError: if a set has fewer than 2 rows, or the dimensions differ.
    """
    for name, x in (("real set", real), ("synthetic set", synthetic)):
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValidationError(
                f"{name}: the Fréchet distance needs at least 2 samples [N, D], got shape {tuple(x.shape)}"
            )
    if real.shape[1] != synthetic.shape[1]:
        raise ValidationError(
            f"Fréchet distance: dimensions differ (real D={real.shape[1]}, synthetic D={synthetic.shape[1]})"
        )
    mu1, s1 = _moments(real)
    mu2, s2 = _moments(synthetic)
    d = real.shape[1]
    sets = (("real", real), ("synthetic", synthetic))
    small = [f"{nm} has N={x.shape[0]} ≤ D={d}" for nm, x in sets if x.shape[0] <= d]
    warning = (
        "; ".join(small) + ": its covariance is singular and FD is biased upwards; use more samples than dimensions"
        if small
        else None
    )
    return {
        "fd": fd_from_moments(mu1, s1, mu2, s2),
        "fd_mean_term": float(((mu1 - mu2) ** 2).sum()),
        "fd_n_real": int(real.shape[0]),
        "fd_n_synthetic": int(synthetic.shape[0]),
        "fd_warning": warning,
    }
