"""The centred statistics release: a DP centre first, then the class statistics of clipped deviations.

Why: frozen-encoder embeddings share a large common component (DINOv2-S on the bundled digits: the
mean unit embedding has norm 0.87, so a record lies at distance about √(1 − 0.87²) ≈ 0.49 from it).
The uncentred release adds noise calibrated to ‖x‖ = 1 although the statistics it estimates vary on
a scale of 0.5. Releasing a DP centre c first (a tiny share of the budget: the centre pools every
record of every client) and then the class statistics of the deviations x − c clipped to a radius R
cuts the noise on the class sums by 1/R and on the second moments by 1/R² for the same ε — the
clipped-deviation statistics of DP mean estimation (Biswas, Dong, Kamath & Ullman 2020, "CoinPress",
Sec. 2: recentre, then clip to a smaller radius), applied to the class sums and the second moments
of "Analyze Gauss" (Dwork, Talwar, Thakurta & Zhang 2014).

The two mechanisms, per client (records x normalised to ‖x‖ = 1, a fixed transform):

1. **centre** (:func:`privatize_centre`): the vector ``(a·Σx, b·n)``, a² + b² = 1, L2 sensitivity 1
   under add/remove of one record, + N(0, σ_A² I). The server pools the clients' releases,
   ``c = Σ_i S̃_i / Σ_i ñ_i`` and ``R = κ·√(max(1 − ‖c‖², 0.05))`` (κ = ``radius``; 1 − ‖c‖² is the
   mean squared distance of unit vectors from their mean), both post-processing (:func:`centring_from`).
2. **class statistics** (:func:`fedhype.privacy.dp_step.privatize_class_sums` with ``centring``):
   the records ``y = clip_R(x − c) / R`` (‖y‖ ≤ 1) go through the weighted release of
   :class:`~fedhype.privacy.dp_step.ReleaseWeights` with noise σ_B, still sensitivity 1 because
   every term of ``(a·y, b, c·m(yyᵀ))`` has norm ≤ its weight. c and R are public (outputs of step 1),
   so step 2 is a Gaussian mechanism given them: adaptive composition of two Gaussian mechanisms.

Accounting: the two steps are recorded as two un-subsampled Gaussian steps ``(σ_A, 1, 1)`` and
``(σ_B, 1, 1)`` (:func:`release_steps`). Their composition is exactly the Gaussian mechanism of
noise multiplier σ₀ with 1/σ₀² = 1/σ_A² + 1/σ_B² (Dong, Roth & Su 2022, "Gaussian differential
privacy", Cor. 3.3: μ-GDP composes as √(Σ μ_i²), μ = 1/σ), so splitting σ₀ as
σ_A = σ₀/√s, σ_B = σ₀/√(1 − s) (s = ``centre_share``) costs what the one release at σ₀ cost.

The server maps the statistics of y back to the unit sphere: class means ``c + R·mean_y``,
covariance ``R²·cov_y`` (:func:`fedhype.federated.class_stats.aggregate_class_stats` with ``centring``).
Clipping biases a far record toward c (shrinking class means toward c by a common factor); R is
chosen on the validation split (:data:`DEFAULT_RADIUS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedhype.errors import ValidationError

if TYPE_CHECKING:  # torch is imported on use: the defaults below are read by `--help` without it
    import torch

#: mechanism names in the ledger (round −1): the centre release, before the class statistics
MECHANISM = "dp-release-centre"
#: weights (a, b) of the centre release: the sum of the unit records and the count (a² + b² = 1)
CENTRE_WEIGHTS = (math.sqrt(0.96), math.sqrt(0.04))
#: default share s of the release's 1/σ₀² given to the centre (σ_A = σ₀/√s): the centre pools all
#: records, so a small share locates it to well within the clip radius (digits validation split,
#: benchmarks/results/release_defaults.md, "centred release")
DEFAULT_CENTRE_SHARE = 0.06
#: default κ: the clip radius R = κ × the DP root-mean-square distance of a record from the centre
DEFAULT_RADIUS = 0.8
#: floor of 1 − ‖c‖² in the radius (as the model space's MIN_TOTAL_VARIANCE)
MIN_SPREAD = 0.05
#: ``train.release_centre``: whose centre a client's records are clipped around. ``client``: its own DP
#: centre, pulled toward the pooled one by how much of its offset is noise (:func:`client_centrings`);
#: ``pooled``: the one pooled centre (:func:`centring_from`); ``auto``: ``client`` where the server sees
#: each client's centre release, ``pooled`` under secure aggregation (the server sees only their sum)
RELEASE_CENTRES = ("auto", "client", "pooled")
#: default ``train.release_centre`` (digits and Fashion-MNIST validation splits:
#: benchmarks/results/release_defaults.md, "client centres")
DEFAULT_RELEASE_CENTRE = "auto"


@dataclass(frozen=True)
class Centring:
    """The public centre c [D] (float32, unit-sphere units) and clip radius R (> 0) of the class-statistics release."""

    centre: torch.Tensor
    radius: float

    def __post_init__(self) -> None:
        if not (isinstance(self.radius, float) and math.isfinite(self.radius) and self.radius > 0):
            raise ValidationError(f"centring radius must be a finite float > 0, got {self.radius!r}")
        import torch

        if self.centre.ndim != 1 or not bool(torch.isfinite(self.centre).all()):
            raise ValidationError("centring centre must be a finite vector [D]")

    def transform(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``y = clip_R(x/‖x‖ − c)/R`` float64 [n, D] (‖y‖ ≤ 1) and the fraction of records clipped."""
        import torch

        z = torch.nn.functional.normalize(x.to(torch.float64), dim=-1) - self.centre.to(torch.float64)
        norms = z.norm(dim=1, keepdim=True)
        z = z * torch.clamp(self.radius / norms.clamp_min(1e-12), max=1.0) / self.radius
        return z, float((norms > self.radius).to(torch.float64).mean()) if len(norms) else 0.0

    def to_dict(self) -> dict:
        return {"radius": self.radius, "centre_norm": float(self.centre.norm())}


