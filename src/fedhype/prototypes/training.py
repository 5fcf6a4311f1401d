"""Model steps of the alternation: the client objective on one data set with the prototypes held fixed.

    L = CE(W f + b, y) + λ_con · L_con(f, y; P, m) + λ_cons · L_cons(f, y; P)

(FedHPro ``Local.local_train``; the terms are defined in :mod:`fedhype.prototypes.losses`). The margin
m is recomputed at the start of every epoch from the data set's own class means under the current
adapter (:func:`~fedhype.prototypes.losses.client_margin`), and is used only in this data set's loss.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from fedhype.prototypes.losses import client_margin, consistency_loss, contrastive_loss
from fedhype.prototypes.network import AdapterNet


@dataclass(frozen=True)
class Objective:
    """Weights of the client objective.

    Attributes:
        lambda_contrastive: λ_con (0 turns the contrastive term off).
        lambda_consistency: λ_cons (0 turns the consistency term off).
        temperature: τ of the contrastive loss (FedHPro: 0.05).
        margin: use the client margin m_i (False: m = 0).
    """

    lambda_contrastive: float
    lambda_consistency: float
    temperature: float = 0.05
    margin: bool = True


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)`` and restore the previous count (``None``: no change).

    The networks here are tiny (an adapter of ~130k parameters): intra-op threads only add
    synchronisation. Measured on a loaded 2-core machine, 8 epochs on 480 embeddings: 1.6 s with
    one thread, 18.7 s with two.
    """
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def features_of(net: AdapterNet, x: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    """Adapter features float ``[N, d]`` of embeddings ``x`` ``[N, D]`` without gradient, in chunks."""
    with torch.no_grad():
        if x.shape[0] <= batch:
            return net.features(x)
        return torch.cat([net.features(x[i:i + batch]) for i in range(0, x.shape[0], batch)])


def train_epochs(net: AdapterNet, prototypes: torch.Tensor, x: torch.Tensor, y: torch.Tensor, objective: Objective,
                 optimizer: torch.optim.Optimizer, *, epochs: int, batch_size: int,
                 generator: torch.Generator) -> dict[str, float]:
    """Run ``epochs`` shuffled mini-batch epochs of the client objective.

    Args:
        net: the adapter + head (updated in place).
        prototypes: float ``[K, L, d]`` (used as constants).
        x: float ``[N, D]`` embeddings; y: int64 ``[N]`` labels in ``[0, K)``.
        objective: loss weights.
        optimizer: over ``net``'s parameters.
        epochs, batch_size: the schedule.
        generator: shuffling.

    Returns:
        ``{"loss", "ce", "contrastive", "consistency"}`` (means over the last epoch) and ``"margin"``.
    """
    p = prototypes.detach()
    n = x.shape[0]
    stats: dict[str, float] = {}
    net.train()
    for _ in range(epochs):
        m = client_margin(features_of(net, x), y) if objective.margin else torch.zeros(())
        sums = {"loss": 0.0, "ce": 0.0, "contrastive": 0.0, "consistency": 0.0}
        order = torch.randperm(n, generator=generator).to(x.device)
        batches = 0
        for i in range(0, n, batch_size):
            idx = order[i:i + batch_size]
            f, logits = net(x[idx])
            yb = y[idx]
            ce = F.cross_entropy(logits, yb)
            con = contrastive_loss(f, yb, p, objective.temperature, m) if objective.lambda_contrastive else ce * 0
            cons = consistency_loss(f, yb, p) if objective.lambda_consistency else ce * 0
            loss = ce + objective.lambda_contrastive * con + objective.lambda_consistency * cons
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            batches += 1
            for key, v in (("loss", loss), ("ce", ce), ("contrastive", con), ("consistency", cons)):
                sums[key] += float(v.detach())
        stats = {k: v / max(batches, 1) for k, v in sums.items()}
        stats["margin"] = float(m)
    net.eval()
    return stats
