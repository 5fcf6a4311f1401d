"""The DP step: per-example gradients, clipping, Gaussian noise — and the one message type that
may leave a client.

This module is the privacy boundary of fedhype. A reader who wants to check the privacy claim
reads :class:`LocalDPSession` and :class:`PrivatizedUpdate`:

* every gradient computed on a client's records is a per-example gradient of the *whole*
  per-example loss over *all* parameters that touch the data (local encoder ψ_i and the
  parameters generated for the client θ_i). By default only its norm and the clipped sum are formed,
  with book-keeping clipping (:mod:`fedhype.privacy.bookkeeping`, ``DPConfig.grad_method =
  "bookkeeping"``: the per-example norms from the layers' inputs and output gradients, tested equal to
  the reference); ``torch.func`` (``vmap(grad(...))``) materialises the per-example gradients and is
  the reference path. Opacus hooks are wrong for generated weights: docs/method.md, decision 2;
* each per-example gradient is clipped to L2 norm ≤ C jointly over all parameters, the clipped
  gradients are summed, and Gaussian noise N(0, σ²C² I) is added (Abadi et al. 2016, "Deep
  Learning with Differential Privacy", Algorithm 1); the result is divided by the expected batch
  size B = q·n (Opacus convention), which is post-processing;
* local optimiser steps use only these noised gradients plus *data-free* terms (functions of the
  parameters alone, e.g. the synthetic–synthetic MMD term: docs/method.md, decision 3);
* the only object a client returns is a :class:`PrivatizedUpdate` ``Δθ_i = θ_i^K − θ_i^0`` built by
  :meth:`LocalDPSession.finish`; its constructor refuses any other caller. (On a server that
  receives updates over a network, :meth:`PrivatizedUpdate.from_wire` re-types the received
  Δθ_i after checking it is shaped exactly like the θ_i that was sent; it adds no privacy.)

Record-level guarantee: the sequence of noised gradients is the subsampled Gaussian mechanism
with noise multiplier σ and Poisson rate q per step; everything else is post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import torch
from torch.func import functional_call, grad, vmap  # noqa: F401  (functional_call re-exported)

from fedhype.errors import ArtifactError, ValidationError

Params = dict[str, torch.Tensor]
_TOKEN = object()


@dataclass(frozen=True)
class DPConfig:
    """Settings of the DP-SGD mechanism on one client.

    Attributes:
        noise_multiplier: σ (noise std / clipping norm); ``None`` only when ``enabled`` is False.
        clip_norm: C, the per-example L2 clipping norm over all data-touching parameters.
        enabled: False only for an explicit ``--no-dp`` run: no clipping, no noise, outputs
            marked non-private.
        grad_method: ``"bookkeeping"`` (default: per-example norms and clipped sums without
            materialising per-example gradients, :mod:`fedhype.privacy.bookkeeping`) or
            ``"vmap"`` (the torch.func reference: ``vmap(grad(...))``). Both clip the same
            per-example gradients; they differ only in speed and memory.
    """

    noise_multiplier: float | None
    clip_norm: float
    enabled: bool = True
    grad_method: str = "bookkeeping"

    def __post_init__(self) -> None:
        if self.enabled:
            if self.noise_multiplier is None or not (self.noise_multiplier >= 0) or not math.isfinite(self.noise_multiplier):
                raise ValidationError(f"noise_multiplier σ must be a finite number ≥ 0, got {self.noise_multiplier}")
            if not (self.clip_norm > 0) or not math.isfinite(self.clip_norm):
                raise ValidationError(f"clip_norm C must be > 0, got {self.clip_norm}")
        if self.grad_method not in ("bookkeeping", "vmap"):
            raise ValidationError(f"grad_method must be 'bookkeeping' or 'vmap', got {self.grad_method!r}")


class PrivatizedUpdate:
    """The only message that carries information derived from a client's records.

    Built by :meth:`LocalDPSession.finish` from noised gradients (the constructor raises
    ``TypeError`` for any other caller); a server receiving it over a network rebuilds it with
    :meth:`from_wire`, which validates it against θ_i. Tensors are read-only copies.

    Attributes:
        client: client id (str).
        tensors: mapping name → float32 tensor of the shared (generated) parameter's shape:
            ``Δθ_i = θ_i^K − θ_i^0`` after K local DP steps.
        steps: K, the number of DP-SGD steps that produced it.
        noise_multiplier: σ of those steps (None when non-private).
        clip_norm: C.
        sample_rate: q of those steps.
        private: False only for an explicit ``--no-dp`` run.
    """

    __slots__ = ("client", "_tensors", "steps", "noise_multiplier", "clip_norm", "sample_rate", "private")

    def __init__(self, *, _token: object, client: str, tensors: Mapping[str, torch.Tensor], steps: int,
                 noise_multiplier: float | None, clip_norm: float, sample_rate: float, private: bool):
        if _token is not _TOKEN:
            raise TypeError("PrivatizedUpdate can only be built by fedhype.privacy.dp_step.LocalDPSession.finish()")
        self.client = str(client)
        self._tensors = MappingProxyType({k: v.detach().clone() for k, v in tensors.items()})
        self.steps = int(steps)
        self.noise_multiplier = noise_multiplier
        self.clip_norm = float(clip_norm)
        self.sample_rate = float(sample_rate)
        self.private = bool(private)

    @property
    def tensors(self) -> Mapping[str, torch.Tensor]:
        return self._tensors

    @classmethod
    def from_wire(cls, *, client: str, tensors: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor],
                  steps: int, noise_multiplier: float | None, clip_norm: float, sample_rate: float,
                  private: bool) -> "PrivatizedUpdate":
        """Server side of a network transport: re-type an update built by a *remote* :meth:`LocalDPSession.finish`.

        The only way to obtain a PrivatizedUpdate outside this module's mechanisms. It neither adds nor removes
        privacy: the clip-and-noise step ran on the client's machine, whose ClientApp can serialise
        nothing but a PrivatizedUpdate (:func:`fedhype.federated.flower.wire.encode_update`). It
        exists so that the server's type check (:meth:`fedhype.federated.server.Server.accept`)
        still holds for updates that arrive over a network, and it refuses anything that is not
        shaped exactly like the θ_i the server sent. The public scalars are checked against the
        round's plan by the caller (:func:`fedhype.federated.flower.wire.decode_update`).

        Args:
            client: client id.
            tensors: received Δθ_i, name → float32 tensor.
            like: θ_i^0 as the server sent it (name → tensor): keys and shapes must match exactly.
            steps, noise_multiplier, clip_norm, sample_rate, private: the public metadata of the
                update (as in the attributes above).

        Raises:
            ArtifactError: unexpected or missing names, a wrong shape or dtype, a non-finite value,
                or metadata out of range (the message names the client and the field).
        """
        where = f"update from client {client!r}"
        if set(tensors) != set(like):
            extra, missing = sorted(set(tensors) - set(like)), sorted(set(like) - set(tensors))
            raise ArtifactError(f"{where}: tensor names differ from θ (unexpected {extra}, missing {missing}); refused")
        for k, v in tensors.items():
            if not isinstance(v, torch.Tensor) or v.dtype != torch.float32 or tuple(v.shape) != tuple(like[k].shape):
                got = (getattr(v, "dtype", type(v).__name__), tuple(getattr(v, "shape", ())))
                raise ArtifactError(f"{where}: {k!r} must be float32 {tuple(like[k].shape)}, got {got}; refused")
            if not bool(torch.isfinite(v).all()):
                raise ArtifactError(f"{where}: {k!r} has non-finite values; refused")
        ok = (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 and isinstance(private, bool)
              and isinstance(clip_norm, (int, float)) and math.isfinite(clip_norm) and clip_norm > 0
              and isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1)
        if private:
            ok = ok and isinstance(noise_multiplier, (int, float)) and math.isfinite(noise_multiplier) \
                and noise_multiplier >= 0
        else:
            ok = ok and noise_multiplier is None
        if not ok:
            raise ArtifactError(f"{where}: bad metadata (steps={steps!r}, σ={noise_multiplier!r}, C={clip_norm!r}, "
                                f"q={sample_rate!r}, private={private!r}); refused")
        return cls(_token=_TOKEN, client=client, tensors=tensors, steps=steps,
                   noise_multiplier=None if noise_multiplier is None else float(noise_multiplier),
                   clip_norm=clip_norm, sample_rate=sample_rate, private=private)

    def nbytes(self) -> int:
        """Size of the payload in bytes (what a client uploads per round)."""
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def __repr__(self) -> str:  # never prints tensor values
        return (f"PrivatizedUpdate(client={self.client!r}, keys={sorted(self._tensors)}, steps={self.steps}, "
                f"σ={self.noise_multiplier}, C={self.clip_norm}, q={self.sample_rate:.4g}, private={self.private})")


def per_example_grads(loss_fn: Callable[..., torch.Tensor], params: Params, batch: tuple[torch.Tensor, ...]) -> Params:
    """Per-example gradients of ``loss_fn`` with ``torch.func.vmap(grad(...))``.

    Args:
        loss_fn: ``loss_fn(params, *example) -> scalar``, the loss of ONE example; ``example``
            are the batch tensors with the leading dimension removed.
        params: name → tensor (no batch dimension).
        batch: tensors with a leading batch dimension B ≥ 1.

    Returns:
        name → tensor ``[B, *param.shape]``, same dtype as the parameter.
    """
    return vmap(grad(loss_fn), in_dims=(None,) + (0,) * len(batch), randomness="error")(params, *batch)


def clip_and_sum(per_example: Params, clip_norm: float) -> tuple[Params, torch.Tensor]:
    """Clip each example's gradient to total L2 norm ≤ C (over all parameters) and sum.

    Factor ``min(1, C / (‖g_i‖ + 1e-6))`` as in Opacus. Returns the summed clipped gradients
    (name → ``param.shape``) and the per-example norms before clipping (float32 ``[B]``).
    """
    norms = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in per_example.values()], 1), dim=1)
    factor = (clip_norm / (norms + 1e-6)).clamp(max=1.0)
    summed = {k: torch.einsum("b,b...->...", factor.to(g.dtype), g) for k, g in per_example.items()}
    return summed, norms


def gaussian_noise_like(t: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """N(0, std²) noise of ``t``'s shape from ``generator`` (float32 on ``t``'s device)."""
    return torch.normal(0.0, std, size=t.shape, generator=generator, device=t.device, dtype=t.dtype)


class LocalDPSession:
    """One client's local DP-SGD steps within one round, ending in a :class:`PrivatizedUpdate`.

    Args:
        client: client id.
        shared: θ_i^0, the parameters generated for this client (name → tensor); copied.
        local: ψ_i, the client's local parameters (never leave the client); updated in place.
        dp: the mechanism settings.
        sample_rate: q = B / n_i of the Poisson sampling that forms each batch.
        expected_batch_size: B = q · n_i; the noised sum is divided by it.
        generator: the client's noise generator (seeded from OS entropy unless a run seed is set).
        make_optimizer: ``params -> torch.optim.Optimizer`` for the local steps (θ and ψ alike).
        local_optimizer_state: optional state dict to continue ψ's optimiser (persisted by the client).
    """

    def __init__(self, client: str, shared: Params, local: Params, dp: DPConfig, *, sample_rate: float,
                 expected_batch_size: float, generator: torch.Generator,
                 make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer]):
        self.client = str(client)
        self.dp = dp
        self.sample_rate = float(sample_rate)
        self.expected_batch_size = float(expected_batch_size)
        self.generator = generator
        self._theta0 = {k: v.detach().clone() for k, v in shared.items()}
        self.shared = {k: v.detach().clone().requires_grad_(True) for k, v in shared.items()}
        self.local = local
        for v in self.local.values():
            v.requires_grad_(True)
        self._opt_shared = make_optimizer(list(self.shared.values()))
        self._opt_local = make_optimizer(list(self.local.values()))
        self.steps = 0
        self.last_norms: torch.Tensor | None = None

    @property
    def local_optimizer(self) -> torch.optim.Optimizer:
        return self._opt_local

    def noised_gradient(self, loss_fn: Callable[..., torch.Tensor], batch: tuple[torch.Tensor, ...],
                        batch_loss: Callable[..., torch.Tensor] | None = None) -> Params:
        """The privatized mean gradient over all parameters for one Poisson batch.

        ``(Σ_i clip_C(∇ℓ_i) + N(0, σ²C²)) / B`` over θ_i ∪ ψ_i; with DP disabled, the plain mean
        gradient over the batch. An empty batch gives noise only (still one mechanism step).
        ``batch_loss`` (same loss, batched, reporting to a tape) enables the book-keeping path.
        """
        params = {**{f"shared.{k}": v.detach() for k, v in self.shared.items()},
                  **{f"local.{k}": v.detach() for k, v in self.local.items()}}
        n = int(batch[0].shape[0])
        if n > 0 and self.dp.enabled and batch_loss is not None and self.dp.grad_method == "bookkeeping":
            from fedhype.privacy.bookkeeping import clipped_sum_bookkeeping

            summed, self.last_norms = clipped_sum_bookkeeping(batch_loss, params, batch, self.dp.clip_norm)
        elif n > 0 and self.dp.enabled:
            pe = per_example_grads(loss_fn, params, batch)
            summed, self.last_norms = clip_and_sum(pe, self.dp.clip_norm)
        elif n > 0:  # explicit --no-dp: the plain batch gradient, no per-example work
            leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
            total = vmap(loss_fn, in_dims=(None,) + (0,) * len(batch), randomness="error")(leaves, *batch).sum()
            summed = dict(zip(leaves, torch.autograd.grad(total, list(leaves.values()), allow_unused=True)))
            summed = {k: (g if g is not None else torch.zeros_like(params[k])) for k, g in summed.items()}
        else:
            summed = {k: torch.zeros_like(v) for k, v in params.items()}
        if self.dp.enabled:
            std = float(self.dp.noise_multiplier) * self.dp.clip_norm
            if std > 0:
                summed = {k: g + gaussian_noise_like(g, std, self.generator) for k, g in summed.items()}
            denom = self.expected_batch_size
        else:
            denom = max(n, 1)
        return {k: g / denom for k, g in summed.items()}

    def step(self, loss_fn: Callable[..., torch.Tensor], batch: tuple[torch.Tensor, ...],
             public_grad: Callable[[Params], Params] | None = None,
             batch_loss: Callable[..., torch.Tensor] | None = None) -> None:
        """One local DP-SGD step.

        Args:
            loss_fn: per-example loss ``loss_fn(params, *example)`` where ``params`` has keys
                ``"shared.<name>"`` and ``"local.<name>"``.
            batch: the Poisson-sampled batch (leading dim = actual batch size, may be 0).
            public_grad: optional data-free term: ``public_grad(shared) -> {name: grad}``, a
                function of the shared parameters only (no records); added after privatisation.
            batch_loss: optional batched form of the same loss for the book-keeping path.
        """
        g = self.noised_gradient(loss_fn, batch, batch_loss)
        for k, v in self.shared.items():
            v.grad = g[f"shared.{k}"].clone()
        for k, v in self.local.items():
            v.grad = g[f"local.{k}"].clone()
        if public_grad is not None:
            extra = public_grad({k: v.detach() for k, v in self.shared.items()})
            for k, e in extra.items():
                self.shared[k].grad = self.shared[k].grad + e
        self._opt_shared.step()
        self._opt_local.step()
        self.steps += 1

    def finish(self) -> PrivatizedUpdate:
        """Build the client's message: ``Δθ_i = θ_i^K − θ_i^0`` (post-processing of noised steps)."""
        delta = {k: (self.shared[k].detach() - self._theta0[k]) for k in self.shared}
        for v in self.local.values():
            v.requires_grad_(False)
        return PrivatizedUpdate(
            _token=_TOKEN, client=self.client, tensors=delta, steps=self.steps,
            noise_multiplier=self.dp.noise_multiplier if self.dp.enabled else None,
            clip_norm=self.dp.clip_norm, sample_rate=self.sample_rate, private=self.dp.enabled,
        )


