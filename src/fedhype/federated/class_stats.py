"""DP statistics before round 0: the model space, the decoder's class output bias and its covariance.

Why (measured on the bundled digits domains, DINOv2-S embeddings): the class information of
frozen-encoder embeddings is small beside their common component — the mean embedding has norm
0.87 on the unit sphere while class means differ from it by 0.07–0.24 — and DP-SGD on the CVAE
alone did not recover it at ε ≤ 4 (TSTR at chance). Releasing the per-class sums and counts once
through the Gaussian mechanism (:func:`fedhype.privacy.dp_step.privatize_class_sums`) gives

* the model space x̃ = (x/‖x‖ − m)/s, centred on the DP mean m with s = √((1 − ‖m‖²)/D), so
  that coordinates have unit mean square (for unit vectors E‖x − μ‖² = 1 − ‖μ‖²);
* the initial class output bias ``dec.cb[k] = (m_k − m)/s`` from the DP class means m_k;
* with second moments (``model.second_moment``, the default): a low-rank-plus-isotropic estimate of
  the covariance (:func:`fedhype.federated.covariance.covariance_estimate`) that initialises the decoder's linear path, so the
  untrained model is the DP class-conditional Gaussian ``N(m_k, W Wᵀ + σ² I)`` (the
  ``dp-gaussian`` baseline samples it directly).

All are post-processing of the clients' privatized statistics (docs/method.md, decision 5: "no private
statistic outside the DP path"); the release is recorded in the ledger as one un-subsampled
Gaussian step per client (mechanism :data:`MECHANISM`, round −1) and composed with the DP-SGD
steps by the accountant.
"""

from __future__ import annotations

from collections.abc import Callable

import math
from pathlib import Path

import torch

from fedhype.errors import FedhypeError, ValidationError
from fedhype.federated.client_shrinkage import SHRINKAGE, ClipShift, shrinkage_mode
from fedhype.federated.covariance import MIN_TOTAL_VARIANCE, _gaussian, class_mean_snr, resolve_located_share
from fedhype.federated.pooling import pooled_class_means
from fedhype.federated.release_outputs import (_has_centre, is_partial, load_release_outputs, load_secure_outputs,
                                               save_release_outputs, save_secure_outputs)
from fedhype.models.config import CLIENT_SHRINKAGE, DEFAULT_RESIDUAL, POOLINGS
from fedhype.privacy.dp_step import PrivatizedUpdate
from fedhype.privacy.events import RELEASE as MECHANISM  # the one list of mechanism names
from fedhype.privacy.secure_agg import DistributedNoise, PrivatizedAggregate, secure_sum



def aggregate_class_stats(updates: "list[PrivatizedUpdate] | PrivatizedAggregate", noise_std: float = 0.0, *, sums_std: float | None = None,
                          second_moment_std: float = 0.0, max_rank: int | None = None, centring=None,
                          residual: str = DEFAULT_RESIDUAL, located_share: float = 0.0,
                          rescale: float = 1.0, pooling: str = "sum") -> dict[str, torch.Tensor]:
    """Pool the clients' privatized statistics into the model space, the class bias and the covariance.

    Args:
        updates: one PrivatizedUpdate per client with ``class_sums`` float32 [K, D], ``class_counts``
            [K] and optionally ``second_moment`` [D, D] (anything else raises TypeError/KeyError), or
            the one :class:`~fedhype.privacy.secure_agg.PrivatizedAggregate` of a run with secure
            aggregation (its sum carries ``noise_variance_factor`` × the variance of one σ₀ release
            instead of n_clients ×; every noise level below uses that factor).
        noise_std: the std of the count noise per client; noisy class counts are floored at
            ``max(1, 2·noise_std·√n_clients)`` so a class with few records cannot blow its mean up
            (the class mean is then shrunk toward the global mean).
        sums_std: the std of the noise on each entry of a client's class sums (default ``noise_std``,
            the legacy equal-weight release).
        second_moment_std: the std of the noise on each *off-diagonal* entry of a client's second
            moments (:meth:`fedhype.privacy.dp_step.ReleaseWeights.noise_std`).
        max_rank: the largest rank of the covariance factor (the model's latent size L).
        centring: the :class:`~fedhype.privacy.centring.Centring` (c, R) of a centred release (or a list,
            one per update): the updates hold statistics of ``y = clip_R(x − c)/R`` and are mapped back
            (:func:`_moments`).
        residual, located_share: where the variance the release cannot locate goes (:func:`fedhype.federated.covariance.covariance_estimate`);
            ``located_share = "auto"`` is resolved from these pooled moments (:func:`fedhype.federated.covariance.resolve_located_share`).
        rescale: the clip rescale g of a centred release (:func:`clip_rescale_factor`; 1 = none).
        pooling: ``model.pooling``, how the clients' class sums make the class means (:mod:`fedhype.federated.pooling`;
            the sum under secure aggregation, without DP noise and for one release). ``"random-effects"`` adds
            ``pooling_tau2`` [K] float64 (τ_k²) to the result.

    Returns:
        float32 tensors in model space: ``space_mean`` [D], ``space_scale`` [] and ``class_bias``
        [K, D]; s² = v/D with v = 1 − (‖m‖² − D·n_clients·std²/N²) clamped to
        [:data:`fedhype.federated.covariance.MIN_TOTAL_VARIANCE`, 1]. With second moments also ``cov_factor`` [D, r],
        ``residual_var`` [] and ``rank`` [] (int64): the covariance estimate
        ``cov_factor·cov_factorᵀ + residual_var·I`` (model space) of :func:`fedhype.federated.covariance.covariance_estimate`; and
        ``located_share`` [] (the share used) and ``class_mean_snr`` [] (F, :func:`fedhype.federated.covariance.class_mean_snr`), float64.
    """
    mo = _moments(updates, noise_std, sums_std=sums_std, second_moment_std=second_moment_std, centring=centring,
                  rescale=rescale, pooling=pooling)
    mean, scale, class_means = mo["mean"], torch.sqrt(mo["var"] / mo["mean"].shape[0]), mo["class_means"]
    out = {"space_mean": mean, "space_scale": scale, "class_bias": (class_means - mean) / scale}
    if pooling == "random-effects" and "pooling_tau2" in mo:
        out["pooling_tau2"] = mo["pooling_tau2"]
    if mo["cov"] is not None:
        share = resolve_located_share(located_share, mo, max_rank)
        factor, resid, rank = _gaussian(mo, max_rank, residual, share)
        out.update({"cov_factor": (factor / scale).to(torch.float32), "residual_var": (resid / scale ** 2).to(torch.float32),
                    "rank": torch.tensor(rank, dtype=torch.int64),
                    "located_share": torch.tensor(share, dtype=torch.float64),
                    "class_mean_snr": torch.tensor(class_mean_snr(mo), dtype=torch.float64)})
    return out


