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
  the covariance (:func:`covariance_estimate`) that initialises the decoder's linear path, so the
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

from fedhype.errors import ValidationError
from fedhype.models.config import (AUTO_LOCATED_FRACTION, AUTO_LOCATED_SHARE, AUTO_SHARE_MAX_LOCATED,
                                   AUTO_SHARE_MIN_SNR, CLIENT_SHRINKAGE, DEFAULT_RESIDUAL, DP_LATENT, RESIDUALS)
from fedhype.privacy.dp_step import PrivatizedUpdate
from fedhype.privacy.events import RELEASE as MECHANISM  # the one list of mechanism names
from fedhype.privacy.secure_agg import DistributedNoise, PrivatizedAggregate, secure_sum

#: floor of the total variance 1 − ‖μ‖² used for the scale s (DINOv2-S digits: 0.24)
MIN_TOTAL_VARIANCE = 0.05


def aggregate_class_stats(updates: "list[PrivatizedUpdate] | PrivatizedAggregate", noise_std: float = 0.0, *, sums_std: float | None = None,
                          second_moment_std: float = 0.0, max_rank: int | None = None, centring=None,
                          residual: str = DEFAULT_RESIDUAL, located_share: float = 0.0,
                          rescale: float = 1.0) -> dict[str, torch.Tensor]:
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
        residual, located_share: where the variance the release cannot locate goes (:func:`covariance_estimate`);
            ``located_share = "auto"`` is resolved from these pooled moments (:func:`resolve_located_share`).
        rescale: the clip rescale g of a centred release (:func:`clip_rescale_factor`; 1 = none).

    Returns:
        float32 tensors in model space: ``space_mean`` [D], ``space_scale`` [] and ``class_bias``
        [K, D]; s² = v/D with v = 1 − (‖m‖² − D·n_clients·std²/N²) clamped to
        [:data:`MIN_TOTAL_VARIANCE`, 1]. With second moments also ``cov_factor`` [D, r],
        ``residual_var`` [] and ``rank`` [] (int64): the covariance estimate
        ``cov_factor·cov_factorᵀ + residual_var·I`` (model space) of :func:`covariance_estimate`; and
        ``located_share`` [] (the share used) and ``class_mean_snr`` [] (F, :func:`class_mean_snr`), float64.
    """
    mo = _moments(updates, noise_std, sums_std=sums_std, second_moment_std=second_moment_std, centring=centring,
                  rescale=rescale)
    mean, scale, class_means = mo["mean"], torch.sqrt(mo["var"] / mo["mean"].shape[0]), mo["class_means"]
    out = {"space_mean": mean, "space_scale": scale, "class_bias": (class_means - mean) / scale}
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
             rescale: float = 1.0) -> dict:
    """The DP first and second moments of a release in unit-sphere units (:func:`aggregate_class_stats`).

    ``centring``: None (uncentred release), one :class:`~fedhype.privacy.centring.Centring` for every
    update, or a list of them, one per update (client centres, :func:`fedhype.privacy.centring.client_centrings`).
    Each update's statistics of ``y = clip_R(x − c)/R`` are mapped back to the unit sphere before they
    are pooled (:func:`_unit_sphere`). ``rescale`` g ≥ 1 (:func:`clip_rescale_factor`, ``model.clip_rescale``)
    maps them back with the radius g·R instead of R, undoing clipping's shrink toward the centre (the
    noise levels below scale with it).

    Returns ``mean`` [D], ``var`` [] (total variance, clamped), ``class_means`` [K, D] float32;
    ``counts`` [K] (floored at ``counts_floor``, twice the count noise std),
    ``sums_noise_var`` (noise variance per coordinate of the pooled sums),
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
    class_means = mean + (sums - counts[:, None] * mean) / class_counts[:, None]
    out = {"mean": mean.to(torch.float32), "var": var.to(torch.float32), "class_means": class_means.to(torch.float32),
           "counts": class_counts.to(torch.float32), "sums_noise_var": sums_noise_var, "cov": None, "offdiag_var": 0.0,
           "counts_floor": float(floor)}
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


def _unit_sphere(update, centring, rescale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]:
    """One release's class sums [K, D], counts [K] and second moments [D, D] (or None) of the unit records, float64.

    A centred release holds the statistics of ``y = clip_R(x − c)/R``; with x = c + R·y (exact for the
    records inside the radius) they map back as Σx = n·c + R·Σy and Σxxᵀ = n·c cᵀ + R(c Σyᵀ + Σy cᵀ) + R²·Σyyᵀ
    (n and Σy the noisy totals over the classes). ``rescale`` g puts g·R in place of R (x ≈ c + g·R·y:
    :func:`clip_rescale_factor`). Post-processing (:mod:`fedhype.privacy.centring`).
    """
    s = update.tensors["class_sums"].to(torch.float64)
    n = update.tensors["class_counts"].to(torch.float64)
    m2 = update.tensors["second_moment"].to(torch.float64) if "second_moment" in update.tensors else None
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


