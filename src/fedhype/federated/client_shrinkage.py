"""Each client's own DP Gaussian, shrunk toward the pooled one (``model.client_shrinkage``; docs/method.md,
decision 11): James–Stein factors of a client's class means and covariance against their DP noise and sampling
error, and the clip shift of a client centred on its own centre.

Post-processing of the clients' privatized statistics (public DP outputs): no ε.
"""

from __future__ import annotations

import torch

from fedhype.federated.covariance import _between_part, _within_of


def _shrunk_cov(client: dict, pooled: dict, shrunk: dict, f: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The client's total covariance and variance moved a share ``f`` from a target toward its own.

    The target is the pooled *within-class* covariance plus the between-class scatter of the client's
    shrunk class means ``shrunk`` under its own class mix, so that :func:`fedhype.federated.covariance._within_class` (which subtracts
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
    :func:`fedhype.federated.class_stats._moments`; returns a new one of the same form (the client's mean is the count-weighted
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
        pooled: :func:`fedhype.federated.class_stats._moments` of every client's release (with second moments).
        centrings: each client's :class:`~fedhype.privacy.centring.Centring`, in client order.
        counts: each client's DP class counts, float [K], in client order.
        rescale: the clip rescale g the moments were mapped back with (:func:`fedhype.federated.class_stats.clip_rescale_factor`):
            a client's class mean is then c_i + g·E[clip_R(x − c_i)].
    """

    def __init__(self, pooled: dict, centrings: list, counts: list[torch.Tensor], rescale: float = 1.0):
        mu = pooled["class_means"].to(torch.float64)  # [K, D]
        cov, _ = _within_of(pooled)
        lam, vec = torch.linalg.eigh((cov + cov.T) / 2)
        root = vec * lam.clamp_min(0).sqrt()  # root·rootᵀ = C_within without its negative (noise) part
        g = torch.Generator().manual_seed(0)
        self._z = torch.randn(CLIP_SHIFT_DRAWS, mu.shape[1], generator=g, dtype=torch.float64) @ root.T  # [S, D]
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
        out = torch.empty_like(self._mu)
        for k in range(self._mu.shape[0]):  # one class at a time (draws μ_k + z): [S, D] temporaries, not [K, S, D]
            dev = (self._mu[k] + self._z).sub_(c)  # the same operations as before: results bit for bit
            dev.mul_(torch.clamp(r / dev.norm(dim=1, keepdim=True).clamp_min(1e-300), max=1.0))
            out[k] = dev.mean(0)
        return self._rescale * out + c - self._mu

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


def _deviations(client: dict, pooled: dict, clip_shift: "torch.Tensor | None") -> tuple:
    """What the heterogeneity tests of :func:`shrink_client` read (DP moments with noise): ``d`` [K, D] float64, the
    client's class means less the pool's; ``dt``, the same less the clip shift (the test's); ``tau2`` [K], the noise
    variance per coordinate of d_ik (DP and sampling); ``resolved`` [K] bool, the classes whose noisy count is above
    the floor; the client's and the pool's counts [K] float64."""
    cm, pm = client["class_means"].to(torch.float64), pooled["class_means"].to(torch.float64)
    d = cm - pm  # [K, D]
    # the test discounts the part of the deviation that the client's clipping explains under the pool
    # (ClipShift.relative); the shrunk means keep the client's own deviation d
    dt = d if clip_shift is None else d - clip_shift
    dim = d.shape[1]
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
    # compared in the counts' own dtype: a count floored at the float64 floor and stored as float32 can round above it
    # (float32(33.159968…) = 33.159969…), and then every floored class took part in the test (all 100 clients of a
    # label-skewed run at ε = 1 read as domains, mean f 0.20; benchmarks/results/release_defaults.md, "counts floor")
    counts = client["counts"]
    resolved = counts > torch.tensor(float(client.get("counts_floor", 0.0)), dtype=counts.dtype)
    return d, dt, tau2, resolved, n_i, n_pool


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
    (nearly) none of: a class whose noisy count is at the floor (:func:`fedhype.federated.class_stats._moments`, two count-noise
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

    Both dicts come from :func:`fedhype.federated.class_stats._moments`; returns a new one of the same form with ``mean_shrinkage``
    (f_ik, [K] float64) and ``cov_shrinkage`` (f_i).
    """
    out = dict(client)
    pm = pooled["class_means"].to(torch.float64)
    if not float(client["sums_noise_var"]) > 0:  # no DP: the client's own statistics (as shrink_toward)
        out["mean_shrinkage"] = torch.ones(client["class_means"].shape[0], dtype=torch.float64)
        out["cov_shrinkage"] = 1.0
        return out
    d, dt, tau2, resolved, n_i, n_pool = _deviations(client, pooled, clip_shift)
    dim = d.shape[1]
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


#: r: the leading eigenvectors of the pooled DP total covariance that form the first block of
#: :func:`shrink_client_subspace` (chosen on the validation splits among 16 / 32 / 64:
#: benchmarks/results/client_subspace.md)
SUBSPACE_RANK = 32


def shrink_client_subspace(client: dict, pooled: dict, clip_shift: "torch.Tensor | None" = None) -> dict:
    """:func:`shrink_client`, with the class-mean deviations shrunk per block of the pooled covariance's eigenbasis
    (``model.client_shrinkage = "subspace"``).

    :func:`shrink_client` gives each class of a client one factor f_ik = A_i/(A_i + τ²_ik) for all D coordinates,
    A_i the client's signal variance per coordinate averaged over all of them. A domain's offset from the pool
    lies mostly along the directions in which the data varies (it is part of the pooled total covariance), while
    the DP noise of the client's class sums is isotropic: averaged over D = 384 coordinates the signal is diluted,
    and f_ik (0.2–0.5 on the digits domains at ε = 1) keeps that share of the noise in every direction. Here the
    deviation d_ik = μ̂_ik − μ̂_k is split by the leading ``rank`` eigenvectors U of the pooled DP total covariance
    (post-processing of the release) into d_ik = U Uᵀ d_ik + (I − U Uᵀ) d_ik, and each block b (of D_b coordinates)
    gets its own signal variance A_ib (:func:`paule_mandel` on ‖P_b d_ik‖²/D_b, the same noise τ²_ik per
    coordinate) and factor f_ikb = A_ib/(A_ib + τ²_ik): the Bayes factor of :func:`shrink_client` with a prior
    variance per block (Efron & Morris 1975, Sec. 3), as James–Stein estimation per subspace of a fixed
    decomposition is (Efron & Morris 1973, Sec. 2). The means become μ' = μ̂_k + Σ_b f_ikb P_b d_ik; their noise
    variance per coordinate is the blocks' average of f² τ²_DP,ik + (1 − f)² τ²_pool,k. The covariance moves as in
    :func:`shrink_client` (by the count-weighted factor of its isotropic test).

    On the digits domains (validation split, mixture code, 3 seeds; benchmarks/results/client_subspace.md) the top
    block keeps f ≈ 0.8–0.97 and the rest ≈ 0; the mixture's MMD² falls at every ε at level TSTR. Post-processing of
    DP outputs (no ε); without DP noise the client's own moments (as :func:`shrink_client`).

    Returns the dict of :func:`shrink_client` with ``mean_shrinkage`` [K] float64 the coordinate-weighted mean of
    the block factors and ``block_shrinkage`` [B, K] float64 (B = 2 blocks, ``block_sizes`` their D_b).
    """
    out = shrink_client(client, pooled, clip_shift)
    if not float(client["sums_noise_var"]) > 0 or pooled.get("cov") is None:
        return out
    d, dt, tau2, resolved, n_i, n_pool = _deviations(client, pooled, clip_shift)
    k, dim = d.shape
    cov = pooled["cov"].to(torch.float64)
    vec = torch.linalg.eigh((cov + cov.T) / 2)[1].flip(1)  # [D, D], leading eigenvector first
    rank = min(SUBSPACE_RANK, dim - 1)
    shrunk, factors, sizes = torch.zeros_like(d), [], []
    for basis in (vec[:, :rank], vec[:, rank:]):
        part, tested = d @ basis, dt @ basis  # [K, D_b]
        a = paule_mandel(tested[resolved].pow(2).sum(1) / basis.shape[1], tau2[resolved]) if bool(resolved.any()) else 0.0
        f = torch.where(resolved, a / (a + tau2), torch.zeros_like(tau2))  # [K]
        shrunk += (f[:, None] * part) @ basis.T
        factors.append(f)
        sizes.append(basis.shape[1])
    pm = pooled["class_means"].to(torch.float64)
    out["class_means"] = (pm + shrunk).to(torch.float32)
    mean_noise = sum(size * (f ** 2 * client["sums_noise_var"] / n_i ** 2
                             + (1.0 - f) ** 2 * pooled["sums_noise_var"] / n_pool ** 2)
                     for size, f in zip(sizes, factors)) / dim
    out["sums_noise_var"] = n_i ** 2 * mean_noise  # [K]
    wi = n_i / n_i.sum()
    out["mean"] = (wi @ (pm + shrunk)).to(torch.float32)
    out["mean_shrinkage"] = sum(size * f for size, f in zip(sizes, factors)) / dim
    out["block_shrinkage"], out["block_sizes"] = torch.stack(factors), sizes
    if client["cov"] is not None:  # the covariance target's between-class part follows the new means
        out["cov"], out["var"] = _shrunk_cov(client, pooled, out, float(out["cov_shrinkage"]))
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
        client, pooled: dicts of :func:`fedhype.federated.class_stats._moments` (with ``cov``); shrunk: :func:`shrink_client`'s output for
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
    benchmarks/results/release_defaults.md, "client covariance test"); at ε = 1 there the mixture's validation MMD²
    falls from 0.0100 to 0.0089 (the release alone: 0.0071) for 0.004 less TSTR ("client covariance test, MMD²").
    Not the default: it trades TSTR for fidelity.
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
SHRINKAGE = {"none": None, "class": shrink_toward, "client": shrink_client, "client-cov": shrink_client_cov,
             "subspace": shrink_client_subspace}


def shrinkage_mode(value) -> str:
    """``model.client_shrinkage`` as one of :data:`SHRINKAGE`'s names (False → none, True → class)."""
    if value is True or value is False:
        return "class" if value else "none"
    return str(value)