def _moments(updates: "list[PrivatizedUpdate] | PrivatizedAggregate", noise_std: float = 0.0, *,
             sums_std: float | None = None, second_moment_std: float = 0.0, centring=None,
             rescale: float = 1.0, pooling: str = "sum") -> dict:
    """The DP first and second moments of a release in unit-sphere units (:func:`aggregate_class_stats`).

    ``centring``: None (uncentred release), one :class:`~fedhype.privacy.centring.Centring` for every
    update, or a list of them, one per update (client centres, :func:`fedhype.privacy.centring.client_centrings`).
    Each update's statistics of ``y = clip_R(x − c)/R`` are mapped back to the unit sphere before they
    are pooled (:func:`_unit_sphere`). ``rescale`` g ≥ 1 (:func:`clip_rescale_factor`, ``model.clip_rescale``)
    maps them back with the radius g·R instead of R, undoing clipping's shrink toward the centre (the
    noise levels below scale with it).

    Returns ``mean`` [D], ``var`` [] (total variance, clamped), ``class_means`` [K, D] float32;
    ``counts`` [K] (floored at ``counts_floor``, twice the count noise std),
    ``sums_noise_var`` (noise variance per coordinate of the pooled sums: a float, or [K] float64 where ``pooling``
    weighted them — N_k² × the noise variance of class mean k, so that class mean k's is ``sums_noise_var/counts²``
    either way; ``pooling_tau2`` [K] with it),
    ``cov`` [D, D] float64 (total covariance M/N − m mᵀ, or None without second moments) and
    ``offdiag_var`` (noise variance of each of its off-diagonal entries).
    """
    if type(updates) is PrivatizedAggregate:
        noise_factor, updates = float(updates.noise_variance_factor), [updates]
    else:
        for u in updates:
            if type(u) is not PrivatizedUpdate:
                raise TypeError(f"class statistics must arrive as PrivatizedUpdate or PrivatizedAggregate, got {type(u).__name__}")
        noise_factor = 1.0  # independent releases: each adds one release's noise variance to the pooled sums
    cens = _per_release(centring, len(updates))
    sums_std = noise_std if sums_std is None else float(sums_std)
    # running sums over the releases, one client's float64 copy at a time: memory is flat in the number
    # of clients (benchmarks/clients_scaling.py), not one [D, D] float64 matrix per client
    sums = counts = m2_sum = None
    all_m2 = True
    for u, cen in zip(updates, cens):
        s_i, n_i, m2_i = _unit_sphere(u, cen, rescale)
        sums, counts = (s_i.clone(), n_i.clone()) if sums is None else (sums.add_(s_i), counts.add_(n_i))
        all_m2 = all_m2 and m2_i is not None
        if all_m2:
            m2_sum = m2_i.clone() if m2_sum is None else m2_sum.add_(m2_i)
        del s_i, n_i, m2_i
    if sums is None:
        raise ValidationError("no client release to pool: the class statistics need at least one client")
    radii = [1.0 if cen is None else float(cen.radius) * float(rescale) for cen in cens]
    n_noise = noise_factor * len(updates)  # pooled count noise variance in units of one release's
    # noise variance per coordinate of the pooled sums: R_i² × one release's, summed over the releases
    sums_noise_var = noise_factor * sums_std ** 2 * sum(r * r for r in radii)
    floor = max(1.0, 2.0 * noise_std * math.sqrt(n_noise))
    total = counts.clamp_min(0).sum().clamp_min(floor)
    mean = sums.sum(0) / total
    dim = sums.shape[1]
    # total variance 1 − ‖μ‖²: ‖m‖² is debiased for the noise (E‖m‖² = ‖μ‖² + D·(noise variance of a
    # coordinate of the pooled sum)/N²) and the variance is kept in [MIN_TOTAL_VARIANCE, 1], so a noisy
    # mean of norm ≥ 1 (small sets at small ε) cannot collapse the scale
    bias = dim * sums_noise_var / float(total) ** 2
    var = torch.clamp(1.0 - (mean.pow(2).sum() - bias), min=MIN_TOTAL_VARIANCE, max=1.0)
    class_counts = counts.clamp_min(floor)
    class_sums, class_noise_var, tau2 = sums, sums_noise_var, None
    if pooling not in POOLINGS:
        raise ValidationError(f"model.pooling must be one of {list(POOLINGS)}, got {pooling!r}")
    if pooling != "sum" and noise_factor == 1.0 and len(updates) > 1 and sums_std > 0:
        # per-client releases under DP: weighted class means (fedhype.federated.pooling), written back as class
        # sums N_k·μ̂_k with the noise variance N_k²·v_k, so that everything below reads them as before
        pool = pooled_class_means(lambda: ((*_unit_sphere(u, cen, rescale, second=False)[:2],
                                            1.0 if cen is None else float(cen.radius) * float(rescale))
                                           for u, cen in zip(updates, cens)), sums_std, pooling)
        ok = pool["pooled"] & (counts > 0)
        class_sums = torch.where(ok[:, None], counts[:, None] * pool["class_means"].nan_to_num(), sums)
        class_noise_var = torch.where(ok, counts ** 2 * pool["noise_var"].nan_to_num(),
                                      torch.full_like(counts, sums_noise_var))
        tau2 = pool["tau2"]
    class_means = mean + (class_sums - counts[:, None] * mean) / class_counts[:, None]
    out = {"mean": mean.to(torch.float32), "var": var.to(torch.float32), "class_means": class_means.to(torch.float32),
           "counts": class_counts.to(torch.float32), "sums_noise_var": class_noise_var, "cov": None, "offdiag_var": 0.0,
           "counts_floor": float(floor)}
    if tau2 is not None:
        out["pooling_tau2"] = tau2
    if all_m2 and m2_sum is not None:
        out["cov"] = m2_sum / float(total) - torch.outer(mean, mean)
        out["offdiag_var"] = noise_factor * float(second_moment_std) ** 2 * sum(r ** 4 for r in radii) / float(total) ** 2
    return out