#: L2 sensitivity of the *unweighted* class statistics (sums and counts): adding or removing one
#: unit-norm record changes one row of the class sums by that record (norm 1) and one count by 1.
#: The legacy release (:data:`LEGACY_WEIGHTS`) is the weighted release below with weights 1/√2.
CLASS_STATS_SENSITIVITY = math.sqrt(2.0)
#: L2 sensitivity of the *weighted* statistics vector ``(a·S, b·n, c·vec(M))`` released by
#: :func:`privatize_class_sums` when ``a² + b² + c² = 1`` (see :class:`ReleaseWeights`).
RELEASE_SENSITIVITY = 1.0
#: default share b² of the unit sensitivity given to the class counts: counts of hundreds of records
#: tolerate 5× the noise of the sums, which then get √(1 − b²) instead of 1/√2 of it (measured on
#: the bundled digits validation split: benchmarks/results/release_defaults.md)
COUNT_SHARE = 0.04


@dataclass(frozen=True)
class ReleaseWeights:
    """Weights (a, b, c) of the one-shot statistics release, with a² + b² + c² = 1.

    Each client releases the vector ``v = (a·S, b·n, c·m(M))`` + N(0, σ₀² I), where S are the
    per-class sums of its unit-norm embeddings [K, D], n the per-class counts [K], and m(M) the
    second-moment matrix ``M = Σ_i x_i x_iᵀ`` [D, D] written as its diagonal and √2 × its upper
    off-diagonal entries ("Analyze Gauss", Dwork, Talwar, Thakurta & Zhang, STOC 2014, Alg. 1,
    with the √2 weighting of the off-diagonals that makes ‖m(xxᵀ)‖₂ = ‖xxᵀ‖_F = ‖x‖² = 1).
    Adding or removing one record x with ‖x‖ = 1 changes v by ``(a·x in one row, b in one count,
    c·m(xxᵀ))``, of L2 norm √(a² + b² + c²) = 1 = :data:`RELEASE_SENSITIVITY`: one Gaussian
    mechanism with noise multiplier σ₀ (Dwork & Roth 2014, Thm. A.1; accounted by Opacus as one
    un-subsampled step ``(σ₀, q = 1, steps = 1)``). Dividing by the weights afterwards is
    post-processing: S carries noise std σ₀/a, n std σ₀/b, the diagonal of M std σ₀/c and each
    off-diagonal entry std σ₀/(c√2) (symmetric).

    Attributes:
        sums, counts, second_moment: a, b, c (floats ≥ 0; c = 0: no second moments released).
    """

    sums: float
    counts: float
    second_moment: float = 0.0

    def __post_init__(self) -> None:
        w = (self.sums, self.counts, self.second_moment)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in w) or self.sums <= 0 \
                or self.counts <= 0 or abs(sum(v * v for v in w) - 1.0) > 1e-9:
            raise ValidationError(f"release weights (a, b, c) must be ≥ 0 with a, b > 0 and a² + b² + c² = 1, got {w}")

    @classmethod
    def split(cls, second_moment_share: float, count_share: float = COUNT_SHARE) -> "ReleaseWeights":
        """Weights from shares of the squared sensitivity: c² = ``second_moment_share``, b² = ``count_share``.

        Raises:
            ValidationError: shares outside [0, 1) or summing to ≥ 1.
        """
        rho, beta = float(second_moment_share), float(count_share)
        if not (0 <= rho < 1 and 0 < beta < 1 and rho + beta < 1):
            raise ValidationError(f"second_moment_share ({rho}) and count share ({beta}) must be in [0, 1) with a sum < 1")
        return cls(math.sqrt(1.0 - rho - beta), math.sqrt(beta), math.sqrt(rho))

    def as_list(self) -> list[float]:
        return [float(self.sums), float(self.counts), float(self.second_moment)]

    def noise_std(self, noise_multiplier: float) -> dict[str, float]:
        """Per-entry noise std of each released statistic (after dividing by its weight)."""
        s = float(noise_multiplier)
        out = {"class_sums": s / self.sums, "class_counts": s / self.counts}
        if self.second_moment > 0:
            out["second_moment_diag"] = s / self.second_moment
            out["second_moment_offdiag"] = s / (self.second_moment * math.sqrt(2.0))
        return out


