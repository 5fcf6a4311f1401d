"""Membership-inference attacks on synthetic embeddings (used by ``fedhype audit``).

The attacker sees the synthetic set and a query record x, and guesses whether x was a training
record (member) of the generator. A higher score means "member". Two attacks:

* **DOMIAS** (van Breugel, Sun, Qian & van der Schaar, "Membership Inference Attacks against
  Synthetic Data through Overfitting Detection", AISTATS 2023, §3): score(x) =
  p_synthetic(x) / p_reference(x), the density ratio of the synthetic set to a reference set of
  real records from the same distribution that were *not* used in training. We use log densities
  (same ranking). Densities are Gaussian kernel density estimates (``sklearn.neighbors.
  KernelDensity``) in a reduced space: embeddings are projected by PCA fit on the reference set
  only (≤ ``pca_dims`` = 32 components, whitened: unit variance per component on the reference
  set), because KDE in hundreds of dimensions is dominated by the nearest point. The bandwidth
  is Scott's rule ``h = n^{-1/(d+4)}`` for unit variances (Scott 1992, "Multivariate Density
  Estimation"; ``KernelDensity(bandwidth="scott")``), n the size of the set the KDE is fit on.
* **DCR** — distance to closest record (e.g. Yale et al. 2020; Stadler, Oprisanu & Troncoso,
  USENIX Security 2022): score(x) = −min_j ‖x − s_j‖ over synthetic records s_j, in the
  evaluation space.

Metrics with members labelled 1 and non-members 0: AUROC (``sklearn.metrics.roc_auc_score``),
TPR at 1 % FPR (from ``roc_curve``: the largest TPR at FPR ≤ 0.01; Carlini et al., "Membership
Inference Attacks From First Principles", IEEE S&P 2022), and a 95 % percentile bootstrap interval
of the AUROC (members and non-members resampled with replacement separately, seeded).
The reference set must be disjoint from members and non-members (not checked here: the caller
builds the splits).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from scipy.stats import rankdata
from sklearn.decomposition import PCA
from sklearn.metrics import roc_auc_score, roc_curve
from sklearn.neighbors import KernelDensity

from fedhype.errors import ValidationError
from fedhype.eval.inputs import ArrayLike, as_matrix, check_min_rows, child_rngs

ATTACKS = ("domias", "dcr")


def _finite(s: np.ndarray) -> np.ndarray:
    """Replace ±inf by values just beyond the finite range (keeps the ranking; NaN → lowest)."""
    s = np.asarray(s, dtype=np.float64).copy()
    fin = np.isfinite(s)
    lo, hi = (s[fin].min(), s[fin].max()) if fin.any() else (0.0, 0.0)
    s[np.isposinf(s)] = hi + 1.0
    s[~np.isfinite(s)] = lo - 1.0
    return s


def dcr_scores(synthetic: torch.Tensor, queries: torch.Tensor, chunk_size: int = 4096) -> np.ndarray:
    """DCR score −min_j ‖q − s_j‖ for each query; float64 ``[Q]``.

    Args:
        synthetic: float32 ``[M, D]``; queries: float32 ``[Q, D]``.
        chunk_size: query rows per distance block (memory ``chunk_size × M``).
    """
    check_min_rows(synthetic, 1, "synthetic set", "the DCR attack")
    out = np.empty(queries.shape[0])
    for s in range(0, queries.shape[0], chunk_size):
        d = torch.cdist(queries[s : s + chunk_size].double(), synthetic.double())
        out[s : s + chunk_size] = -d.min(1).values.numpy()
    return out


def domias_scores(
    synthetic: torch.Tensor, reference: torch.Tensor, queries: torch.Tensor, *, pca_dims: int = 32, seed: int = 0
) -> np.ndarray:
    """DOMIAS log density ratio log p_synthetic(q) − log p_reference(q); float64 ``[Q]``.

    Args:
        synthetic: float32 ``[M, D]``; reference: float32 ``[R, D]``; queries: float32 ``[Q, D]``.
        pca_dims: maximum PCA components (fit on ``reference``; also capped at D and R − 1).
        seed: ``random_state`` of the PCA solver.

    Raises:
        ValidationError: if the synthetic or reference set has fewer than 3 rows.
    """
    check_min_rows(synthetic, 3, "synthetic set", "the DOMIAS attack")
    check_min_rows(reference, 3, "reference set", "the DOMIAS attack")
    n_comp = int(min(pca_dims, reference.shape[1], reference.shape[0] - 1))
    pca = PCA(n_components=n_comp, whiten=True, random_state=seed).fit(reference.double().numpy())
    z_ref, z_syn, z_q = (pca.transform(t.double().numpy()) for t in (reference, synthetic, queries))
    kde_syn = KernelDensity(kernel="gaussian", bandwidth="scott").fit(z_syn)
    kde_ref = KernelDensity(kernel="gaussian", bandwidth="scott").fit(z_ref)
    return kde_syn.score_samples(z_q) - kde_ref.score_samples(z_q)


def tpr_at_fpr(y: np.ndarray, scores: np.ndarray, fpr: float = 0.01) -> float:
    """Largest TPR over ROC points with FPR ≤ ``fpr``."""
    f, t, _ = roc_curve(y, scores)
    return float(t[f <= fpr].max())


def _auroc_rows(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """AUROC of each row pair via the Mann–Whitney U statistic (mid-ranks for ties).

    ``AUROC = (Σ ranks of positives − n₁(n₁+1)/2) / (n₁ n₀)`` — identical to ``roc_auc_score``,
    vectorised over bootstrap rows. ``pos`` ``[B, n₁]``, ``neg`` ``[B, n₀]``; returns ``[B]``.
    """
    n1, n0 = pos.shape[1], neg.shape[1]
    ranks = rankdata(np.concatenate([pos, neg], axis=1), axis=1)
    return (ranks[:, :n1].sum(1) - n1 * (n1 + 1) / 2.0) / (n1 * n0)


def attack_metrics(
    member_scores: np.ndarray, non_member_scores: np.ndarray, *, n_bootstrap: int = 200, rng: np.random.Generator
) -> dict:
    """AUROC, TPR at 1 % FPR and a 95 % bootstrap interval of the AUROC.

    Returns:
        ``{"auroc", "auroc_ci": [lo, hi] or None, "tpr_at_1pct_fpr", "n_bootstrap"}``.
    """
    a, b = _finite(member_scores), _finite(non_member_scores)
    y = np.r_[np.ones(len(a)), np.zeros(len(b))]
    s = np.r_[a, b]
    out = {"auroc": float(roc_auc_score(y, s)), "tpr_at_1pct_fpr": tpr_at_fpr(y, s, 0.01)}
    ci = None
    if n_bootstrap > 0:
        ia = rng.integers(0, len(a), size=(n_bootstrap, len(a)))
        ib = rng.integers(0, len(b), size=(n_bootstrap, len(b)))
        boots = _auroc_rows(a[ia], b[ib])
        ci = [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]
    out.update(auroc_ci=ci, n_bootstrap=int(max(n_bootstrap, 0)))
    return out


def mia_report(
    synthetic: ArrayLike,
    members: ArrayLike,
    non_members: ArrayLike,
    reference: ArrayLike | None = None,
    *,
    space: str = "l2",
    attacks: Sequence[str] = ATTACKS,
    pca_dims: int = 32,
    n_bootstrap: int = 200,
    seed: int = 0,
) -> dict:
    """Membership-inference report of the DOMIAS and DCR attacks.

    Args:
        synthetic: the released synthetic embeddings ``[M, D]`` (store, tensor or array).
        members: training records of the generator ``[Q₁, D]``.
        non_members: held-out records from the same distribution ``[Q₀, D]``.
        reference: real records disjoint from both (needed by DOMIAS; ``None`` skips it).
        space: evaluation space, ``"l2"`` (default) or ``"raw"``.
        attacks: subset of ``("domias", "dcr")``.
        pca_dims: PCA components for DOMIAS.
        n_bootstrap: bootstrap resamples of the AUROC interval (0: no interval).
        seed: seed of the bootstrap and PCA.

    Returns:
        ``{"domias": {...} or None, "dcr": {...}, "n_synthetic", "n_members", "n_non_members",
        "n_reference", "space"}``; each attack entry is :func:`attack_metrics` output.

    Raises:
        ValidationError: unknown attack, empty member/non-member sets, dimensions that differ.
    """
    unknown = set(attacks) - set(ATTACKS)
    if unknown:
        raise ValidationError(f"unknown attacks {sorted(unknown)}; choose from {list(ATTACKS)}")
    syn = as_matrix(synthetic, space, "synthetic set")
    mem = as_matrix(members, space, "member set")
    non = as_matrix(non_members, space, "non-member set")
    ref = None if reference is None else as_matrix(reference, space, "reference set")
    check_min_rows(mem, 1, "member set", "membership inference")
    check_min_rows(non, 1, "non-member set", "membership inference")
    dims = {"synthetic": syn.shape[1], "members": mem.shape[1], "non_members": non.shape[1]}
    if ref is not None:
        dims["reference"] = ref.shape[1]
    if len(set(dims.values())) != 1:
        raise ValidationError(f"membership inference: embedding dimensions differ {dims}")
    rngs = dict(zip(ATTACKS, child_rngs(seed, len(ATTACKS))))
    queries = torch.cat([mem, non])
    q = mem.shape[0]
    out: dict = {"domias": None, "dcr": None}
    if "domias" in attacks and ref is not None:
        s = domias_scores(syn, ref, queries, pca_dims=pca_dims, seed=seed)
        out["domias"] = attack_metrics(s[:q], s[q:], n_bootstrap=n_bootstrap, rng=rngs["domias"])
    if "dcr" in attacks:
        s = dcr_scores(syn, queries)
        out["dcr"] = attack_metrics(s[:q], s[q:], n_bootstrap=n_bootstrap, rng=rngs["dcr"])
    out.update(
        n_synthetic=int(syn.shape[0]),
        n_members=int(q),
        n_non_members=int(non.shape[0]),
        n_reference=None if ref is None else int(ref.shape[0]),
        space=space,
    )
    return out
