"""The client objective of FedHPro on adapter features: contrastive loss with a client margin, consistency.

Source: Wang et al., "FedHPro" (ICML 2026, arXiv 2605.13475) and its official code
(``Local.calculate_infonce`` / ``calculate_infonce_batch`` / ``compute_margin`` / ``local_train``).
A client minimises

    L = CE(W f + b, y) + λ_con · L_con(f, y; P, m_i) + λ_cons · L_cons(f, y; P)

where ``f`` ∈ R^d is the adapter output of one embedding, ``W, b`` the linear head, and
``P`` ∈ R^{K×L×d} the hyper-prototypes (L per class, K classes), held fixed during client steps.

Notation used by every function here: ``f̂ = f / ‖f‖``, ``P̂_{k,l} = P_{k,l} / ‖P_{k,l}‖``,
``c̄_k = (1/L) Σ_l P̂_{k,l}`` (the mean of the class's unit prototypes, *not* renormalised) and the
class similarity ``s_k(f) = f̂ · c̄_k = (1/L) Σ_l cos(f, P_{k,l})`` (official code: the mean cosine
over the class's prototypes).

Where we depart from the official code (our design, docs/method.md decision 7):

* the margin ``m_i`` is subtracted from the positive *logit* (an additive margin of m_i nats, i.e.
  a CosFace-style cosine margin τ·m_i: Wang et al. 2018, Eq. 4) instead of being added to the
  softmax denominator: with τ = 0.05 the denominator holds terms up to e^{20}, so adding m ≤ 1
  there changes nothing. A margin of m_i in cosine units instead (up to 0.99/τ ≈ 20 nats) swamped
  the loss at initialisation, when all class means are alike (measured: m_i ≈ 0.99);
* ``m_i`` is the mean pairwise *cosine* similarity of the client's class means (the official code
  sums raw dot products and divides by (K − 1)²), clamped to [0, 0.99];
* consistency is the squared L2 distance ``‖f̂ − ĉ_y‖²`` (official: smooth-L1 between the same
  two unit vectors), ``ĉ_y`` = the normalised mean of class y's prototypes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedhype.errors import ValidationError

_EPS = 1e-12


def class_anchors(prototypes: torch.Tensor) -> torch.Tensor:
    """``c̄_k = (1/L) Σ_l P̂_{k,l}``: float ``[K, d]`` from prototypes ``[K, L, d]`` (not renormalised)."""
    if prototypes.ndim != 3:
        raise ValidationError(f"prototypes must be [K, L, d], got shape {tuple(prototypes.shape)}")
    return F.normalize(prototypes, dim=2, eps=_EPS).mean(dim=1)


def class_similarities(features: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """``s_{b,k} = f̂_b · c̄_k``: mean cosine of each feature to each class's prototypes.

    Args:
        features: float ``[B, d]`` adapter outputs.
        prototypes: float ``[K, L, d]``.

    Returns:
        float ``[B, K]`` in [−1, 1].
    """
    return F.normalize(features, dim=1, eps=_EPS) @ class_anchors(prototypes).T


def client_margin(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Client-specific margin ``m_i``: mean pairwise cosine similarity of the client's class means.

    ``μ_c = mean_{b: y_b = c} f̂_b`` over the classes present at the client (K_i of them), and

        m_i = clamp( (1 / (K_i (K_i − 1))) Σ_{a ≠ b} cos(μ_a, μ_b), 0, 0.99 )

    (FedHPro ``compute_margin``: a client whose classes look alike gets a larger margin).
    It is a statistic of the client's data and is only used inside that client's own loss.

    Args:
        features: float ``[N, d]`` adapter outputs of the client's records.
        labels: int64 ``[N]``.

    Returns:
        scalar float tensor (0 when fewer than two classes are present); no gradient.
    """
    with torch.no_grad():
        f = F.normalize(features, dim=1, eps=_EPS)
        classes = torch.unique(labels)
        if classes.numel() < 2:
            return torch.zeros((), dtype=f.dtype, device=f.device)
        means = torch.stack([f[labels == c].mean(0) for c in classes])
        means = F.normalize(means, dim=1, eps=_EPS)
        gram = means @ means.T
        k = classes.numel()
        off = (gram.sum() - gram.diagonal().sum()) / (k * (k - 1))
        return off.clamp(0.0, 0.99)


def contrastive_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
                     temperature: float = 0.05, margin: float | torch.Tensor = 0.0,
                     reduction: str = "mean") -> torch.Tensor:
    """Hyper-prototype contrastive loss with an additive margin on the positive class.

        L_con(f, y) = −log [ e^{s_y/τ − m} / ( e^{s_y/τ − m} + Σ_{k ≠ y} e^{s_k/τ} ) ]

    with ``s_k`` the mean cosine of ``f`` to class k's prototypes (module docstring), τ the
    temperature (FedHPro: 0.05) and ``m`` the client margin (:func:`client_margin`). It pulls
    ``f`` towards its class's prototypes and pushes it from the other classes'.

    Args:
        features: float ``[B, d]``; labels: int64 ``[B]`` in ``[0, K)``; prototypes: ``[K, L, d]``.
        temperature: τ > 0.
        margin: m in logit units (nats; float or scalar tensor, no gradient expected).
        reduction: ``"mean"`` (over the batch) or ``"none"`` (float ``[B]``).
    """
    if temperature <= 0:
        raise ValidationError(f"temperature must be > 0, got {temperature}")
    logits = class_similarities(features, prototypes) / temperature
    logits = logits - margin * F.one_hot(labels, logits.shape[1]).to(logits.dtype)
    return F.cross_entropy(logits, labels, reduction=reduction)


def consistency_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
                     reduction: str = "mean") -> torch.Tensor:
    """Consistency penalty pulling each feature to its class's hyper-prototype mean.

        L_cons(f, y) = ‖ f̂ − ĉ_y ‖²₂,   ĉ_y = normalise( (1/L) Σ_l P_{y,l} )

    (FedHPro ``loss_hpal``, squared L2 instead of smooth-L1). Equals ``2 − 2 cos(f, ĉ_y)``.

    Args:
        features: float ``[B, d]``; labels: int64 ``[B]``; prototypes: ``[K, L, d]``.
        reduction: ``"mean"`` or ``"none"`` (float ``[B]``).
    """
    target = F.normalize(prototypes.mean(dim=1), dim=1, eps=_EPS)[labels]
    out = (F.normalize(features, dim=1, eps=_EPS) - target).pow(2).sum(1)
    return out.mean() if reduction == "mean" else out
