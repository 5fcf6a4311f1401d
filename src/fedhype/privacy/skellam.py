"""Distributed Skellam noise in the integer domain: the statistics release summed by SecAgg+ across machines.

Secure aggregation over a network (SecAgg+, Bell et al. 2020, CCS; Flower's implementation of it in
:mod:`fedhype.federated.flower.secagg`) sums **integer vectors modulo 2⁶⁴**: every client adds
pseudo-random masks that cancel in the sum. Continuous Gaussian noise cannot go through it, and
rounding a noised float vector afterwards would leave a sum whose noise is no longer the Gaussian
the accountant composes. So, as in Kairouz, Liu & Steinke 2021 ("The Distributed Discrete
Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML) and Agarwal, Kairouz &
Liu 2021 ("The Skellam Mechanism for Differentially Private Federated Learning", NeurIPS), the
noise is added **in the integer domain**, here the Skellam noise of the latter.

**The mechanism** (one release, e.g. the centre or the class statistics of :mod:`fedhype.privacy.centring`).
Client i holds the real vector ``v_i = Σ_{records r} u_r`` of the weighted release
(:class:`~fedhype.privacy.dp_step.ReleaseWeights`, :data:`~fedhype.privacy.centring.CENTRE_WEIGHTS`:
``‖u_r‖₂ ≤ 1`` for every record, the clipping being the fixed normalisation and centring
transform) and sends, under the SecAgg+ masks,

    X_i = ⌊γ·v_i + U_i⌋ + Z_i,     U_i ~ Uniform[0, 1)^L,     Z_i ~ Sk(μ/(m − t)) per entry,

with γ = 2^k the public scale (:func:`choose_scale`), U_i the randomised-rounding dither (entry j
rounds up with probability equal to the fractional part of γ·v_ij: unbiased) and Sk(ν) the
symmetric Skellam distribution of variance ν: the difference of two independent Poisson(ν/2)
variables. The server learns ``Σ_{i∈S} X_i mod 2⁶⁴`` over the contributing set S (|S| ≥ m − t,
else SecAgg+ refuses), decodes it as a signed integer (its entries are far below 2⁶³:
:meth:`SkellamPlan.check_range`) and divides by γ.

**Why it is DP, with the ε the ledger gets** (record-level, add/remove of one record of client j;
adversary: the server and at most t clients that are missing or collude with it, as in
:mod:`fedhype.privacy.secure_agg`).

1. *Sensitivity after rounding.* Couple the rounding of the two neighbouring datasets through the
   same dither U_j: ⌊a + U⌋ and ⌊b + U⌋ differ by at most ⌈|a − b|⌉ ≤ |a − b| + 1, and not at all
   where a = b. A record touches at most d coordinates (:meth:`Layout.record_dim`: its class row, its
   count and the packed second moment), so the two rounded vectors differ by an integer vector Δ with
   ``‖Δ‖₂ ≤ γ + √d`` and ``‖Δ‖₁ ≤ min(‖Δ‖₂², √d·‖Δ‖₂)`` (an integer vector has |Δ_j| ≤ Δ_j²) — the
   deterministic (β = 0) rounding bound of Kairouz, Liu & Steinke 2021, Sec. 4.1, for a vector of
   norm γ. Both outputs are mixtures over the dither (and over every other client's rounding and
   noise) with the same mixing weights, and the Rényi divergence is jointly quasi-convex (van Erven
   & Harremoës 2014, Thm. 13), so the worst case is a fixed shift Δ of the noise.
2. *The noise the adversary cannot remove.* Subtracting what the colluders know leaves the honest
   contributors' noise, a sum of ≥ m − t independent Sk(μ/(m − t)): Skellam variables add
   (Poisson(a) + Poisson(b) = Poisson(a + b)), so it is exactly Sk(ν) with ν ≥ μ — the Sk(μ)
   mechanism followed by adding independent Sk(ν − μ), i.e. post-processing. (This closure is why
   Skellam is used here rather than the discrete Gaussian, whose sums are only close to one.)
3. *Accounting.* The multi-dimensional Skellam mechanism Sk(μ) with integer sensitivities Δ₂, Δ₁
   is (α, ε(α))-RDP for integer α ≥ 2 with (Agarwal, Kairouz & Liu 2021, the multi-dimensional
   Skellam RDP bound; :func:`skellam_rdp`)

       ε(α) ≤ α·Δ₂²/(2μ) + min( ((2α − 1)·Δ₂² + 6·Δ₁)/(4μ²),  3·Δ₁/(2μ) ).

   The ledger records the release as its own noise kind (``noise = "skellam"``, with σ = √μ/γ,
   γ and d: :meth:`SkellamPlan.event_fields`), and the accountant composes it with the client's
   DP-SGD steps by RDP at integer orders (:func:`fedhype.privacy.accountant.epsilon_discrete`, the
   conversion of Balle et al. 2020 as in Opacus). PRV and PLD model Gaussian noise only, so a client
   with a Skellam release is accounted by RDP alone (a looser bound than PRV), and the Flower
   deployment scales the release's σ by the smallest factor that keeps every client's RDP ε at or
   below the ε planned for the Gaussian release (:func:`calibrate_factor`): the claim stays the
   planned one, paid with a little more noise.

With more than t clients missing or colluding the honest noise is below μ, so SecAgg+ refuses to
unmask a sum of fewer than m − t contributions, and its Shamir threshold m − t must exceed the t
colluders (2t < m: :func:`check_deployment`).

The sampler is NumPy's ``Generator.poisson`` (PCG64; the PTRS rejection sampler of Hörmann 1993 for
large means), seeded from the client's release generator (:mod:`fedhype.privacy.randomness`: OS
entropy unless a run seed makes it reproducible); the Poisson means are kept below 2⁴⁸ so the
double-precision sampler returns exact integers (:func:`choose_scale`).

:class:`IntegerShare` is the boundary type: a client's X_i, readable only through
:meth:`IntegerShare.masked` (what SecAgg+ sends) or :func:`integer_secure_sum` (the protocol's
ideal functionality, in process); the server receives a
:class:`~fedhype.privacy.secure_agg.PrivatizedAggregate` from :func:`aggregate_from_sum` or
:func:`integer_secure_sum`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fedhype.errors import ValidationError
from fedhype.privacy.secure_agg import DistributedNoise, SecureAggregationError

if TYPE_CHECKING:  # torch is imported on use
    import torch

#: the ledger's name of this noise (:class:`fedhype.privacy.ledger.LedgerEvent` ``noise``)
NOISE = "skellam"
#: SecAgg+ sums modulo 2**MODULUS_BITS (uint64 wrap-around)
MODULUS_BITS = 64
#: RDP orders of the discrete accounting (integers: the Skellam bound is for integer α ≥ 2)
ORDERS = tuple(range(2, 257))
#: the largest Poisson mean drawn (the double-precision sampler is exact below 2⁵³)
MAX_POISSON_MEAN = float(2 ** 48)
#: scale γ: at least this many times √d (the rounding's sensitivity inflation √d/γ ≤ 1e-3) …
SCALE_OVER_ROOT_DIM = 1000.0
#: … between 2**MIN_SCALE_BITS and 2**MAX_SCALE_BITS
MIN_SCALE_BITS, MAX_SCALE_BITS = 8, 24
#: the largest factor :func:`calibrate_factor` may apply to the planned σ
MAX_FACTOR = 4.0

KINDS = ("centre", "statistics")
_SHARE_TOKEN = object()


# ---------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class Layout:
    """Where each released statistic sits in the integer vector of one release.

    ``kind`` ``"centre"``: ``[a·Σx (D), b·n (1)]`` (:data:`~fedhype.privacy.centring.CENTRE_WEIGHTS`);
    ``"statistics"``: ``[a·S (K·D), b·n (K), c·m(M) (D(D + 1)/2 when c > 0)]`` with m(M) the diagonal
    of M = Σ y yᵀ then √2 × its upper off-diagonal entries, row by row (``np.triu_indices(D, 1)``):
    :class:`~fedhype.privacy.dp_step.ReleaseWeights`.
    """

    kind: str
    dim: int
    n_classes: int = 0
    weights: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValidationError(f"integer release kind must be one of {KINDS}, got {self.kind!r}")
        if self.dim < 1 or (self.kind == "statistics" and self.n_classes < 1):
            raise ValidationError(f"integer release layout needs D ≥ 1 (and K ≥ 1), got D = {self.dim}, K = {self.n_classes}")

    @classmethod
    def centre(cls, dim: int) -> "Layout":
        from fedhype.privacy.centring import CENTRE_WEIGHTS

        return cls("centre", int(dim), 0, (float(CENTRE_WEIGHTS[0]), float(CENTRE_WEIGHTS[1]), 0.0))

    @classmethod
    def statistics(cls, n_classes: int, dim: int, weights) -> "Layout":
        return cls("statistics", int(dim), int(n_classes), tuple(float(w) for w in weights.as_list()))

    @property
    def second_moment(self) -> bool:
        return self.kind == "statistics" and self.weights[2] > 0

    @property
    def packed(self) -> int:
        return self.dim * (self.dim + 1) // 2 if self.second_moment else 0

    @property
    def length(self) -> int:
        """L, the length of the integer vector."""
        if self.kind == "centre":
            return self.dim + 1
        return self.n_classes * self.dim + self.n_classes + self.packed

    @property
    def record_dim(self) -> int:
        """d: the most coordinates one record's contribution touches (its class row or sum, its count, m(yyᵀ))."""
        return self.dim + 1 + self.packed

    def encode(self, x: "torch.Tensor", labels: "torch.Tensor | None" = None, centring=None) -> np.ndarray:
        """The client's real release vector v = Σ_r u_r, float64 [L] (records normalised, centred and clipped
        exactly as :func:`~fedhype.privacy.centring.privatize_centre` and
        :func:`~fedhype.privacy.dp_step.privatize_class_sums` do)."""
        import torch

        if self.kind == "centre":
            u = torch.nn.functional.normalize(x.to(torch.float32), dim=-1).to(torch.float64)
            a, b, _ = self.weights
            return np.concatenate([a * u.sum(0).numpy(), [b * float(len(u))]])
        y = torch.nn.functional.normalize(x.to(torch.float32), dim=-1).to(torch.float64) if centring is None else \
            centring.transform(x)[0].to(torch.float64)
        onehot = torch.nn.functional.one_hot(labels.to(torch.int64), self.n_classes).to(torch.float64)
        a, b, c = self.weights
        parts = [a * (onehot.T @ y).numpy().ravel(), b * onehot.sum(0).numpy()]
        if self.second_moment:
            parts.append(c * pack_symmetric((y.T @ y).numpy()))
        return np.concatenate(parts)

    def decode(self, v: np.ndarray) -> dict[str, "torch.Tensor"]:
        """The released statistics (float32 tensors, the Gaussian path's names) of a real release vector [L]."""
        import torch

        v = np.asarray(v, dtype=np.float64)
        if v.shape != (self.length,):
            raise ValidationError(f"integer release: a vector of length {v.shape} for a layout of {self.length}")
        a, b, c = self.weights
        f32 = lambda arr: torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))  # noqa: E731
        if self.kind == "centre":
            return {"sum": f32(v[:self.dim] / a), "count": f32(v[self.dim:] / b)}
        kd = self.n_classes * self.dim
        out = {"class_sums": f32((v[:kd] / a).reshape(self.n_classes, self.dim)),
               "class_counts": f32(v[kd:kd + self.n_classes] / b)}
        if self.second_moment:
            out["second_moment"] = f32(unpack_symmetric(v[kd + self.n_classes:] / c, self.dim))
        return out


