"""Secure aggregation with distributed Gaussian noise, for the one-shot statistics release.

Without it every client adds the full noise N(0, σ₀²) to each entry of its release, because the
server sees every client's message; the pooled statistic then carries m·σ₀², √m times the noise
std that a central curator would add. With secure aggregation the server learns only the **sum**
of the clients' messages (Bonawitz et al. 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning", CCS), so each client may add only a share of the noise.

**The construction** (:class:`DistributedNoise` ``(m, t)``). Each of the m clients adds
N(0, σ₀²/(m − t)) to every entry of its weighted release vector ``v_i`` (L2 sensitivity 1 per
record, :class:`fedhype.privacy.dp_step.ReleaseWeights`); the aggregator refuses to output a sum
of fewer than m − t contributions (:func:`secure_sum`).

**Why it is (ε, δ)-DP with the central release's figure.** Fix a record of client j and let the
adversary be the server together with any set T of clients that collude with it, where the
clients missing from the sum and the colluders number at most t together. The adversary sees
``Σ_{i∈S} (v_i + n_i)`` over the set S of contributing clients and knows ``v_i, n_i`` for i ∈ T;
subtracting them leaves ``v_j + Σ_{i∈H∖{j}} v_i + Σ_{i∈H} n_i`` over the honest contributors H
(|H| ≥ m − t). Conditioned on the other clients' data (worst case: the adversary knows it), this
is the Gaussian mechanism on v_j with noise N(0, |H|·σ₀²/(m − t) · I), whose variance is
≥ σ₀². A Gaussian of variance ≥ σ₀² is the σ₀-Gaussian mechanism followed by adding independent
noise, i.e. post-processing (Dwork & Roth 2014, Prop. 2.1), so the record enjoys at least the
guarantee of one un-subsampled Gaussian step with noise multiplier σ₀ — what the ledger records
and the accountant composes (the distributed-DP argument of Kairouz, Liu & Steinke 2021, "The
Distributed Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", Sec. 2,
for continuous noise). With more than t clients missing or colluding the guarantee is weaker
(σ₀·√(|H|/(m − t)) < σ₀): the aggregator then refuses to release the sum.

**What is simulated here.** In process, :func:`secure_sum` plays the aggregation protocol: it is
the only reader of the clients' :class:`SecureShare` objects (which expose no tensors) and hands
the server a :class:`PrivatizedAggregate`, the only type the server's statistics accept besides
per-client :class:`~fedhype.privacy.dp_step.PrivatizedUpdate`. Across machines (the Flower
deployment) the protocol is SecAgg+ over integers modulo 2⁶⁴ and the noise is added in the integer
domain: randomised rounding and distributed Skellam noise, with its own accounting
(:mod:`fedhype.privacy.skellam`, :mod:`fedhype.federated.flower.secagg`; docs/method.md, decision 10).

Only the release before round 0 is aggregated this way: the DP-SGD updates of the rounds depend
on each client's code and stay per client with the full noise (docs/method.md, decision 10).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from fedhype.errors import ValidationError

if TYPE_CHECKING:  # torch is imported on use: a SuperNode's SecAgg+ key-exchange stages import this module
    import torch

_SHARE_TOKEN = object()
_AGG_TOKEN = object()


class SecureAggregationError(ValidationError):
    """The aggregation protocol refused to output a sum (too few contributions, a duplicate, a wrong type)."""


@dataclass(frozen=True)
class DistributedNoise:
    """How the noise of one release is split over the clients under secure aggregation.

    Attributes:
        clients: m, the number of clients in the federation (int ≥ 2).
        dropout_tolerance: t, how many clients may be missing from the sum or collude with the
            server while the guarantee holds (int, 0 ≤ t < m).

    Raises:
        ValidationError: m < 2 (secure aggregation of a single client is its own message), t < 0,
            t ≥ m, or a non-integer.
    """

    clients: int
    dropout_tolerance: int = 0

    def __post_init__(self) -> None:
        m, t = self.clients, self.dropout_tolerance
        for name, v in (("clients", m), ("dropout_tolerance", t)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValidationError(f"secure aggregation: {name} must be an integer, got {v!r}")
        if m < 2:
            raise ValidationError(f"secure aggregation needs at least 2 clients, the federation has {m}: "
                                  "drop --secure-aggregation (a single client's sum is its own message)")
        if t < 0:
            raise ValidationError(f"--dropout-tolerance must be an integer ≥ 0, got {t}")
        if t >= m:
            raise ValidationError(f"--dropout-tolerance must be in [0, {m - 1}] for {m} clients, got {t} "
                                  "(t ≥ m would let the server see a sum with no honest contribution)")

    @property
    def min_contributions(self) -> int:
        """m − t: the fewest contributions the aggregator sums."""
        return self.clients - self.dropout_tolerance

    @property
    def share_std_factor(self) -> float:
        """1/√(m − t): each client's noise std as a fraction of the central σ₀."""
        return 1.0 / math.sqrt(self.min_contributions)

    def noise_variance_factor(self, contributions: int) -> float:
        """Variance of the summed noise of ``contributions`` shares, in units of σ₀²: c/(m − t) (≥ 1)."""
        return float(contributions) / self.min_contributions

    def describe(self) -> str:
        """The ledger note: what each client adds and what the sum is guaranteed to carry."""
        m, t = self.clients, self.dropout_tolerance
        return (f"distributed noise under secure aggregation: m = {m} clients, dropout tolerance t = {t}; each client "
                f"adds variance σ₀²/(m − t) = σ₀²/{m - t}, any sum of ≥ {m - t} honest contributions carries ≥ σ₀²")


