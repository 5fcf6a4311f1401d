"""Downstream utility: train-on-synthetic / test-on-real (TSTR) and train-on-real (TRTR).

TSTR (Esteban, Hyland & Rätsch 2017, "Real-valued (medical) time series generation with recurrent
conditional GANs", §4) trains a classifier on synthetic embeddings and tests it on held-out real
ones; TRTR trains the same classifier on real training embeddings and tests on the same held-out
set, the reference TSTR is read against.

The classifier ("probe") is scikit-learn's ``Pipeline(StandardScaler, LogisticRegression)``: L2
regularised multinomial logistic regression (lbfgs, ``max_iter=1000``; binary logistic for two
classes). The scaler is fit on that probe's own training set only. Classes absent from a training
set are handled: :meth:`Probe.predict_proba` returns columns for *all* classes (zeros for absent
ones); with a single class present the probe predicts it with probability 1.

Metrics (``sklearn.metrics``): accuracy, balanced accuracy (mean per-class recall over the
classes present in ``y_true``), macro-F1 (unweighted mean of per-class F1 over the classes present
in ``y_true``; ``zero_division=0``). Reported pooled and per domain (client) of the real test set.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.eval.inputs import as_matrix, labels_of, present_domains

METRICS = ("accuracy", "balanced_accuracy", "macro_f1")


class Probe(ClassifierMixin, BaseEstimator):
    """A linear probe over ``n_classes`` classes (a scikit-learn classifier: ``fit`` / ``predict``).

    Args:
        n_classes: total number of classes (columns of :meth:`predict_proba`).
        max_iter: lbfgs iterations.
        C: inverse L2 strength of the logistic regression.
        seed: ``random_state`` of the logistic regression.
    """

    def __init__(self, n_classes: int, max_iter: int = 1000, C: float = 1.0, seed: int = 0):
        self.n_classes = int(n_classes)
        self.max_iter = max_iter
        self.C = C
        self.seed = seed

    def fit(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> "Probe":
        """Fit on float ``x`` ``[N, D]`` and int labels ``y`` ``[N]`` in ``[0, n_classes)``.

        ``sample_weight`` (float ``[N]``, ≥ 0, not all 0; default all 1) weights every record in both
        the scaler's mean/variance and the logistic loss (scikit-learn's ``sample_weight``).

        Raises:
            ValidationError: if ``x`` is empty, labels fall outside ``[0, n_classes)``, or
                ``sample_weight`` has the wrong shape, a negative or non-finite entry, or sums to 0.
        """
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)
        if x.shape[0] == 0:
            raise ValidationError("cannot train a classifier on an empty set")
        if y.min() < 0 or y.max() >= self.n_classes:
            raise ValidationError(f"labels outside [0, {self.n_classes})")
        fit_params = {}
        if sample_weight is not None:
            w = np.asarray(sample_weight, dtype=np.float64)
            if w.shape != y.shape:
                raise ValidationError(f"sample_weight must have shape {y.shape} (one weight per record), got {w.shape}")
            if not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
                raise ValidationError("sample_weight must be finite, ≥ 0 and not all 0")
            fit_params = {"standardscaler__sample_weight": w, "logisticregression__sample_weight": w}
        self.classes_ = np.unique(y)
        self.converged_ = True
        if len(self.classes_) == 1:
            self.model_ = None
            return self
        self.model_ = make_pipeline(
            StandardScaler(), LogisticRegression(C=self.C, max_iter=self.max_iter, random_state=self.seed)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            self.model_.fit(x, y, **fit_params)
        self.converged_ = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
        return self

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities float64 ``[N, n_classes]`` (columns of absent classes are 0)."""
        x = np.asarray(x, dtype=np.float64)
        out = np.zeros((x.shape[0], self.n_classes))
        if self.model_ is None:
            out[:, self.classes_[0]] = 1.0
        else:
            out[:, self.classes_] = self.model_.predict_proba(x)
        return out

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted class index int64 ``[N]``."""
        return self.predict_proba(x).argmax(1)


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Accuracy, balanced accuracy and macro-F1 over the classes present in ``y_true``."""
    present = np.unique(y_true)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # y_pred with classes absent from y_true
        return {
            "accuracy": float(accuracy_score(y_true, y_pred)),
            "balanced_accuracy": float(balanced_accuracy_score(y_true, y_pred)),
            "macro_f1": float(f1_score(y_true, y_pred, labels=present, average="macro", zero_division=0)),
        }


def fit_probe(store: EmbeddingStore, space: str = "l2", seed: int = 0, max_iter: int = 1000) -> Probe:
    """A :class:`Probe` trained on ``store`` (embeddings in ``space``) over all its classes."""
    return Probe(store.n_classes, max_iter=max_iter, seed=seed).fit(as_matrix(store, space).numpy(), labels_of(store))


def _scores(probe: Probe, test: EmbeddingStore, space: str) -> tuple[dict, dict]:
    x, y = as_matrix(test, space).numpy(), labels_of(test)
    pred = probe.predict(x)
    pooled = classification_metrics(y, pred)
    dom = test.domains.numpy()
    per = {}
    for d in present_domains(test):
        sel = dom == d
        per[test.domain_names[d]] = {"n": int(sel.sum()), **classification_metrics(y[sel], pred[sel])}
    return pooled, per


def utility_report(
    real_test: EmbeddingStore,
    synthetic: EmbeddingStore,
    *,
    real_train: EmbeddingStore | None = None,
    space: str = "l2",
    per_domain: bool = True,
    seed: int = 0,
) -> dict:
    """TSTR (and TRTR when ``real_train`` is given) on the held-out ``real_test`` store.

    Args:
        real_test: held-out real embeddings (test set), with domains = clients.
        synthetic: synthetic embeddings (training set of the TSTR probe).
        real_train: real training embeddings (training set of the TRTR probe), or ``None``.
        space: evaluation space (:func:`fedhype.eval.inputs.as_matrix`).
        per_domain: also report metrics per domain of ``real_test``.
        seed: ``random_state`` of the probes.

    Returns:
        ``{"tstr_accuracy", "tstr_balanced_accuracy", "tstr_macro_f1", "trtr_accuracy",
        "trtr_balanced_accuracy", "trtr_macro_f1", "tstr_converged", "trtr_converged",
        "synthetic_missing_classes", "per_domain": {domain_name: {"n", "tstr_*", "trtr_*"}}}``;
        ``trtr_*`` are ``None`` without ``real_train``.
    """
    out: dict = {}
    per: dict[str, dict] = {}
    for prefix, train in (("tstr", synthetic), ("trtr", real_train)):
        if train is None:
            out.update({f"{prefix}_{m}": None for m in METRICS}, **{f"{prefix}_converged": None})
            continue
        probe = fit_probe(train, space, seed)
        pooled, dom = _scores(probe, real_test, space)
        out.update({f"{prefix}_{m}": v for m, v in pooled.items()}, **{f"{prefix}_converged": probe.converged_})
        for name, row in dom.items():
            entry = per.setdefault(name, {"n": row["n"]})
            entry.update({f"{prefix}_{m}": row[m] for m in METRICS})
    for entry in per.values():
        for m in METRICS:
            entry.setdefault(f"trtr_{m}", None)
    counts = synthetic.class_counts()
    out["synthetic_missing_classes"] = [c for c, n in zip(synthetic.class_names, counts) if n == 0]
    if per_domain:
        out["per_domain"] = per
    return out