def pack_symmetric(m: np.ndarray) -> np.ndarray:
    """m(M): the diagonal, then √2 × the upper off-diagonal entries (``triu_indices(D, 1)`` order); ‖m(M)‖ = ‖M‖_F."""
    i, j = np.triu_indices(m.shape[0], 1)
    return np.concatenate([np.diag(m), math.sqrt(2.0) * m[i, j]])


def unpack_symmetric(p: np.ndarray, dim: int) -> np.ndarray:
    """The inverse of :func:`pack_symmetric`: a symmetric [D, D] matrix."""
    out = np.diag(p[:dim]).astype(np.float64)
    i, j = np.triu_indices(dim, 1)
    off = p[dim:] / math.sqrt(2.0)
    out[i, j] = off
    out[j, i] = off
    return out


# ---------------------------------------------------------------------------- the plan
def choose_scale(record_dim: int, noise_multiplier: float) -> int:
    """γ = 2^k: the smallest power of two ≥ 1000·√d (the rounding adds at most √d/γ ≤ 0.1 % to the
    sensitivity), within [2⁸, 2²⁴], lowered until the Poisson means (γσ)²/2 stay ≤ 2⁴⁸ (σ: the largest
    noise multiplier the release may get, so the sampler's doubles hold exact integers)."""
    bits = int(math.ceil(math.log2(SCALE_OVER_ROOT_DIM * math.sqrt(max(int(record_dim), 1)))))
    bits = max(MIN_SCALE_BITS, min(MAX_SCALE_BITS, bits))
    s = float(noise_multiplier) * MAX_FACTOR
    while bits > MIN_SCALE_BITS and (s * 2 ** bits) ** 2 / 2.0 > MAX_POISSON_MEAN:
        bits -= 1
    return 2 ** bits