def _per_release(centring, n: int) -> list:
    """The centring of each of ``n`` releases: ``centring`` repeated (None or one Centring) or its list as is.

    Raises:
        ValidationError: a list whose length is not ``n``.
    """
    cens = list(centring) if isinstance(centring, (list, tuple)) else [centring] * n
    if len(cens) != n:
        raise ValidationError(f"{len(cens)} centrings for {n} client releases")
    return cens


def _unit_sphere(update, centring, rescale: float = 1.0, second: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]:
    """One release's class sums [K, D], counts [K] and second moments [D, D] (or None) of the unit records, float64.

    A centred release holds the statistics of ``y = clip_R(x − c)/R``; with x = c + R·y (exact for the
    records inside the radius) they map back as Σx = n·c + R·Σy and Σxxᵀ = n·c cᵀ + R(c Σyᵀ + Σy cᵀ) + R²·Σyyᵀ
    (n and Σy the noisy totals over the classes). ``rescale`` g puts g·R in place of R (x ≈ c + g·R·y:
    :func:`clip_rescale_factor`). ``second=False`` skips the second moments (None: the class sums' passes of
    :func:`fedhype.federated.pooling.pooled_class_means`). Post-processing (:mod:`fedhype.privacy.centring`).
    """
    s = update.tensors["class_sums"].to(torch.float64)
    n = update.tensors["class_counts"].to(torch.float64)
    m2 = update.tensors["second_moment"].to(torch.float64) if second and "second_moment" in update.tensors else None
    if centring is None:
        return s, n, m2
    c, r = centring.centre.to(torch.float64), float(centring.radius) * float(rescale)
    sums = n[:, None] * c + r * s
    if m2 is not None:
        sy = s.sum(0)
        m2 = (r * r) * m2 + r * (torch.outer(c, sy) + torch.outer(sy, c)) + float(n.sum()) * torch.outer(c, c)
    return sums, n, m2


#: the largest clip rescale g (:func:`clip_rescale_factor`): a noisy trace must not inflate the statistics
MAX_CLIP_RESCALE = 2.0


def clip_rescale_factor(updates: "list[PrivatizedUpdate] | PrivatizedAggregate", centring) -> float:
    """The factor g ≥ 1 that undoes the clipping of a centred release, from the unit norms (ours).

    A centred release clips each record's deviation from its centre c to the radius R
    (:mod:`fedhype.privacy.centring`; ``κ = 0.8`` clips most records), so the moments mapped back with
    x = c + R·y (:func:`_unit_sphere`) describe records pulled toward c: their covariance has a smaller
    trace than the data's, and the class means lie nearer c. In D = 384 dimensions the deviations'
    norms concentrate, so clipping is close to one common shrink x − c ↦ f·(x − c). The records are
    unit vectors, so the mean of ‖x‖² is exactly 1; the g = 1/f that gives the mapped-back second
    moments that trace solves

        C·g² + 2B·g + (A − 1) = 0,  A = Σᵢ nᵢ‖cᵢ‖²/N,  B = Σᵢ Rᵢ cᵢᵀΣyᵢ/N,  C = Σᵢ Rᵢ² tr(Σyyᵀ)ᵢ/N

    over the releases i (their noisy counts nᵢ, class sums summed over classes Σyᵢ, second-moment
    traces; N = Σnᵢ). Clipping only shrinks, so g is kept in [1, :data:`MAX_CLIP_RESCALE`]; g = 1
    where nothing was clipped, without a centred release, or where the noisy C is not positive.
    Post-processing of DP outputs: no ε. g multiplies the noise on the class means too, which is why
    ``model.clip_rescale`` is an option (docs/method.md, decision 19).

    Args:
        updates: the clients' releases (PrivatizedUpdate list) or the secure aggregate.
        centring: None, one :class:`~fedhype.privacy.centring.Centring` or one per update.

    Returns:
        g (float).
    """
    ups = [updates] if type(updates) is PrivatizedAggregate else list(updates)
    cens = _per_release(centring, len(ups))
    if not ups or any(c is None for c in cens) or not all("second_moment" in u.tensors for u in ups):
        return 1.0
    a = b = c2 = total = 0.0
    for u, cen in zip(ups, cens):
        c, r = cen.centre.to(torch.float64), float(cen.radius)
        n = float(u.tensors["class_counts"].to(torch.float64).sum())
        sy = u.tensors["class_sums"].to(torch.float64).sum(0)
        a += n * float(c @ c)
        b += r * float(c @ sy)
        c2 += r * r * float(torch.diagonal(u.tensors["second_moment"].to(torch.float64)).sum())
        total += n
    if total <= 0 or c2 <= 0:
        return 1.0
    a, b, c2 = a / total, b / total, c2 / total
    disc = b * b - c2 * (a - 1.0)
    if disc <= 0:
        return 1.0
    return float(min(max((-b + math.sqrt(disc)) / c2, 1.0), MAX_CLIP_RESCALE))


assert tuple(SHRINKAGE) == CLIENT_SHRINKAGE


