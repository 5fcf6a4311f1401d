"""The functional CVAE: a client's local encoder q_ψ(z | x, y) and the generated decoder.

All functions are pure (parameters passed as dicts) so that ``torch.func`` can take per-example
gradients over the whole loss (method.md, decision 2). Shapes: a single example (``x`` [D],
``y1h`` [K]) or a batch (``x`` [B, D], ``y1h`` [B, K]) both work.

Embedding space (method.md, decision 5 — no private statistics): the model works on
``x̃ = √D · x / ‖x‖₂`` — L2 normalisation (a fixed transform) scaled so coordinates have unit
mean square. Synthetic outputs are mapped back to the unit sphere (``x̂ / ‖x̂‖``).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from fedhype.models.config import ModelConfig
from fedhype.models.hypernet import _linear_init

Params = dict[str, torch.Tensor]


Space = tuple[torch.Tensor, torch.Tensor]


def to_model_space(x: torch.Tensor, space: Space | None = None) -> torch.Tensor:
    """``(x/‖x‖ − m) / s`` for float32 ``x`` [..., D].

    ``space = (m [D], s [])`` comes from DP class statistics (:mod:`fedhype.federated.class_stats`);
    without it, m = 0 and s = 1/√D: the fixed transform ``√D · x / ‖x‖``.
    """
    u = F.normalize(x, dim=-1)
    if space is None:
        return u * math.sqrt(x.shape[-1])
    return (u - space[0]) / space[1]


def to_output_space(x: torch.Tensor, space: Space | None = None) -> torch.Tensor:
    """Back from model space to unit-norm embeddings ``y / ‖y‖``, ``y = m + s·x̃`` [..., D] — the
    space synthetic stores are written in."""
    if space is not None:
        x = space[0] + space[1] * x
    return F.normalize(x, dim=-1)


def init_local_encoder(cfg: ModelConfig, generator: torch.Generator) -> Params:
    """Fresh ψ_i: 3 hidden layers (width ``hidden``) → (μ, log σ²) of size L each."""
    h, D, K, L = cfg.hidden, cfg.dim, cfg.n_classes, cfg.latent
    p: Params = {}
    for (wn, bn, o, i) in [("w1", "b1", h, D + K), ("w2", "b2", h, h), ("w3", "b3", h, h),
                           ("wmu", "bmu", L, h), ("wlv", "blv", L, h)]:
        p[wn], p[bn] = _linear_init(o, i, generator)
    p["wlv"] = p["wlv"] * 0.0
    p["blv"] = p["blv"] * 0.0 - 2.0
    return p


def _linear(p: Params, w: str, b: str, x: torch.Tensor, tape, prefix: str) -> torch.Tensor:
    """``F.linear`` that reports the parameter use to a per-example-gradient tape if given."""
    if tape is None:
        return F.linear(x, p[w], p[b])
    return tape.linear(prefix + w, prefix + b, x, p[w], p[b])


def encode(local: Params, x: torch.Tensor, y1h: torch.Tensor, tape=None, prefix: str = "local.") -> tuple[torch.Tensor, torch.Tensor]:
    """q_ψ(z | x, y): returns (μ, log σ²), each [..., L].

    ``tape`` (optional, see :class:`fedhype.privacy.bookkeeping.GradTape`) records every
    parameter use for per-example gradient norms; ``prefix`` names the parameters on it.
    """
    h = torch.cat([x, y1h], dim=-1)
    for i in (1, 2, 3):
        h = F.silu(_linear(local, f"w{i}", f"b{i}", h, tape, prefix))
    mu = _linear(local, "wmu", "bmu", h, tape, prefix)
    return mu, 4.0 * torch.tanh(_linear(local, "wlv", "blv", h, tape, prefix) / 4.0)


def decode(theta: Params, z: torch.Tensor, y1h: torch.Tensor, tape=None, prefix: str = "shared.") -> torch.Tensor:
    """p_θ(x | z, y) mean: [..., L] ⊕ [..., K] → [..., D] (model space), with FiLM if present."""
    h = torch.cat([z, y1h], dim=-1)
    film = "film.gamma" in theta
    for i in (1, 2, 3):
        h = _linear(theta, f"dec.w{i}", f"dec.b{i}", h, tape, prefix)
        if film:
            if tape is None:
                h = theta["film.gamma"][i - 1] * h + theta["film.beta"][i - 1]
            else:
                h = tape.film(prefix + "film.gamma", prefix + "film.beta", i - 1, h,
                              theta["film.gamma"][i - 1], theta["film.beta"][i - 1])
        h = F.silu(h)
    out = _linear(theta, "dec.wo", "dec.bo", h, tape, prefix)
    if "dec.cb" in theta:  # class output bias (ours): out += onehot(y) @ cb
        out = out + (y1h @ theta["dec.cb"] if tape is None else tape.matmul(prefix + "dec.cb", y1h, theta["dec.cb"]))
    return out


def prior(theta: Params, y1h: torch.Tensor, latent: int, tape=None, prefix: str = "shared.") -> tuple[torch.Tensor, torch.Tensor]:
    """Class-conditional prior (μ_{i,y}, log σ²_{i,y}) [..., L]; N(0, I) when not generated."""
    if "prior.mu" in theta:
        if tape is None:
            return y1h @ theta["prior.mu"], y1h @ theta["prior.logvar"]
        return (tape.matmul(prefix + "prior.mu", y1h, theta["prior.mu"]),
                tape.matmul(prefix + "prior.logvar", y1h, theta["prior.logvar"]))
    zeros = torch.zeros(*y1h.shape[:-1], latent, dtype=y1h.dtype, device=y1h.device)
    return zeros, zeros


def sample(theta: Params, labels: torch.Tensor, cfg: ModelConfig, generator: torch.Generator,
           temperature: float = 1.0, space: Space | None = None) -> torch.Tensor:
    """Draw synthetic embeddings: z ~ prior(y), x ~ N(decode(z, y), diag σ_x²), mapped to the unit sphere.

    Args:
        labels: int64 [N]. space: the model space (:func:`to_model_space`). Returns float32 [N, D], unit norm.
    """
    y1h = F.one_hot(labels, cfg.n_classes).to(torch.float32)
    mu, lv = prior(theta, y1h, cfg.latent)
    eps = torch.randn(mu.shape, generator=generator, device=mu.device)
    z = mu + temperature * torch.exp(0.5 * lv) * eps
    x = decode(theta, z, y1h)
    if "dec.logsx" in theta:
        x = x + temperature * torch.exp(theta["dec.logsx"]) * torch.randn(x.shape, generator=generator, device=x.device)
    return to_output_space(x, space)