#: the release before second moments: sums and counts with equal weights (std σ₀·√2 each)
LEGACY_WEIGHTS = ReleaseWeights(1.0 / math.sqrt(2.0), 1.0 / math.sqrt(2.0), 0.0)


def symmetric_noise(dim: int, diag_std: float, generator: torch.Generator) -> torch.Tensor:
    """Symmetric Gaussian noise [D, D]: diagonal N(0, s²), off-diagonal N(0, s²/2) (mirrored)."""
    e = torch.triu(torch.normal(0.0, diag_std / math.sqrt(2.0), size=(dim, dim), generator=generator))
    e = e + e.T  # off-diagonals: std s/√2; diagonal: 2 × std s/√2 = s·√2
    e.diagonal().mul_(1.0 / math.sqrt(2.0))
    return e


def privatize_class_sums(client: str, x: torch.Tensor, labels: torch.Tensor, n_classes: int, dp: DPConfig,
                         generator: torch.Generator, weights: ReleaseWeights | None = None, *,
                         distributed=None, centring=None) -> PrivatizedUpdate:
    """Per-class sums and counts (and, with ``weights.second_moment > 0``, the second-moment matrix)
    of a client's unit-norm embeddings, through one Gaussian mechanism.

    The weighted vector ``(a·S, b·n, c·m(M))`` of :class:`ReleaseWeights` has L2 sensitivity 1
    under add/remove of one record (rows are normalised to unit L2 norm first: the clipping, a
    fixed transform), and N(0, σ₀²) is added to each of its entries; the returned tensors are
    divided by the weights again (post-processing), so ``class_sums`` = S + N(0, (σ₀/a)²),
    ``class_counts`` = n + N(0, (σ₀/b)²), ``second_moment`` = M + symmetric noise (diagonal std
    σ₀/c, off-diagonal std σ₀/(c√2)). Accounting: one un-subsampled Gaussian step
    ``(σ₀, q = 1, steps = 1)`` (Dwork & Roth 2014, Thm. A.1). With DP disabled the exact
    statistics are returned, marked non-private.

    Args:
        client: client id. x: float32 ``[n, D]`` raw embeddings. labels: int64 ``[n]`` in ``[0, K)``.
        n_classes: K. dp: mechanism settings (``noise_multiplier`` = σ₀ of this release).
        generator: the client's noise generator.
        weights: the split of the unit sensitivity (default :data:`LEGACY_WEIGHTS`: sums and counts
            only, each with noise std σ₀·√2).
        distributed: a :class:`fedhype.privacy.secure_agg.DistributedNoise` ``(m, t)`` for a run with
            secure aggregation: every noise std is multiplied by 1/√(m − t) and the result is a
            :class:`~fedhype.privacy.secure_agg.SecureShare`, readable only by
            :func:`~fedhype.privacy.secure_agg.secure_sum` (whose sum of ≥ m − t shares carries the
            noise of the σ₀ release; the derivation is in that module's docstring).
        centring: a :class:`fedhype.privacy.centring.Centring` (c, R) — the public outputs of the
            centre release: the statistics are those of ``y = clip_R(x/‖x‖ − c)/R`` (‖y‖ ≤ 1, so the
            sensitivity stays 1; :mod:`fedhype.privacy.centring`) and ``dp.noise_multiplier`` is σ_B.

    Returns:
        PrivatizedUpdate with tensors ``class_sums`` float32 [K, D], ``class_counts`` [K] and, when
        ``weights.second_moment > 0``, ``second_moment`` [D, D] (symmetric); ``steps = 1``,
        ``sample_rate = 1``, ``clip_norm`` = :data:`RELEASE_SENSITIVITY`.
    """
    w = LEGACY_WEIGHTS if weights is None else weights
    x = torch.nn.functional.normalize(x.to(torch.float32), dim=-1) if centring is None else \
        centring.transform(x)[0].to(torch.float32)
    onehot = torch.nn.functional.one_hot(labels.to(torch.int64), n_classes).to(torch.float32)
    tensors = {"class_sums": onehot.T @ x, "class_counts": onehot.sum(0)}
    if w.second_moment > 0:
        tensors["second_moment"] = (x.T.to(torch.float64) @ x.to(torch.float64)).to(torch.float32)
    if dp.enabled and float(dp.noise_multiplier) > 0:
        std = w.noise_std(float(dp.noise_multiplier))
        if distributed is not None:
            std = {k: v * distributed.share_std_factor for k, v in std.items()}
        tensors["class_sums"] = tensors["class_sums"] + gaussian_noise_like(tensors["class_sums"], std["class_sums"], generator)
        tensors["class_counts"] = tensors["class_counts"] + gaussian_noise_like(
            tensors["class_counts"], std["class_counts"], generator)
        if "second_moment" in tensors:
            tensors["second_moment"] = tensors["second_moment"] + symmetric_noise(
                x.shape[1], std["second_moment_diag"], generator)
    if distributed is not None:
        from fedhype.privacy.secure_agg import _share

        return _share(client, tensors, distributed, dp.noise_multiplier if dp.enabled else None, dp.enabled)
    return PrivatizedUpdate(
        _token=_TOKEN, client=client, tensors=tensors, steps=1,
        noise_multiplier=dp.noise_multiplier if dp.enabled else None, clip_norm=RELEASE_SENSITIVITY,
        sample_rate=1.0, private=dp.enabled)


def poisson_batch(n: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson-sampled batch: each of ``n`` records independently with prob. q.

    Returns int64 ``[b]`` (b ~ Binomial(n, q), may be 0). Poisson sampling is what the
    subsampled-Gaussian accountants assume (Mironov et al. 2019; Opacus ``UniformWithReplacementSampler``).
    """
    mask = torch.rand(n, generator=generator) < sample_rate
    return mask.nonzero(as_tuple=False).flatten()
