"""Loss terms of FedHypeVAE, each either per-example decomposable or data-independent.

(docs/method.md, decision 3.) For a client with generated parameters θ and local encoder ψ, the
per-example loss of a record (x, y) in model space is

    ℓ(x, y) = Σ_d [½(x_d − dec_θ(z, y)_d)² / σ_{x,d}² + log σ_{x,d}] + β·KL(q_ψ(z|x,y) ‖ p_θ(z|y)) − 2·λ_MMD · (1/m) Σ_j k(x, x̃_j)

with z = μ_q + σ_q ⊙ ε (reparameterisation, Kingma & Welling 2014) and x̃_j = dec_θ(z̃_j, y),
z̃_j ~ p_θ(z | y) — the *cross term* of the (class-conditional) MMD² (Gretton et al. 2012,
eq. 3), which is a mean over real examples. The *synthetic–synthetic* term
λ_MMD · mean_{j≠j'} k(x̃_j, x̃_j') uses no records and is added after privatisation
(:func:`synthetic_repulsion`); the real–real term has no parameter gradient and is dropped.
The Lipschitz penalty of h_Φ (:func:`lipschitz_penalty`) depends only on Φ and the codes.

Kernel: a sum of Gaussian RBF kernels on the unit sphere with fixed bandwidths (no median
heuristic on private data: docs/method.md, decision 5).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from fedhype.models.config import ModelConfig
from fedhype.models.cvae import decode, encode, prior

Params = dict[str, torch.Tensor]


def rbf(a: torch.Tensor, b: torch.Tensor, bandwidths: tuple[float, ...]) -> torch.Tensor:
    """Mean of Gaussian RBF kernels exp(−‖â − b̂‖² / (2h²)) on unit-normalised inputs.

    ``a`` [..., n, D], ``b`` [..., m, D] → [..., n, m].
    """
    a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    d2 = (2.0 - 2.0 * a @ b.transpose(-1, -2)).clamp_min(0.0)
    return sum(torch.exp(-d2 / (2.0 * h * h)) for h in bandwidths) / len(bandwidths)


def kl_diag_gauss(mu_q: torch.Tensor, lv_q: torch.Tensor, mu_p: torch.Tensor, lv_p: torch.Tensor) -> torch.Tensor:
    """KL(N(μ_q, σ_q²) ‖ N(μ_p, σ_p²)) summed over the last dim (closed form)."""
    return 0.5 * (lv_p - lv_q + (torch.exp(lv_q) + (mu_q - mu_p) ** 2) / torch.exp(lv_p) - 1.0).sum(-1)


def split_params(params: Params) -> tuple[Params, Params]:
    """Split ``{"shared.k": ..., "local.k": ...}`` into (θ, ψ)."""
    theta = {k[7:]: v for k, v in params.items() if k.startswith("shared.")}
    psi = {k[6:]: v for k, v in params.items() if k.startswith("local.")}
    return theta, psi


def example_terms(theta: Params, psi: Params, x: torch.Tensor, y1h: torch.Tensor, eps_q: torch.Tensor,
                  eps_s: torch.Tensor, cfg: ModelConfig, tape=None) -> dict[str, torch.Tensor]:
    """Reconstruction, KL and MMD cross term for one example or a batch.

    Args:
        x: model-space embedding [D] (or [B, D]); y1h: one-hot label [K] (or [B, K]);
        eps_q: N(0, I) noise [L] for z; eps_s: N(0, I) noise [m, L] for the synthetic samples.
    Returns: dict of ``recon``, ``kl``, ``mmd_cross`` (each a scalar or [B]).
    """
    mu_q, lv_q = encode(psi, x, y1h, tape)
    z = mu_q + torch.exp(0.5 * lv_q) * eps_q
    mu_p, lv_p = prior(theta, y1h, cfg.latent, tape)
    kl = kl_diag_gauss(mu_q, lv_q, mu_p, lv_p)
    if cfg.lambda_mmd > 0:
        # one decoder pass for the reconstruction and the m synthetic samples (one per-example
        # gradient contribution per layer instead of two)
        zs = mu_p.unsqueeze(-2) + torch.exp(0.5 * lv_p).unsqueeze(-2) * eps_s  # [..., m, L]
        zall = torch.cat([z.unsqueeze(-2), zs], dim=-2)  # [..., 1+m, L]
        out = decode(theta, zall, y1h.unsqueeze(-2).expand(*zall.shape[:-1], y1h.shape[-1]), tape)
        xr, xs = out[..., 0, :], out[..., 1:, :]
        cross = -2.0 * rbf(x.unsqueeze(-2), xs, cfg.mmd_bandwidths).mean((-1, -2))
    else:
        xr = decode(theta, z, y1h, tape)
        cross = torch.zeros_like(kl)
    if "dec.logsx" in theta:  # Gaussian NLL with learned per-dimension σ_x (up to ½·D·log 2π)
        ls = theta["dec.logsx"] if tape is None else tape.per_example("shared.dec.logsx", theta["dec.logsx"], x.shape[0])
        recon = (0.5 * (x - xr) ** 2 * torch.exp(-2.0 * ls) + ls).sum(-1)
    else:
        recon = 0.5 * ((x - xr) ** 2).sum(-1)
    return {"recon": recon, "kl": kl, "mmd_cross": cross}


def make_per_example_loss(cfg: ModelConfig):
    """The per-example loss ``loss(params, x, y1h, eps_q, eps_s) -> scalar`` for the DP step.

    ``params`` keys: ``shared.<θ name>`` and ``local.<ψ name>`` (see :mod:`fedhype.privacy.dp_step`).
    """

    def loss(params: Params, x, y1h, eps_q, eps_s):
        theta, psi = split_params(params)
        t = example_terms(theta, psi, x, y1h, eps_q, eps_s, cfg)
        return t["recon"] + cfg.beta * t["kl"] + cfg.lambda_mmd * t["mmd_cross"]

    return loss


def make_batch_loss(cfg: ModelConfig):
    """The same loss for a whole batch: ``loss(params, tape, x, y1h, eps_q, eps_s) -> [B]``.

    Every parameter use is reported to ``tape`` (book-keeping per-example clipping,
    :mod:`fedhype.privacy.bookkeeping`); equal to :func:`make_per_example_loss` row by row.
    """

    def loss(params: Params, tape, x, y1h, eps_q, eps_s):
        theta, psi = split_params(params)
        t = example_terms(theta, psi, x, y1h, eps_q, eps_s, cfg, tape)
        return t["recon"] + cfg.beta * t["kl"] + cfg.lambda_mmd * t["mmd_cross"]

    return loss


def synthetic_repulsion(theta: Params, cfg: ModelConfig, generator: torch.Generator, per_class: int = 8) -> torch.Tensor:
    """λ_MMD · mean over classes of mean_{j≠j'} k(x̃_j, x̃_j') — the data-free MMD² term.

    Classes are weighted uniformly (a public choice). Returns a scalar with gradient w.r.t. θ.
    """
    K, L = cfg.n_classes, cfg.latent
    y = torch.arange(K).repeat_interleave(per_class)
    y1h = F.one_hot(y, K).to(torch.float32)
    mu, lv = prior(theta, y1h, L)
    z = mu + torch.exp(0.5 * lv) * torch.randn(mu.shape, generator=generator)
    xs = decode(theta, z, y1h).reshape(K, per_class, -1)
    k = rbf(xs, xs, cfg.mmd_bandwidths)  # [K, m, m]
    off = (k.sum((-1, -2)) - k.diagonal(dim1=-2, dim2=-1).sum(-1)) / (per_class * (per_class - 1))
    return cfg.lambda_mmd * off.mean()


def make_public_grad(cfg: ModelConfig, generator: torch.Generator, per_class: int = 8):
    """``public_grad(θ) -> ∇_θ synthetic_repulsion`` for :meth:`LocalDPSession.step` (no records)."""

    def public_grad(theta: Params) -> Params:
        if cfg.lambda_mmd <= 0:
            return {}
        th = {k: v.detach().requires_grad_(True) for k, v in theta.items()}
        val = synthetic_repulsion(th, cfg, generator, per_class)
        grads = torch.autograd.grad(val, list(th.values()), allow_unused=True)
        return {k: g for k, g in zip(th, grads) if g is not None}

    return public_grad


def lipschitz_penalty(hnet, codes: torch.Tensor, generator: torch.Generator, delta: float = 0.1) -> torch.Tensor:
    """Finite-difference Lipschitz penalty of the code-dependent outputs of h_Φ.

    mean_i ‖h(c_i + δu_i) − h(c_i)‖² / δ² with u_i uniform on the unit sphere: an unbiased
    (up to O(δ)) estimate of ‖J_h(c_i)‖_F² / code_dim. ``codes`` float32 [n, code_dim].
    Depends only on Φ and the (DP) codes, so it is added unclipped (docs/method.md, decision 3).
    """
    u = F.normalize(torch.randn(codes.shape, generator=generator), dim=-1)
    total = codes.new_zeros(())
    for c, d in zip(codes, u):
        a, b = hnet.generated(c), hnet.generated(c + delta * d)
        if not a:
            return total
        total = total + sum(((b[k] - a[k]) ** 2).sum() for k in a) / delta**2
    return total / max(len(codes), 1)


def lipschitz_penalty_backward(hnet, codes: torch.Tensor, indices: list[int], generator: torch.Generator,
                               weight: float, delta: float = 0.1) -> torch.Tensor:
    """``weight ×`` :func:`lipschitz_penalty` of ``codes[indices]``, back-propagated one code at a time.

    The same estimate with the same random directions (one ``randn`` of shape [len(indices),
    code_dim] from ``generator``, as :func:`lipschitz_penalty` draws), but each code's term is
    back-propagated into the ``.grad`` of Φ and ``codes`` (float32 [n_clients, code_dim], a leaf) as
    soon as it is built, so memory does not grow with the number of codes. Returns the penalty's
    value (detached, without ``weight``).
    """
    u = F.normalize(torch.randn((len(indices), codes.shape[1]), generator=generator), dim=-1)
    n = max(len(indices), 1)
    total = 0.0
    for i, d in zip(indices, u):
        c = codes[i]
        a, b = hnet.generated(c), hnet.generated(c + delta * d)
        if not a:
            break
        term = sum(((b[k] - a[k]) ** 2).sum() for k in a) / delta**2
        (weight * term / n).backward()
        total += float(term.detach())
    return torch.tensor(total / n)


def batch_elbo(theta: Params, psi: Params, x: torch.Tensor, labels: torch.Tensor, cfg: ModelConfig,
               generator: torch.Generator) -> dict[str, float]:
    """Diagnostics on a batch (no gradient): mean recon, KL and negative ELBO per example."""
    with torch.no_grad():
        y1h = F.one_hot(labels, cfg.n_classes).to(torch.float32)
        eps_q = torch.randn(x.shape[0], cfg.latent, generator=generator)
        eps_s = torch.randn(x.shape[0], 1, cfg.latent, generator=generator)
        t = example_terms(theta, psi, x, y1h, eps_q, eps_s, cfg)
        recon, kl = t["recon"].mean().item(), t["kl"].mean().item()
    return {"recon": recon, "kl": kl, "neg_elbo": recon + kl}