def apply_class_stats(hnet, stats: dict[str, torch.Tensor]) -> None:
    """Set the model space buffers and ``base.cb`` of a :class:`~fedhype.models.hypernet.HyperNetwork`.

    With a covariance estimate (``cov_factor``) and a decoder with a linear path (``dec.wl``), the
    untrained model is set to the DP class-conditional Gaussian: ``wl[:r] = cov_factorᵀ``,
    ``logsx = ½ log residual_var``, the MLP output layer and the prior heads zeroed (prior N(0, I)),
    so ``x̃ | y ~ N(cb[y], W Wᵀ + σ_x² I)`` before DP-SGD refines it.
    """
    with torch.no_grad():
        hnet.space_mean.copy_(stats["space_mean"])
        hnet.space_scale.copy_(stats["space_scale"])
        if "cb" in hnet.base:
            hnet.base["cb"].copy_(stats["class_bias"])
        if "wl" in hnet.base and "cov_factor" in stats:
            f = stats["cov_factor"]
            r = min(f.shape[1], hnet.base["wl"].shape[0])
            hnet.base["wl"].zero_()
            hnet.base["wl"][:r] = f[:, :r].T
            hnet.base["wo"].zero_()
            hnet.base["bo"].zero_()
            if "logsx" in hnet.base:
                hnet.base["logsx"].fill_(0.5 * math.log(float(stats["residual_var"])))
            for k in ("mu_w", "mu_b", "lv_w", "lv_b"):
                if k in hnet.heads:
                    hnet.heads[k].zero_()
            if hasattr(hnet, "anchor_cb"):  # the untrained model's class means, kept for synthesis
                hnet.anchor_cb.copy_(hnet.base["cb"])


def apply_client_stats(hnet, codes: torch.Tensor, updates: list[PrivatizedUpdate], dp, weights,
                       max_rank: int | None = None, centring=None, rescale: float = 1.0) -> dict[str, float]:
    """Set the client-statistics heads of ``hnet`` so that h(c_i) is client i's own DP Gaussian.

    After :func:`apply_class_stats` has set the base to the pooled statistics, client i's own release
    (``pooled_stats([u_i])``, its class means, covariance factor and residual variance, mapped into
    the pooled model space) gives target offsets y_i = (cb_i − cb, W_i − W, log σ_i − log σ) of the
    generated ``dec.cb`` [K, D], ``dec.wl`` [L, D] and ``dec.logsx`` [D]. The heads are linear in the
    code, offset = W_cs·c, so the minimum-norm W_cs = Y C⁺ (C = [c_1 … c_m], Y = [y_1 … y_m],
    Moore–Penrose) reproduces every client exactly while the codes are linearly independent (random
    codes of dimension ≥ m are, almost surely). Client i's model then samples
    x̃ | y ~ N(cb_i[y], W_i W_iᵀ + σ_i² I), the mixture over clients is the mixture of the clients'
    DP Gaussians, and the neutral meta-code c̄ = Σ w_i c_i gets the size-weighted mean offset.
    Everything is post-processing of the per-client releases the server already holds (no ε).

    Why (digits validation split, dp-gaussian statistics, 3 seeds; benchmarks/results/release_defaults.md,
    "client statistics"): the mixture of the clients' own DP Gaussians beats the pooled one at every ε,
    because the domains differ in their class means and covariances.

    Args:
        hnet: a :class:`~fedhype.models.hypernet.HyperNetwork` with ``cfg.client_heads``.
        codes: float32 [m, code_dim], the clients' codes (m = len(updates)).
        updates: the clients' PrivatizedUpdates of the release, in client order.
        dp, weights: the release settings (for the noise levels); max_rank: latent size L.
        centring: the release's centring: None, one for every client, or a list with each client's own.
        rescale: the pool's clip rescale g (:func:`clip_rescale_factor`; 1 = none).

    Returns:
        ``{"clients": m, "exact": …}``: ``exact`` is True when the codes are linearly independent
        (rank C = m, so h(c_i) reproduces every target); with more clients than ``code_dim`` the heads
        are the least-squares fit. Memory is flat in m: the fit is accumulated one client at a time.
    """
    cfg = hnet.cfg
    K, L, D = cfg.n_classes, cfg.latent, cfg.dim
    m, s = hnet.space_mean.to(torch.float64), hnet.space_scale.to(torch.float64)
    with torch.no_grad():
        base_cb, base_wl = hnet.base["cb"].to(torch.float64), hnet.base["wl"].to(torch.float64)
        base_lsx = hnet.base["logsx"].to(torch.float64) if "logsx" in hnet.base else None
        pooled = release_moments(updates, dp, weights, centring, rescale, cfg.pooling)
        shrink = shrinkage_mode(getattr(cfg, "client_shrinkage", False))
        cens = _per_release(centring, len(updates))
        # client centres (each client clipped around its own): the "client" test discounts the clip shift
        distinct = len({id(cen) for cen in cens}) > 1 and all(cen is not None for cen in cens)
        shifts = ClipShift(pooled, cens, [u.tensors["class_counts"] for u in updates], rescale) \
            if shrink in ("client", "client-cov", "subspace") and distinct and pooled["cov"] is not None and dp.enabled and dp.noise_multiplier else None
        share = resolve_located_share(cfg.located_share, pooled, max_rank)  # the pool's, once for every client
        c = codes.detach().to(torch.float64)  # [m, code_dim]
        pinv = torch.linalg.pinv(c)  # [code_dim, m]
        w = None  # [P, code_dim] = Yᵀ C⁺ᵀ = Σ_i y_i ⊗ C⁺[:, i], accumulated one client at a time (flat in m)
        factors: list[tuple[float, float]] = []
        for i, (u, cen) in enumerate(zip(updates, cens)):
            g = client_gaussian(u, pooled, dp, weights, max_rank, shrink=shrink, centring=cen, residual=cfg.residual,
                                clip_shift=None if shifts is None else shifts.relative(cen),
                                located_share=share, rescale=rescale)
            if "cov_shrinkage" in g:  # what the shrinkage kept of the client's own statistics (release.json)
                factors.append((round(float(g["mean_shrinkage"].mean()), 6), round(float(g["cov_shrinkage"]), 6)))
            cb = (g["class_means"] - m) / s
            f = g["cov_factor"] / s
            r = min(f.shape[1], L)
            wl = torch.zeros(L, D, dtype=torch.float64)
            wl[:r] = f[:, :r].T
            # W_i and R·W_i (R orthogonal [L, L]) give the same covariance; align W_i to the pooled W
            # (orthogonal Procrustes, Schönemann 1966: R = U Vᵀ for U S Vᵀ = svd(W Wᵢᵀ)) so the
            # offsets are small and their size-weighted mean (the neutral code's) stays near the pooled W
            uu, _, vh = torch.linalg.svd(base_wl @ wl.T)
            wl = (uu @ vh) @ wl
            parts = [(cb - base_cb).flatten(), (wl - base_wl).flatten()]
            if base_lsx is not None:
                lsx = 0.5 * torch.log(g["residual_var"] / s ** 2)
                parts.append(lsx - base_lsx)
            term = torch.outer(torch.cat(parts), pinv[:, i])
            w = term if w is None else w.add_(term)
        n_cb, n_wl = K * D, L * D
        hnet.heads["cs_cb_w"].copy_(w[:n_cb].to(torch.float32))
        hnet.heads["cs_wl_w"].copy_(w[n_cb:n_cb + n_wl].to(torch.float32))
        if base_lsx is not None:
            hnet.heads["cs_lsx_w"].copy_(w[n_cb + n_wl:].to(torch.float32))
        if hasattr(hnet, "anchor_cs_cb_w"):
            hnet.anchor_cs_cb_w.copy_(hnet.heads["cs_cb_w"])
    out = {"clients": len(updates), "exact": int(torch.linalg.matrix_rank(c)) == len(updates)}
    if factors:
        out["client_shrinkage"] = shrink
        out["client_mean_shrinkage"] = [a for a, _ in factors]
        out["client_cov_shrinkage"] = [b for _, b in factors]
    return out


