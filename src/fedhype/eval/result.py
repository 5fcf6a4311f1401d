"""The typed result of an evaluation (:func:`fedhype.evaluate`): the headline figures plus every metric."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Evaluation:
    """Fidelity and utility of a synthetic set against held-out real embeddings.

    Attributes:
        tstr_accuracy: accuracy on the real test set of a linear probe trained on the synthetic set
            only (TSTR, Esteban et al. 2017; higher is better, in [0, 1]).
        trtr_accuracy: the same probe trained on the real training set (the real-data reference;
            None without ``real_train``).
        chance: the accuracy of the best constant guess: the share of the real test set's most frequent class
            (1 / K where the K classes are balanced), as the job's report gives it.
        mmd2: unbiased MMD² to the real test set (Gretton et al. 2012, eq. 3; Gaussian kernel,
            median-heuristic bandwidth; lower is better, ≈ 0 when the sets match).
        mmd2_p_value: permutation-test p-value of MMD² = 0 (None with 0 permutations).
        fd: Fréchet distance between Gaussian fits (Heusel et al. 2017, eq. 6; lower is better).
        precision, recall, density, coverage: PRDC with k neighbours (Naeem et al. 2020, eqs. 1–4):
            precision/density ≈ how many synthetic points fall on the real manifold, recall/coverage
            ≈ how much of the real manifold the synthetic set covers (in [0, 1], density can exceed 1).
        n_real, n_synthetic: rows compared.
        metrics: every figure :func:`fedhype.eval.evaluate` computed (JSON-able; per-domain TSTR,
            balanced accuracy, macro-F1, bandwidths, …).
    """

    tstr_accuracy: float
    trtr_accuracy: float | None
    chance: float
    mmd2: float
    mmd2_p_value: float | None
    fd: float
    precision: float
    recall: float
    density: float
    coverage: float
    n_real: int
    n_synthetic: int
    metrics: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_metrics(cls, metrics: dict[str, Any], n_classes: int, chance: float | None = None) -> "Evaluation":
        """Wrap the dict of :func:`fedhype.eval.evaluate` (``n_classes``: K of the stores; ``chance``: the real test
        set's majority-class share, 1 / K where not given)."""
        m = dict(metrics)
        return cls(tstr_accuracy=float(m["tstr_accuracy"]),
                   trtr_accuracy=None if m.get("trtr_accuracy") is None else float(m["trtr_accuracy"]),
                   chance=float(chance) if chance is not None else 1.0 / int(n_classes), mmd2=float(m["mmd2"]),
                   mmd2_p_value=None if m.get("mmd2_p_value") is None else float(m["mmd2_p_value"]),
                   fd=float(m["fd"]), precision=float(m["precision"]), recall=float(m["recall"]),
                   density=float(m["density"]), coverage=float(m["coverage"]), n_real=int(m["n_real"]),
                   n_synthetic=int(m["n_synthetic"]), metrics=m)

    def to_dict(self) -> dict[str, Any]:
        """Every metric as a JSON-able dict (the ``metrics`` plus ``chance``)."""
        return {**self.metrics, "chance": self.chance}

    def __str__(self) -> str:
        ref = f"real-data TRTR {self.trtr_accuracy:.3f}, " if self.trtr_accuracy is not None else ""
        return (f"TSTR accuracy {self.tstr_accuracy:.3f} ({ref}chance {self.chance:.3f}); MMD² {self.mmd2:.4f}; "
                f"FD {self.fd:.3f}; precision {self.precision:.2f}, recall {self.recall:.2f}, "
                f"density {self.density:.2f}, coverage {self.coverage:.2f} ({self.n_synthetic} synthetic vs "
                f"{self.n_real} real)")
