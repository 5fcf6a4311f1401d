"""The downstream-classifier step of the run pipeline: hyper-prototypes beside a linear probe.

Both classifiers are trained on the same synthetic store and tested on held-out real embeddings
(TSTR, Esteban et al. 2017); with ``real_train`` both are also trained on real training embeddings
(TRTR, the reference). The linear probe is :class:`fedhype.eval.utility.Probe` (scikit-learn
StandardScaler + LogisticRegression on L2-normalised rows); the hyper-prototype classifier is
:class:`~fedhype.prototypes.classifier.HyperPrototypeClassifier` with its defaults
(``matching="none"``: fixed prototypes, the measured best; ``matching="synthetic"`` would also be
free, post-processing of the synthetic store). Metrics: accuracy,
balanced accuracy, macro-F1 (:func:`fedhype.eval.utility.classification_metrics`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedhype.data.store import EmbeddingStore
from fedhype.eval.inputs import as_matrix, check_compatible, present_domains
from fedhype.eval.utility import METRICS, classification_metrics, fit_probe
from fedhype.prototypes.classifier import HyperPrototypeClassifier


def _fit_pair(train: EmbeddingStore, seed: int, params: dict) -> tuple[HyperPrototypeClassifier, Any]:
    classes = np.arange(train.n_classes)
    clf = HyperPrototypeClassifier(**{"seed": seed, **params})
    clf.fit(train.embeddings, train.labels.numpy(), classes=classes)
    return clf, fit_probe(train, space="l2", seed=seed)


def prototypes_downstream(synthetic: EmbeddingStore, real_test: EmbeddingStore, *,
                          real_train: EmbeddingStore | None = None, seed: int = 0,
                          per_domain: bool = True, **params: Any) -> dict[str, Any]:
    """Hyper-prototype classifier vs linear probe, trained on ``synthetic``, tested on ``real_test``.

    Args:
        synthetic: synthetic embeddings (training set).
        real_test: held-out real embeddings (domains = clients for the per-domain metrics).
        real_train: real training embeddings: adds the ``*_trtr_*`` reference metrics.
        seed: seed of both classifiers.
        per_domain: also report accuracy per domain of ``real_test``.
        **params: overrides of :class:`HyperPrototypeClassifier` parameters.

    Returns:
        ``{"hyperproto_accuracy", "hyperproto_balanced_accuracy", "hyperproto_macro_f1",
        "linear_probe_accuracy", "linear_probe_balanced_accuracy", "linear_probe_macro_f1",
        "hyperproto_trtr_*", "linear_probe_trtr_*"`` (None without ``real_train``)``,
        "hyperproto_head", "hyperproto_epsilon_matching": 0.0, "n_train", "n_test", "seconds",
        "per_domain": {name: {"n", "hyperproto_accuracy", "linear_probe_accuracy"}}}``.

    Raises:
        ValidationError: stores of different dimension or class names.
    """
    t0 = time.perf_counter()
    check_compatible(real_test, synthetic, "real test store", "synthetic store")
    if real_train is not None:
        check_compatible(real_train, synthetic, "real train store", "synthetic store")
    x_test, y_test = real_test.embeddings, real_test.labels.numpy()
    out: dict[str, Any] = {}
    preds = {}
    for suffix, train in (("", synthetic), ("_trtr", real_train)):
        if train is None:
            out.update({f"{name}{suffix}_{m}": None for name in ("hyperproto", "linear_probe") for m in METRICS})
            continue
        clf, probe = _fit_pair(train, seed, params)
        pred = {"hyperproto": clf.predict(x_test), "linear_probe": probe.predict(as_matrix(real_test, "l2").numpy())}
        for name, p in pred.items():
            out.update({f"{name}{suffix}_{k}": v for k, v in classification_metrics(y_test, p).items()})
        if suffix == "":
            preds, out["hyperproto_head"] = pred, clf.head
    if per_domain:
        dom = real_test.domains.numpy()
        out["per_domain"] = {
            real_test.domain_names[d]: {"n": int((dom == d).sum()),
                                        **{f"{name}_accuracy": float((p[dom == d] == y_test[dom == d]).mean())
                                           for name, p in preds.items()}}
            for d in present_domains(real_test)}
    out.update(hyperproto_epsilon_matching=0.0, n_train=len(synthetic), n_test=len(real_test),
               seconds=time.perf_counter() - t0)
    return out