def release_steps(noise_multiplier: float, centre_share: float) -> list[tuple[float, float, int]]:
    """The release's accountant steps ``[(σ, q = 1, steps = 1), …]`` for an effective σ₀ (module docstring).

    ``centre_share`` 0 → ``[(σ₀, 1, 1)]`` (the uncentred release); s ∈ (0, 1) →
    ``[(σ₀/√s, 1, 1), (σ₀/√(1 − s), 1, 1)]`` (centre, then class statistics).

    Raises:
        ValidationError: σ₀ ≤ 0 or s outside [0, 1).
    """
    s0, s = float(noise_multiplier), float(centre_share)
    if not (s0 > 0 and math.isfinite(s0)):
        raise ValidationError(f"release noise multiplier must be > 0, got {noise_multiplier!r}")
    if not (0 <= s < 1):
        raise ValidationError(f"train.centre_share must be in [0, 1), got {centre_share!r}")
    if s == 0:
        return [(s0, 1.0, 1)]
    return [(s0 / math.sqrt(s), 1.0, 1), (s0 / math.sqrt(1.0 - s), 1.0, 1)]


def privatize_centre(client: str, x: torch.Tensor, noise_multiplier: float | None, generator: torch.Generator, *,
                     distributed=None):
    """A client's DP sum of unit-norm records and count: the centre release (step 1 of the module docstring).

    Args:
        client: client id. x: float32 ``[n, D]`` raw embeddings (normalised here).
        noise_multiplier: σ_A (None or 0: exact, non-private). generator: the client's release generator.
        distributed: a :class:`~fedhype.privacy.secure_agg.DistributedNoise` under secure aggregation
            (noise std × 1/√(m − t); returns a :class:`~fedhype.privacy.secure_agg.SecureShare`).

    Returns:
        PrivatizedUpdate (or SecureShare) with ``sum`` float32 [D] = Σx + N(0, (σ_A/a)²) and ``count``
        [1] = n + N(0, (σ_A/b)²), (a, b) = :data:`CENTRE_WEIGHTS`; ``steps = 1``, ``sample_rate = 1``.
    """
    import torch

    from fedhype.privacy.dp_step import _TOKEN, RELEASE_SENSITIVITY, PrivatizedUpdate, gaussian_noise_like

    x = torch.nn.functional.normalize(x.to(torch.float32), dim=-1)
    tensors = {"sum": x.to(torch.float64).sum(0).to(torch.float32), "count": torch.tensor([float(len(x))])}
    private = bool(noise_multiplier)
    if private:
        f = distributed.share_std_factor if distributed is not None else 1.0
        a, b = CENTRE_WEIGHTS
        tensors["sum"] = tensors["sum"] + gaussian_noise_like(tensors["sum"], f * float(noise_multiplier) / a, generator)
        tensors["count"] = tensors["count"] + gaussian_noise_like(tensors["count"], f * float(noise_multiplier) / b, generator)
    if distributed is not None:
        from fedhype.privacy.secure_agg import _share

        return _share(client, tensors, distributed, noise_multiplier if private else None, private)
    return PrivatizedUpdate(_token=_TOKEN, client=client, tensors=tensors, steps=1,
                            noise_multiplier=noise_multiplier if private else None, clip_norm=RELEASE_SENSITIVITY,
                            sample_rate=1.0, private=private)


def centring_from(updates, radius: float = DEFAULT_RADIUS) -> Centring:
    """Pool centre releases (PrivatizedUpdates, or one PrivatizedAggregate) into the public :class:`Centring`.

    ``c = Σ sums / max(Σ counts, 1)``, then rescaled to norm ≤ 1 − 1e-6 (a noisy centre outside the
    unit ball would make 1 − ‖c‖² negative); ``R = radius · √(max(1 − ‖c‖², MIN_SPREAD))``.
    Post-processing of DP outputs (no ε).

    Raises:
        TypeError: an update that is not the boundary type. ValidationError: radius ≤ 0.
    """
    import torch

    if not (isinstance(radius, (int, float)) and radius > 0):
        raise ValidationError(f"train.release_radius must be > 0, got {radius!r}")
    ups = _checked(updates)
    total = sum(u.tensors["sum"].to(torch.float64) for u in ups)
    n = max(float(sum(float(u.tensors["count"].sum()) for u in ups)), 1.0)
    c = total / n
    norm = float(c.norm())
    if norm >= 1.0:
        c = c * ((1.0 - 1e-6) / norm)
    spread = max(1.0 - float(c.pow(2).sum()), MIN_SPREAD)
    return Centring(c.to(torch.float32), float(radius) * math.sqrt(spread))


