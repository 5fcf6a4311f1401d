"""The DP linear classifier's fitted model: weights, centring, privacy record, and its file.

``model.safetensors`` holds ``weight`` float32 ``[K, D]``, ``bias`` ``[K]`` and ``center`` ``[D]`` (the
DP mean m, or zeros) with JSON metadata (format ``fedhype-dp-linear/1``: feature scale, privacy
record, training settings); ``ledger.json`` beside it is the release's own privacy ledger.
Trained by :func:`fedhype.prototypes.dp_linear.fit_dp_fedavg_linear`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedhype.errors import ArtifactError, ValidationError
from fedhype.io import atomic_save_tensors, load_tensors
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.prototypes.inputs import as_features

FORMAT = "fedhype-dp-linear/1"


class DPLinearModel:
    """A trained linear classifier: ``weight`` float32 ``[K, D]``, ``bias`` ``[K]``, ``center`` ``[D]`` (m), privacy."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, center: torch.Tensor, feature_scale: float,
                 privacy: dict[str, Any], config: dict[str, Any], history: list[dict] | None = None):
        self.weight, self.bias, self.center = weight.detach().clone(), bias.detach().clone(), center.detach().clone()
        self.feature_scale = float(feature_scale)
        self.privacy, self.config, self.history = privacy, config, history or []

    def predict_proba(self, x: Any) -> np.ndarray:
        """Class probabilities float ``[N, K]`` of raw embeddings ``x`` ``[N, D]``."""
        xt = as_features(x, "X")
        if xt.shape[1] != self.weight.shape[1]:
            raise ValidationError(f"X has {xt.shape[1]} features, the classifier was trained on {self.weight.shape[1]}")
        xt = features(xt, self.feature_scale, self.center)
        return torch.softmax(xt @ self.weight.T + self.bias, dim=1).numpy()

    def predict(self, x: Any) -> np.ndarray:
        """Predicted class int64 ``[N]``."""
        return self.predict_proba(x).argmax(1)

    def save(self, path: str | Path, ledger: PrivacyLedger | None = None) -> Path:
        """Write ``path/model.safetensors`` (W, b + JSON metadata) and ``path/ledger.json`` (atomic)."""
        path = Path(path)
        meta = {"format": FORMAT, "feature_scale": self.feature_scale, "privacy": self.privacy, "config": self.config}
        atomic_save_tensors(path / "model.safetensors", {"weight": self.weight, "bias": self.bias, "center": self.center},
                            {"fedhype": json.dumps(meta)})
        if ledger is not None:
            ledger.save(path / "ledger.json")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "DPLinearModel":
        """Read a model written by :meth:`save` (ArtifactError if missing, corrupt or of another format)."""
        from safetensors import safe_open

        file = Path(path) / "model.safetensors"
        t = load_tensors(file, what="DP linear model")
        with safe_open(str(file), framework="pt") as fh:
            raw = (fh.metadata() or {}).get("fedhype") or "{}"
        try:
            meta = json.loads(raw)
        except json.JSONDecodeError:
            raise ArtifactError(f"{file}: metadata is not valid JSON") from None
        if meta.get("format") != FORMAT or not {"weight", "bias", "center"} <= set(t):
            raise ArtifactError(f"{file}: not a DP linear model (format {meta.get('format')!r})")
        return cls(t["weight"], t["bias"], t["center"], meta["feature_scale"], meta["privacy"], meta["config"])


def features(x: torch.Tensor, scale: float, center: torch.Tensor) -> torch.Tensor:
    """``s · (x/‖x‖ − m)`` for float32 ``x`` ``[N, D]`` (L2 normalisation, then the public centring and scale)."""
    return (F.normalize(x, dim=1) - center) * scale
