"""Per-round held-out diagnostics. NOT covered by DP: they read clients' validation records.

They exist to show that training works (tests, plots); they are written under the key
``diagnostics_not_dp`` and must not be released as private outputs.
"""

from __future__ import annotations

import torch

from fedhype.models.config import ModelConfig
from fedhype.models.cvae import sample, to_output_space
from fedhype.models.losses import rbf


def mmd2_fixed(x: torch.Tensor, y: torch.Tensor, bandwidths: tuple[float, ...]) -> float:
    """Biased MMD² (V-statistic) with the model's fixed-bandwidth RBF kernel; [n, D], [m, D]."""
    return float(rbf(x, x, bandwidths).mean() + rbf(y, y, bandwidths).mean() - 2 * rbf(x, y, bandwidths).mean())


def round_diagnostics(server, clients, val, round_next: int, cfg: ModelConfig) -> dict[str, float]:
    """Mean over clients of validation −ELBO terms and MMD² (synthetic from θ_i vs validation)."""
    out = {"val_neg_elbo": 0.0, "val_recon": 0.0, "val_kl": 0.0, "val_mmd2": 0.0}
    n = 0
    for c, (xv, yv) in zip(clients, val):
        if len(yv) < 2:
            continue
        theta = server.theta_for(c.index)
        d = c.diagnostics(theta, round_next, cfg, xv, yv)
        gen = torch.Generator().manual_seed(4321)
        with torch.no_grad():
            xs = sample(theta, yv, cfg, gen, space=c.space)
        out["val_neg_elbo"] += d["neg_elbo"]
        out["val_recon"] += d["recon"]
        out["val_kl"] += d["kl"]
        out["val_mmd2"] += mmd2_fixed(to_output_space(xv), xs, cfg.mmd_bandwidths)
        n += 1
    return {k: v / max(n, 1) for k, v in out.items()}
