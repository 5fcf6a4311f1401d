"""Hyper-prototypes where they are meant to help: global anchors for a client's own local training.

FedHPro (Wang et al., ICML 2026, arXiv 2605.13475) gives clients global class anchors — the
hyper-prototypes — and each client trains on its own real data with

    L = CE + λ_con · L_con(f, y; P, m_i) + λ_cons · L_cons(f, y; P)

(contrastive pull towards the class's hyper-prototypes and away from the other classes', τ = 0.05,
with the client-specific margin m_i, the mean cosine similarity of the client's own class means;
plus a consistency penalty towards the class's hyper-prototype mean: :mod:`.losses`,
:func:`.training.train_epochs`). Here the global model and anchors come from the DP synthetic
store — a :class:`~fedhype.prototypes.classifier.HyperPrototypeClassifier` trained on it, which
is post-processing of DP output and costs no privacy — and client i fine-tunes a copy on its
real local training records (:func:`fit_local`). Variants (:data:`VARIANTS`):

* ``alone`` — the same client training alone: a fresh network with its own random orthonormal
  anchors, the same objective, on its real records only;
* ``synthetic_init`` — the synthetic-trained network fine-tuned with cross-entropy only (no anchor
  term): separates what the starting point gives from what the anchors give;
* ``hyper`` — the synthetic-trained network and its prototypes as fixed anchors (trained with
  ``matching="none"``, the classifier's default: the anchors the synthetic features were shaped to);
* ``hyper_matched`` — the same with prototypes learned by gradient matching on the synthetic store
  (``matching="synthetic"``, dataset-condensation style: :mod:`.matching`);
* ``class_means`` — FedProto-style prototype averaging (Tan et al., AAAI 2022), the global
  prototypes being the class means of the synthetic embeddings' features under the
  synthetic-trained network (one per class): CE + λ_proto · ‖f̂ − ĉ_y‖² (the consistency term with
  L = 1, :func:`~fedhype.prototypes.losses.consistency_loss`), predicted with the linear head and
  the nearest-prototype head together (``head="both"``);
* ``<variant>+synthetic`` (for ``synthetic_init``, ``hyper``, ``class_means``) — the same, trained on
  the client's real records together with the whole synthetic store (unweighted): local training on
  real records alone forgets the classes a client lacks, which the global model knew (ours).

The DP-SGD FedAvg linear reference (:mod:`.dp_linear`) has its own ε and is added beside these
rows by the callers (``benchmarks/downstream.py``). Ours (docs/method.md decision 7): every network
is the adapter on frozen embeddings (:mod:`.network`), anchors are fixed during local training,
the synthetic store stands in for FedHPro's server-side gradient matching on client gradients.

Measured (``benchmarks/downstream.py``, 3 seeds, mean over clients; ``benchmarks/results/downstream.md``):
validation accuracy on the clients' own splits / on the union of their validation splits, at ε = 1 and ε = 8
of the generator (its DP synthetic store; the variants are post-processing of it):

=========================  =================================  =================================
variant                    digits (4 domains) ε = 1 / ε = 8   Fashion-MNIST (10 Dirichlet) 1 / 8
=========================  =================================  =================================
alone                      0.890 / 0.520 · 0.890 / 0.520      0.888 / 0.419 · 0.888 / 0.419
synthetic_init             0.873 / 0.577 · 0.876 / 0.689      0.875 / 0.493 · 0.893 / 0.553
hyper                      0.888 / 0.589 · 0.883 / 0.692      0.882 / 0.473 · 0.893 / 0.544
hyper_matched              0.873 / 0.583 · 0.883 / 0.694      0.881 / 0.492 · 0.888 / 0.536
class_means                0.888 / 0.579 · 0.894 / 0.684      0.890 / 0.446 · 0.895 / 0.524
hyper+synthetic            0.884 / 0.652 · 0.878 / 0.810      0.874 / 0.608 · 0.862 / 0.749
class_means+synthetic      0.887 / 0.655 · 0.896 / 0.822      0.878 / 0.615 · 0.866 / 0.754
=========================  =================================  =================================

* The global model from the synthetic store is what helps on the union (the classes and domains a
  client lacks): ``synthetic_init`` alone takes the union from 0.52 to 0.58–0.69 (digits, ε = 1–8) and
  from 0.42 to 0.49–0.55 (Fashion). The hyper-prototype anchors add 0.00–0.015 to it on the clients' own
  splits and 0.000–0.012 on the digits union; on the Fashion-MNIST union, whose clients lack classes,
  they cost 0.01–0.02 (the contrastive pull towards the client's own classes' anchors crowds out the
  absent ones).
* Gradient matching (``hyper_matched``) is within noise of the fixed anchors: −0.008 to +0.019 on the
  union, 0 to −0.015 on the own splits. It stays off by default, as in :mod:`.classifier`.
* FedProto-style class means keep the own-split accuracy of the client alone (−0.002 to +0.011), and with the
  synthetic records (``class_means+synthetic``) are the best variant on the union at every ε on both
  datasets, ahead of ``hyper+synthetic`` by 0.002–0.015 — the default of :func:`anchored_classifier`.
  Training with the synthetic records costs up to 0.01 on the digits clients' own splits and 0.01–0.03
  on the Fashion-MNIST ones.
* On the test splits ``class_means+synthetic`` is level with the linear probe trained on the same data
  (:func:`fedhype.eval.client_downstream.client_downstream`, ``local_synthetic``) on Fashion-MNIST
  (+0.001 to +0.010 on the union) and 0.02–0.05 above it on the digits union; the probe is 0.006–0.014
  above it on the digits clients' own splits.

Privacy: the synthetic-trained model and its anchors are post-processing of DP output; client i's
real records are used only by client i for its own classifier, and the figures (held-out real
records) are for the data holder's eyes: not covered by DP.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.eval.client_downstream import client_items, union_store
from fedhype.eval.inputs import check_compatible, labels_of
from fedhype.eval.interpolation import ClientSplits
from fedhype.eval.utility import METRICS, classification_metrics
from fedhype.prototypes.classifier import HyperPrototypeClassifier
from fedhype.prototypes.inputs import as_features, as_labels
from fedhype.prototypes.training import torch_threads, train_epochs

#: variants of the per-client comparison; a "+synthetic" variant also trains on the synthetic store
VARIANTS = ("alone", "synthetic_init", "hyper", "hyper_matched", "class_means", "synthetic_init+synthetic",
            "hyper+synthetic", "class_means+synthetic")
WITH_SYNTHETIC = "+synthetic"
#: the defaults of :func:`anchored_classifier`: the variant best on the union of the clients' validation splits
#: at every ε on both datasets (benchmarks/results/downstream.md; module docstring)
DEFAULT_ANCHORS = "class_means"
DEFAULT_WITH_SYNTHETIC = True
ANCHORS = ("hyper", "hyper_matched", "class_means", "none")


def synthetic_model(synthetic: EmbeddingStore, *, matching: str = "none", seed: int = 0,
                    **params: Any) -> HyperPrototypeClassifier:
    """The global model: a :class:`HyperPrototypeClassifier` fit on the synthetic store over all K classes.

    Args:
        synthetic: the DP synthetic store (float32 ``[N, D]``, labels int64 ``[N]``).
        matching: ``"none"`` (fixed orthonormal anchors) or ``"synthetic"`` (gradient matching on the
            synthetic store); both are free (post-processing). ``"dp"`` is refused (it reads real records).
        seed: the classifier's seed.
        **params: other :class:`HyperPrototypeClassifier` parameters.

    Raises:
        ValidationError: an empty store, ``matching`` not in ``("none", "synthetic")``, bad parameters.
    """
    if matching not in ("none", "synthetic"):
        raise ValidationError(f"the global model learns from the synthetic store only: matching must be 'none' or "
                              f"'synthetic', got {matching!r}")
    if len(synthetic) == 0:
        raise ValidationError("the synthetic store is empty")
    return HyperPrototypeClassifier(**{"seed": seed, **params, "matching": matching}).fit(
        synthetic.embeddings, synthetic.labels.numpy(), classes=np.arange(synthetic.n_classes))


def class_mean_anchors(model: HyperPrototypeClassifier, x: Any, y: Any) -> torch.Tensor:
    """FedProto-style global prototypes: the normalised class means of ``model``'s features of ``(x, y)``.

    Args:
        model: a fitted classifier (its adapter defines the feature space).
        x: float ``[N, D]`` (the synthetic embeddings); y: int labels ``[N]`` from ``model.classes_``.

    Returns:
        float32 ``[K, 1, d]`` unit vectors; a class without a record keeps the normalised mean of
        ``model``'s own prototypes for it.
    """
    f = torch.as_tensor(model.transform(x))
    yt = model._encode(as_labels(y, f.shape[0], "y"))
    out = F.normalize(model.prototypes_.mean(1), dim=1).clone()
    for c in torch.unique(yt).tolist():
        out[c] = F.normalize(f[yt == c].mean(0), dim=0)
    return out.unsqueeze(1)


def fit_local(x: Any, y: Any, n_classes: int, *, start: HyperPrototypeClassifier | None = None,
              anchors: torch.Tensor | None = None, lambda_contrastive: float = 0.3,
              lambda_consistency: float = 0.3, margin: bool = True, epochs: int = 30, lr: float = 1e-3,
              batch_size: int = 64, seed: int = 0) -> HyperPrototypeClassifier:
    """Client i's own classifier, trained on its real records with fixed anchors.

    Args:
        x: float ``[n, D]`` the client's real training embeddings; y: int labels ``[n]`` in ``[0, K)``.
        n_classes: K (the classifier outputs all K classes, also those the client lacks).
        start: the global model to fine-tune (a copy; ``start`` is not changed), or ``None`` for a
            fresh network with its own random orthonormal anchors (the client alone).
        anchors: float ``[K, L, d]`` fixed anchors (default: ``start``'s prototypes).
        lambda_contrastive, lambda_consistency, margin: the client objective (:class:`~fedhype.prototypes.training.Objective`).
        epochs, lr, batch_size: Adam schedule of the local training.
        seed: initialisation (``start=None``) and shuffling.

    Returns:
        a fitted :class:`HyperPrototypeClassifier` (``classes_ = 0 … K−1``; ``prototypes_`` = the anchors).

    Raises:
        ValidationError: bad ``x`` / ``y``, labels outside ``[0, K)``, D or K unlike ``start``'s,
            anchors not ``[K, L, d]``, ``anchors`` without ``start``.
    """
    xt = as_features(x, "x")
    yl = as_labels(y, xt.shape[0], "y")
    if yl.min() < 0 or yl.max() >= n_classes:
        raise ValidationError(f"y holds labels outside [0, {n_classes})")
    params = dict(lambda_contrastive=lambda_contrastive, lambda_consistency=lambda_consistency, margin=margin,
                  epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
    if start is None:
        if anchors is not None:
            raise ValidationError("anchors need the global model they live with (start=)")
        return HyperPrototypeClassifier(**params).fit(xt, yl, classes=np.arange(n_classes))
    if start.n_features_in_ != xt.shape[1] or len(start.classes_) != n_classes:
        raise ValidationError(f"the global model has D = {start.n_features_in_} and K = {len(start.classes_)}; "
                              f"x has D = {xt.shape[1]}, n_classes = {n_classes}")
    p = start.prototypes_ if anchors is None else torch.as_tensor(anchors, dtype=torch.float32)
    if p.ndim != 3 or p.shape[0] != n_classes or p.shape[2] != start.prototypes_.shape[2]:
        raise ValidationError(f"anchors must be [K={n_classes}, L, d={start.prototypes_.shape[2]}], got {tuple(p.shape)}")
    clf = copy.deepcopy(start)
    clf.set_params(**params, n_prototypes=int(p.shape[1]))
    clf._check_params()
    with torch_threads(clf.n_threads):
        net = clf.net_.train()
        opt = torch.optim.Adam(net.parameters(), lr=float(lr))
        gen = torch.Generator().manual_seed(int(seed))
        stats = train_epochs(net, p, xt, clf._encode(yl), clf.objective(), opt, epochs=int(epochs),
                             batch_size=int(batch_size), generator=gen)
    clf.net_, clf.prototypes_ = net.eval(), p.detach().clone()
    clf.history_ = list(start.history_) + [{"local": True, **stats}]
    return clf


def anchored_classifier(synthetic: EmbeddingStore, x: Any, y: Any, *, anchors: str = DEFAULT_ANCHORS,
                        with_synthetic: bool = DEFAULT_WITH_SYNTHETIC, seed: int = 0,
                        **local: Any) -> HyperPrototypeClassifier:
    """One client's classifier on its real records ``(x, y)`` with anchors from the synthetic store.

    Args:
        synthetic: the DP synthetic store (the global model and the anchors are learned from it).
        x: float ``[n, D]`` the client's real training embeddings; y: int labels ``[n]`` in ``[0, K)``.
        anchors: ``"hyper"`` (the synthetic-trained prototypes), ``"hyper_matched"`` (learned by
            gradient matching on the synthetic store), ``"class_means"`` (FedProto-style class means,
            λ_con = 0 and λ_cons = 1 unless given) or ``"none"`` (the client alone, no global model).
        with_synthetic: train on the client's records together with the synthetic store.
        seed: seed of the networks and shuffles.
        **local: further :func:`fit_local` arguments (objective, schedule).

    Raises:
        ValidationError: an unknown ``anchors``, and as :func:`fit_local`.
    """
    if anchors not in ANCHORS:
        raise ValidationError(f"anchors must be one of {list(ANCHORS)}, got {anchors!r}")
    k = synthetic.n_classes
    xt, yl = as_features(x, "x"), as_labels(y, len(x), "y")
    if xt.shape[1] != synthetic.dim:
        raise ValidationError(f"x has {xt.shape[1]} features, the synthetic store {synthetic.dim}")
    if with_synthetic:
        xt, yl = torch.cat([xt, synthetic.embeddings]), np.concatenate([yl, synthetic.labels.numpy()])
    if anchors == "none":
        return fit_local(xt, yl, k, seed=seed, **local)
    model = synthetic_model(synthetic, matching="synthetic" if anchors == "hyper_matched" else "none", seed=seed)
    if anchors == "class_means":
        p = class_mean_anchors(model, synthetic.embeddings, synthetic.labels.numpy())
        return fit_local(xt, yl, k, start=model, anchors=p, seed=seed,
                         **{"lambda_contrastive": 0.0, "lambda_consistency": 1.0, **local})
    return fit_local(xt, yl, k, start=model, seed=seed, **local)


def _scores(clf: HyperPrototypeClassifier, sets: Mapping[str, tuple[torch.Tensor, np.ndarray]]) -> dict:
    return {where: classification_metrics(y, clf.predict(x)) for where, (x, y) in sets.items()}


def anchored_downstream(clients: Mapping[str, ClientSplits] | Sequence[ClientSplits], synthetic: EmbeddingStore, *,
                        variants: Sequence[str] = VARIANTS, epochs: int = 30, local_epochs: int = 30,
                        lambda_consistency: float = 0.3, lambda_proto: float = 1.0, seed: int = 0) -> dict:
    """Per client, its own classifier on its real records under each of ``variants`` (module docstring).

    Args:
        clients: per-client real ``ClientSplits`` (train / val / test stores; float32 ``[n, D]``,
            labels int64 in ``[0, K)``; the synthetic store's D and classes); each split ≥ 1 record.
        synthetic: the DP synthetic store.
        variants: a subset of :data:`VARIANTS`.
        epochs: epochs of the global models on the synthetic store.
        local_epochs: epochs of each client's local training.
        lambda_consistency: λ_cons of ``alone``, ``hyper`` and ``hyper_matched`` (λ_con = 0.3, margin on).
        lambda_proto: λ of the ``class_means`` regulariser (λ_con = 0).
        seed: seed of every network and shuffle.

    Returns:
        ``{"variants", "clients": {name: {variant: {"own", "union", "val", "union_val": {metric}}}},
        "mean": {variant: {"own" | "union" | "val" | "union_val": {metric}}}, "global": {"hyper" |
        "hyper_matched": {"union", "union_val"} (the synthetic-trained models themselves)},
        "private": False, "note"}``. ``own``/``val``: the client's own test/validation split;
        ``union``/``union_val``: all clients' test/validation splits. Choose on the ``val`` keys.

    Raises:
        ValidationError: no clients, an unknown variant, an empty split, stores whose D or classes
            differ from the synthetic store's.
    """
    items = client_items(clients)
    if not items:
        raise ValidationError("the anchored downstream protocol needs at least one client")
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ValidationError(f"variants must be a non-empty subset of {list(VARIANTS)}, got {list(variants)}")
    if len(synthetic) == 0:
        raise ValidationError("the synthetic store is empty")
    for name, c in items:
        for split in ("train", "val", "test"):
            check_compatible(getattr(c, split), synthetic, f"client {name} {split} store", "synthetic store")
            if len(getattr(c, split)) == 0:
                raise ValidationError(f"client {name}: the {split} split is empty")
    k = synthetic.n_classes
    union = {"union": union_store({n: c.test for n, c in items}), "union_val": union_store({n: c.val for n, c in items})}
    union = {w: (s.embeddings, labels_of(s)) for w, s in union.items()}
    bases = {v.removesuffix(WITH_SYNTHETIC) for v in variants}
    need = {"hyper": {"synthetic_init", "hyper", "class_means"}, "hyper_matched": {"hyper_matched"}}
    models = {m: synthetic_model(synthetic, matching="synthetic" if m == "hyper_matched" else "none", seed=seed,
                                 epochs=epochs) for m, uses in need.items() if uses & bases}
    means = (class_mean_anchors(models["hyper"], synthetic.embeddings, synthetic.labels.numpy())
             if "class_means" in bases else None)
    hyper_obj = dict(lambda_contrastive=0.3, lambda_consistency=lambda_consistency)
    setups = {"alone": dict(start=None, **hyper_obj),
              "synthetic_init": dict(start=models.get("hyper"), lambda_contrastive=0.0, lambda_consistency=0.0),
              "hyper": dict(start=models.get("hyper"), **hyper_obj),
              "hyper_matched": dict(start=models.get("hyper_matched"), **hyper_obj),
              "class_means": dict(start=models.get("hyper"), anchors=means, lambda_contrastive=0.0,
                                  lambda_consistency=lambda_proto)}
    x_syn, y_syn = synthetic.embeddings, labels_of(synthetic)
    per: dict[str, dict] = {}
    for name, c in items:
        sets = {"own": (c.test.embeddings, labels_of(c.test)), "val": (c.val.embeddings, labels_of(c.val)), **union}
        local = (c.train.embeddings, labels_of(c.train))
        both = (torch.cat([local[0], x_syn]), np.concatenate([local[1], y_syn]))
        per[name] = {v: _scores(fit_local(*(both if v.endswith(WITH_SYNTHETIC) else local), k, epochs=local_epochs,
                                          seed=seed, **setups[v.removesuffix(WITH_SYNTHETIC)]), sets)
                     for v in variants}
    mean = {v: {w: {m: float(np.mean([per[n][v][w][m] for n in per])) for m in METRICS}
                for w in ("own", "union", "val", "union_val")} for v in variants}
    glob = {m: _scores(model, union) for m, model in models.items()}
    return {"variants": list(variants), "clients": per, "mean": mean, "global": glob, "epochs": epochs,
            "local_epochs": local_epochs, "lambda_consistency": lambda_consistency, "lambda_proto": lambda_proto,
            "private": False,
            "note": "evaluation on held-out real records, for the data holder's eyes: not covered by DP"}


__all__ = ["ANCHORS", "DEFAULT_ANCHORS", "DEFAULT_WITH_SYNTHETIC", "VARIANTS", "anchored_classifier", "anchored_downstream", "class_mean_anchors",
           "fit_local", "synthetic_model"]