class SecureShare:
    """One client's noised summand under secure aggregation: readable only by :func:`secure_sum`.

    It carries variance σ₀²/(m − t) per entry, less than a release on its own needs, so it exposes no
    tensors (``tensors`` raises): the server receives only the :class:`PrivatizedAggregate`.
    Built by :func:`fedhype.privacy.dp_step.privatize_class_sums` with ``distributed`` set.
    """

    __slots__ = ("client", "_tensors", "noise", "noise_multiplier", "private")

    def __init__(self, *, _token: object, client: str, tensors: Mapping[str, torch.Tensor], noise: DistributedNoise,
                 noise_multiplier: float | None, private: bool):
        if _token is not _SHARE_TOKEN:
            raise TypeError("SecureShare can only be built by fedhype.privacy.dp_step.privatize_class_sums()")
        self.client = str(client)
        self._tensors = {k: v.detach().clone() for k, v in tensors.items()}
        self.noise, self.noise_multiplier, self.private = noise, noise_multiplier, bool(private)

    @property
    def tensors(self):
        raise TypeError(f"the secure-aggregation share of client {self.client!r} is not readable on its own: "
                        "sum the shares with fedhype.privacy.secure_agg.secure_sum")

    def __repr__(self) -> str:
        return f"SecureShare(client={self.client!r}, names={sorted(self._tensors)})"


class PrivatizedAggregate:
    """The sum of the clients' secure-aggregation shares: what the server receives instead of their releases.

    Attributes:
        tensors: name → float32 tensor, the sum over ``contributors`` of each client's noised statistic.
        contributors: the client ids in the sum (tuple of str).
        noise: the :class:`DistributedNoise` plan (m, t).
        noise_multiplier: σ₀, the noise multiplier the sum is guaranteed to carry (None without DP).
        noise_variance_factor: the summed noise variance per entry in units of σ₀² (c/(m − t) ≥ 1),
            the factor the server's estimators use in place of the number of per-client releases.
        private: False only for an explicit ``--no-dp`` run.
    """

    __slots__ = ("_tensors", "contributors", "noise", "noise_multiplier", "noise_variance_factor", "private")

    def __init__(self, *, _token: object, tensors: Mapping[str, torch.Tensor], contributors: tuple[str, ...],
                 noise: DistributedNoise, noise_multiplier: float | None, private: bool):
        if _token is not _AGG_TOKEN:
            raise TypeError("PrivatizedAggregate can only be built by fedhype.privacy.secure_agg.secure_sum()")
        self._tensors = MappingProxyType({k: v.detach().clone() for k, v in tensors.items()})
        self.contributors = tuple(contributors)
        self.noise, self.noise_multiplier, self.private = noise, noise_multiplier, bool(private)
        self.noise_variance_factor = noise.noise_variance_factor(len(self.contributors))

    @property
    def tensors(self) -> Mapping[str, torch.Tensor]:
        return self._tensors


def _share(client: str, tensors: Mapping[str, torch.Tensor], noise: DistributedNoise, noise_multiplier: float | None,
           private: bool) -> SecureShare:
    """Wrap a noised summand (called by :func:`fedhype.privacy.dp_step.privatize_class_sums` only)."""
    return SecureShare(_token=_SHARE_TOKEN, client=client, tensors=tensors, noise=noise,
                       noise_multiplier=noise_multiplier, private=private)


