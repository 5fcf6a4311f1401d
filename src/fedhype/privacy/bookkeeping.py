"""Per-example gradient norms and clipped sums without materialising per-example gradients.

Book-keeping / ghost clipping (Goodfellow 2015, "Efficient per-example gradient computations";
Li et al. 2022, "Large language models can be strong DP learners", §4; Bu et al. 2023,
"Differentially private optimization on large model at small cost", Alg. 1). For a linear use
``o = a Wᵀ + b`` of example i over T positions (a_i ∈ R^{T×in}, output gradient δ_i ∈ R^{T×out}):

    ∇_W ℓ_i = δ_iᵀ a_i,   ‖∇_W ℓ_i‖²_F = ⟨a_i a_iᵀ, δ_i δ_iᵀ⟩_F,   ∇_b ℓ_i = Σ_t δ_{i,t}

so the per-example norms need only T×T Gram matrices, and the clipped sum
Σ_i c_i ∇_W ℓ_i = (c ⊙ δ)ᵀ a is one matrix product. The output gradients δ come from ONE
backward pass of Σ_i ℓ_i, taken with respect to every recorded output itself (examples are
independent, so ∂(Σ_j ℓ_j)/∂o_i = ∂ℓ_i/∂o_i). The parameters enter the forward pass as leaves
that require grad, so every recorded output is in the graph; the backward pass computes only the
output gradients asked for, never a parameter gradient. (Adding a zero "probe" tensor to each
output, the previous form, gave the same δ for about 12 % more time per DP step: 1.44× against
1.29× the non-DP step, measured in one run on 2 CPU cores with ``benchmarks/dp_step.py``'s model,
248,320 parameters, B = 64.)

Why not ``vmap(grad)`` here (docs/method.md decision 2: no module hooks; torch.func is the reference): it materialises
B × |θ ∪ ψ| numbers per step; measured on 2 CPU cores (D = 384, B = 64, 546k parameters) it cost
4.7–9× the non-DP step, against about 1.5–2× for this path (``benchmarks/dp_step.py``). The
torch.func path stays the reference (:func:`fedhype.privacy.dp_step.per_example_grads`); tests
check that both give the same norms and clipped sums on the FedHypeVAE loss. Like torch.func,
this path works with generated weights (no module hooks).

Requirement checked at run time: every parameter is used by exactly one recorded op (per
FiLM row), so the per-op norms add up to the per-example norm.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.nn import functional as F

from fedhype.errors import FedhypeError

Params = dict[str, torch.Tensor]


class GradTape:
    """Records each parameter use of one batched forward pass (leading dim = example)."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self._used: set = set()

    def _mark(self, *keys) -> None:
        for k in keys:
            if k in self._used:
                raise FedhypeError(f"book-keeping DP step: parameter {k!r} used twice in one forward pass; "
                                   "per-example norms would be wrong (use the torch.func path)")
            self._used.add(k)

    def linear(self, wkey: str, bkey: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``F.linear(x, w, b)`` with x ``[B, ..., in]``."""
        self._mark(wkey, bkey)
        out = F.linear(x, w, b)
        self.ops.append(("linear", wkey, bkey, x.detach(), out))
        return out

    def matmul(self, key: str, a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """``a @ m`` with a ``[B, ..., K]`` (data side) and parameter m ``[K, L]``."""
        self._mark(key)
        out = a @ m
        self.ops.append(("matmul", key, None, a.detach(), out))
        return out

    def per_example(self, key: str, p: torch.Tensor, batch: int) -> torch.Tensor:
        """``p`` broadcast to ``[batch, *p.shape]``: each example's copy gets its own gradient."""
        self._mark(key)
        out = p.expand(batch, *p.shape)
        self.ops.append(("elementwise", key, None, None, out))
        return out

    def film(self, gkey: str, bkey: str, row: int, h: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """``gamma * h + beta`` where gamma, beta are row ``row`` of the parameters gkey, bkey."""
        self._mark((gkey, row), (bkey, row))
        out = gamma * h + beta
        self.ops.append(("film", (gkey, row), (bkey, row), h.detach(), out))
        return out


def _as3(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1, t.shape[-1])


def clipped_sum_bookkeeping(batch_loss: Callable[..., torch.Tensor], params: Params, batch: tuple[torch.Tensor, ...],
                            clip_norm: float) -> tuple[Params, torch.Tensor]:
    """Σ_i min(1, C/‖g_i‖) g_i over all parameters, and the per-example norms ‖g_i‖ (float32 [B]).

    Args:
        batch_loss: ``batch_loss(params, tape, *batch) -> [B]`` per-example losses, computed
            batched, with every parameter use reported to ``tape``.
        params: name → tensor (no batch dim); every one must be used exactly once.
        batch: tensors with leading dim B ≥ 1.
        clip_norm: C.

    Returns the same quantities as :func:`fedhype.privacy.dp_step.clip_and_sum` applied to
    per-example gradients (tested equal to the torch.func reference).
    """
    tape = GradTape()
    # leaves that require grad: every recorded output is then in the graph (its gradient is asked for
    # below); no parameter gradient is computed, only the recorded outputs'
    losses = batch_loss({k: v.detach().requires_grad_(True) for k, v in params.items()}, tape, *batch)
    B = losses.shape[0]
    deltas = torch.autograd.grad(losses.sum(), [op[-1] for op in tape.ops])
    sq = torch.zeros(B, dtype=losses.dtype, device=losses.device)
    parts = []
    for op, d in zip(tape.ops, deltas):
        kind, k1, k2, a, _ = op
        if kind == "elementwise":  # per-example gradients are the probe gradients themselves
            g = d.reshape(B, -1)
            sq = sq + g.pow(2).sum(1)
            parts.append((kind, k1, None, d, None, None))
            continue
        a3, d3 = _as3(a), _as3(d)
        if kind in ("linear", "matmul"):
            if a3.shape[1] == 1:
                sq = sq + a3.pow(2).sum((1, 2)) * d3.pow(2).sum((1, 2))
            else:
                sq = sq + (torch.bmm(a3, a3.transpose(1, 2)) * torch.bmm(d3, d3.transpose(1, 2))).sum((1, 2))
            gb = d3.sum(1) if kind == "linear" else None
            if gb is not None:
                sq = sq + gb.pow(2).sum(1)
            parts.append((kind, k1, k2, a3, d3, gb))
        else:  # film: per-example gradients are small [B, hidden]: materialise them
            gg, gb = (d3 * a3).sum(1), d3.sum(1)
            sq = sq + gg.pow(2).sum(1) + gb.pow(2).sum(1)
            parts.append((kind, k1, k2, gg, None, gb))
    norms = sq.clamp_min(0).sqrt()
    c = (clip_norm / (norms + 1e-6)).clamp(max=1.0)
    out: Params = {}
    for kind, k1, k2, x, d3, gb in parts:
        if kind == "linear":
            cd = d3 * c[:, None, None]
            out[k1] = torch.einsum("bto,bti->oi", cd, x)
            out[k2] = cd.sum((0, 1))
        elif kind == "elementwise":
            out[k1] = torch.einsum("b,b...->...", c, x)
        elif kind == "matmul":
            out[k1] = torch.einsum("btk,btl->kl", x, d3 * c[:, None, None])
        else:
            (gkey, row), (bkey, _) = k1, k2
            out.setdefault(gkey, torch.zeros_like(params[gkey]))[row] = (c[:, None] * x).sum(0)
            out.setdefault(bkey, torch.zeros_like(params[bkey]))[row] = (c[:, None] * gb).sum(0)
    missing = set(params) - set(out)
    if missing:
        raise FedhypeError(f"book-keeping DP step: parameters {sorted(missing)} were not recorded by the tape; "
                           "their use would escape clipping")
    return out, norms