@dataclass(frozen=True)
class SkellamPlan:
    """The public parameters of one integer-domain release under secure aggregation.

    Attributes:
        noise: the :class:`~fedhype.privacy.secure_agg.DistributedNoise` (m, t).
        noise_multiplier: σ = √μ/γ, the std of the noise any ≥ m − t honest contributions carry per
            entry, in units of the release's L2 sensitivity 1 (real units). 0 only in tests
            (quantisation alone: not private).
        scale: γ (a power of two).
        record_dim: d, the most coordinates one record touches.
        length: L, the length of the integer vector.
        kind: ``"centre"`` or ``"statistics"``.
    """

    noise: DistributedNoise
    noise_multiplier: float
    scale: int
    record_dim: int
    length: int
    kind: str = "statistics"

    def __post_init__(self) -> None:
        if not isinstance(self.noise, DistributedNoise):
            raise ValidationError("a Skellam plan needs the run's DistributedNoise (m, t)")
        s = self.noise_multiplier
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
            raise ValidationError(f"Skellam plan: noise multiplier must be a finite number ≥ 0, got {s!r}")
        g = self.scale
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1 or (int(g) & (int(g) - 1)):
            raise ValidationError(f"Skellam plan: scale γ must be a power of two ≥ 1, got {g!r}")
        if int(self.record_dim) < 1 or int(self.length) < int(self.record_dim) or self.kind not in KINDS:
            raise ValidationError(f"Skellam plan: bad record_dim {self.record_dim}, length {self.length} or kind {self.kind!r}")
        if self.client_mean > MAX_POISSON_MEAN:
            raise ValidationError(f"Skellam plan: Poisson mean {self.client_mean:.3g} above 2⁴⁸ (σ {s:g} × γ {g}); "
                                  "use a smaller scale")

    @classmethod
    def for_layout(cls, layout: Layout, noise: DistributedNoise, noise_multiplier: float,
                   scale: int | None = None) -> "SkellamPlan":
        """The plan of ``layout`` with σ = ``noise_multiplier`` (γ from :func:`choose_scale` unless given)."""
        g = choose_scale(layout.record_dim, noise_multiplier) if scale is None else int(scale)
        return cls(noise, float(noise_multiplier), g, layout.record_dim, layout.length, layout.kind)

    @property
    def variance(self) -> float:
        """μ = (σγ)², the Skellam variance (integer units) any ≥ m − t honest contributions carry per entry."""
        return (self.noise_multiplier * self.scale) ** 2

    @property
    def client_mean(self) -> float:
        """ν/2 with ν = μ/(m − t): the mean of each of the two Poissons a client draws per entry."""
        return self.variance / (2.0 * self.noise.min_contributions)

    @property
    def l2_sensitivity(self) -> float:
        """Δ₂ = γ + √d (integer units): one record's effect on the rounded vector (module docstring)."""
        return float(self.scale) + math.sqrt(self.record_dim)

    @property
    def l1_sensitivity(self) -> float:
        """Δ₁ = min(Δ₂², √d·Δ₂)."""
        d2 = self.l2_sensitivity
        return min(d2 * d2, math.sqrt(self.record_dim) * d2)

    def rdp(self, orders: Sequence[int] = ORDERS) -> np.ndarray:
        """ε(α) of one release at integer orders (:func:`skellam_rdp`)."""
        return skellam_rdp(orders, self.noise_multiplier, self.scale, self.record_dim)

    def event_fields(self) -> dict:
        """The ledger fields of this release (:class:`~fedhype.privacy.ledger.LedgerEvent`)."""
        return {"noise_multiplier": float(self.noise_multiplier), "noise": NOISE, "scale": float(self.scale),
                "record_dim": int(self.record_dim)}

    def check_range(self, n_records: int) -> None:
        """Refuse a plan whose decoded sum could come near 2⁶³: every entry of a record's contribution is ≤ 1, so
        |sum| ≤ γ·n + m (rounding) + 20 standard deviations of the m clients' noise, m·μ/(m − t)."""
        m = self.noise.clients
        bound = self.scale * float(n_records) + m + 20.0 * math.sqrt(m * self.variance / self.noise.min_contributions)
        if bound >= 2.0 ** (MODULUS_BITS - 2):
            raise ValidationError(f"integer release: values up to {bound:.3g} would not fit the 2⁶⁴ field; "
                                  "use fewer records per release or a smaller scale")

    def describe(self) -> str:
        """The ledger note: what each client adds, what the sum carries, the accounting."""
        m, t = self.noise.clients, self.noise.dropout_tolerance
        return (f"distributed Skellam noise in the integer domain under SecAgg+: m = {m} clients, dropout tolerance "
                f"t = {t}; scale γ = {self.scale}, each client adds Sk(μ/(m − t)) with μ = (σγ)² = {self.variance:.6g} "
                f"(σ = {self.noise_multiplier:.6g}) to ⌊γv + U⌋, any ≥ {m - t} honest contributions carry Sk(≥ μ); "
                f"sensitivity after rounding Δ₂ = γ + √d = {self.l2_sensitivity:.6g} (d = {self.record_dim}), "
                f"Δ₁ = {self.l1_sensitivity:.6g}; accounted by the Skellam RDP bound (Agarwal, Kairouz & Liu 2021)")


