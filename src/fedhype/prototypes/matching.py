"""Gradient matching of hyper-prototypes to class-wise gradients (dataset condensation style).

Sources: Zhao, Mopuri & Bilen, "Dataset Condensation with Gradient Matching" (ICLR 2021), Eq. 8–10
and Alg. 1 (alternate a few matching steps on the synthetic set with model steps); FedHPro (Wang
et al., ICML 2026) applies it to a learnable set of L hyper-prototypes per class.

The classifier whose gradients are matched is the linear head ``z = W f + b`` (W float ``[K, d]``,
b float ``[K]``) on adapter features. For a set of features ``F`` ``[B, d]`` with labels ``y``, the
gradient of the mean cross-entropy w.r.t. the head is (closed form, softmax σ)

    ∂/∂W = (1/B) Σ_b (σ(z_b) − e_{y_b}) f_bᵀ,      ∂/∂b = (1/B) Σ_b (σ(z_b) − e_{y_b}).

For class c the prototypes ``P_c`` ``[L, d]`` (all labelled c) give ``g_P(c)`` and the class-c
data give the target ``g_D(c)``; the prototypes minimise

    D = Σ_c Σ_{layers ℓ ∈ {W, b}} ( 1 − cos( vec g_P(c)_ℓ , vec g_D(c)_ℓ ) )

with the **whole-vector** cosine (our design, docs/method.md decision 7). The official dataset
condensation code (``distance_wb``) instead sums ``1 − cos`` over the output rows of each weight
and skips biases; :func:`gradient_distance` offers it as ``form="per_row"`` for comparison only.
Cosine distances are invariant to a positive rescaling of the target, so a noised *sum* needs no
division by a (private) class count.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

from fedhype.errors import ValidationError

_EPS = 1e-12
FORMS = ("whole", "per_row")


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1) + _EPS)


def gradient_distance(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], form: str = "whole") -> torch.Tensor:
    """Gradient-matching distance between two lists of per-layer gradients.

    * ``"whole"`` (ours): ``Σ_ℓ (1 − cos(vec a_ℓ, vec b_ℓ))`` over every layer, biases included.
    * ``"per_row"`` (official DC ``distance_wb``): for a layer with ≥ 2 dims reshaped to
      ``[out, −1]``, ``Σ_rows (1 − cos(a_row, b_row))``; 1-D layers (biases) contribute 0.

    Args:
        a, b: equal-length sequences of tensors with matching shapes.
        form: ``"whole"`` or ``"per_row"``.

    Returns:
        scalar tensor (differentiable w.r.t. both inputs). Zero vectors have cosine 0.

    Raises:
        ValidationError: lengths or shapes differ, or unknown ``form``.
    """
    if form not in FORMS:
        raise ValidationError(f"form must be one of {FORMS}, got {form!r}")
    if len(a) != len(b):
        raise ValidationError(f"gradient lists differ in length: {len(a)} vs {len(b)}")
    total = torch.zeros((), dtype=a[0].dtype if len(a) else torch.float32)
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            raise ValidationError(f"layer {i}: gradient shapes differ {tuple(x.shape)} vs {tuple(y.shape)}")
        if form == "whole":
            total = total + 1 - _cos(x.reshape(-1), y.reshape(-1))
        elif x.ndim >= 2:
            total = total + (1 - _cos(x.reshape(x.shape[0], -1), y.reshape(y.shape[0], -1))).sum()
    return total


def head_gradients(weight: torch.Tensor, bias: torch.Tensor, features: torch.Tensor,
                   labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(∂CE/∂W [K, d], ∂CE/∂b [K])`` of the mean cross-entropy of ``W f + b`` (closed form above).

    Differentiable w.r.t. ``features`` (used to move the prototypes) and the head.

    Args:
        weight: float ``[K, d]``; bias: float ``[K]``; features: float ``[B, d]`` (B ≥ 1);
        labels: int64 ``[B]`` in ``[0, K)``.
    """
    err = torch.softmax(features @ weight.T + bias, dim=1) - F.one_hot(labels, weight.shape[0]).to(features.dtype)
    n = features.shape[0]
    return err.T @ features / n, err.sum(0) / n


