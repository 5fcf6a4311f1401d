"""Class-wise clipped and noised gradient sums of a client's records: one subsampled Gaussian mechanism.

DP-SGD's clip-and-noise (Abadi et al. 2016, "Deep Learning with Differential Privacy", Alg. 1)
applied to class-wise sums, as hyper-prototype matching needs them (:mod:`fedhype.prototypes.dp_gradients`):

1. a Poisson batch: each of the client's n records independently with probability q
   (:func:`fedhype.privacy.dp_step.poisson_batch`);
2. per-example gradients ``g_j = ∇_θ ℓ(θ; f_j, y_j)`` at the current (public) parameters θ, with
   ``torch.func`` (:func:`fedhype.privacy.dp_step.per_example_grads`);
3. each ``g_j`` clipped to L2 norm ≤ C jointly over all of θ, then summed *per class*:
   ``G_c = Σ_{j: y_j = c} clip_C(g_j)`` (:func:`fedhype.privacy.dp_step.clip_and_sum`);
4. ``G̃_c = G_c + N(0, σ²C² I)`` for *every* class c (also classes absent from the batch), divided by
   the expected batch size ``q·n`` (n is the client's public size; Opacus convention).

Sensitivity: a record enters exactly one class sum with a gradient of norm ≤ C, so the
concatenation ``(G_1, …, G_K)`` changes by at most C in L2 under adding or removing one record
(tested in ``tests/prototypes/test_dp_matching.py``): one Poisson-subsampled Gaussian step with
noise multiplier σ and rate q, charged as
:func:`fedhype.privacy.events.dp_sgd_events` ``(mechanism=PROTOTYPE_GRADIENT, steps=1)``.
"""

from __future__ import annotations

from typing import Callable

import torch

from fedhype.errors import ValidationError
from fedhype.privacy.dp_step import (_TOKEN, PrivatizedUpdate, clip_and_sum, gaussian_noise_like, per_example_grads,
                                     poisson_batch)


def check_arguments(client: str, n: int, *, noise_multiplier: float, clip_norm: float, sample_rate: float,
                    n_classes: int = 1) -> None:
    """Refuse arguments :func:`privatize_class_gradients` cannot run with (callers check before they charge).

    Raises:
        ValidationError: no records (n = 0), C ≤ 0, σ < 0, q ∉ (0, 1] or K < 1, naming the value.
    """
    if n == 0:
        raise ValidationError(f"client {client!r} has no records for the DP class gradients")
    if not clip_norm > 0:
        raise ValidationError(f"clip_norm C must be > 0, got {clip_norm}")
    if not noise_multiplier >= 0:
        raise ValidationError(f"noise_multiplier σ must be ≥ 0, got {noise_multiplier}")
    if not 0 < sample_rate <= 1:
        raise ValidationError(f"sample_rate q must be in (0, 1], got {sample_rate}")
    if int(n_classes) < 1:
        raise ValidationError(f"n_classes must be ≥ 1, got {n_classes}")


def privatize_class_gradients(client: str, loss_fn: Callable[..., torch.Tensor], params: dict[str, torch.Tensor],
                              features: torch.Tensor, labels: torch.Tensor, n_classes: int, *,
                              noise_multiplier: float, clip_norm: float, sample_rate: float,
                              generator: torch.Generator) -> PrivatizedUpdate:
    """The class-wise release of the module docstring, as the boundary type.

    Args:
        client: client id.
        loss_fn: ``loss_fn(params, f, y) -> scalar``, the loss of ONE example (f ``[d]``, y ``[]``).
        params: the current public parameters, name → float tensor (not trained here).
        features: float ``[n, d]``, the client's records (as the model sees them); labels: int64 ``[n]`` in ``[0, K)``.
        n_classes: K.
        noise_multiplier: σ ≥ 0 (σ = 0 releases unnoised sums: ε = ∞ in the ledger).
        clip_norm: C > 0. sample_rate: Poisson rate q ∈ (0, 1].
        generator: the client's sampling and noise generator (:func:`fedhype.privacy.randomness.noise_generator`).

    Returns:
        PrivatizedUpdate with, for each parameter name, float ``[K, *param.shape]``: row c is ``G̃_c / (q·n)``;
        ``steps = 1``, ``sample_rate = q``, ``clip_norm = C``, ``noise_multiplier = σ``.

    Raises:
        ValidationError: C ≤ 0, σ < 0, q ∉ (0, 1], K < 1, or an empty client.
    """
    n = int(features.shape[0])
    check_arguments(client, n, noise_multiplier=noise_multiplier, clip_norm=clip_norm, sample_rate=sample_rate,
                    n_classes=n_classes)
    idx = poisson_batch(n, sample_rate, generator)
    params = {k: v.detach() for k, v in params.items()}
    f, y = features.detach()[idx], labels[idx]
    per_example = per_example_grads(loss_fn, params, (f, y)) if idx.numel() else None
    std = float(noise_multiplier) * float(clip_norm)
    denom = sample_rate * n
    rows: dict[str, list[torch.Tensor]] = {name: [] for name in params}
    for c in range(int(n_classes)):
        mask = y == c
        if per_example is not None and bool(mask.any()):
            summed, _ = clip_and_sum({name: g[mask] for name, g in per_example.items()}, clip_norm)
        else:
            summed = {name: torch.zeros_like(p) for name, p in params.items()}
        if std > 0:
            summed = {name: g + gaussian_noise_like(g, std, generator) for name, g in summed.items()}
        for name, g in summed.items():
            rows[name].append(g / denom)
    return PrivatizedUpdate(_token=_TOKEN, client=str(client), tensors={k: torch.stack(v) for k, v in rows.items()},
                            steps=1, noise_multiplier=float(noise_multiplier), clip_norm=float(clip_norm),
                            sample_rate=float(sample_rate), private=True)