def skellam_rdp(orders: Sequence[int], noise_multiplier: float, scale: float, record_dim: int) -> np.ndarray:
    """RDP ε(α) of the Skellam mechanism Sk(μ), μ = (σγ)², with Δ₂ = γ + √d, Δ₁ = min(Δ₂², √d·Δ₂), at integer α ≥ 2.

    ``α·Δ₂²/(2μ) + min(((2α − 1)·Δ₂² + 6·Δ₁)/(4μ²), 3·Δ₁/(2μ))`` (Agarwal, Kairouz & Liu 2021); ∞ when σ = 0.

    Raises:
        ValidationError: an order that is not an integer ≥ 2.
    """
    a = np.asarray(orders, dtype=np.float64)
    if a.ndim != 1 or not np.all(a >= 2) or not np.all(a == np.round(a)):
        raise ValidationError(f"the Skellam RDP bound holds at integer orders α ≥ 2, got {list(orders)[:5]}…")
    if noise_multiplier <= 0:
        return np.full(a.shape, np.inf)
    mu = (float(noise_multiplier) * float(scale)) ** 2
    d2 = float(scale) + math.sqrt(int(record_dim))
    d1 = min(d2 * d2, math.sqrt(int(record_dim)) * d2)
    return a * d2 * d2 / (2.0 * mu) + np.minimum(((2.0 * a - 1.0) * d2 * d2 + 6.0 * d1) / (4.0 * mu * mu),
                                                3.0 * d1 / (2.0 * mu))