#: the keys of :func:`release_notes` (``release.json``, the model's metadata, the report)
RELEASE_NOTE_KEYS = ("located_share", "class_mean_snr", "located_directions")


def release_notes(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """What the run records of :func:`pooled_stats`' choices (``release.json``, the model's metadata): the
    located share used (``model.located_share = "auto"`` resolved, :func:`fedhype.federated.covariance.resolve_located_share`), the class
    means' James–Stein factor F it was chosen from and the number r of covariance directions the release
    located (:func:`fedhype.federated.covariance.covariance_estimate`); empty without second moments; with
    ``model.pooling = "random-effects"`` also ``pooling_tau2``, the clients' class-mean scatter τ_k² per class
    (:mod:`fedhype.federated.pooling`). Public: functions of DP outputs."""
    share, snr, directions = RELEASE_NOTE_KEYS
    out = {k: round(float(stats[k]), 6) for k in (share, snr) if k in stats}
    if "rank" in stats:
        out[directions] = int(stats["rank"])
    if "pooling_tau2" in stats:  # model.pooling = "random-effects": the scatter τ_k² it found, per class
        out["pooling_tau2"] = [float(f"{float(v):.4g}") for v in stats["pooling_tau2"]]
    return out


def release_moments(updates, dp, weights, centring=None, rescale: float = 1.0, pooling: str = "sum") -> dict:
    """:func:`_moments` of ``updates`` with the noise levels of the release settings (``dp``, ``weights``)."""
    std = release_noise(dp, weights)
    return _moments(updates, std["class_counts"], sums_std=std["class_sums"], second_moment_std=std["second_moment_offdiag"],
                    centring=centring, rescale=rescale, pooling=pooling)


def client_gaussian(update: PrivatizedUpdate, pooled: dict, dp, weights, max_rank: int | None = None, *,
                    shrink: bool | str = True, centring=None, residual: str = DEFAULT_RESIDUAL,
                    clip_shift: "torch.Tensor | None" = None,
                    located_share: float = 0.0, rescale: float = 1.0) -> dict[str, torch.Tensor]:
    """Client ``update``'s own DP class-conditional Gaussian, unit-sphere units (float64).

    ``clip_shift`` (``"client"``, ``"client-cov"`` and ``"subspace"`` shrinkage): :meth:`ClipShift.relative` of the client's centring,
    [K, D] float64, removed from its class means before they are compared with the pool's.

    ``pooled``: :func:`release_moments` of every client's release. ``shrink`` (``model.client_shrinkage``):
    ``"class"`` (or True) first shrinks the client's moments toward the pooled ones class by class
    (:func:`fedhype.federated.client_shrinkage.shrink_toward`), ``"client"`` class by class from the client's signal variance (:func:`fedhype.federated.client_shrinkage.shrink_client`);
    ``"none"`` (or False) keeps its own release alone (as :func:`pooled_stats` ``([update])``). ``rescale``:
    the pool's clip rescale g (:func:`clip_rescale_factor`), applied to this client's release too.

    Returns ``class_means`` [K, D], ``cov_factor`` [D, r], ``residual_var`` [] (covariance
    ``cov_factor·cov_factorᵀ + residual_var·I``) and, with ``shrink``, ``mean_shrinkage`` [K] and
    ``cov_shrinkage`` [] (the James–Stein factors, 1 = the client's own estimate).
    """
    mo = release_moments([update], dp, weights, centring, rescale)
    mode = shrinkage_mode(shrink)
    if mode not in SHRINKAGE:
        raise ValidationError(f"model.client_shrinkage must be one of {sorted(SHRINKAGE)} (or true/false), got {shrink!r}")
    shrink = SHRINKAGE[mode] is not None
    if shrink:
        mo = (SHRINKAGE[mode](mo, pooled, clip_shift) if mode in ("client", "client-cov", "subspace")
              else SHRINKAGE[mode](mo, pooled))
    # "auto" takes the pool's share (each client's Gaussian as the pooled one)
    factor, resid, _ = _gaussian(mo, max_rank, residual, resolve_located_share(located_share, pooled, max_rank))
    out = {"class_means": mo["class_means"].to(torch.float64), "cov_factor": factor, "residual_var": resid}
    if shrink:
        out["mean_shrinkage"] = mo["mean_shrinkage"]
        out["cov_shrinkage"] = torch.tensor(mo.get("cov_shrinkage", 1.0), dtype=torch.float64)
    return out


def release_noise(dp, weights) -> dict[str, float]:
    """Per-entry noise std of each released statistic for the release settings ``dp`` (zeros without DP)."""
    if not dp.enabled or not dp.noise_multiplier:
        return {"class_sums": 0.0, "class_counts": 0.0, "second_moment_offdiag": 0.0}
    return {"second_moment_offdiag": 0.0, **weights.noise_std(float(dp.noise_multiplier))}


def pooled_stats(updates: list[PrivatizedUpdate], dp, weights, max_rank: int | None = None,
                 centring=None, residual: str = DEFAULT_RESIDUAL, located_share: float = 0.0,
                 rescale: float = 1.0, pooling: str = "sum") -> dict[str, torch.Tensor]:
    """:func:`aggregate_class_stats` with the noise levels of the release settings (``dp``, ``weights``)."""
    std = release_noise(dp, weights)
    return aggregate_class_stats(updates, std["class_counts"], sums_std=std["class_sums"],
                                 second_moment_std=std["second_moment_offdiag"], max_rank=max_rank, centring=centring,
                                 residual=residual, located_share=located_share, rescale=rescale, pooling=pooling)


def run_class_stats_stage(clients, server, n_classes: int, dp, ledger, ledger_path, *, seeded: bool,
                          weights=None, distributed: DistributedNoise | None = None, centre_share: float = 0.0,
                          radius: float | None = None, release_centre: str = "pooled",
                          budget_check: "Callable[[list], None] | None" = None, outputs: "Path | None" = None,
                          reuse_outputs: bool = False):
    """Release every client's class statistics (write-ahead ledger first) and set the model(s).

    A federated server pools all clients (:func:`aggregate_class_stats`); a ``local-cvae`` server
    (one model per client, attribute ``servers``) sets each client's model from its own release.
    Charged write-ahead by the ledger's one rerun rule (:func:`fedhype.privacy.ledger.pending_charges`):
    a ``seeded`` rerun replays the same noise and is not charged again, an unseeded one is (fresh noise). ``weights``: the
    :class:`~fedhype.privacy.dp_step.ReleaseWeights` (default: the legacy sums-and-counts release).
    ``distributed``: secure aggregation (:mod:`fedhype.privacy.secure_agg`): each client releases a
    share with the noise split over m − t clients, the server receives only their sum (its ledger
    events name the split; ε is that of the σ₀ release the sum is guaranteed to carry).

    With ``centre_share`` s > 0 (and DP) the release is centred (:mod:`fedhype.privacy.centring`):
    each client first releases its sum and count at σ_A = σ₀/√s, the server pools them into the public
    centre c and radius R (``radius`` κ × the DP spread), and the class statistics of the clipped
    deviations follow at σ_B = σ₀/√(1 − s) — together the cost of one release at σ₀. Each step is
    charged write-ahead just before it runs; the centres are saved the moment they arrive, so a run
    interrupted between the steps (a Flower node killed during the statistics step) reuses them on its resume
    and releases — and is charged for — the statistics step alone (again, unless seeded). A step that fails
    for some clients after others' updates arrived (a Flower node killed during it, an in-process client's release
    raising; the other clients are still asked) saves the updates that arrived — public DP outputs — as a partial
    file before the error is re-raised; its resume releases, and is charged for, that step of the missing clients
    alone (pending charges under the same rerun rule; ``budget_check`` sees only those events; after a partial
    centre step, every client's statistics step follows), merges the updates in client order and goes on
    as a normal run (per-client releases only: under secure aggregation the server holds a sum, nothing per client).
    A client whose node refuses a step explicitly, before touching its records (a Flower node's refusal:
    :data:`fedhype.federated.transport.REFUSED`), has what this call charged it for that step voided in the ledger
    (:func:`~fedhype.federated.transport.void_refused`; both steps where it refused its centre); its resume charges
    them afresh. A missing reply or any other error keeps the charge (not on the Flower integer path either).
    ``release_centre`` (``train.release_centre``) says around
    which centre each client clips: ``"client"`` its own DP centre pulled toward the pooled one, with
    one common radius (:func:`fedhype.privacy.centring.client_centrings`), ``"pooled"`` the pooled one
    (:func:`~fedhype.privacy.centring.centring_from`), ``"auto"`` client centres except under secure
    aggregation, where the server sees only the sum of the centre releases. A ``local-cvae`` server
    centres each client on its own centre release and radius (each client is a model of its own).

    ``budget_check``: called with the release's pending ledger events (what this call would charge) before
    anything is charged; it raises :class:`~fedhype.errors.BudgetExceededError` to refuse (``train.max_epsilon``
    on a resume that re-releases: :func:`fedhype.federated.engine.release_statistics`).

    ``outputs``: where the clients' released updates (centres and statistics: public DP outputs) are saved the
    moment they arrive, before the server's post-processing (:func:`fedhype.federated.release_outputs.save_release_outputs`); with
    ``reuse_outputs`` (the engine's resume of a run whose release was charged) a file already there is read back
    instead of asking the clients again — nothing is charged or released a second time. Under in-process secure
    aggregation the server keeps only the sums it received (:func:`fedhype.federated.release_outputs.save_secure_outputs`), reused the same way, in
    process and on the Flower integer path (:mod:`fedhype.federated.secure_release`) alike.

    Returns the clients' DP class counts ``[m][K]`` (floored at 0; public DP outputs, used to weight
    a mixture per class), or None under secure aggregation (the server sees only their sum).
    """
    from fedhype.privacy import centring as centring_mod
    from fedhype.privacy.dp_step import LEGACY_WEIGHTS, RELEASE_SENSITIVITY, DPConfig
    from fedhype.privacy.events import release_events
    from fedhype.privacy.ledger import charge, pending_charges

    weights = LEGACY_WEIGHTS if weights is None else weights
    session = getattr(clients[0], "secure_session", None) if (distributed is not None and clients) else None
    if session is not None:  # clients on other machines: SecAgg+ over integers, Skellam noise (secure_release)
        from fedhype.federated.secure_release import run_integer_release

        return run_integer_release(session(), clients, server, n_classes, dp, ledger, ledger_path, seeded=seeded,
                                   weights=weights, distributed=distributed, centre_share=centre_share,
                                   radius=centring_mod.DEFAULT_RADIUS if radius is None else float(radius),
                                   budget_check=budget_check, outputs=outputs,
                                   reuse_outputs=reuse_outputs and outputs is not None)
    what = "class sums, counts and second moments" if weights.second_moment > 0 else "class sums and counts"
    centred = bool(dp.enabled and centre_share > 0)
    radius = centring_mod.DEFAULT_RADIUS if radius is None else float(radius)
    steps = centring_mod.release_steps(float(dp.noise_multiplier), centre_share if centred else 0.0) if dp.enabled else []
    if centred:
        sigma_a, sigma_b = steps[0][0], steps[1][0]
        dp = DPConfig(sigma_b, dp.clip_norm, enabled=True)
    split = f"; {distributed.describe()}" if distributed is not None else ""
    reuse = reuse_outputs and outputs is not None and dp.enabled
    if distributed is None:
        kept = load_release_outputs(outputs, clients) if reuse else None
    else:  # the sums the server received before the interruption (charged then)
        kept = load_secure_outputs(outputs, clients, distributed) if reuse else None
    if kept is not None and centred != _has_centre(kept[0]):  # not this release's outputs (centred or not)
        kept = None
    # interrupted between the centre and the statistics step: the centre (released, charged) is reused and only
    # the statistics step is released — and charged — again (a Flower node killed during the statistics step);
    # interrupted during the statistics step after some clients' updates arrived: only the missing clients' again
    missing = [i for i, u in enumerate(kept[1]) if u is None] if kept is not None and is_partial(kept[1]) else None
    # interrupted during the centre step after some clients' centres arrived: only the missing clients' centres again
    # (then every client's statistics step)
    no_centre = ([i for i, u in enumerate(kept[0]) if u is None]
                 if kept is not None and distributed is None and is_partial(kept[0]) else None)
    only_stats = kept is not None and no_centre is None and (kept[1] is None or missing is not None)
    pending: list = []  # what this call charges (write-ahead): a client that refuses its step has its part voided
    if dp.enabled and (kept is None or only_stats or no_centre is not None):
        stats_note = (f"{what}; weights (a, b, c) = {[round(w, 6) for w in weights.as_list()]}"
                      + (f"; centred, clip radius {radius:g} × the DP spread" if centred else "") + split)
        centre_note = f"sum and count of the unit records (the release's centre){split}"
        if no_centre is not None:  # the missing clients' centres, then every client's statistics
            events = (release_events([clients[i].id for i in no_centre], steps[:1], [centring_mod.MECHANISM],
                                     RELEASE_SENSITIVITY, [centre_note])
                      + release_events([c.id for c in clients], steps[-1:], [MECHANISM], RELEASE_SENSITIVITY,
                                       [stats_note]))
        elif only_stats:
            who = clients if missing is None else [clients[i] for i in missing]
            stats_step = steps[-1:] if centred else [(float(dp.noise_multiplier), 1.0, 1)]
            events = release_events([c.id for c in who], stats_step, [MECHANISM], RELEASE_SENSITIVITY, [stats_note])
        else:
            events = release_events([c.id for c in clients], steps if centred else [(float(dp.noise_multiplier), 1.0, 1)],
                                    [centring_mod.MECHANISM, MECHANISM] if centred else [MECHANISM], RELEASE_SENSITIVITY,
                                    [centre_note, stats_note] if centred else [stats_note])
        pending = pending_charges(ledger, events, replays=lambda e: seeded)
        if budget_check is not None:
            budget_check(pending)  # the release's whole plan, before either step is charged
    # each step is charged (write-ahead) just before it runs, as on the secure integer path: a stop during the centre
    # step leaves the statistics step uncharged (a helper's kill -9 of a node there charged both, and the resume both
    # again: the statistics step twice, though no client had run it)
    centre_part = [e for e in pending if e.mechanism == centring_mod.MECHANISM]
    stats_part = [e for e in pending if e.mechanism != centring_mod.MECHANISM]
    if centre_part:
        charge(ledger, centre_part, ledger_path)
    rank_cap, residual, share = server.cfg.latent, server.cfg.residual, server.cfg.located_share
    rescaled = bool(getattr(server.cfg, "clip_rescale", False))
    parts = getattr(server, "servers", None)
    if distributed is not None:
        if parts is not None:
            raise ValidationError("secure aggregation pools the clients' statistics; local-cvae needs each client's own")
        cen_sum, agg = kept if kept is not None else (None, None)  # a resume: the sums received before
        if kept is None and centred:
            cen_sum = secure_sum([c.release_centre(sigma_a, distributed=distributed) for c in clients], distributed)
            if outputs is not None:  # saved the moment it arrives: a resume after it releases the statistics only
                save_secure_outputs(outputs, cen_sum, None)
        cen = centring_mod.centring_from(cen_sum, radius) if centred else None
        if agg is None:
            if stats_part:
                charge(ledger, stats_part, ledger_path)
            agg = secure_sum([c.release_class_stats(n_classes, dp, weights, distributed=distributed, centring=cen)
                              for c in clients], distributed)
            if outputs is not None and dp.enabled:  # saved before the post-processing: a resume reuses them
                save_secure_outputs(outputs, cen_sum, agg)
        g = clip_rescale_factor(agg, cen) if rescaled else 1.0
        stats = pooled_stats(agg, dp, weights, rank_cap, cen, residual, share, g)  # the sum only
        apply_class_stats(server.hnet, stats)
        server.release_notes = release_notes(stats)
        return None
    if kept is not None and no_centre is None:  # a resume: the updates released before the interruption (charged then)
        centres, updates = kept
    else:
        centres, updates = (list(kept[0]) if kept is not None else [None] * len(clients) if centred else []), None
        if centred:  # saved the moment they arrive (those that did, if some fail): a resume releases the rest only
            save = (lambda have: save_release_outputs(outputs, have, [])) if outputs is not None else None
            try:
                centres = _fill(centres, lambda ask: release_all_centres([clients[i] for i in ask], sigma_a), save)
            except FedhypeError as exc:  # a node that refused its centre did not run it: that charge is voided
                from fedhype.federated.transport import void_refused

                void_refused(ledger, centre_part, exc, ledger_path)
                raise
    if centred:
        if parts is not None:
            cens = [centring_mod.centring_from([u], radius) for u in centres]
        elif release_centre == "pooled":
            cens = [centring_mod.centring_from(centres, radius)] * len(clients)
        else:
            cens = centring_mod.client_centrings(centres, radius, sigma_a)
    else:
        cens = [None] * len(clients)
    if updates is None or missing is not None:  # saved before the (slower) post-processing: a resume reuses them
        if stats_part:
            charge(ledger, stats_part, ledger_path)
        try:
            updates = _release_missing(clients, n_classes, dp, weights, cens, updates,
                                       outputs if dp.enabled else None, centres)
        except FedhypeError as exc:  # a node that refused the statistics step did not run it: that charge is voided
            from fedhype.federated.transport import void_refused

            void_refused(ledger, stats_part, exc, ledger_path)
            raise
    counts = [[max(0.0, float(v)) for v in u.tensors["class_counts"]] for u in updates]
    if parts is not None:
        notes = []
        for s, u, cen in zip(parts, updates, cens):
            g = clip_rescale_factor([u], cen) if rescaled else 1.0
            stats = pooled_stats([u], dp, weights, rank_cap, cen, residual, share, g)
            apply_class_stats(s.hnet, stats)
            notes.append(release_notes(stats))
        server.release_notes = {k: [n.get(k) for n in notes] for k in (notes[0] if notes else {})}  # one per client
    else:
        g = clip_rescale_factor(updates, cens) if rescaled else 1.0
        stats = pooled_stats(updates, dp, weights, rank_cap, cens, residual, share, g, server.cfg.pooling)
        apply_class_stats(server.hnet, stats)
        server.release_notes = release_notes(stats)
        if server.hnet.cfg.client_heads:  # h(c_i) = client i's own DP Gaussian
            fit = apply_client_stats(server.hnet, server.codes, updates, dp, weights, rank_cap, cens, g)
            # the shrinkage rule and, per client, the share of its own class means (mean over classes) and
            # covariance it kept (release.json: post-processing of DP outputs; a probe could not tell the rules apart)
            server.release_notes.update({k: fit[k] for k in ("client_shrinkage", "client_mean_shrinkage",
                                                             "client_cov_shrinkage") if k in fit})
    return counts


#: the attribute of an exception raised by :func:`release_all_class_stats` after some clients' updates arrived:
#: ``{position in the clients asked: PrivatizedUpdate}`` (public DP outputs, saved before the error is re-raised)
RELEASED = "released_updates"


def _release_missing(clients, n_classes: int, dp, weights, cens, have, outputs, centres) -> list[PrivatizedUpdate]:
    """The statistics of the clients without one in ``have`` (None: every client), merged in client order and saved
    to ``outputs`` (None: not saved). If some clients fail after others' updates arrived, those are saved as a
    partial file (:func:`fedhype.federated.release_outputs.save_release_outputs`) and the error is re-raised."""
    have = [None] * len(clients) if have is None else list(have)
    save = (lambda got: save_release_outputs(outputs, centres, got)) if outputs is not None else None
    return _fill(have, lambda ask: release_all_class_stats([clients[i] for i in ask], n_classes, dp, weights,
                                                           [cens[i] for i in ask]), save)


def _fill(have: list, release: "Callable[[list[int]], list[PrivatizedUpdate]]",
          save: "Callable[[list], None] | None") -> list[PrivatizedUpdate]:
    """``have`` (one entry per client, None where a client's update is missing) with the holes filled by
    ``release(positions)`` and saved by ``save`` (None: not saved). If some clients fail after others' updates
    arrived (the error's :data:`RELEASED`), those are merged and saved — a partial file: a resume asks only the
    missing clients — and the error is re-raised."""
    ask = [i for i, u in enumerate(have) if u is None]
    try:
        got = release(ask)
    except BaseException as exc:
        arrived = getattr(exc, RELEASED, None) or {}
        for j, u in arrived.items():
            have[ask[j]] = u
        if arrived and save is not None:  # public DP outputs, charged
            save(have)
        raise
    for i, u in zip(ask, got):
        have[i] = u
    if save is not None:
        save(have)
    return have


def release_all_centres(clients, noise_multiplier: float) -> list[PrivatizedUpdate]:
    """Every client's DP centre release (:mod:`fedhype.privacy.centring`), each client asked once: through
    ``release_centre_all`` where the clients' type offers it (the Flower grid clients: one message to every node),
    else one by one, as :func:`release_all_class_stats` (the same errors, carrying the centres that arrived)."""
    batch = getattr(type(clients[0]), "release_centre_all", None) if clients else None
    if batch is not None:
        return batch(clients, noise_multiplier)
    return _ask_each(clients, lambda j, c: c.release_centre(noise_multiplier))


def release_all_class_stats(clients, n_classes: int, dp, weights, centrings) -> list[PrivatizedUpdate]:
    """Every client's class-statistics release, client i around ``centrings[i]`` (each client asked once).

    Clients whose type offers ``release_class_stats_all`` (the Flower grid clients: one message to
    every node) release through it; in-process clients one by one. When some clients fail, the error
    is raised carrying the updates that did arrive as its attribute :data:`RELEASED` (by position in
    ``clients``): in process the other clients are still asked (their release was charged write-ahead),
    then the first error is re-raised; an interrupt (not an ``Exception``) is re-raised at once.
    """
    batch = getattr(type(clients[0]), "release_class_stats_all", None) if clients else None
    if batch is not None:
        return batch(clients, n_classes, dp, weights, list(centrings))
    centrings = list(centrings)
    return _ask_each(clients, lambda j, c: c.release_class_stats(n_classes, dp, weights, centring=centrings[j]))


def _ask_each(clients, ask: "Callable[[int, object], PrivatizedUpdate]") -> list[PrivatizedUpdate]:
    """``ask(j, clients[j])`` for every client in turn; on failures see :func:`release_all_class_stats`."""
    out: dict[int, PrivatizedUpdate] = {}
    failed: BaseException | None = None
    for j, c in enumerate(clients):
        try:
            out[j] = ask(j, c)
        except Exception as exc:  # noqa: BLE001 — re-raised below, after the others were asked
            failed = failed or exc
        except BaseException as exc:  # an interrupt: what arrived is kept, nothing more is asked
            _carry(exc, out)
            raise
    if failed is not None:
        _carry(failed, out)
        raise failed
    return [out[j] for j in range(len(clients))]


def _carry(exc: BaseException, arrived: dict) -> None:
    """Attach the updates that arrived to ``exc`` (:data:`RELEASED`), where an exception takes attributes."""
    try:
        setattr(exc, RELEASED, dict(arrived))
    except AttributeError:
        pass


def client_space(server, index: int):
    """The model space (m, s) client ``index`` trains in."""
    parts = getattr(server, "servers", None)
    return (parts[index] if parts is not None else server).hnet.space()