def secure_sum(shares: list[SecureShare], noise: DistributedNoise) -> PrivatizedAggregate:
    """Sum the clients' shares, as the secure-aggregation protocol would, and refuse a sum that is too small.

    Args:
        shares: the contributing clients' :class:`SecureShare` (at most one per client), all built
            for the same plan ``noise`` and with the same tensor names and shapes.
        noise: the run's :class:`DistributedNoise`.

    Returns:
        :class:`PrivatizedAggregate` (sums computed in float64, returned as float32).

    Raises:
        SecureAggregationError: fewer than m − t shares (naming how many arrived), a duplicate client,
            a share that is not a :class:`SecureShare`, one built for another plan, or mismatched tensors.
    """
    for s in shares:
        if type(s) is not SecureShare:
            raise SecureAggregationError(f"secure aggregation sums SecureShare objects only, got {type(s).__name__}")
        if s.noise != noise:
            raise SecureAggregationError(f"client {s.client!r} split its noise for {s.noise}, the run for {noise}: "
                                         "every client must use the same (m, t)")
    ids = [s.client for s in shares]
    if len(set(ids)) != len(ids):
        raise SecureAggregationError(f"secure aggregation: client(s) {sorted({i for i in ids if ids.count(i) > 1})} "
                                     "contributed twice")
    if len(shares) < noise.min_contributions:
        raise SecureAggregationError(
            f"secure aggregation received {len(shares)} of {noise.clients} contributions, fewer than m − t = "
            f"{noise.min_contributions} (--dropout-tolerance {noise.dropout_tolerance}): the sum would carry less noise "
            "than the privacy claim needs, so nothing was released; rerun when the clients are back or with a larger "
            "--dropout-tolerance")
    names = sorted(shares[0]._tensors)
    for s in shares:
        if sorted(s._tensors) != names or any(s._tensors[k].shape != shares[0]._tensors[k].shape for k in names):
            raise SecureAggregationError(f"client {s.client!r} sent tensors {sorted(s._tensors)} that do not match "
                                         f"the others' {names}")
    import torch

    total = {k: sum(s._tensors[k].to(torch.float64) for s in shares).to(torch.float32) for k in names}
    return PrivatizedAggregate(_token=_AGG_TOKEN, tensors=total, contributors=tuple(ids), noise=noise,
                               noise_multiplier=shares[0].noise_multiplier, private=all(s.private for s in shares))


def restore_sum(tensors: Mapping[str, "torch.Tensor"], contributors: tuple[str, ...], noise: DistributedNoise,
                noise_multiplier: float | None, private: bool) -> PrivatizedAggregate:
    """Rebuild a sum :func:`secure_sum` returned before, from the run's own checkpoint of it.

    A run interrupted after its secure-aggregation release was charged (write-ahead) and before the model it sets
    was saved resumes from the sum it had received (a public DP output, saved by
    :func:`fedhype.federated.release_outputs.save_secure_outputs`) instead of releasing and being charged again. This
    makes no new sum: it restores one that already left the clients, with the same checks a sum passes.

    Args:
        tensors: name → tensor of the saved sum (float32). contributors: the client ids in it. noise: the run's
            :class:`DistributedNoise`. noise_multiplier: σ₀ it carries (None without DP). private: as saved.

    Raises:
        SecureAggregationError: fewer contributors than m − t, a duplicate, or a non-finite entry (a damaged file).
    """
    import torch

    ids = tuple(str(c) for c in contributors)
    if len(set(ids)) != len(ids) or len(ids) < noise.min_contributions:
        raise SecureAggregationError(f"the saved secure-aggregation sum lists contributors {list(ids)}: it needs "
                                     f"{noise.min_contributions} distinct ones for this run; delete the run's "
                                     "ckpt/release-outputs.safetensors to release again")
    for k, v in tensors.items():
        if not bool(torch.isfinite(v).all()):
            raise SecureAggregationError(f"the saved secure-aggregation sum has non-finite entries in {k!r}; delete "
                                         "the run's ckpt/release-outputs.safetensors to release again")
    return PrivatizedAggregate(_token=_AGG_TOKEN, tensors=dict(tensors), contributors=ids, noise=noise,
                               noise_multiplier=noise_multiplier, private=private)