def calibrate_factor(gaussian_steps: Sequence[tuple[float, float, int]], plans_like: Sequence[tuple[int, int]],
                     tails: Sequence[Sequence[tuple[float, float, int]]], delta: float) -> float:
    """The smallest k ≥ 1 such that Skellam releases at k × the planned σ cost no more than the Gaussian ones.

    The plan calibrated σ₀ for Gaussian release steps (``gaussian_steps`` ``[(σ, 1, 1), …]``) followed by
    each client's DP-SGD steps (``tails[i]``), accounted by the reported figure (PRV or RDP, the
    smaller). The integer-domain release is accounted by RDP alone (:func:`fedhype.privacy.accountant.epsilon_discrete`),
    so at the same σ it would claim more. Returns the k (to 1e-4, rounded up) with
    ``max_i ε_RDP(Skellam(k·σ_j, γ_j, d_j) + tail_i) ≤ max_i ε(gaussian + tail_i)``.

    Args:
        gaussian_steps: the release's planned steps.
        plans_like: ``[(γ_j, d_j)]`` of each step's integer layout.
        tails: every client's DP-SGD history (``[]`` for a statistics-only run; an empty list of tails
            means the release alone).
        delta: δ.

    Raises:
        ValidationError: no k ≤ :data:`MAX_FACTOR` reaches the planned ε (the DP-SGD steps alone cost
            more by RDP than the whole plan).
    """
    from fedhype.privacy.accountant import epsilon, epsilon_discrete

    steps = [(float(s), float(q), int(n)) for s, q, n in gaussian_steps]
    if len(steps) != len(plans_like) or any(q != 1.0 or n != 1 for _, q, n in steps):
        raise ValidationError("calibrate_factor: one un-subsampled Gaussian step per integer release")
    tails = [list(t) for t in tails] or [[]]
    target = max(epsilon(steps + t, delta) for t in tails)

    def worst(k: float) -> float:
        terms = [(k * s, float(g), int(d), 1) for (s, _, _), (g, d) in zip(steps, plans_like)]
        return max(epsilon_discrete(t, terms, delta) for t in tails)

    if worst(1.0) <= target:
        return 1.0
    if worst(MAX_FACTOR) > target:
        raise ValidationError(f"the integer-domain release cannot reach the planned ε = {target:.4g} by RDP within "
                              f"{MAX_FACTOR:g}× the planned noise (the DP-SGD steps alone cost too much by RDP); give the "
                              "release a larger share of ε (--class-stats-share) or more noise")
    lo, hi = 1.0, MAX_FACTOR
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if worst(mid) <= target else (mid, hi)
    return hi


