"""One call that evaluates a synthetic store against held-out real embeddings.

Fidelity: MMD² (:mod:`fedhype.eval.mmd`), Fréchet distance (:mod:`fedhype.eval.frechet`),
precision/recall/density/coverage (:mod:`fedhype.eval.prdc`). Utility: TSTR and TRTR
(:mod:`fedhype.eval.utility`). All metrics see both sets in the same evaluation space
(:func:`fedhype.eval.inputs.as_matrix`).
"""

from __future__ import annotations

import numpy as np

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.eval.frechet import frechet_distance
from fedhype.eval.inputs import as_matrix, check_compatible, check_space, child_rngs, subsample
from fedhype.eval.mmd import mmd_report
from fedhype.eval.prdc import prdc
from fedhype.eval.utility import utility_report

#: Keys ``fedhype evaluate --json`` always prints.
HEADLINE_KEYS = (
    "mmd2",
    "mmd2_p_value",
    "fd",
    "precision",
    "recall",
    "density",
    "coverage",
    "tstr_accuracy",
    "trtr_accuracy",
)


def evaluate(
    real_test: EmbeddingStore,
    synthetic: EmbeddingStore,
    *,
    real_train: EmbeddingStore | None = None,
    space: str = "l2",
    n_permutations: int = 200,
    max_samples: int = 2000,
    k: int = 5,
    seed: int = 0,
    per_domain: bool = True,
    prdc_max_samples: int | None = 10_000,
) -> dict:
    """Fidelity and utility of ``synthetic`` against held-out ``real_test``.

    Args:
        real_test: held-out real embeddings (float32 ``[N, D]``, labels, domains = clients).
        synthetic: synthetic embeddings (float32 ``[M, D]``, same class names).
        real_train: real training embeddings for the TRTR reference classifier, or ``None``.
        space: ``"l2"`` (row-wise unit norm, default) or ``"raw"``.
        n_permutations: MMD² permutation-test permutations (0: no p-values).
        max_samples: MMD² subsamples each set (seeded) to at most this many rows.
        k: PRDC neighbourhood size.
        seed: seed of every random draw (subsamples, permutations, classifiers).
        per_domain: add TSTR/TRTR per domain of ``real_test`` under ``"per_domain"``.
        prdc_max_samples: PRDC subsamples each set to at most this many rows (``None``: all; the
            chunked computation never holds an N × M matrix, but costs O(N·M·D) time).

    Returns:
        A JSON-able dict with ``mmd2, mmd2_p_value, mmd2_multi, mmd2_multi_p_value,
        mmd2_bandwidth, mmd2_n_real, mmd2_n_synthetic, mmd2_permutations, fd, fd_mean_term,
        fd_warning, precision, recall, density, coverage, prdc_k, prdc_n_real, prdc_n_synthetic,
        tstr_accuracy, tstr_balanced_accuracy, tstr_macro_f1, trtr_* (None without real_train),
        tstr_converged, trtr_converged, synthetic_missing_classes, per_domain, n_real,
        n_synthetic, n_real_train, space, seed``.

    Raises:
        ValidationError: D or class names differ between stores, bad ``space`` / ``k`` /
            ``max_samples``, or a set too small for a metric (e.g. k ≥ N).
    """
    check_space(space)
    check_compatible(real_test, synthetic, "real test store", "synthetic store")
    if real_train is not None:
        check_compatible(real_train, synthetic, "real train store", "synthetic store")
    if max_samples < 2:
        raise ValidationError(f"max_samples must be ≥ 2, got {max_samples}")
    if n_permutations < 0:
        raise ValidationError(f"n_permutations must be ≥ 0, got {n_permutations}")
    if k < 1:
        raise ValidationError(f"k must be ≥ 1, got {k}")
    if prdc_max_samples is not None and prdc_max_samples <= k:
        raise ValidationError(f"prdc_max_samples must exceed k={k}, got {prdc_max_samples}")
    x = as_matrix(real_test, space, "real test store")
    y = as_matrix(synthetic, space, "synthetic store")
    ss_mmd, ss_prdc = np.random.SeedSequence(int(seed)).spawn(2)
    out: dict = {}
    out.update(mmd_report(x, y, n_permutations=n_permutations, max_samples=max_samples, seed=ss_mmd))
    out.update(frechet_distance(x, y))
    r_x, r_y = child_rngs(ss_prdc, 2)
    out.update(prdc(subsample(x, prdc_max_samples, r_x), subsample(y, prdc_max_samples, r_y), k=k))
    out.update(
        utility_report(real_test, synthetic, real_train=real_train, space=space, per_domain=per_domain, seed=seed)
    )
    out.update(
        n_real=len(real_test),
        n_synthetic=len(synthetic),
        n_real_train=None if real_train is None else len(real_train),
        space=space,
        seed=int(seed),
    )
    return out