Targets = Mapping[int, tuple[torch.Tensor, torch.Tensor]]


def matching_distance(prototypes: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: Targets,
                      form: str = "whole") -> torch.Tensor:
    """``D = Σ_{c ∈ targets} gradient_distance(g_P(c), g_D(c))`` (module docstring).

    The prototype gradients of all target classes are computed in one batch (same closed form
    as :func:`head_gradients`, per class).

    Args:
        prototypes: float ``[K, L, d]``; weight, bias: the head (treated as constants);
        targets: class → ``(g_W [K, d], g_b [K])`` target gradients (classes without one are skipped).
    """
    if not targets:
        return torch.zeros((), dtype=prototypes.dtype, device=prototypes.device)
    if form != "whole":
        total = torch.zeros((), dtype=prototypes.dtype, device=prototypes.device)
        for c, (tw, tb) in targets.items():
            labels = torch.full((prototypes.shape[1],), int(c), dtype=torch.long, device=prototypes.device)
            gw, gb = head_gradients(weight.detach(), bias.detach(), prototypes[int(c)], labels)
            total = total + gradient_distance([gw, gb], [tw, tb], form)
        return total
    cls = torch.tensor([int(c) for c in targets], dtype=torch.long, device=prototypes.device)
    p = prototypes[cls]                                                   # [C, L, d]
    k = weight.shape[0]
    err = torch.softmax(p @ weight.detach().T + bias.detach(), dim=2) - F.one_hot(cls, k).to(p.dtype)[:, None, :]
    gw = torch.einsum("clk,cld->ckd", err, p) / p.shape[1]                # [C, K, d]
    gb = err.mean(1)                                                      # [C, K]
    tw = torch.stack([targets[c][0] for c in targets]).to(p.dtype)
    tb = torch.stack([targets[c][1] for c in targets]).to(p.dtype)
    return (2 - _cos(gw.flatten(1), tw.flatten(1)) - _cos(gb, tb)).sum()


def class_gradients(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    max_per_class: int | None = 256, generator: torch.Generator | None = None) -> dict[int, tuple]:
    """Noise-free class-wise target gradients ``g_D(c)`` on (adapter) features of labelled data.

    For the free path only (synthetic embeddings: post-processing of DP outputs). For client real
    data use :func:`fedhype.prototypes.dp_gradients.dp_class_gradients`.

    Args:
        features: float ``[N, d]`` adapter outputs (no gradient needed); labels: int64 ``[N]``.
        weight, bias: the current head.
        max_per_class: at most this many records per class (uniform subsample, DC's ``batch_real``).
        generator: for the subsample.

    Returns:
        class → ``(g_W, g_b)`` for every class present in ``labels``.
    """
    out = {}
    with torch.no_grad():
        for c in torch.unique(labels).tolist():
            idx = (labels == c).nonzero().flatten()
            if max_per_class is not None and idx.numel() > max_per_class:
                idx = idx[torch.randperm(idx.numel(), generator=generator)[:max_per_class]]
            out[int(c)] = head_gradients(weight, bias, features[idx], labels[idx])
    return out


def match_prototypes(prototypes: torch.Tensor, optimizer: torch.optim.Optimizer, weight: torch.Tensor,
                     bias: torch.Tensor, targets: Targets, steps: int, form: str = "whole") -> tuple[float, float]:
    """Run ``steps`` optimiser steps on ``prototypes`` (a leaf with ``requires_grad``) minimising D.

    Returns:
        ``(D before, D after)`` as floats (0.0, 0.0 when ``targets`` is empty).
    """
    if not targets:
        return 0.0, 0.0
    before = None
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        d = matching_distance(prototypes, weight, bias, targets, form)
        if before is None:
            before = float(d.detach())
        d.backward()
        optimizer.step()
    with torch.no_grad():
        after = float(matching_distance(prototypes, weight, bias, targets, form))
    return (after if before is None else before), after