def check_deployment(noise: DistributedNoise) -> None:
    """Refuse an (m, t) that SecAgg+ cannot protect: its Shamir threshold m − t must exceed the t colluders.

    With 2t ≥ m the t clients that may collude with the server would hold m − t shares of every other
    client's mask secrets and could unmask its individual vector.

    Raises:
        ValidationError: naming ``--dropout-tolerance``.
    """
    m, t = noise.clients, noise.dropout_tolerance
    if 2 * t >= m:
        raise ValidationError(f"--dropout-tolerance {t} with {m} clients: the Flower deployment's SecAgg+ shares each "
                              f"client's mask secrets with threshold m − t = {m - t}, which must exceed the t clients "
                              f"that may collude with the server (2t < m); use --dropout-tolerance ≤ {(m - 1) // 2}")


# ---------------------------------------------------------------------------- the mechanism
class IntegerShare:
    """One client's integer release X_i = ⌊γv + U⌋ + Sk(μ/(m − t)): readable only masked or summed.

    Built by :func:`privatize_integer`; it carries less noise than a release on its own needs, so it exposes
    no values: :meth:`masked` returns X_i plus a SecAgg+ mask (mod 2⁶⁴), :func:`integer_secure_sum` the sum.
    """

    __slots__ = ("client", "plan", "_ints", "private")

    def __init__(self, *, _token: object, client: str, plan: SkellamPlan, ints: np.ndarray, private: bool):
        if _token is not _SHARE_TOKEN:
            raise TypeError("IntegerShare can only be built by fedhype.privacy.skellam.privatize_integer()")
        self.client, self.plan, self.private = str(client), plan, bool(private)
        self._ints = np.array(ints, dtype=np.int64, copy=True)

    @property
    def length(self) -> int:
        return int(self._ints.shape[0])

    def masked(self, mask: np.ndarray) -> np.ndarray:
        """``(X_i + mask) mod 2⁶⁴`` as uint64 [L]: what this client sends under SecAgg+.

        Raises:
            ValidationError: a mask that is not uint64 of the share's length.
        """
        mask = np.asarray(mask)
        if mask.dtype != np.uint64 or mask.shape != self._ints.shape:
            raise ValidationError(f"a SecAgg+ mask must be uint64 [{self.length}], got {mask.dtype} {mask.shape}")
        return self._ints.view(np.uint64) + mask  # uint64 arithmetic wraps modulo 2⁶⁴

    @property
    def values(self):
        raise TypeError(f"the integer share of client {self.client!r} is not readable on its own: it goes through "
                        "SecAgg+ masked (IntegerShare.masked) or is summed (integer_secure_sum)")

    def __repr__(self) -> str:
        return f"IntegerShare(client={self.client!r}, kind={self.plan.kind!r}, length={self.length})"


