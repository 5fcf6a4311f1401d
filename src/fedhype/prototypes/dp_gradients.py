"""Class-wise gradients of a client's real records under record-level DP (one ledger event per call).

The mechanism is :func:`fedhype.privacy.class_gradients.privatize_class_gradients` (DP-SGD's
clip-and-noise, Abadi et al. 2016, Alg. 1, applied to class-wise sums of the linear head's
per-example cross-entropy gradients): a Poisson batch at rate q, per-example gradients clipped to
L2 norm ≤ C jointly over (W, b), summed per class, N(0, σ²C²) added to every class's sum, divided by
the expected batch size q·n. A record enters one class sum, so the release has sensitivity C: one
Poisson-subsampled Gaussian step, charged write-ahead as
a ledger event (mechanism ``"hyperprototype-dp-gradient"``, noise_multiplier σ, sample_rate q, steps 1,
clip_norm C; :func:`fedhype.privacy.events.dp_sgd_events`). Everything computed from the release
afterwards (prototype matching) is post-processing. No per-class count is released or used: the
matching distance is scale invariant.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fedhype.privacy.class_gradients import check_arguments, privatize_class_gradients
from fedhype.privacy.dp_step import PrivatizedUpdate
from fedhype.privacy.events import PROTOTYPE_GRADIENT as MECHANISM
from fedhype.privacy.events import dp_sgd_events
from fedhype.privacy.ledger import PrivacyLedger, charge


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
        ledger: where the event is recorded, write-ahead (before the records are touched).
        client: the client id used in the ledger.
        round: federated round or matching round number (−1: outside rounds).

    Returns:
        class → ``(G̃_W [K, d], G̃_b [K])`` for every class ``0 .. K−1``.

    Raises:
        ValidationError: C ≤ 0, σ < 0, q ∉ (0, 1], or an empty client (nothing is recorded then).
    """
    check_arguments(client, int(features.shape[0]), noise_multiplier=noise_multiplier, clip_norm=clip_norm,
                    sample_rate=sample_rate)  # before the charge: nothing is recorded for a refused call
    charge(ledger, dp_sgd_events(round, [(client, sample_rate, 1)], noise_multiplier, clip_norm, mechanism=MECHANISM,
                                 note="class-wise linear-head gradients for hyper-prototype matching"))
    update = privatize_class_gradients(str(client), _example_loss, {"weight": weight, "bias": bias}, features, labels,
                                       int(weight.shape[0]), noise_multiplier=noise_multiplier, clip_norm=clip_norm,
                                       sample_rate=sample_rate, generator=generator)
    return _by_class(update)


def _by_class(update: PrivatizedUpdate) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """class → ``(G̃_W, G̃_b)`` of a release; only the boundary type is accepted."""
    if type(update) is not PrivatizedUpdate:
        raise TypeError(f"class gradients must arrive as a PrivatizedUpdate, got {type(update).__name__}")
    w, b = update.tensors["weight"], update.tensors["bias"]
    return {c: (w[c], b[c]) for c in range(int(w.shape[0]))}


def privacy_summary(matching: str, ledger: PrivacyLedger | None, noise_note: str) -> dict[str, Any]:
    """What the prototypes cost: ε per client recomputed by the accountant from the ledger's events.

    Without DP matching this step touches no client record (``matching_epsilon`` 0) and ``epsilon`` is
    None: the model's guarantee is its training data's (a DP synthetic store's ε; none for real records),
    which the caller knows and this summary does not — an ε of 0 here had read as perfect privacy.
    """
    if ledger is None:
        return {"dp_matching": False, "matching": matching, "epsilon": None,
                "matching_epsilon": 0.0 if matching != "dp" else None,
                "note": "prototypes matched to the training data only (no client records touched by this step); "
                        "the model's ε is its training data's"}
    per = ledger.epsilons()
    worst = max(per.values()) if per else 0.0
    return {"dp_matching": True, "matching": matching, "epsilon": worst, "delta": ledger.delta, "accountant": "prv",
            "per_client": per, "events": len(ledger), "mechanism": MECHANISM, "noise_seed": noise_note}