def _checked(updates) -> list:
    """The centre releases as a list, each of the boundary type (else TypeError)."""
    from fedhype.privacy.dp_step import PrivatizedUpdate
    from fedhype.privacy.secure_agg import PrivatizedAggregate

    ups = [updates] if type(updates) is PrivatizedAggregate else list(updates)
    for u in ups:
        if type(u) not in (PrivatizedUpdate, PrivatizedAggregate):
            raise TypeError(f"centre releases must arrive as PrivatizedUpdate or PrivatizedAggregate, got {type(u).__name__}")
    return ups


def client_centrings(updates, radius: float = DEFAULT_RADIUS, noise_multiplier: float | None = None) -> list[Centring]:
    """One centre per client, each its own DP centre pulled toward the pooled one; one common radius.

    Why: clients that are different domains sit in different parts of the sphere (the bundled digits:
    the domain axis is the largest direction of the within-class covariance), so clipping every record
    around the pooled centre cuts the domain offset off far records and biases the class statistics. A
    client's own centre ĉ_i = S̃_i/ñ_i carries noise of variance τ_i² = (σ_A/a)²/ñ_i² per coordinate
    (a = :data:`CENTRE_WEIGHTS` [0]); the positive-part James–Stein factor (James & Stein 1961;
    Baranchik 1964; toward the pooled centre c as target, Efron & Morris 1973)

        f_i = max(0, 1 − D·τ_i² / ‖ĉ_i − c‖²),   c_i = c + f_i (ĉ_i − c)

    keeps a distinct domain's offset (f ≈ 1) and drops an offset that is mostly noise (f ≈ 0: small
    clients, small ε). The radius is common to every client: ``R = κ·√(Σ_i ñ_i v_i / Σ_i ñ_i)`` with
    v_i = 1 − 2 ĉ_i·c_i + ‖c_i‖² + 2 f_i D τ_i² the client's mean squared distance from its centre
    (unbiased: E[ĉ_i·c_i] exceeds x̄_i·c_i by f_i D τ_i², the noise ĉ_i shares with c_i), floored at
    :data:`MIN_SPREAD`. A per-client radius (each client's own spread) clipped the classes a
    label-skewed client holds few records of, far from its own centre: on the Fashion-MNIST validation
    split (10 Dirichlet α = 0.3 clients) it cost 0.16 TSTR at ε = 1; the common radius does not
    (benchmarks/results/release_defaults.md, "client centres").

    Post-processing of the clients' DP centre releases (no ε); each client's class-statistics release
    around its own public (c_i, R) keeps sensitivity 1 (:func:`fedhype.privacy.dp_step.privatize_class_sums`).

    Args:
        updates: each client's centre release (:func:`privatize_centre`), in client order.
        radius: κ. noise_multiplier: σ_A of those releases (None or 0: exact releases, f_i = 1).

    Returns:
        ``[Centring(c_i, R)]``, one per update.

    Raises:
        TypeError: an update that is not a PrivatizedUpdate. ValidationError: radius ≤ 0.
    """
    import torch

    from fedhype.privacy.dp_step import PrivatizedUpdate

    if not (isinstance(radius, (int, float)) and radius > 0):
        raise ValidationError(f"train.release_radius must be > 0, got {radius!r}")
    ups = _checked(updates)
    if any(type(u) is not PrivatizedUpdate for u in ups):
        raise TypeError("client centres need each client's own centre release (PrivatizedUpdate), not an aggregate")
    pooled = centring_from(ups, radius).centre.to(torch.float64)
    dim = pooled.shape[0]
    std = float(noise_multiplier or 0.0) / CENTRE_WEIGHTS[0]
    centres, spreads, sizes = [], [], []
    for u in ups:
        n = max(float(u.tensors["count"].sum()), 1.0)
        own = u.tensors["sum"].to(torch.float64) / n
        tau2 = std * std / (n * n)
        gap = float((own - pooled).pow(2).sum())
        f = (max(0.0, 1.0 - dim * tau2 / gap) if gap > 0 else 0.0) if tau2 > 0 else 1.0
        c = pooled + f * (own - pooled)
        norm = float(c.norm())
        if norm >= 1.0:
            c = c * ((1.0 - 1e-6) / norm)
        centres.append(c)
        spreads.append(1.0 - 2.0 * float(own @ c) + float(c @ c) + 2.0 * f * dim * tau2)
        sizes.append(n)
    spread = max(sum(n * v for n, v in zip(sizes, spreads)) / sum(sizes), MIN_SPREAD)
    r = float(radius) * math.sqrt(spread)
    return [Centring(c.to(torch.float32), r) for c in centres]