def numpy_generator(generator: "torch.Generator") -> np.random.Generator:
    """A NumPy PCG64 generator seeded with 63 bits drawn from ``generator`` (the client's release stream)."""
    import torch

    return np.random.Generator(np.random.PCG64(int(torch.randint(0, 2 ** 62, (1,), generator=generator))))


def randomized_round(v: np.ndarray, scale: int, rng: np.random.Generator) -> np.ndarray:
    """⌊γ·v + U⌋, U ~ Uniform[0, 1) per entry: unbiased rounding of γ·v (int64)."""
    return np.floor(np.asarray(v, dtype=np.float64) * float(scale) + rng.random(np.shape(v))).astype(np.int64)


def skellam_noise(shape, client_mean: float, rng: np.random.Generator) -> np.ndarray:
    """Sk(2ν) per entry: Poisson(ν) − Poisson(ν) with ν = ``client_mean`` (int64; zeros for ν = 0)."""
    if client_mean <= 0:
        return np.zeros(shape, dtype=np.int64)
    return rng.poisson(client_mean, shape).astype(np.int64) - rng.poisson(client_mean, shape).astype(np.int64)


def privatize_integer(client: str, vector: np.ndarray, plan: SkellamPlan, generator: "torch.Generator") -> IntegerShare:
    """A client's integer release of its real release vector (module docstring): ``⌊γv + U⌋ + Sk(μ/(m − t))``.

    Args:
        client: client id. vector: float64 [L], the client's Σ_r u_r (:meth:`Layout.encode`; every record's
            u_r of norm ≤ 1). plan: the release's :class:`SkellamPlan`. generator: the client's release
            generator (seeds the dither and the noise).

    Raises:
        ValidationError: a vector of another length than the plan's.
    """
    v = np.asarray(vector, dtype=np.float64)
    if v.shape != (plan.length,):
        raise ValidationError(f"integer release of client {client!r}: vector of shape {v.shape}, plan of length {plan.length}")
    rng = numpy_generator(generator)
    ints = randomized_round(v, plan.scale, rng) + skellam_noise(v.shape, plan.client_mean, rng)
    return IntegerShare(_token=_SHARE_TOKEN, client=client, plan=plan, ints=ints, private=plan.noise_multiplier > 0)


def privatize_centre_integer(client: str, x: "torch.Tensor", plan: SkellamPlan,
                             generator: "torch.Generator") -> IntegerShare:
    """The centre release (:func:`fedhype.privacy.centring.privatize_centre`) in the integer domain."""
    layout = Layout.centre(int(x.shape[1]))
    _match(layout, plan)
    return privatize_integer(client, layout.encode(x), plan, generator)


