"""Maximum mean discrepancy (MMD²) between real and synthetic embeddings, with a permutation test.

Source: Gretton, Borgwardt, Rasch, Schölkopf & Smola, "A Kernel Two-Sample Test", JMLR 13 (2012).
The statistic is the unbiased U-statistic of Lemma 6 (eq. 3)::

    MMD²_u = 1/(m(m-1)) Σ_{i≠j} k(x_i, x_j) + 1/(n(n-1)) Σ_{i≠j} k(y_i, y_j) − 2/(mn) Σ_{i,j} k(x_i, y_j)

with the Gaussian RBF kernel ``k(x, y) = exp(−‖x − y‖² / (2σ²))``. It can be negative (it is
unbiased: its mean is 0 when both samples come from one distribution).

* Bandwidth σ: the median heuristic (Gretton et al. 2012, §8) — the median pairwise Euclidean
  distance of the *real reference set*, computed on a seeded subsample of at most 1000 real rows
  for speed. The real set here is the held-out evaluation set, never a client's training data.
* Multi-bandwidth variant: the kernel ``Σ_s exp(−‖x − y‖² / (2 (sσ)²))`` for
  ``s ∈ {0.25, 0.5, 1, 2, 4}`` (a sum of characteristic kernels is characteristic), reported as
  ``mmd2_multi``; less sensitive to a poor single bandwidth.
* Permutation p-value (Gretton et al. 2012, §5): the pooled sample is relabelled at random
  ``n_permutations`` times; ``p = (1 + #{MMD²_perm ≥ MMD²_obs}) / (1 + n_permutations)``.
  Vectorised: the joint kernel matrix ``K`` (zero diagonal) is built once; for a relabelling with
  indicator ``u`` of the "real" rows, ``Σ_xx = uᵀKu``, ``Σ_xy = uᵀK1 − uᵀKu`` and
  ``Σ_yy = 1ᵀK1 − 2uᵀK1 + uᵀKu``, so a batch of permutations is one matrix product.
* Both sets are subsampled (seeded, without replacement) to at most ``max_samples`` rows; the
  sizes used are reported. Memory: one ``(m + n)²`` float32 kernel matrix (64 MB at 2000 + 2000).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fedhype.errors import ValidationError
from fedhype.eval.inputs import check_min_rows, child_rngs, subsample

#: Bandwidth multipliers of the multi-bandwidth kernel.
MULTI_SCALES: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)

#: Elements of one permutation-indicator block (``batch × (m + n)``, float32: 16 MB).
_PERM_BLOCK = 1 << 22


def median_heuristic(real: torch.Tensor, rng: np.random.Generator, max_n: int = 1000) -> float:
    """Median pairwise Euclidean distance of ``real`` (float32 ``[N, D]``), on ≤ ``max_n`` rows.

    Raises:
        ValidationError: if fewer than 2 rows, or the median distance is 0 (mostly duplicates).
    """
    check_min_rows(real, 2, "real set", "the median-heuristic bandwidth")
    x = subsample(real, max_n, rng).double()
    med = float(np.median(torch.pdist(x).numpy()))
    if not med > 0.0:
        raise ValidationError(
            "real set: median pairwise distance is 0 (most rows are duplicates); "
            "pass an explicit bandwidth or deduplicate the store"
        )
    return med


def _sq_dists(z: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances ``[N, N]`` (float32, diagonal exactly 0)."""
    sq = (z * z).sum(1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (z @ z.T)
    d2.clamp_(min=0.0).fill_diagonal_(0.0)
    return d2


def _kernel(d2: torch.Tensor, bandwidth: float, scales: Sequence[float]) -> torch.Tensor:
    """Sum of RBF kernels at ``bandwidth * s`` for s in ``scales``, with a zero diagonal."""
    k = torch.zeros_like(d2)
    for s in scales:
        k += torch.exp(d2 / (-2.0 * (bandwidth * s) ** 2))
    return k.fill_diagonal_(0.0)


def _mmd2_from_kernel(k: torch.Tensor, m: int) -> float:
    """Unbiased MMD² (eq. 3) from a zero-diagonal joint kernel; rows ``:m`` are X."""
    n = k.shape[0] - m
    # float32 row sums (torch's cascade summation), then float64 across rows.
    s_xx = k[:m, :m].sum(1).double().sum()
    s_yy = k[m:, m:].sum(1).double().sum()
    s_xy = k[:m, m:].sum(1).double().sum()
    return float(s_xx / (m * (m - 1)) + s_yy / (n * (n - 1)) - 2.0 * s_xy / (m * n))


def _perm_stats(k: torch.Tensor, u: torch.Tensor, m: int) -> torch.Tensor:
    """MMD²_u for each row of the 0/1 indicator matrix ``u`` ``[P, N]`` (``m`` ones per row)."""
    n = k.shape[0] - m
    rowsum = k.sum(1).double()
    total = rowsum.sum()
    q = ((u @ k).double() * u.double()).sum(1)  # uᵀKu
    r = u.double() @ rowsum  # uᵀK1
    s_xx, s_xy, s_yy = q, r - q, total - 2.0 * r + q
    return s_xx / (m * (m - 1)) + s_yy / (n * (n - 1)) - 2.0 * s_xy / (m * n)


def permutation_p_value(k: torch.Tensor, m: int, n_permutations: int, rng: np.random.Generator) -> float | None:
    """Permutation p-value of the MMD² whose joint zero-diagonal kernel is ``k`` (X = rows ``:m``).

    Returns ``None`` when ``n_permutations`` is 0.
    """
    if n_permutations <= 0:
        return None
    n_all = k.shape[0]
    ident = torch.zeros(1, n_all, dtype=k.dtype)
    ident[0, :m] = 1.0
    observed = float(_perm_stats(k, ident, m)[0])  # same arithmetic path as the permutations
    exceed = 0
    done = 0
    batch = max(1, _PERM_BLOCK // n_all)
    while done < n_permutations:
        b = min(batch, n_permutations - done)
        order = np.argsort(rng.random((b, n_all)), axis=1)[:, :m]
        u = torch.zeros(b, n_all, dtype=k.dtype)
        u.scatter_(1, torch.from_numpy(order), 1.0)
        exceed += int((_perm_stats(k, u, m) >= observed).sum())
        done += b
    return (1.0 + exceed) / (1.0 + n_permutations)


def mmd2_unbiased(
    real: torch.Tensor, synthetic: torch.Tensor, bandwidth: float, scales: Sequence[float] = (1.0,)
) -> float:
    """Unbiased MMD² (Gretton et al. 2012, eq. 3) with an RBF kernel (or a sum over ``scales``).

    Args:
        real: float32 ``[m, D]``, m ≥ 2.
        synthetic: float32 ``[n, D]``, n ≥ 2.
        bandwidth: σ > 0 (same units as the embeddings).
        scales: bandwidth multipliers; the kernel is the sum of the RBF kernels.

    Raises:
        ValidationError: if a set has fewer than 2 rows or ``bandwidth`` ≤ 0.
    """
    check_min_rows(real, 2, "real set", "MMD²")
    check_min_rows(synthetic, 2, "synthetic set", "MMD²")
    if not bandwidth > 0:
        raise ValidationError(f"MMD² bandwidth must be > 0, got {bandwidth}")
    z = torch.cat([real, synthetic]).float()
    return _mmd2_from_kernel(_kernel(_sq_dists(z), bandwidth, scales), real.shape[0])


def mmd_report(
    real: torch.Tensor,
    synthetic: torch.Tensor,
    *,
    n_permutations: int = 200,
    max_samples: int | None = 2000,
    bandwidth: float | None = None,
    seed: int | np.random.SeedSequence = 0,
) -> dict:
    """MMD² (single and multi-bandwidth RBF) with permutation p-values.

    Args:
        real: float32 ``[m, D]``, the real reference set (bandwidth is computed from it).
        synthetic: float32 ``[n, D]``.
        n_permutations: permutations for the p-values (0 disables them: p-values ``None``).
        max_samples: each set is subsampled (seeded) to at most this many rows.
        bandwidth: σ; ``None`` uses the median heuristic on ≤ 1000 real rows.
        seed: seed or ``SeedSequence`` for subsampling and permutations.

    Returns:
        ``{"mmd2", "mmd2_p_value", "mmd2_multi", "mmd2_multi_p_value", "mmd2_bandwidth",
        "mmd2_n_real", "mmd2_n_synthetic", "mmd2_permutations"}`` (floats; p-values may be None).

    Raises:
        ValidationError: fewer than 2 rows in a set, or a bad ``max_samples`` / bandwidth.
    """
    if max_samples is not None and max_samples < 2:
        raise ValidationError(f"max_samples must be ≥ 2, got {max_samples}")
    check_min_rows(real, 2, "real set", "MMD²")
    check_min_rows(synthetic, 2, "synthetic set", "MMD²")
    r_sub_x, r_sub_y, r_bw, r_perm1, r_perm2 = child_rngs(seed, 5)
    x = subsample(real, max_samples, r_sub_x)
    y = subsample(synthetic, max_samples, r_sub_y)
    bw = median_heuristic(x, r_bw) if bandwidth is None else float(bandwidth)
    if not bw > 0:
        raise ValidationError(f"MMD² bandwidth must be > 0, got {bw}")
    m = x.shape[0]
    d2 = _sq_dists(torch.cat([x, y]).float())
    out: dict = {}
    for key, scales, rng in (("mmd2", (1.0,), r_perm1), ("mmd2_multi", MULTI_SCALES, r_perm2)):
        k = _kernel(d2, bw, scales)
        out[key] = _mmd2_from_kernel(k, m)
        out[f"{key}_p_value"] = permutation_p_value(k, m, n_permutations, rng)
        del k
    out.update(
        mmd2_bandwidth=bw,
        mmd2_n_real=int(m),
        mmd2_n_synthetic=int(y.shape[0]),
        mmd2_permutations=int(max(n_permutations, 0)),
    )
    return out