def _gaussian(mo: dict, max_rank: int | None, residual: str = DEFAULT_RESIDUAL,
              located_share: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The low-rank-plus-isotropic covariance of moments ``mo`` (:func:`_within_class`, :func:`covariance_estimate`)."""
    cov, tr = _within_of(mo)
    return covariance_estimate(cov, tr, mo["offdiag_var"], max_rank=max_rank, residual=residual,
                               located_share=located_share)


def _within_of(mo: dict) -> tuple[torch.Tensor, float]:
    """:func:`_within_class` of moments ``mo``: the covariance its class-conditional samples get, and its trace."""
    m64 = mo["mean"].to(torch.float64)
    return _within_class(mo["cov"], float(mo["var"]), mo["class_means"].to(torch.float64) - m64,
                         mo["counts"].to(torch.float64), mo["sums_noise_var"])


def _shrunk_cov(client: dict, pooled: dict, shrunk: dict, f: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The client's total covariance and variance moved a share ``f`` from a target toward its own.

    The target is the pooled *within-class* covariance plus the between-class scatter of the client's
    shrunk class means ``shrunk`` under its own class mix, so that :func:`_within_class` (which subtracts
    that scatter) leaves the pooled within-class covariance at f = 0. Shrinking toward the pooled
    *total* covariance instead left the pool's between-class scatter in a label-skewed client's
    covariance (its class mix is not the pool's): at f = 0 its Gaussian was not the pooled one."""
    if f == 1.0:
        return client["cov"], client["var"]
    pw, ptr = _within_of(pooled)
    if pw is pooled["cov"]:  # the pooled Gaussian keeps its between-class scatter (class means too noisy)
        target, target_var = pooled["cov"], float(pooled["var"])
    else:  # plus exactly what _within_class will subtract from the client's covariance (its shrunk means)
        dev = shrunk["class_means"].to(torch.float64) - shrunk["mean"].to(torch.float64)
        sub = _between_part(dev, shrunk["counts"].to(torch.float64), shrunk["sums_noise_var"])
        sub = torch.zeros_like(pw) if sub is None else sub
        target, target_var = pw + sub, ptr + float(torch.trace(sub))
    cov = target + f * (client["cov"] - target)
    var = target_var + f * (float(client["var"]) - target_var)
    return cov, torch.tensor(var, dtype=torch.float32)


def shrink_toward(client: dict, pooled: dict) -> dict:
    """Positive-part James–Stein shrinkage of one client's DP moments toward the pooled ones.

    A client's own release is n_clients times noisier than the pool relative to its size; its
    estimates are shrunk toward the pooled estimates by how much of their difference is noise
    (James & Stein 1961; positive part, Baranchik 1964; toward a data-chosen target as in Efron &
    Morris 1973), separately for

    * each class mean: μ'_ik = μ_k + f_ik (μ_ik − μ_k), f_ik = max(0, 1 − D τ²_ik / ‖μ_ik − μ_k‖²),
      τ²_ik = (noise variance per coordinate of the client's class-k sum) / n_ik² (n_ik: its floored
      DP count);
    * the covariance and the total variance: C'_i = C + f_i (C_i − C), v'_i = v + f_i (v_i − v),
      f_i = max(0, 1 − D(D + 1) v_i / ‖C_i − C‖²_F), v_i the noise variance of an off-diagonal entry
      of C_i (a diagonal entry has 2 v_i); the shrunk matrix then carries noise variance about
      f_i² v_i + (1 − f_i)² v per entry (the pool's noise is treated as independent of the client's:
      it contains it, so this overstates the noise slightly and keeps fewer spikes).

    Without noise (no DP) every f is 1 and the client's own moments are returned unchanged.
    Post-processing of DP outputs the server already holds (no ε). Both dicts come from
    :func:`_moments`; returns a new one of the same form (the client's mean is the count-weighted
    mean of its shrunk class means).
    """
    out = dict(client)
    d = client["class_means"].to(torch.float64) - pooled["class_means"].to(torch.float64)  # [K, D]
    dim = d.shape[1]
    tau2 = client["sums_noise_var"] / client["counts"].to(torch.float64) ** 2  # [K]
    f = (1.0 - dim * tau2 / d.pow(2).sum(1).clamp_min(1e-30)).clamp(0.0, 1.0)
    cm = pooled["class_means"].to(torch.float64) + f[:, None] * d
    w = client["counts"].to(torch.float64) / client["counts"].to(torch.float64).sum()
    out["class_means"] = cm.to(torch.float32)
    out["mean"] = (w @ cm).to(torch.float32)
    out["mean_shrinkage"] = f
    if client["cov"] is not None and pooled["cov"] is not None:
        delta = client["cov"] - pooled["cov"]
        v = float(client["offdiag_var"])
        fc = max(0.0, min(1.0, 1.0 - dim * (dim + 1) * v / max(float(delta.pow(2).sum()), 1e-300))) if v > 0 else 1.0
        out["cov"], out["var"] = _shrunk_cov(client, pooled, out, fc)
        out["offdiag_var"] = fc ** 2 * v + (1.0 - fc) ** 2 * float(pooled["offdiag_var"])
        out["cov_shrinkage"] = fc
    return out


#: Monte Carlo draws per class of :class:`ClipShift` (a fixed seed: post-processing, not a privacy parameter)
CLIP_SHIFT_DRAWS = 2000


class ClipShift:
    """How much clipping around each client's centre moves its class means, beyond what it moves the pool's.

    A centred release clips each record's deviation from its client's centre c_i to the radius R
    (:mod:`fedhype.privacy.centring`), so a client's class mean is pulled toward c_i, the more so the
    farther the class lies from it. With client centres (``train.release_centre = "client"``) a
    label-skewed client's centre sits among its own classes, and its few records of the other classes
    are pulled more than the pool's records of them: a systematic difference that is neither DP nor
    sampling noise, and that the heterogeneity test of :func:`shrink_client` read as a domain (all
    70,000 Fashion-MNIST images, label skew only, ε = 4: f_i = 0.05–0.74 with client centres, 0 with the
    pooled centre).

    Under the pooled DP Gaussian x ~ N(μ_k, C_within) the expected shift of client i's class-k mean is
    b_ik = E[c_i + clip_R(x − c_i)] − μ_k (Monte Carlo, :data:`CLIP_SHIFT_DRAWS` draws per class, the
    same draws for every client, a fixed seed), and the pooled class mean carries the count-weighted
    mean b̄_k = Σ_i n_ik b_ik / Σ_i n_ik. :meth:`relative` gives b_i − b̄, the part of client i's
    deviation from the pool that its clipping explains. Post-processing of DP outputs (no ε).

    Args:
        pooled: :func:`_moments` of every client's release (with second moments).
        centrings: each client's :class:`~fedhype.privacy.centring.Centring`, in client order.
        counts: each client's DP class counts, float [K], in client order.
        rescale: the clip rescale g the moments were mapped back with (:func:`clip_rescale_factor`):
            a client's class mean is then c_i + g·E[clip_R(x − c_i)].
    """

    def __init__(self, pooled: dict, centrings: list, counts: list[torch.Tensor], rescale: float = 1.0):
        mu = pooled["class_means"].to(torch.float64)  # [K, D]
        cov, _ = _within_of(pooled)
        lam, vec = torch.linalg.eigh((cov + cov.T) / 2)
        root = vec * lam.clamp_min(0).sqrt()  # root·rootᵀ = C_within without its negative (noise) part
        g = torch.Generator().manual_seed(0)
        z = torch.randn(CLIP_SHIFT_DRAWS, mu.shape[1], generator=g, dtype=torch.float64) @ root.T  # [S, D]
        self._draws = mu[:, None, :] + z[None]  # [K, S, D]
        self._mu = mu
        self._rescale = float(rescale)
        total, weight = torch.zeros_like(mu), torch.zeros(mu.shape[0], dtype=torch.float64)
        for cen, n in zip(centrings, counts):
            w = n.to(torch.float64).clamp_min(0)
            total += w[:, None] * self.shift(cen)
            weight += w
        self.mean = total / weight.clamp_min(1e-12)[:, None]  # b̄ [K, D]

    def shift(self, centring) -> torch.Tensor:
        """b_i [K, D] float64 for a client clipped around ``centring``."""
        c, r = centring.centre.to(torch.float64), float(centring.radius)
        dev = self._draws - c
        scale = torch.clamp(r / dev.norm(dim=2, keepdim=True).clamp_min(1e-300), max=1.0)
        return self._rescale * (dev * scale).mean(1) + c - self._mu

    def relative(self, centring) -> torch.Tensor:
        """b_i − b̄ [K, D] float64: what client i's clipping adds to its class means' deviation from the pool's."""
        return self.shift(centring) - self.mean


def paule_mandel(q: torch.Tensor, tau2: torch.Tensor, iters: int = 100) -> float:
    """The between-group variance A ≥ 0 of the method of moments of Paule & Mandel (1982): the root of
    Σ_k q_k / (A + τ²_k) = K, or 0 where Σ_k q_k/τ²_k ≤ K.

    q: [K] float64, each group's squared deviation per coordinate (‖d_k‖²/D); tau2: [K] its noise
    variance per coordinate. With equal τ²_k the root is τ²·(χ²/(K·D) − 1), χ² = D·Σ_k q_k/τ², so
    A/(A + τ²) is the positive-part James–Stein factor 1 − K·D/χ² (Efron & Morris 1973, Sec. 2).
    Bisection: the left side falls strictly in A.
    """
    k = q.numel()
    if float((q / tau2).sum()) <= k:
        return 0.0
    lo, hi = 0.0, float(q.sum())  # at A = Σ q the left side is < 1 ≤ K
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float((q / (mid + tau2)).sum()) > k else (lo, mid)
    return 0.5 * (lo + hi)


def shrink_client(client: dict, pooled: dict, clip_shift: "torch.Tensor | None" = None) -> dict:
    """One client's DP moments pulled toward the pooled ones, class by class, from a heterogeneity test.

    :func:`shrink_toward` treats only the DP noise as noise, so a client's *sampling* error (its n_ik
    records' class mean differs from its population's by about s²/n_ik per coordinate) counts as a
    difference to keep; with label skew alone (clients drawn from one population) that keeps
    nothing but noise. Here the difference d_ik = μ̂_ik − μ̂_k of the client's class-k mean to the pooled
    one has, per coordinate, noise variance

        τ²_ik = σ²_S/n²_ik + s²/n_ik

    (DP noise of the class sum; sampling error, s² the pooled within-class variance per coordinate,
    tr C_within / D from the release). The DP noise η of the class *count* scales the whole mean
    (μ̂ = (nμ + ξ)/(n + η) ≈ μ + ξ/n − μη/n): an error along μ_k alone, which an isotropic τ² term
    σ²_n‖μ_k‖²/(D n²) would spread over all D directions; with it the digits validation TSTR at ε = 1
    fell from 0.570 to 0.557 (mixture code, 3 seeds; benchmarks/results/client_shrinkage.md, "100
    clients"), so it is left out. The client's signal variance A_i
    per coordinate, common to its classes, is the method-of-moments root of Σ_k q_ik/(A_i + τ²_ik) = K
    with q_ik = ‖d_ik‖²/D (:func:`paule_mandel`; 0 when the client's means fit the pool's within
    their noise), and each class keeps the share

        f_ik = A_i / (A_i + τ²_ik)

    of its deviation (the Bayes factor of a normal prior of variance A_i: Efron & Morris 1975,
    Sec. 3; with equal τ²_ik it is the positive-part James–Stein factor 1 − K·D/χ²_i, χ²_i =
    Σ_k ‖d_ik‖²/τ²_ik, Efron & Morris 1973, Sec. 2; Baranchik 1964): about 0 for a client of the
    pool's population, about 1 for a distinct domain — and about 0 for a class the client holds
    (nearly) none of: a class whose noisy count is at the floor (:func:`_moments`, two count-noise
    stds) is not resolved — its "mean" is mostly the client's noisy overall mean — so it keeps the
    pool's mean and takes no part in the test. One factor for all classes, floored ones included, was
    the previous rule: on 100 Fashion-MNIST clients of ~420 records at ε = 1 it gave every client
    f > 0 (up to 0.96), moved the classes a client barely holds by up to 10 (unit-sphere units) and
    left the mixture's validation MMD² at 0.11 (0.014 now; benchmarks/results/client_shrinkage.md,
    "100 clients").

    With client centres, ``clip_shift`` (:class:`ClipShift`) is the part of d_ik that clipping around
    the client's own centre explains under the pool; the test uses d_ik − b_ik (the shrunk means keep
    d). The client's class means move by f_ik, μ' = μ + f_ik d; its covariance and total variance by
    the count-weighted factor f_i = Σ_k n_ik f_ik / Σ_k n_ik: C' = T + f_i (C_i − T),
    v' = tr T + f_i (v_i − tr T), with T the pooled within-class covariance plus the between-class part
    of the client's shrunk means (:func:`_shrunk_cov`; the pooled total covariance where the pool
    keeps its between-class scatter) (noise variance per off-diagonal entry f_i² v_i + (1 − f_i)² v,
    per coordinate of class mean k f_ik² τ²_DP,ik + (1 − f_ik)² τ²_pool,k: at A_i = 0 the client's
    Gaussian is the pooled one). Post-processing of DP outputs (no ε). Without DP noise the client's
    own moments are returned (f = 1, as :func:`shrink_toward`): on the Fashion-MNIST validation split
    pulling exact statistics to the pool cost 0.026 TSTR (benchmarks/results/client_shrinkage.md). The
    clip-shift correction was measured on the validation splits: benchmarks/results/release_defaults.md,
    "client statistics, clip shift".

    Both dicts come from :func:`_moments`; returns a new one of the same form with ``mean_shrinkage``
    (f_ik, [K] float64) and ``cov_shrinkage`` (f_i).
    """
    out = dict(client)
    cm, pm = client["class_means"].to(torch.float64), pooled["class_means"].to(torch.float64)
    d = cm - pm  # [K, D]
    # the test discounts the part of the deviation that the client's clipping explains under the pool
    # (ClipShift.relative); the shrunk means keep the client's own deviation d
    dt = d if clip_shift is None else d - clip_shift
    k, dim = d.shape
    if not float(client["sums_noise_var"]) > 0:  # no DP: the client's own statistics (as shrink_toward)
        out["mean_shrinkage"] = torch.ones(k, dtype=torch.float64)
        out["cov_shrinkage"] = 1.0
        return out
    n_i = client["counts"].to(torch.float64)
    n_pool = pooled["counts"].to(torch.float64)
    w = n_pool / n_pool.sum()
    dev = pm - pooled["mean"].to(torch.float64)
    between = float((w * (dev.pow(2).sum(1) - dim * pooled["sums_noise_var"] / n_pool ** 2)).sum())
    total = float(pooled["var"])
    s2 = max(total - max(between, 0.0), 0.25 * total) / dim
    tau2 = client["sums_noise_var"] / n_i ** 2 + s2 / n_i  # [K]
    # a class whose noisy count is at the floor (2 count-noise stds) is not resolved: its mean carries the
    # client's noisy overall mean (_moments), not its records; it keeps the pool's and takes no part in the test
    resolved = client["counts"].to(torch.float64) > float(client.get("counts_floor", 0.0))
    a = paule_mandel(dt[resolved].pow(2).sum(1) / dim, tau2[resolved]) if bool(resolved.any()) else 0.0
    f = torch.where(resolved, a / (a + tau2), torch.zeros_like(tau2))  # [K]
    out["class_means"] = (pm + f[:, None] * d).to(torch.float32)
    # the noise of the shrunk class means, per coordinate f²·τ²_DP,ik + (1 − f)²·τ²_pool,k, expressed as a
    # per-class sum noise variance over the client's counts (what _within_class reads): at A = 0 the
    # client's Gaussian is the pooled one, within-class decision included
    mean_noise = f ** 2 * client["sums_noise_var"] / n_i ** 2 + (1.0 - f) ** 2 * pooled["sums_noise_var"] / n_pool ** 2
    out["sums_noise_var"] = n_i ** 2 * mean_noise  # [K]
    wi = n_i / n_i.sum()
    out["mean"] = (wi @ (pm + f[:, None] * d)).to(torch.float32)
    out["mean_shrinkage"] = f
    f_cov = float(wi @ f)
    if client["cov"] is not None and pooled["cov"] is not None:
        out["cov"], out["var"] = _shrunk_cov(client, pooled, out, f_cov)
        out["offdiag_var"] = f_cov ** 2 * float(client["offdiag_var"]) + (1.0 - f_cov) ** 2 * float(pooled["offdiag_var"])
    out["cov_shrinkage"] = f_cov
    return out


def covariance_factor(client: dict, pooled: dict, shrunk: dict) -> float:
    """The positive-part James–Stein factor of a client's covariance against its target, DP *and* sampling noise.

    :func:`shrink_client` moves the covariance by the count-weighted share f_i of its class means' deviations,
    a test of the *means*. This one tests the covariance itself: with T the target of :func:`_shrunk_cov`
    (the pooled within-class covariance plus the client's between-class scatter) and Q = ‖C_i − T‖²_F,

        f_c = max(0, 1 − (D(D + 1)(v_i + v) + (tr(S)² + tr(S²))/n_i) / Q)

    (James & Stein 1961, positive part Baranchik 1964; the form of :func:`shrink_toward`'s covariance factor
    plus the sampling error of a covariance estimated from n_i records, E‖Ŝ − S‖²_F ≈ (tr(S)² + tr(S²))/n_i for
    Gaussian records, Anderson 2003, Sec. 3.4; S the pooled within-class covariance, v_i and v the noise
    variance of an off-diagonal entry of the client's and the pool's release). Post-processing of DP outputs.

    Args:
        client, pooled: dicts of :func:`_moments` (with ``cov``); shrunk: :func:`shrink_client`'s output for
            the client (its shrunk class means set the target's between-class part).

    Returns:
        f_c in [0, 1] (1 without DP noise or without second moments).
    """
    if client["cov"] is None or pooled["cov"] is None or not float(client["sums_noise_var"]) > 0:
        return 1.0
    target, _ = _shrunk_cov(client, pooled, shrunk, 0.0)
    q = float((client["cov"].to(torch.float64) - target.to(torch.float64)).pow(2).sum())
    dim = int(target.shape[0])
    within = _within_of(pooled)[0].to(torch.float64)
    n_i = max(float(client["counts"].to(torch.float64).sum()), 1.0)
    noise = (dim * (dim + 1) * (float(client["offdiag_var"]) + float(pooled["offdiag_var"]))
             + (float(torch.trace(within)) ** 2 + float(within.pow(2).sum())) / n_i)
    return max(0.0, 1.0 - noise / q) if q > 0 else 0.0


def shrink_client_cov(client: dict, pooled: dict, clip_shift: "torch.Tensor | None" = None) -> dict:
    """:func:`shrink_client`, with the covariance moved by the smaller of its factor f_i and the covariance's own
    test :func:`covariance_factor` (``model.client_shrinkage = "client-cov"``).

    On Fashion-MNIST (10 Dirichlet clients: label skew only) every client's covariance is within its noise
    (f_c = 0), while the means' test leaves f_i up to 0.5; pooling them lifts the mixture's validation precision /
    coverage at ε = 4 from 0.16 / 0.50 to 0.40 / 0.65 for 0.006 less TSTR (0.762 → 0.756; at ε = 8 0.37 / 0.67 →
    0.40 / 0.69, TSTR 0.780 → 0.779); on the digits domains TSTR moves by at most 0.001 and
    precision / coverage at ε = 8 fall from 0.48 / 0.61 to 0.44 / 0.55 (3 seeds;
    benchmarks/results/release_defaults.md, "client covariance test"). Not the default: it trades TSTR for
    fidelity where the clients differ by label skew only.
    Returns the dict of :func:`shrink_client` with ``cov_shrinkage`` the factor used.
    """
    out = shrink_client(client, pooled, clip_shift)
    if client["cov"] is None or pooled["cov"] is None or not float(client["sums_noise_var"]) > 0:
        return out
    f_i = float(out["cov_shrinkage"])
    f = min(f_i, covariance_factor(client, pooled, out))
    if f < f_i:
        out["cov"], out["var"] = _shrunk_cov(client, pooled, out, f)
        out["offdiag_var"] = f ** 2 * float(client["offdiag_var"]) + (1.0 - f) ** 2 * float(pooled["offdiag_var"])
        out["cov_shrinkage"] = f
    return out


#: ``model.client_shrinkage`` values (:data:`fedhype.models.config.CLIENT_SHRINKAGE`) → the shrinkage of a
#: client's moments (None: its own release)
SHRINKAGE = {"none": None, "class": shrink_toward, "client": shrink_client, "client-cov": shrink_client_cov}
assert tuple(SHRINKAGE) == CLIENT_SHRINKAGE


def shrinkage_mode(value) -> str:
    """``model.client_shrinkage`` as one of :data:`SHRINKAGE`'s names (False → none, True → class)."""
    if value is True or value is False:
        return "class" if value else "none"
    return str(value)


#: the James–Stein factor of the class means above which the between-class scatter is subtracted
#: from the total covariance (:func:`_within_class`; chosen on the digits validation split)
WITHIN_CLASS_MIN_SNR = 0.9


def _within_class(cov: torch.Tensor, total_variance: float, deviations: torch.Tensor, counts: torch.Tensor,
                  sum_noise_var: float) -> tuple[torch.Tensor, float]:
    """The covariance the class-conditional samples get: within-class when the class means are precise.

    With the between-class scatter B = Σ_k w_k d_k d_kᵀ of the DP class-mean deviations d_k (weights
    w_k ∝ noisy counts) and t² = Σ_k w_k · (noise variance per coordinate of class mean k), the
    James–Stein factor f = 1 − D·t²/tr B (Efron & Morris 1973) measures how much of B is signal. For
    f ≥ :data:`WITHIN_CLASS_MIN_SNR` the debiased between-class scatter f·(B − t² I) is subtracted
    (within-class covariance, as a Gaussian fit on exact statistics would); below it the total
    covariance is kept: subtracting a noisy B removes variance in directions where only noise
    separates the classes, and a classifier trained on such samples relies on that noise. Digits
    validation split, 3 seeds (benchmarks/results/release_defaults.md, "within-class threshold"):
    always subtracting gives TSTR 0.568 / 0.619 at ε = 4 / 8 against 0.570 / 0.628 with this
    threshold, and never subtracting 0.786 without DP against 0.849.

    When the debiased scatter would leave less than :data:`MIN_TOTAL_VARIANCE` of the total variance
    (a small client's noisy class means at small ε), the total covariance is kept as below the threshold.

    Returns ``(covariance [D, D], its trace)`` float64.
    """
    sub = _between_part(deviations, counts, sum_noise_var)
    if sub is None:
        return cov, total_variance
    within = total_variance - float(torch.trace(sub))
    if within < MIN_TOTAL_VARIANCE * total_variance:  # the noisy scatter holds (nearly) all the variance: a small
        return cov, total_variance  # client's noise, not its classes; a negative trace had made log σ² NaN
    return cov - sub, within


def _between_snr(deviations: torch.Tensor, counts: torch.Tensor, sum_noise_var) -> tuple[torch.Tensor, float, float]:
    """The between-class scatter B [D, D] float64, t² and the James–Stein factor f = 1 − D·t²/tr B (:func:`_within_class`)."""
    dim = deviations.shape[1]
    w = counts / counts.sum()
    between = (deviations.T * w) @ deviations
    t2 = float((w * sum_noise_var / counts ** 2).sum())
    tb = float(torch.trace(between))
    return between, t2, (1.0 - dim * t2 / tb if tb > 0 else 0.0)


def _between_part(deviations: torch.Tensor, counts: torch.Tensor, sum_noise_var) -> "torch.Tensor | None":
    """What :func:`_within_class` subtracts: f·(B − t² I) [D, D] float64, or None below the threshold."""
    between, t2, f = _between_snr(deviations, counts, sum_noise_var)
    if f < WITHIN_CLASS_MIN_SNR:
        return None
    return f * (between - t2 * torch.eye(between.shape[0], dtype=between.dtype))


def class_mean_snr(mo: dict) -> float:
    """The James–Stein factor F = 1 − D·t²/tr B of the DP class means of moments ``mo`` (:func:`_moments`).

    B = Σ_k w_k d_k d_kᵀ is the scatter of the class means' deviations d_k from the mean (w_k ∝ the noisy
    counts) and t² = Σ_k w_k · (noise variance per coordinate of class mean k), so F estimates the share of
    the class means' spread that is signal (Efron & Morris 1973): 1 without DP noise, lower as the noise
    grows (digits: 0.37 / 0.89 / 0.96 at ε = 1 / 4 / 8). Clipped at 0, the positive-part estimator: a release
    whose noise exceeds the spread of its class means (tiny clients at ε = 1) has F = 0, not a negative share.
    Computed from released statistics only (post-processing, no ε). The threshold of :func:`_within_class` and
    of :func:`resolve_located_share`.
    """
    m64 = mo["mean"].to(torch.float64)
    return max(0.0, float(_between_snr(mo["class_means"].to(torch.float64) - m64, mo["counts"].to(torch.float64),
                                       mo["sums_noise_var"])[2]))


def resolve_located_share(share, mo: dict, max_rank: int | None = None) -> float:
    """``model.located_share`` as a number: itself, or for ``"auto"`` the rule below on moments ``mo``.

    ``"auto"`` is :data:`~fedhype.models.config.AUTO_LOCATED_SHARE` (0.8) where the release is noisy (under
    DP), its class means are precise — :func:`class_mean_snr` F ≥ :data:`~fedhype.models.config.AUTO_SHARE_MIN_SNR`
    (0.94) —, it locates at most :data:`~fedhype.models.config.AUTO_SHARE_MAX_LOCATED` (20) covariance directions
    (:func:`located_rank`); 0 otherwise. Why (docs/method.md, decision
    16; validation splits, benchmarks/results/release_defaults.md, "located share, auto"): s = 0.8 lifts precision
    and coverage from ≈ 0.01 to 0.3–0.5 where it applies, at no TSTR cost; it costs TSTR where the class means are
    noisy (digits ε = 4 per client, F ≈ 0.89) and where the release already locates many directions (Fashion-MNIST
    with secure aggregation at ε = 8, r = 27). On all 70,000 Fashion-MNIST images the rule turns it on only at ε = 1
    with 10 clients (F 0.988, r 11-13: ours +0.004) and at ε = 4 with 100 clients (F 0.989, r 12-14: level; the
    release alone +0.003) ("located share, scale"). Post-processing of DP outputs (no ε);
    every client's Gaussian takes the pool's share (``mo`` = the pooled moments).

    Args:
        share: ``"auto"`` or s ∈ [0, 1]. mo: :func:`_moments` of the pooled release. max_rank: the latent size L
            (caps r as :func:`covariance_estimate` does).

    Returns:
        the share s ∈ [0, 1] (float).
    """
    if share != "auto":
        return float(share)
    noisy = float(torch.as_tensor(mo["sums_noise_var"], dtype=torch.float64).max()) > 0
    if not noisy or mo.get("cov") is None:
        return 0.0
    if class_mean_snr(mo) < AUTO_SHARE_MIN_SNR:
        return 0.0
    cov, _ = _within_of(mo)
    return AUTO_LOCATED_SHARE if located_rank(cov, mo["offdiag_var"], max_rank) <= AUTO_SHARE_MAX_LOCATED else 0.0


def located_rank(cov: torch.Tensor, noise_var: float, max_rank: int | None = None, margin: float = 1.05) -> int:
    """r: the eigenvalues of the noisy covariance ``cov`` [D, D] above the Wigner noise edge 2√(vD) × ``margin``,
    at most ``max_rank`` (default D − 1); D − 1 (or ``max_rank``) without noise (:func:`covariance_estimate`)."""
    lam = torch.linalg.eigvalsh((cov + cov.T) / 2) if noise_var > 0 else None
    return _spikes(lam, noise_var, cov.shape[0], max_rank, margin)[0]


def _spikes(lam: "torch.Tensor | None", noise_var: float, dim: int, max_rank: int | None,
            margin: float) -> tuple[int, int, float]:
    """``(r, cap, edge)``: the eigenvalues ``lam`` above ``margin`` × the Wigner edge 2√(vD), at most the cap
    (``max_rank``, default D − 1); the cap itself without noise."""
    edge = 2.0 * math.sqrt(max(noise_var, 0.0) * dim)
    cap = dim - 1 if max_rank is None else max(0, min(int(max_rank), dim - 1))
    rank = min(int((lam > margin * edge).sum()), cap) if noise_var > 0 else cap
    return rank, cap, edge


def covariance_estimate(cov: torch.Tensor, total_variance: float, noise_var: float, *,
                        max_rank: int | None = None, margin: float = 1.05,
                        residual: str = DEFAULT_RESIDUAL,
                        located_share: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Low-rank-plus-isotropic covariance from a noisy covariance matrix (unit-sphere space).

    ``C = M/N − m mᵀ`` (minus the between-class scatter, :func:`_within_class`) carries symmetric
    Gaussian noise with off-diagonal variance v per entry: its eigenvalues spread over a semicircle
    of radius 2√(vD) (Wigner), so only eigenvalues above that edge (× ``margin``) are signal. Each
    kept eigenvalue λ is debiased to the spike strength θ = (λ + √(λ² − 4vD))/2 (spiked Wigner
    model, Benaych-Georges & Nadakuditi 2011, Sec. 3.1: a spike θ > √(vD) appears at λ = θ + vD/θ).
    The remaining variance U = ``total_variance − Σθ`` (the trace of C is known from the unit norms:
    tr C = 1 − ‖m‖²) is the variance the release cannot locate. ``residual`` says where it goes:

    * ``"isotropic"``: spread evenly over the other D − r directions (probabilistic PCA's isotropic
      residual, Tipping & Bishop 1999, eq. 8);
    * ``"latent"`` (with ``max_rank`` = the model's latent size L): into the model's L − r free latent
      directions first, along the next eigenvectors u_j (j = r … L − 1) of the noisy C, each with
      variance ∝ max(λ_j, 0) and at most λ_j; only what is left (nothing, under DP noise, where those
      λ_j sum to more than U) spreads evenly over the last D − L directions. The trace is kept either
      way. Ours (docs/method.md, decision 14): below the edge an eigenvector's overlap with the signal
      is small but not zero at finite D, and the unlocated variance put along those directions instead
      of all D − r gave, on the validation splits (3 seeds; benchmarks/results/release_defaults.md,
      "unlocated variance"), TSTR −0.010 / +0.013 / +0.018 at ε = 1 / 4 / 8 for the release alone
      (dp-gaussian) and −0.001 / +0.006 / +0.015 for ours on digits, +0.009 / +0.011 / +0.005 and
      +0.003 / +0.004 / −0.004 on Fashion-MNIST. It does not raise precision or coverage: the samples
      still leave the few located directions.

    * ``"located"``: into the r located spikes, each scaled by (Σθ + U)/Σθ, the residual at its floor
      (isotropic where no spike is located). Every sample then lies near the few directions the release
      resolved: precision and coverage rise (digits test split, ε = 4: 0.006 / 0.010 → see
      benchmarks/results/residual_located.md) at a cost in recall and TSTR. An option for users who need
      samples on the data's manifold, not the default.

    Without noise (v = 0) r = ``max_rank`` (every direction is located) and ``"latent"`` and
    ``"isotropic"`` agree (``"located"`` moves the last D − L directions' variance into the L).

    * ``located_share`` s > 0 (``model.located_share``) with ``"latent"`` (explicit or from ``"auto"``): a
      share s of U first goes on the located spikes (each scaled by (Σθ + sU)/Σθ), the rest as
      ``"latent"``; s = 1 is ``"located"``. Ours at s = 0.95, digits test split, 3 seeds
      (benchmarks/results/located_share_test.md): precision / coverage 0.008 / 0.012 → 0.366 / 0.499 at
      ε = 4 and 0.018 / 0.032 → 0.645 / 0.813 at ε = 8, TSTR −0.018 / −0.005, recall 0.87 / 0.91 →
      0.44 / 0.40 (the release alone: TSTR −0.050 / −0.004). ``model.located_share = "auto"`` (the default)
      is s = 0.8 where the class means are precise and few directions are located, else 0
      (:func:`resolve_located_share`, docs/method.md decision 16); this function takes the resolved number.

    * ``"auto"`` (the default): ``"located"`` when the release resolves at least half the latent
      directions (r ≥ :data:`fedhype.models.config.AUTO_LOCATED_FRACTION` · ``max_rank``; always without DP, where r =
      ``max_rank``), ``"latent"`` below. Without DP the located rule gave ours validation TSTR 0.848 →
      0.864 (digits) and 0.808 → 0.814 (Fashion-MNIST), the release alone 0.850 → 0.847 and 0.808 → 0.806
      (3 seeds; benchmarks/results/release_defaults.md, "unlocated variance, no DP"). Under DP the
      release resolves r = 4 / 10 / 14 of L = 64 directions on digits and 4 / 7 / 11 on Fashion-MNIST
      (10,000 images) at ε = 1 / 4 / 8, where ``"latent"`` is the better rule, and 11 / 35 / 55 on all
      70,000 Fashion-MNIST images (42,000 training records), where ``"located"`` gave the release alone
      0.774 → 0.776 / 0.781 → 0.796 / 0.781 → 0.799 ("unlocated variance, scale"). The located rule
      holds for L ≤ :data:`fedhype.models.config.DP_LATENT` = 64 only: with the larger latent of a
      large training set (L = 128, :data:`fedhype.models.config.SCALE_LATENT`) ``"latent"`` scored at or
      above ``"located"`` in all 6 validation cells on all 70,000 images, also where the secure-
      aggregation release resolves ≥ 64 directions (0.804 vs 0.793 and 0.803 vs 0.789 at ε = 4 / 8;
      benchmarks/results/release_scale.md, "where the unlocated variance goes"), so ``"auto"`` is
      ``"latent"`` there.

    Args:
        cov: float64 [D, D] (symmetrised here). total_variance: its trace as known from the release.
        noise_var: v, the variance of the noise on each off-diagonal entry of ``cov`` (0 without DP).
        max_rank: largest number of factor columns (the model's latent size; default D − 1).
        residual: ``"auto"``, ``"latent"``, ``"isotropic"`` or ``"located"`` (:data:`fedhype.models.config.RESIDUALS`).
        located_share: s ∈ [0, 1], used where the rule is ``"latent"`` (explicit or from ``"auto"``).

    Returns:
        ``(factor [D, k], residual []), r`` in unit-sphere units with covariance ``factor·factorᵀ +
        residual·I`` (factor columns are u_j·√(θ_j − residual)), float64; r ≤ k: the located spikes.

    Raises:
        ValidationError: an unknown ``residual``.
    """
    if residual not in RESIDUALS:
        raise ValidationError(f"model.residual must be one of {list(RESIDUALS)}, got {residual!r}")
    auto = residual == "auto"
    dim = cov.shape[0]
    c = cov
    lam, vec = torch.linalg.eigh((c + c.T) / 2)
    lam, vec = lam.flip(0), vec.flip(1)
    rank, cap, edge = _spikes(lam, noise_var, dim, max_rank, margin)
    share = float(located_share)
    if auto:  # located once the release resolves at least half of an L ≤ 64 latent (always without DP)
        located = noise_var <= 0 or (cap <= DP_LATENT and rank >= AUTO_LOCATED_FRACTION * cap)
        residual = "located" if located else "latent"
    kept = lam[:rank]
    theta = (kept + (kept ** 2 - 4.0 * noise_var * dim).clamp_min(0).sqrt()) / 2 if noise_var > 0 else kept.clamp_min(0)
    floor = 1e-3 * max(float(total_variance), MIN_TOTAL_VARIANCE) / dim  # > 0 whatever the noisy trace
    unlocated = float(total_variance) - float(theta.sum())
    cols = rank
    def onto_spikes(amount: float) -> torch.Tensor:  # the located spikes scaled up to carry ``amount`` more
        return theta * (1.0 + amount / max(float(theta.sum()), 1e-300))

    if residual == "located" and rank > 0:  # all of it along the located spikes, in proportion to them
        theta = onto_spikes(max(unlocated, 0.0))
        unlocated = 0.0
    elif residual == "latent" and cap > rank:
        if share > 0 and rank > 0:  # a share of it along the located spikes first (model.located_share)
            moved = share * max(unlocated, 0.0)
            theta = onto_spikes(moved)
            unlocated -= moved
        free = lam[rank:cap].clamp_min(0)
        theta = torch.cat([theta, free * min(1.0, max(unlocated, 0.0) / max(float(free.sum()), 1e-300))])
        unlocated -= float(theta[rank:].sum())
        cols = cap
    resid = max(unlocated / max(dim - cols, 1), floor)
    factor = vec[:, :cols] * (theta - resid).clamp_min(0).sqrt()
    return factor, torch.tensor(resid, dtype=torch.float64), rank


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
        pooled = release_moments(updates, dp, weights, centring, rescale)
        shrink = shrinkage_mode(getattr(cfg, "client_shrinkage", False))
        cens = _per_release(centring, len(updates))
        # client centres (each client clipped around its own): the "client" test discounts the clip shift
        distinct = len({id(cen) for cen in cens}) > 1 and all(cen is not None for cen in cens)
        shifts = ClipShift(pooled, cens, [u.tensors["class_counts"] for u in updates], rescale) \
            if shrink in ("client", "client-cov") and distinct and pooled["cov"] is not None and dp.enabled and dp.noise_multiplier else None
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
    located share used (``model.located_share = "auto"`` resolved, :func:`resolve_located_share`), the class
    means' James–Stein factor F it was chosen from and the number r of covariance directions the release
    located (:func:`covariance_estimate`); empty without second moments. Public: functions of DP outputs."""
    share, snr, directions = RELEASE_NOTE_KEYS
    out = {k: round(float(stats[k]), 6) for k in (share, snr) if k in stats}
    if "rank" in stats:
        out[directions] = int(stats["rank"])
    return out


def release_moments(updates, dp, weights, centring=None, rescale: float = 1.0) -> dict:
    """:func:`_moments` of ``updates`` with the noise levels of the release settings (``dp``, ``weights``)."""
    std = release_noise(dp, weights)
    return _moments(updates, std["class_counts"], sums_std=std["class_sums"], second_moment_std=std["second_moment_offdiag"],
                    centring=centring, rescale=rescale)


def client_gaussian(update: PrivatizedUpdate, pooled: dict, dp, weights, max_rank: int | None = None, *,
                    shrink: bool | str = True, centring=None, residual: str = DEFAULT_RESIDUAL,
                    clip_shift: "torch.Tensor | None" = None,
                    located_share: float = 0.0, rescale: float = 1.0) -> dict[str, torch.Tensor]:
    """Client ``update``'s own DP class-conditional Gaussian, unit-sphere units (float64).

    ``clip_shift`` (``"client"`` shrinkage only): :meth:`ClipShift.relative` of the client's centring,
    [K, D] float64, removed from its class means before they are compared with the pool's.

    ``pooled``: :func:`release_moments` of every client's release. ``shrink`` (``model.client_shrinkage``):
    ``"class"`` (or True) first shrinks the client's moments toward the pooled ones class by class
    (:func:`shrink_toward`), ``"client"`` class by class from the client's signal variance (:func:`shrink_client`);
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
        mo = SHRINKAGE[mode](mo, pooled, clip_shift) if mode in ("client", "client-cov") else SHRINKAGE[mode](mo, pooled)
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
                 rescale: float = 1.0) -> dict[str, torch.Tensor]:
    """:func:`aggregate_class_stats` with the noise levels of the release settings (``dp``, ``weights``)."""
    std = release_noise(dp, weights)
    return aggregate_class_stats(updates, std["class_counts"], sums_std=std["class_sums"],
                                 second_moment_std=std["second_moment_offdiag"], max_rank=max_rank, centring=centring,
                                 residual=residual, located_share=located_share, rescale=rescale)


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
    deviations follow at σ_B = σ₀/√(1 − s) — together the cost of one release at σ₀. Both are
    charged write-ahead before either runs; the centres are saved the moment they arrive, so a run
    interrupted between the steps (a Flower node killed during the statistics step) reuses them on its resume
    and releases — and is charged for — the statistics step alone (again, unless seeded). ``release_centre`` (``train.release_centre``) says around
    which centre each client clips: ``"client"`` its own DP centre pulled toward the pooled one, with
    one common radius (:func:`fedhype.privacy.centring.client_centrings`), ``"pooled"`` the pooled one
    (:func:`~fedhype.privacy.centring.centring_from`), ``"auto"`` client centres except under secure
    aggregation, where the server sees only the sum of the centre releases. A ``local-cvae`` server
    centres each client on its own centre release and radius (each client is a model of its own).

    ``budget_check``: called with the release's pending ledger events (what this call would charge) before
    anything is charged; it raises :class:`~fedhype.errors.BudgetExceededError` to refuse (``train.max_epsilon``
    on a resume that re-releases: :func:`fedhype.federated.engine.release_statistics`).

    ``outputs``: where the clients' released updates (centres and statistics: public DP outputs) are saved the
    moment they arrive, before the server's post-processing (:func:`save_release_outputs`); with
    ``reuse_outputs`` (the engine's resume of a run whose release was charged) a file already there is read back
    instead of asking the clients again — nothing is charged or released a second time. Under in-process secure
    aggregation the server keeps only the sums it received (:func:`save_secure_outputs`), reused the same way, in
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
    # the statistics step is released — and charged — again (a Flower node killed during the statistics step)
    only_stats = kept is not None and kept[1] is None
    if dp.enabled and (kept is None or only_stats):
        stats_note = (f"{what}; weights (a, b, c) = {[round(w, 6) for w in weights.as_list()]}"
                      + (f"; centred, clip radius {radius:g} × the DP spread" if centred else "") + split)
        centre_note = f"sum and count of the unit records (the release's centre){split}"
        if only_stats:
            events = release_events([c.id for c in clients], steps[-1:], [MECHANISM], RELEASE_SENSITIVITY, [stats_note])
        else:
            events = release_events([c.id for c in clients], steps if centred else [(float(dp.noise_multiplier), 1.0, 1)],
                                    [centring_mod.MECHANISM, MECHANISM] if centred else [MECHANISM], RELEASE_SENSITIVITY,
                                    [centre_note, stats_note] if centred else [stats_note])
        pending = pending_charges(ledger, events, replays=lambda e: seeded)
        if budget_check is not None:
            budget_check(pending)
        charge(ledger, pending, ledger_path)
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
            agg = secure_sum([c.release_class_stats(n_classes, dp, weights, distributed=distributed, centring=cen)
                              for c in clients], distributed)
            if outputs is not None and dp.enabled:  # saved before the post-processing: a resume reuses them
                save_secure_outputs(outputs, cen_sum, agg)
        g = clip_rescale_factor(agg, cen) if rescaled else 1.0
        stats = pooled_stats(agg, dp, weights, rank_cap, cen, residual, share, g)  # the sum only
        apply_class_stats(server.hnet, stats)
        server.release_notes = release_notes(stats)
        return None
    if kept is not None:  # a resume: the updates the clients released before the interruption (charged then)
        centres, updates = kept
    else:
        centres = [c.release_centre(sigma_a) for c in clients] if centred else []
        updates = None
        if centred and outputs is not None:  # saved the moment they arrive: a resume after them releases the rest only
            save_release_outputs(outputs, centres, [])
    if centred:
        if parts is not None:
            cens = [centring_mod.centring_from([u], radius) for u in centres]
        elif release_centre == "pooled":
            cens = [centring_mod.centring_from(centres, radius)] * len(clients)
        else:
            cens = centring_mod.client_centrings(centres, radius, sigma_a)
    else:
        cens = [None] * len(clients)
    if updates is None:
        updates = release_all_class_stats(clients, n_classes, dp, weights, cens)
        if outputs is not None and dp.enabled:  # saved before the (slower) post-processing: a resume reuses them
            save_release_outputs(outputs, centres, updates)
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
        stats = pooled_stats(updates, dp, weights, rank_cap, cens, residual, share, g)
        apply_class_stats(server.hnet, stats)
        server.release_notes = release_notes(stats)
        if server.hnet.cfg.client_heads:  # h(c_i) = client i's own DP Gaussian
            fit = apply_client_stats(server.hnet, server.codes, updates, dp, weights, rank_cap, cens, g)
            # the shrinkage rule and, per client, the share of its own class means (mean over classes) and
            # covariance it kept (release.json: post-processing of DP outputs; a probe could not tell the rules apart)
            server.release_notes.update({k: fit[k] for k in ("client_shrinkage", "client_mean_shrinkage",
                                                             "client_cov_shrinkage") if k in fit})
    return counts


def _has_centre(saved) -> bool:
    """Whether saved release outputs hold a centre: a non-empty list of centre updates, or a centre's sum."""
    return saved is not None and (not isinstance(saved, list) or len(saved) > 0)


def save_release_outputs(path: Path, centres: list[PrivatizedUpdate], updates: list[PrivatizedUpdate]) -> None:
    """Write the clients' released updates (their tensors and public metadata; atomic safetensors)."""
    import json

    from fedhype.io import atomic_save_tensors

    tensors, meta = {}, []
    for kind, us in (("centre", centres), ("stats", updates)):
        for i, u in enumerate(us):
            tensors.update({f"{kind}.{i}.{k}": v for k, v in u.tensors.items()})
            meta.append({"kind": kind, "index": i, "client": u.client, "steps": u.steps,
                         "noise_multiplier": u.noise_multiplier, "clip_norm": u.clip_norm,
                         "sample_rate": u.sample_rate, "private": u.private})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_tensors(path, tensors, {"fedhype_release_outputs": json.dumps(meta)})


def load_release_outputs(path: Path, clients) -> "tuple[list[PrivatizedUpdate], list[PrivatizedUpdate]] | None":
    """The ``(centres, updates)`` :func:`save_release_outputs` wrote, or None when there is no such file or it is
    not these clients' (then the release runs again). Each update is re-typed with
    :meth:`~fedhype.privacy.dp_step.PrivatizedUpdate.from_wire` (names, shapes, finiteness and metadata checked).

    Raises:
        ArtifactError: the file exists but is unreadable or was modified after it was written.
    """
    import json

    from fedhype.io import load_tensors, tensor_metadata

    if path is None or not Path(path).exists():
        return None
    t = load_tensors(path, what="released statistics (the clients' updates)")
    meta = json.loads(tensor_metadata(path).get("fedhype_release_outputs", "[]"))
    out: dict[str, list] = {"centre": [], "stats": []}
    if any(m.get("kind") not in out for m in meta):  # a secure-aggregation sum (save_secure_outputs), not updates
        return None
    for m in sorted(meta, key=lambda m: (m["kind"], m["index"])):
        p = f"{m['kind']}.{m['index']}."
        tensors = {k[len(p):]: v for k, v in t.items() if k.startswith(p)}
        out[m["kind"]].append(PrivatizedUpdate.from_wire(
            client=m["client"], tensors=tensors, like=tensors, steps=m["steps"], noise_multiplier=m["noise_multiplier"],
            clip_norm=m["clip_norm"], sample_rate=m["sample_rate"], private=m["private"]))
    ids = [str(c.id) for c in clients]
    if out["centre"] and [u.client for u in out["centre"]] != ids:
        return None
    if not out["stats"]:  # saved between the steps: the centres alone (None when there is nothing)
        return (out["centre"], None) if out["centre"] else None
    if [u.client for u in out["stats"]] != ids:
        return None
    return out["centre"], out["stats"]


def save_secure_outputs(path: Path, centre_sum, stats_sum) -> None:
    """Write the sums a secure-aggregation release gave the server (``centre_sum`` None for an uncentred release):
    their tensors and public metadata (contributors, the noise plan, σ₀), atomic safetensors. The server holds
    only these sums (public DP outputs), never a client's own update."""
    import json

    from fedhype.io import atomic_save_tensors

    tensors, meta = {}, []
    for part, agg in (("centre", centre_sum), ("stats", stats_sum)):
        if agg is None:
            continue
        tensors.update({f"{part}.sum.{k}": v for k, v in agg.tensors.items()})
        meta.append({"kind": "secure", "part": part, "contributors": list(agg.contributors),
                     "clients": agg.noise.clients, "dropout_tolerance": agg.noise.dropout_tolerance,
                     "noise_multiplier": agg.noise_multiplier, "private": agg.private})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_tensors(path, tensors, {"fedhype_release_outputs": json.dumps(meta)})


def load_secure_outputs(path: Path, clients, noise) -> "tuple[object, object] | None":
    """The ``(centre_sum, stats_sum)`` :func:`save_secure_outputs` wrote (``centre_sum`` None if uncentred), rebuilt
    by :func:`fedhype.privacy.secure_agg.restore_sum`; None when there is no such file or it is not a sum of these
    clients under this noise plan ``noise`` (then the release runs again).

    Raises:
        ArtifactError: the file exists but is unreadable or was modified after it was written.
        SecureAggregationError: the saved sum is damaged (too few contributors, non-finite entries).
    """
    import json

    from fedhype.io import load_tensors, tensor_metadata
    from fedhype.privacy.secure_agg import restore_sum

    if path is None or not Path(path).exists():
        return None
    t = load_tensors(path, what="released statistics (the secure-aggregation sums)")
    meta = json.loads(tensor_metadata(path).get("fedhype_release_outputs", "[]"))
    ids = {str(c.id) for c in clients}
    out: dict = {}
    for m in meta:
        if (m.get("kind") != "secure" or (m["clients"], m["dropout_tolerance"]) != (noise.clients, noise.dropout_tolerance)
                or not set(m["contributors"]) <= ids):
            return None
        p = f"{m['part']}.sum."
        out[m["part"]] = restore_sum({k[len(p):]: v for k, v in t.items() if k.startswith(p)}, m["contributors"],
                                     noise, m["noise_multiplier"], m["private"])
    if "stats" not in out:  # saved between the steps: the centre's sum alone
        return (out["centre"], None) if "centre" in out else None
    return out.get("centre"), out["stats"]


def release_all_class_stats(clients, n_classes: int, dp, weights, centrings) -> list[PrivatizedUpdate]:
    """Every client's class-statistics release, client i around ``centrings[i]`` (each client asked once).

    Clients whose type offers ``release_class_stats_all`` (the Flower grid clients: one message to
    every node) release through it; in-process clients one by one.
    """
    batch = getattr(type(clients[0]), "release_class_stats_all", None) if clients else None
    if batch is not None:
        return batch(clients, n_classes, dp, weights, list(centrings))
    return [c.release_class_stats(n_classes, dp, weights, centring=cen) for c, cen in zip(clients, centrings)]


def client_space(server, index: int):
    """The model space (m, s) client ``index`` trains in."""
    parts = getattr(server, "servers", None)
    return (parts[index] if parts is not None else server).hnet.space()