def privatize_class_stats_integer(client: str, x: "torch.Tensor", labels: "torch.Tensor", n_classes: int, weights,
                                  plan: SkellamPlan, generator: "torch.Generator", *, centring=None) -> IntegerShare:
    """The class-statistics release (:func:`fedhype.privacy.dp_step.privatize_class_sums`) in the integer domain."""
    layout = Layout.statistics(n_classes, int(x.shape[1]), weights)
    _match(layout, plan)
    return privatize_integer(client, layout.encode(x, labels, centring), plan, generator)


def _match(layout: Layout, plan: SkellamPlan) -> None:
    if (layout.kind, layout.length, layout.record_dim) != (plan.kind, plan.length, plan.record_dim):
        raise ValidationError(f"the {plan.kind} plan (L = {plan.length}, d = {plan.record_dim}) does not fit this "
                              f"client's {layout.kind} release (L = {layout.length}, d = {layout.record_dim})")


# ---------------------------------------------------------------------------- the server's side
def decode_sum(total: np.ndarray) -> np.ndarray:
    """A sum modulo 2⁶⁴ (uint64) as signed integers (int64)."""
    total = np.asarray(total)
    if total.dtype != np.uint64:
        raise SecureAggregationError(f"a SecAgg+ sum must be uint64, got {total.dtype}")
    return total.view(np.int64)


def aggregate_from_sum(total: np.ndarray, plan: SkellamPlan, layout: Layout, contributors: Sequence[str]):
    """The server's :class:`~fedhype.privacy.secure_agg.PrivatizedAggregate` of an unmasked SecAgg+ sum.

    Args:
        total: uint64 [L], ``Σ_{i∈S} X_i mod 2⁶⁴``.
        plan, layout: the release's. contributors: the client ids in the sum.

    Raises:
        SecureAggregationError: fewer than m − t contributors, a duplicate, or a sum of another length.
    """
    from fedhype.privacy.secure_agg import _AGG_TOKEN, PrivatizedAggregate

    ids = [str(c) for c in contributors]
    noise = plan.noise
    if len(set(ids)) != len(ids):
        raise SecureAggregationError(f"secure aggregation: a client contributed twice ({sorted(ids)})")
    if len(ids) < noise.min_contributions:
        raise SecureAggregationError(
            f"secure aggregation received {len(ids)} of {noise.clients} contributions, fewer than m − t = "
            f"{noise.min_contributions} (--dropout-tolerance {noise.dropout_tolerance}): the sum would carry less noise "
            "than the privacy claim needs, so nothing was released")
    ints = decode_sum(total)
    if ints.shape != (plan.length,) or layout.length != plan.length:
        raise SecureAggregationError(f"secure aggregation: a sum of length {ints.shape} for a release of {plan.length}")
    tensors = layout.decode(ints.astype(np.float64) / float(plan.scale))
    return PrivatizedAggregate(_token=_AGG_TOKEN, tensors=tensors, contributors=tuple(ids), noise=noise,
                               noise_multiplier=float(plan.noise_multiplier) if plan.noise_multiplier > 0 else None,
                               private=plan.noise_multiplier > 0)


def integer_secure_sum(shares: Sequence[IntegerShare], layout: Layout):
    """The ideal functionality of SecAgg+ in process: the sum of the shares mod 2⁶⁴, decoded.

    Raises:
        SecureAggregationError: shares of different plans or types, or as :func:`aggregate_from_sum`.
    """
    if not shares:
        raise SecureAggregationError("secure aggregation received no contribution")
    for s in shares:
        if type(s) is not IntegerShare:
            raise SecureAggregationError(f"integer secure aggregation sums IntegerShare objects only, got {type(s).__name__}")
        if s.plan != shares[0].plan:
            raise SecureAggregationError(f"client {s.client!r} used another release plan than {shares[0].client!r}")
    total = np.zeros(shares[0].length, dtype=np.uint64)
    for s in shares:
        total = total + s._ints.view(np.uint64)
    return aggregate_from_sum(total, shares[0].plan, layout, [s.client for s in shares])
