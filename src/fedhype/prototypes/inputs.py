"""Input checks at the estimator boundary: embeddings and labels, with errors naming the argument."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedhype.errors import ValidationError


def as_features(x: Any, name: str = "X") -> torch.Tensor:
    """``x`` (numpy or torch, ``[N, D]``) as a float32 CPU tensor; ValidationError naming ``name``."""
    t = x.detach().cpu() if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
    if t.ndim != 2:
        raise ValidationError(f"{name} must be a 2-D array [n_samples, n_features], got shape {tuple(t.shape)}")
    if t.shape[0] == 0 or t.shape[1] == 0:
        raise ValidationError(f"{name} is empty (shape {tuple(t.shape)})")
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise ValidationError(f"{name} must hold numbers, got dtype {t.dtype}")
    t = t.to(torch.float32)
    if not torch.isfinite(t).all():
        raise ValidationError(f"{name} contains NaN or Inf")
    return t.contiguous()


def as_labels(y: Any, n: int, name: str = "y") -> np.ndarray:
    """``y`` as int64 ``[n]``; ValidationError naming ``name`` if not integer or the wrong length."""
    a = y.detach().cpu().numpy() if torch.is_tensor(y) else np.asarray(y)
    if a.ndim != 1 or a.shape[0] != n:
        raise ValidationError(f"{name} must be 1-D with {n} labels (one per row of X), got shape {a.shape}")
    if a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and np.all(np.mod(a, 1) == 0)):
        raise ValidationError(f"{name} must hold integer class labels, got dtype {a.dtype}")
    return a.astype(np.int64)
