"""Class-wise gradients of a client's real records under record-level DP (one ledger event per call).

The mechanism (DP-SGD's clip-and-noise, Abadi et al. 2016, Alg. 1, applied to class-wise sums):

1. a Poisson batch: each of the client's n records independently with probability q;
2. per-example gradients ``g_j = ∂CE(W f_j + b, y_j)/∂(W, b)`` of the linear head at the current
   (public) model, with ``torch.func`` (:func:`fedhype.privacy.dp_step.per_example_grads`);
3. each ``g_j`` clipped to L2 norm ≤ C jointly over W and b, then summed *per class*:
   ``G_c = Σ_{j: y_j = c} clip_C(g_j)`` (:func:`fedhype.privacy.dp_step.clip_and_sum`);
4. ``G̃_c = G_c + N(0, σ²C² I)`` for *every* class c (also classes absent from the batch), divided by
   the expected batch size ``q·n`` (public: n is the client's public size; Opacus convention).

Privacy: a record enters exactly one class sum, so the concatenation ``(G_1, …, G_K)`` has L2
sensitivity C under adding/removing one record; noising every coordinate with std σC is one
Poisson-subsampled Gaussian mechanism with noise multiplier σ and rate q, recorded in the ledger as
``LedgerEvent(mechanism="hyperprototype-dp-gradient", noise_multiplier=σ, sample_rate=q, steps=1,
clip_norm=C)``. Everything computed from ``G̃`` afterwards (prototype matching) is post-processing.
No per-class count is released or used: the matching distance is scale invariant.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fedhype.errors import ValidationError
from fedhype.privacy.dp_step import clip_and_sum, gaussian_noise_like, per_example_grads, poisson_batch
from fedhype.privacy.ledger import LedgerEvent, PrivacyLedger

MECHANISM = "hyperprototype-dp-gradient"


def _example_loss(params: dict[str, torch.Tensor], f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = f @ params["weight"].T + params["bias"]
    return F.cross_entropy(logits.unsqueeze(0), y.unsqueeze(0))


def dp_class_gradients(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *,
                       noise_multiplier: float, clip_norm: float, sample_rate: float, generator: torch.Generator,
                       ledger: PrivacyLedger, client: str, round: int = -1) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """One DP release of class-wise head gradients on a client's records (module docstring).

    Args:
        features: float ``[n, d]``: adapter outputs of the client's records under the current
            public model (computed on the client).
        labels: int64 ``[n]`` in ``[0, K)``.
        weight, bias: the current linear head, float ``[K, d]`` and ``[K]``.
        noise_multiplier: σ ≥ 0 (σ = 0 releases unnoised sums: ε = ∞ in the ledger).
        clip_norm: C > 0.
        sample_rate: Poisson rate q ∈ (0, 1].
        generator: the client's sampling and noise generator.
        ledger: where the event is recorded (before the release is returned).
        client: the client id used in the ledger.
        round: federated round or matching round number (−1: outside rounds).

    Returns:
        class → ``(G̃_W [K, d], G̃_b [K])`` for every class ``0 .. K−1``.

    Raises:
        ValidationError: C ≤ 0, σ < 0, q ∉ (0, 1], or an empty client.
    """
    n, k = int(features.shape[0]), int(weight.shape[0])
    if n == 0:
        raise ValidationError(f"client {client!r} has no records for the DP class gradients")
    if not clip_norm > 0:
        raise ValidationError(f"clip_norm C must be > 0, got {clip_norm}")
    if not noise_multiplier >= 0:
        raise ValidationError(f"noise_multiplier σ must be ≥ 0, got {noise_multiplier}")
    if not 0 < sample_rate <= 1:
        raise ValidationError(f"sample_rate q must be in (0, 1], got {sample_rate}")
    event = LedgerEvent(client=str(client), round=int(round), mechanism=MECHANISM,
                        noise_multiplier=float(noise_multiplier), sample_rate=float(sample_rate), steps=1,
                        clip_norm=float(clip_norm), note="class-wise linear-head gradients for hyper-prototype matching")
    idx = poisson_batch(n, sample_rate, generator)
    params = {"weight": weight.detach(), "bias": bias.detach()}
    f, y = features.detach()[idx], labels[idx]
    per_example = per_example_grads(_example_loss, params, (f, y)) if idx.numel() else None
    std = float(noise_multiplier) * float(clip_norm)
    denom = sample_rate * n
    out = {}
    for c in range(k):
        mask = y == c
        if per_example is not None and bool(mask.any()):
            summed, _ = clip_and_sum({name: g[mask] for name, g in per_example.items()}, clip_norm)
        else:
            summed = {name: torch.zeros_like(p) for name, p in params.items()}
        if std > 0:
            summed = {name: g + gaussian_noise_like(g, std, generator) for name, g in summed.items()}
        out[c] = (summed["weight"] / denom, summed["bias"] / denom)
    ledger.record(event)
    return out


def privacy_summary(matching: str, ledger: PrivacyLedger | None, noise_note: str) -> dict[str, Any]:
    """What the prototypes cost: ε per client recomputed by the accountant from the ledger's events."""
    if ledger is None:
        return {"dp_matching": False, "matching": matching, "epsilon": 0.0 if matching != "dp" else None,
                "note": "prototypes matched to the training data only (no client records touched)"}
    per = ledger.epsilons()
    worst = max(per.values()) if per else 0.0
    return {"dp_matching": True, "matching": matching, "epsilon": worst, "delta": ledger.delta, "accountant": "prv",
            "per_client": per, "events": len(ledger), "mechanism": MECHANISM, "noise_seed": noise_note}
