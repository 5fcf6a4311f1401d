"""Class-mean anchoring: each code's synthetic class means put back on the statistics release's.

The statistics release before round 0 estimates each class mean once, with the Gaussian mechanism
(docs/method.md decisions 9–12); the untrained model samples exactly those means
(:func:`fedhype.federated.class_stats.apply_class_stats`). DP-SGD then moves the class output bias, the
prior means and the MLP with noisy steps, and the mean of the decoder under the prior drifts from the data's
(a VAE fits the data under its aggregate posterior, not under the prior it is sampled from): on all 70,000
Fashion-MNIST images (10 clients, validation split, 3 seeds, ε = 4 / 8) ours' synthetic class means lie
0.07 / 0.08 (L2, unit-sphere units) from the real ones, the release's 0.04, and ours' MMD² is the larger.
Anchoring keeps the within-class shape DP-SGD learned and restores the release's means: for the model θ of a
code,

    E[x̃ | y] = E_z[MLP_θ(z, y)] + μ_y·W_lin + cb[y]        (z ~ the code's prior N(μ_y, diag σ_y²))

and the class output bias is replaced by ``cb'[y] = a[y] − E_z[MLP_θ(z, y)] − μ_y·W_lin`` so that
``E[x̃ | y] = a[y]``, the release's class mean of that code
(:meth:`fedhype.models.hypernet.HyperNetwork.release_class_means`). Every quantity is a DP output the
model already holds: post-processing, no ε. The MLP term is a Monte Carlo mean over ``draws`` latent
draws per class (antithetic pairs z = μ ± σ·e) from a fixed generator (exact, with no Monte Carlo error, when
the MLP output layer is zero, as in the untrained model and ``dp-gaussian``: anchoring then changes nothing).

It halves the class-mean error and lowers MMD² below the release alone's, but part of what DP-SGD adds to TSTR
lies in those moved means (−0.003 at ε = 4 on all 70,000 images), so synthesis does not anchor by default
(:data:`fedhype.synthesis.defaults.DEFAULT_ANCHOR`; ``benchmarks/class_anchor.py``,
``benchmarks/results/class_anchor.md``, docs/method.md decision 18).
"""

from __future__ import annotations

import torch

from fedhype.models.cvae import Params, decode, prior

#: Latent draws per class of the Monte Carlo mean of the MLP term (float32 decode of K × draws rows). The
#: linear path, which carries nearly all the spread, is exact; the MLP term's Monte Carlo error with 256
#: antithetic draws is 3·10⁻⁵ (L2, unit-sphere units) against a drift of 0.046 on all 70,000 Fashion-MNIST
#: images at ε = 8 (ours, seed 0): a thousandth of what anchoring corrects, at 2,560 decoder rows per code.
ANCHOR_DRAWS = 256


def anchored(theta: Params, target: torch.Tensor, n_classes: int, latent: int, *, temperature: float = 1.0,
             draws: int = ANCHOR_DRAWS, seed: int = 0) -> Params:
    """``theta`` with ``dec.cb`` set so that the decoder's class-y mean in model space is ``target[y]``.

    Args:
        theta: generated parameters of one code (``dec.cb`` [K, D] required; ``dec.wl`` [L, D] optional).
        target: float32 [K, D], the class means to restore (model space).
        n_classes, latent: K and L.
        temperature: the scale of the prior's standard deviation the samples will be drawn at (as in sampling).
        draws: latent draws per class for E_z[MLP(z, y)].
        seed: seed of those draws (a fixed default: anchoring is deterministic for a model and code).

    Returns:
        A new dict (``theta`` is not changed) with ``dec.cb`` float32 [K, D] replaced.

    Raises:
        KeyError: ``theta`` has no ``dec.cb`` (a model without the class output bias cannot be anchored).
    """
    gen = torch.Generator(device=target.device).manual_seed(seed)
    with torch.no_grad():
        eye = torch.eye(n_classes, device=target.device)
        mu, lv = prior(theta, eye, latent)  # [K, L]
        eps = torch.randn(n_classes, (draws + 1) // 2, latent, generator=gen, device=target.device)
        eps = torch.cat([eps, -eps], dim=1)  # antithetic pairs: the odd part of the MLP's response cancels exactly
        z = mu[:, None, :] + temperature * torch.exp(0.5 * lv)[:, None, :] * eps
        mlp_only = {k: v for k, v in theta.items() if k not in ("dec.cb", "dec.wl")}
        mlp_mean = decode(mlp_only, z, eye[:, None, :].expand(*z.shape[:2], n_classes)).mean(1)  # [K, D]
        linear = mu @ theta["dec.wl"] if "dec.wl" in theta else torch.zeros_like(target)
        out = dict(theta)
        out["dec.cb"] = (target - mlp_mean - linear).to(theta["dec.cb"].dtype)
    return out
