"""Precision, recall, density and coverage (PRDC) of synthetic against real embeddings.

Source: Naeem, Oh, Uh, Choi & Yoo, "Reliable Fidelity and Diversity Metrics for Generative
Models", ICML 2020 — precision/recall (eqs. 1–2, after Kynkäänniemi et al. 2019), density (eq. 3)
and coverage (eq. 4). With real X (N rows), fake Y (M rows), ``NND_k(·)`` the distance to the k-th
nearest *other* point of the same set, and ``B(c, r)`` the closed ball::

    precision = 1/M Σ_j 1[∃ i: Y_j ∈ B(X_i, NND_k(X_i))]
    recall    = 1/N Σ_i 1[∃ j: X_i ∈ B(Y_j, NND_k(Y_j))]
    density   = 1/(kM) Σ_j Σ_i 1[Y_j ∈ B(X_i, NND_k(X_i))]
    coverage  = 1/N Σ_i 1[∃ j: Y_j ∈ B(X_i, NND_k(X_i))]

(The authors' reference code uses a strict ``<``; we use the paper's closed ball ``≤``, which only
differs on exact ties and keeps duplicates inside each other's balls.)

Memory: distances are computed in row chunks with ``torch.cdist`` and only what the metrics need
is kept — the k-NN radii of each set, a per-fake "inside some real ball" count, a per-real
"inside some fake ball" flag and a per-real "nearest fake inside my ball" flag — so an
``N × M`` matrix never materialises. ``chunk_size`` rows × the other set are held at a time.
"""

from __future__ import annotations

import torch

from fedhype.errors import ValidationError

#: Default cap on the elements of one distance block (float32: 64 MB).
_BLOCK_ELEMS = 1 << 24


def _chunk(n_cols: int, chunk_size: int | None) -> int:
    return max(1, int(chunk_size) if chunk_size else _BLOCK_ELEMS // max(n_cols, 1))


def knn_radii(x: torch.Tensor, k: int, chunk_size: int | None = None) -> torch.Tensor:
    """Distance from each row of ``x`` ``[N, D]`` to its k-th nearest other row; float32 ``[N]``.

    Raises:
        ValidationError: if ``k`` < 1 or ``k`` ≥ N (a point has only N − 1 neighbours).
    """
    n = x.shape[0]
    if k < 1:
        raise ValidationError(f"PRDC: k must be ≥ 1 (--k, evaluate.k in a job), got {k}")
    if k >= n:
        raise ValidationError(
            f"PRDC: k={k} nearest neighbours need more than k samples per set, got N={n}; lower k (--k, evaluate.k in a job) or add samples"
        )
    step = _chunk(n, chunk_size)
    out = torch.empty(n, dtype=torch.float32)
    for s in range(0, n, step):
        d = torch.cdist(x[s : s + step], x)
        # k+1 smallest includes the point itself (distance ~0): the last one is the k-th other.
        out[s : s + step] = d.topk(k + 1, dim=1, largest=False).values[:, k]
    return out


def prdc(real: torch.Tensor, synthetic: torch.Tensor, k: int = 5, chunk_size: int | None = None) -> dict:
    """Precision, recall, density and coverage (Naeem et al. 2020, eqs. 1–4).

    Args:
        real: float32 ``[N, D]`` real embeddings.
        synthetic: float32 ``[M, D]`` synthetic embeddings.
        k: neighbourhood size (the paper recommends 5).
        chunk_size: rows per distance block (``None``: as many as fit in 2²⁴ elements).

    Returns:
        ``{"precision", "recall", "density", "coverage", "prdc_k", "prdc_n_real",
        "prdc_n_synthetic"}``; precision/recall/coverage in [0, 1], density ≥ 0 (≈ 1 when the sets
        come from one distribution).

    Raises:
        ValidationError: if k ≥ N or k ≥ M, k < 1, or the dimensions differ.
    """
    if real.ndim != 2 or synthetic.ndim != 2 or real.shape[1] != synthetic.shape[1]:
        raise ValidationError(
            f"PRDC: need [N, D] and [M, D] with equal D, got {tuple(real.shape)} and {tuple(synthetic.shape)}"
        )
    x, y = real.float(), synthetic.float()
    r_real = knn_radii(x, k, chunk_size)
    r_fake = knn_radii(y, k, chunk_size)
    n, m = x.shape[0], y.shape[0]
    inside_count = torch.zeros(m, dtype=torch.int64)  # per fake: # real balls containing it
    recalled = torch.zeros(n, dtype=torch.bool)  # per real: inside some fake ball
    nearest_fake = torch.full((n,), float("inf"))  # per real: distance to the closest fake
    step = _chunk(n, chunk_size)
    for s in range(0, m, step):
        d = torch.cdist(y[s : s + step], x)  # [c, N]
        inside_count[s : s + step] = (d <= r_real[None, :]).sum(1)
        recalled |= (d <= r_fake[s : s + step, None]).any(0)
        nearest_fake = torch.minimum(nearest_fake, d.min(0).values)
    return {
        "precision": float((inside_count > 0).double().mean()),
        "recall": float(recalled.double().mean()),
        "density": float(inside_count.double().sum() / (k * m)),
        "coverage": float((nearest_fake <= r_real).double().mean()),
        "prdc_k": int(k),
        "prdc_n_real": int(n),
        "prdc_n_synthetic": int(m),
    }
