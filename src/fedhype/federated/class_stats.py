"""DP class statistics before round 0: the model space and the decoder's class output bias.

Why (measured on the bundled digits domains, DINOv2-S embeddings): the class information of
frozen-encoder embeddings is small beside their common component — the mean embedding has norm
0.87 on the unit sphere while class means differ from it by 0.07–0.24 — and DP-SGD on the CVAE
alone did not recover it at ε ≤ 4 (TSTR at chance). Releasing the per-class sums and counts once
through the Gaussian mechanism (:func:`fedhype.privacy.dp_step.privatize_class_sums`) gives

* the model space x̃ = (x/‖x‖ − m)/s, centred on the DP mean m with s = √((1 − ‖m‖²)/D), so
  that coordinates have unit mean square (for unit vectors E‖x − μ‖² = 1 − ‖μ‖²);
* the initial class output bias ``dec.cb[k] = (m_k − m)/s`` from the DP class means m_k.

Both are post-processing of the clients' privatized statistics (method.md, decision 5: "DP
estimates paid for in the ledger"); the release is recorded in the ledger as one un-subsampled
Gaussian step per client (mechanism :data:`MECHANISM`, round −1) and composed with the DP-SGD
steps by the accountant.
"""

from __future__ import annotations

import math

import torch

from fedhype.privacy.dp_step import PrivatizedUpdate

MECHANISM = "dp-class-stats"
#: floor of the total variance 1 − ‖μ‖² used for the scale s (DINOv2-S digits: 0.24)
MIN_TOTAL_VARIANCE = 0.05


def aggregate_class_stats(updates: list[PrivatizedUpdate], noise_std: float = 0.0) -> dict[str, torch.Tensor]:
    """Pool the clients' privatized class sums/counts into the space and the class bias.

    Args:
        updates: one PrivatizedUpdate per client with ``class_sums`` float32 [K, D] and
            ``class_counts`` [K] (anything else raises TypeError/KeyError).
        noise_std: the std of the count noise per client; noisy class counts are floored at
            ``max(1, 2·noise_std·√n_clients)`` so a class with few records cannot blow its mean up
            (the class mean is then shrunk toward the global mean).

    Returns:
        ``space_mean`` [D], ``space_scale`` [] and ``class_bias`` [K, D] (model space), float32.
        s² = v/D with v = 1 − (‖m‖² − D·n_clients·std²/N²) clamped to [:data:`MIN_TOTAL_VARIANCE`, 1].
    """
    for u in updates:
        if type(u) is not PrivatizedUpdate:
            raise TypeError(f"class statistics must arrive as PrivatizedUpdate, got {type(u).__name__}")
    sums = sum(u.tensors["class_sums"] for u in updates)
    counts = sum(u.tensors["class_counts"] for u in updates)
    floor = max(1.0, 2.0 * noise_std * math.sqrt(len(updates)))
    total = counts.clamp_min(0).sum().clamp_min(floor)
    mean = sums.sum(0) / total
    dim = sums.shape[1]
    # total variance 1 − ‖μ‖²: ‖m‖² is debiased for the noise (each client adds N(0, std²) per
    # coordinate to the pooled sum: E‖m‖² = ‖μ‖² + D·n_clients·std²/N²) and the variance is kept
    # in [MIN_TOTAL_VARIANCE, 1], so a noisy mean of norm ≥ 1 (small sets at small ε) cannot
    # collapse the scale
    bias = dim * len(updates) * noise_std ** 2 / float(total) ** 2
    var = torch.clamp(1.0 - (mean.pow(2).sum() - bias), min=MIN_TOTAL_VARIANCE, max=1.0)
    scale = torch.sqrt(var / dim)
    class_means = mean + (sums - counts[:, None] * mean) / counts.clamp_min(floor)[:, None]
    return {"space_mean": mean, "space_scale": scale, "class_bias": (class_means - mean) / scale}


def apply_class_stats(hnet, stats: dict[str, torch.Tensor]) -> None:
    """Set the model space buffers and ``base.cb`` of a :class:`~fedhype.models.hypernet.HyperNetwork`."""
    with torch.no_grad():
        hnet.space_mean.copy_(stats["space_mean"])
        hnet.space_scale.copy_(stats["space_scale"])
        if "cb" in hnet.base:
            hnet.base["cb"].copy_(stats["class_bias"])


def run_class_stats_stage(clients, server, n_classes: int, dp, ledger, ledger_path, *, seeded: bool,
                          already, rerun) -> None:
    """Release every client's class statistics (write-ahead ledger first) and set the model(s).

    A federated server pools all clients (:func:`aggregate_class_stats`); a ``local-cvae`` server
    (one model per client, attribute ``servers``) sets each client's model from its own release.
    ``already``/``rerun`` are the engine's ledger helpers: a seeded rerun replays the same noise
    and is not charged again, an unseeded one is (fresh noise).
    """
    from fedhype.privacy.ledger import LedgerEvent

    if dp.enabled:
        for c in clients:
            e = LedgerEvent(client=c.id, round=-1, mechanism=MECHANISM, noise_multiplier=float(dp.noise_multiplier),
                            sample_rate=1.0, steps=1, clip_norm=math.sqrt(2.0), note="class sums and counts")
            if not (seeded and already(ledger, e)):
                ledger.record(e if not already(ledger, e) else rerun(e))
        ledger.save(ledger_path)
    updates = [c.release_class_stats(n_classes, dp) for c in clients]
    std = float(dp.noise_multiplier) * math.sqrt(2.0) if dp.enabled else 0.0
    parts = getattr(server, "servers", None)
    if parts is not None:
        for s, u in zip(parts, updates):
            apply_class_stats(s.hnet, aggregate_class_stats([u], std))
    else:
        apply_class_stats(server.hnet, aggregate_class_stats(updates, std))


def client_space(server, index: int):
    """The model space (m, s) client ``index`` trains in."""
    parts = getattr(server, "servers", None)
    return (parts[index] if parts is not None else server).hnet.space()


def class_stats_noise_multiplier(share: float, delta: float, plan: list[tuple[float, int]], *,
                                 target_epsilon: float | None = None, noise_multiplier: float | None = None) -> float:
    """σ₀ of the class-statistics release (one un-subsampled Gaussian step, Δ = √2).

    With a target ε: calibrated so the release alone costs ``share × target_epsilon`` (the DP-SGD σ
    is then calibrated on top, :func:`fedhype.privacy.accountant.calibrate_noise_plan` with the
    release as ``prefix``). With an explicit DP-SGD σ: calibrated to ``share ×`` the worst ε of the
    DP-SGD ``plan`` ``[(q_i, steps_i)]`` alone (σ₀ = 1 if that ε is infinite).
    Used by ``fedhype train`` (:func:`fedhype.federated.engine.plan_privacy`) and ``fedhype budget``.
    """
    from fedhype.privacy.accountant import calibrate_noise, epsilon

    if target_epsilon is not None:
        return calibrate_noise(share * target_epsilon, delta, 1.0, 1)
    eps_sgd = max(epsilon([(float(noise_multiplier), q, t)], delta) for q, t in plan)
    return calibrate_noise(share * eps_sgd, delta, 1.0, 1) if math.isfinite(eps_sgd) else 1.0
