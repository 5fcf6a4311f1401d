"""The :class:`Encoder`: a frozen image model that maps pixel batches to embeddings.

Every encoder family (``hf:``, ``timm:``, bundled weights) builds one of these, so the embedding
pipeline and later stages see a single type whatever the model behind it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from fedhype.errors import ValidationError
from fedhype.io import tensor_digest

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; ``"cpu"`` / ``"cuda"`` / ``"cuda:N"`` as given.

    Raises:
        ValidationError: unknown device string, or ``cuda`` asked for on a machine without CUDA.
    """
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValidationError(f"--device must be auto, cpu or cuda, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValidationError("--device cuda was asked for but CUDA is not available; use --device cpu or auto")
    return torch.device(name)


#: the /proc/cpuinfo flags of bfloat16 instructions: AMX tiles (the matrix unit) and AVX-512 dot products
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_bf16_flags() -> list[str]:
    """The bfloat16 instruction flags (:data:`BF16_FLAGS`) of this CPU, from the ``flags`` line of ``/proc/cpuinfo``
    (Linux); [] where that file is absent."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [name for name in BF16_FLAGS if name in flags]
    except OSError:
        return []
    return []


def cpuinfo_field(name: str) -> str:
    """The first value of ``name`` in ``/proc/cpuinfo`` (Linux; e.g. ``"model name"``); ``"unknown"`` where absent."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith(name)), "unknown")
    except OSError:
        return "unknown"


def cpu_vendor() -> str:
    """The ``vendor_id`` of ``/proc/cpuinfo`` (``"GenuineIntel"``, ``"AuthenticAMD"``); ``"unknown"`` where absent."""
    return cpuinfo_field("vendor_id")


def cpu_supports_bf16() -> bool:
    """Whether bfloat16 autocast is faster than float32 on this CPU: it has AMX-BF16 (``amx_bf16``), or AVX512-BF16
    (``avx512_bf16``) and is an AMD CPU (:func:`cpu_vendor` ``"AuthenticAMD"``).

    Measured with ``benchmarks/embed.py --dtype-ratio`` (bundled DINOv2 ViT-S/14 at 112 px, 2 cores;
    ``benchmarks/results/embed_dtype.md``): 3.28× the float32 throughput on a CPU with AMX-BF16 (2026-12-02);
    with AVX512-BF16 and no AMX 1.90× on an AMD EPYC (2026-12-07; a bare bfloat16 matrix product 2.3× float32's)
    but 0.56× on an Intel Xeon (2026-12-07, nothing beside it; a bare bfloat16 matrix product 0.51–0.55×); 0.15×
    where bfloat16 is emulated (AVX2 only). AVX512-BF16 on an Intel CPU without AMX therefore does not count.
    """
    flags = cpu_bf16_flags()
    return "amx_bf16" in flags or ("avx512_bf16" in flags and cpu_vendor() == "AuthenticAMD")


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """Compute dtype of the encoder's forward pass.

    ``None`` → float32 on CPU, bfloat16 on GPU (the exact reference; the Python default);
    ``"auto"`` (the CLI and job default) → bfloat16 on GPUs and on CPUs where it is faster (AMX-BF16, or
    AVX512-BF16 on AMD: :func:`cpu_supports_bf16`), float32 elsewhere. bfloat16 and float16 run under
    ``torch.autocast`` (weights stay float32; matrix products in the low precision).

    Raises:
        ValidationError: a name other than auto, float32, bfloat16, float16.
    """
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or cpu_supports_bf16() else torch.float32
    if dtype not in _DTYPES:
        raise ValidationError(f"--dtype must be one of {['auto', *sorted(_DTYPES)]}, got {dtype!r}")
    return _DTYPES[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class Encoder:
    """A frozen image encoder (eval mode, no gradients, inference mode).

    Attributes:
        id: the encoder spec it was created from (e.g. ``"dinov2-vits14"``, ``"hf:/models/vit"``).
        dim: embedding dimension D.
        weights_hash: SHA-256 over the float32 state dict (names, shapes, bytes; see
            :func:`fedhype.io.tensor_digest`), taken before any dtype cast.
        preprocess: ``{"size", "crop", "mean", "std", "resample"}``: shorter side resized to
            ``size`` pixels with ``resample``, centre crop ``crop`` × ``crop``, then normalised.
        transform: PIL RGB image → float32 tensor ``[3, crop, crop]`` (picklable, runs in workers).
        pooling: how tokens are pooled (``"cls"``, ``"mean"`` or ``"avg"`` for CNNs).
        model: the frozen ``torch.nn.Module``.
        device, dtype: where and in which precision the model runs (:func:`resolve_dtype`).
    """

    def __init__(
        self,
        *,
        id: str,
        model: nn.Module,
        features: Callable[[nn.Module, torch.Tensor], torch.Tensor],
        dim: int,
        preprocess: dict[str, Any],
        pooling: str,
        device: str | torch.device = "auto",
        dtype: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        from fedhype.encoders.preprocess import build_transform

        self.id = id
        self.dim = int(dim)
        self.pooling = pooling
        self.preprocess = dict(preprocess)
        self.transform = build_transform(self.preprocess)
        self.extra = dict(extra or {})
        model = model.float().eval()
        model.requires_grad_(False)
        self.weights_hash = tensor_digest(model.state_dict())
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.model = model.to(device=self.device)  # float32 weights; low precision through autocast
        self._features = features

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Embed a batch.

        Args:
            pixel_values: float32 ``[B, 3, H, W]``, normalised as :attr:`preprocess` says.

        Returns:
            float32 ``[B, D]`` on the CPU (not an inference-mode tensor).

        Raises:
            ValidationError: ``pixel_values`` is not ``[B, 3, H, W]``.
        """
        if pixel_values.ndim != 4 or pixel_values.shape[1] != 3:
            raise ValidationError(f"pixel_values must be [B, 3, H, W], got {tuple(pixel_values.shape)}")
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.dtype,
                                                    enabled=self.dtype != torch.float32):
            x = pixel_values.to(device=self.device, dtype=torch.float32, non_blocking=True)
            out = self._features(self.model, x).to(device="cpu", dtype=torch.float32)
        return out.clone()  # an ordinary tensor: later stages may modify it in place

    def describe(self) -> dict[str, Any]:
        """JSON-able provenance (no weights)."""
        return {
            "encoder": self.id,
            "weights_hash": self.weights_hash,
            "dim": self.dim,
            "pooling": self.pooling,
            "preprocess": self.preprocess,
            "device": str(self.device),
            "dtype": dtype_name(self.dtype) + ("" if self.dtype == torch.float32 else "-autocast"),
            **self.extra,
        }

    def __repr__(self) -> str:
        return f"Encoder(id={self.id!r}, dim={self.dim}, pooling={self.pooling!r}, device={self.device}, dtype={dtype_name(self.dtype)})"
