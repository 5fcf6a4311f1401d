"""The functional CVAE: a client's local encoder q_ψ(z | x, y) and the generated decoder.

All functions are pure (parameters passed as dicts) so that ``torch.func`` can take per-example
gradients over the whole loss (docs/method.md, decision 2). Shapes: a single example (``x`` [D],
``y1h`` [K]) or a batch (``x`` [B, D], ``y1h`` [B, K]) both work.

Embedding space (docs/method.md, decision 5 — no private statistics): the model works on
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


def to_output_space(x: torch.Tensor, space: Space | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Back from model space to unit-norm embeddings ``y / ‖y‖``, ``y = m + s·x̃`` [..., D] — the
    space synthetic stores are written in (into ``out`` when given: float32, same shape)."""
    if space is not None:
        x = space[0] + space[1] * x
    return F.normalize(x, dim=-1, out=out)


def init_local_encoder(cfg: ModelConfig, generator: torch.Generator) -> Params:
    """Fresh ψ_i: 3 hidden layers (width ``hidden``) → (μ, log σ²) of size L each."""
    h, D, K, L = cfg.hidden, cfg.dim, cfg.n_classes, cfg.latent
    p: Params = {}
    for (wn, bn, o, i) in [("w1", "b1", h, D + K), ("w2", "b2", h, h), ("w3", "b3", h, h),
                           ("wmu", "bmu", L, h), ("wlv", "blv", L, h)]:
        p[wn], p[bn] = _linear_init(o, i, generator)
    p["wlv"] = p["wlv"] * 0.0
    p["blv"] = p["blv"] * 0.0 - 2.0
    if cfg.linear_path:  # linear path of the encoder (set to the PPCA posterior: init_encoder_from_decoder)
        p["wx"], p["wy"] = torch.zeros(D, L), torch.zeros(K, L)
    return p


def init_encoder_from_decoder(psi: Params, theta: Params) -> None:
    """Set ψ's linear path to the exact posterior of the linear-Gaussian decoder in θ (in place).

    With ``x̃ = z·W + cb[y] + σ_x ⊙ ε``, z ~ N(0, I) (the untrained model of
    :func:`fedhype.federated.class_stats.apply_class_stats`), the posterior is
    q(z | x, y) = N(Σ W diag(σ_x⁻²)(x̃ − cb[y]), Σ) with Σ = (I + W diag(σ_x⁻²) Wᵀ)⁻¹ (probabilistic
    PCA, Tipping & Bishop 1999, eq. 6): ``wx = diag(σ_x⁻²) Wᵀ Σ`` [D, L], ``wy = −cb·wx`` [K, L],
    ``blv = log diag Σ``, and the MLP's outputs (``wmu``, ``bmu``, ``wlv``) zeroed, so the ELBO's
    starting point is the PPCA optimum that the decoder was initialised at. θ comes from public DP
    outputs, so this is post-processing.
    """
    w = theta["dec.wl"].to(torch.float64)  # [L, D]
    inv_var = torch.exp(-2.0 * theta["dec.logsx"].to(torch.float64)) if "dec.logsx" in theta else torch.ones(w.shape[1], dtype=torch.float64, device=w.device)
    prec = torch.eye(w.shape[0], dtype=torch.float64, device=w.device) + (w * inv_var) @ w.T
    cov = torch.linalg.inv(prec)
    cov = (cov + cov.T) / 2
    wx = (w * inv_var).T @ cov  # [D, L]
    with torch.no_grad():
        psi["wx"].copy_(wx.to(psi["wx"].dtype))
        psi["wy"].copy_((-theta["dec.cb"].to(torch.float64) @ wx).to(psi["wy"].dtype) if "dec.cb" in theta else 0.0)
        psi["wmu"].zero_()
        psi["bmu"].zero_()
        psi["wlv"].zero_()
        # encode() bounds log σ² as 4·tanh(·/4): invert it so the output is log diag Σ
        target = torch.log(torch.diagonal(cov).clamp_min(1e-6)).clamp(-3.9, 3.9)
        psi["blv"].copy_((4.0 * torch.atanh(target / 4.0)).to(psi["blv"].dtype))


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
    if "wx" in local:  # linear path (ours): + x̃·wx + onehot(y)·wy
        if tape is None:
            mu = mu + x @ local["wx"] + y1h @ local["wy"]
        else:
            mu = mu + tape.matmul(prefix + "wx", x, local["wx"]) + tape.matmul(prefix + "wy", y1h, local["wy"])
    return mu, 4.0 * torch.tanh(_linear(local, "wlv", "blv", h, tape, prefix) / 4.0)


def decode(theta: Params, z: torch.Tensor, y1h: torch.Tensor, tape=None, prefix: str = "shared.") -> torch.Tensor:
    """p_θ(x | z, y) mean: [..., L] ⊕ [..., K] → [..., D] (model space), with FiLM if present.

    ``MLP(z ⊕ y) + z·W_lin + cb[y]``; the last two terms only when ``dec.wl`` / ``dec.cb`` exist.
    """
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
    if "dec.wl" in theta:  # linear path (ours): out += z @ W_lin, W_lin [L, D]
        out = out + (z @ theta["dec.wl"] if tape is None else tape.matmul(prefix + "dec.wl", z, theta["dec.wl"]))
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
           temperature: float = 1.0, space: Space | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Draw synthetic embeddings: z ~ prior(y), x ~ N(decode(z, y), diag σ_x²), mapped to the unit sphere.

    Args:
        labels: int64 [N]. space: the model space (:func:`to_model_space`). out: float32 [N, D] to write
            the result into (optional). Returns float32 [N, D], unit norm.
    """
    y1h = F.one_hot(labels, cfg.n_classes).to(torch.float32)
    mu, lv = prior(theta, y1h, cfg.latent)
    eps = torch.randn(mu.shape, generator=generator, device=mu.device)
    z = mu + temperature * torch.exp(0.5 * lv) * eps
    x = decode(theta, z, y1h)
    if "dec.logsx" in theta:
        x = x + temperature * torch.exp(theta["dec.logsx"]) * torch.randn(x.shape, generator=generator, device=x.device)
    return to_output_space(x, space, out)
