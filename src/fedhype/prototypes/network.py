"""The hyper-prototype network on frozen embeddings: adapter, linear head, K × L hyper-prototypes.

Our adaptation of FedHPro (docs/method.md, decision 7): with a frozen encoder there is no backbone to
shape, so the features the prototypes live with come from a small trainable adapter on the
embedding::

    x ∈ R^D ──x √D / ‖x‖ (fixed)──▶ Linear(D, H) ─ GELU ─ Linear(H, d) ──▶ f ∈ R^d
    f ──▶ linear head  W f + b ∈ R^K                  (the CE term and the matched gradients)
    f ──▶ prototype head: logit_k = τ_p · log Σ_l exp(cos(f, P_{k,l}) / τ_p)   (smooth max over L)

The fixed input transform puts every embedding on the sphere of radius √D (unit RMS per
coordinate, so PyTorch's default Linear initialisation sees unit-scale inputs); it uses no data
statistic. Defaults H = 256, d = 128, L = 5 (FedHPro's ``length_of_hp``). The prototypes are a separate
tensor ``P`` float ``[K, L, d]`` (they are trained by gradient matching, not by the client loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedhype.errors import ValidationError

HEAD_PARAMS = ("head.weight", "head.bias")


class AdapterNet(nn.Module):
    """Adapter + linear head.

    Args:
        dim: embedding dimension D.
        n_classes: K.
        hidden: H, width of the adapter's hidden layer.
        feature_dim: d, dimension of the adapter output (the prototype space).
    """

    def __init__(self, dim: int, n_classes: int, hidden: int = 256, feature_dim: int = 128):
        super().__init__()
        for name, v in (("dim", dim), ("n_classes", n_classes), ("hidden", hidden), ("feature_dim", feature_dim)):
            if not isinstance(v, int) or v < 1:
                raise ValidationError(f"{name} must be a positive integer, got {v!r}")
        self.adapter = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, feature_dim))
        self.head = nn.Linear(feature_dim, n_classes)
        self.input_scale = float(dim) ** 0.5

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Adapter output ``f`` float ``[B, d]`` of raw embeddings ``x`` ``[B, D]`` (normalised here)."""
        return self.adapter(F.normalize(x, dim=1, eps=1e-12) * self.input_scale)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f [B, d], linear logits [B, K])``."""
        f = self.features(x)
        return f, self.head(f)


def init_parameters(net: nn.Module, generator: torch.Generator) -> nn.Module:
    """Re-initialise every ``nn.Linear`` of ``net`` as PyTorch's default, drawing from ``generator``.

    Weights: Kaiming-uniform with a = √5 (bound 1/√fan_in); biases: U(−1/√fan_in, 1/√fan_in), as
    ``nn.Linear.reset_parameters`` does, but with the given generator instead of global state.
    """
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.Linear):
                nn.init.kaiming_uniform_(m.weight, a=5 ** 0.5, generator=generator)
                bound = 1.0 / m.weight.shape[1] ** 0.5
                nn.init.uniform_(m.bias, -bound, bound, generator=generator)
    return net


def prototype_logits(features: torch.Tensor, prototypes: torch.Tensor, temperature: float,
                     pool: str = "lse") -> torch.Tensor:
    """Logits of the prototype head, float ``[B, K]``.

    ``pool="lse"``: ``τ · log Σ_l exp(cos(f, P_{k,l}) / τ)`` (a smooth maximum over the class's L
    prototypes, softmax-ready after dividing by τ); ``pool="max"``: ``max_l cos(f, P_{k,l})``.
    The returned logits are already divided by τ (so ``softmax`` gives the class probabilities).
    """
    f = F.normalize(features, dim=1, eps=1e-12)
    p = F.normalize(prototypes, dim=2, eps=1e-12)
    cos = torch.einsum("bd,kld->bkl", f, p)
    if pool == "lse":
        return torch.logsumexp(cos / temperature, dim=2)
    if pool == "max":
        return cos.amax(dim=2) / temperature
    raise ValidationError(f"pool must be 'lse' or 'max', got {pool!r}")


def orthogonal_anchors(n_classes: int, n_prototypes: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """Random orthonormal anchors, float32 ``[K, L, d]``.

    The K·L vectors are the orthonormal columns of Q from the QR decomposition of a standard
    normal ``[d, K·L]`` matrix (sign-corrected, i.e. Haar-distributed: Mezzadri 2007, §5) when
    K·L ≤ d; with more vectors than dimensions, d orthonormal vectors are drawn repeatedly
    (blocks of d mutually orthogonal vectors).
    """
    total = n_classes * n_prototypes
    blocks = []
    while sum(b.shape[1] for b in blocks) < total:
        g = torch.randn(dim, dim, generator=generator)
        q, r = torch.linalg.qr(g)
        blocks.append(q * torch.sign(torch.diagonal(r)).unsqueeze(0))
    q = torch.cat(blocks, dim=1)[:, :total]
    return q.T.reshape(n_classes, n_prototypes, dim).contiguous()
