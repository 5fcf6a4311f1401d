"""One registry for every ``--encoder`` string (in the style of timm's ``create_model``).

Exact names (``dinov2-vits14``, ``efficientnet-lite0``) and prefixes (``hf:<id-or-dir>``,
``timm:<model-name>``) map to factory functions. A family registers itself with
:func:`register_encoder` in its own module; every module of this package is imported on first
use, so adding a family means adding one file.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Protocol

from fedhype.errors import ValidationError

#: The encoder used when none is named.
DEFAULT_ENCODER = "dinov2-vits14"

POOLINGS = ("cls", "mean")


class Factory(Protocol):
    def __call__(
        self, ref: str, *, device: str, dtype: str | None, pooling: str, image_size: int | None, weights: str | None
    ):  # -> Encoder
        ...


@dataclass(frozen=True)
class _Entry:
    name: str
    factory: Callable
    prefix: bool
    help: str


_REGISTRY: dict[str, _Entry] = {}
_loaded = False


def register_encoder(name: str, *, prefix: bool = False, help: str = "") -> Callable[[Callable], Callable]:
    """Decorator registering ``factory(ref, *, device, dtype, pooling, image_size, weights) -> Encoder``.

    With ``prefix=True`` the factory serves every spec ``"<name>:<ref>"`` and gets ``ref``;
    otherwise it serves the exact name and gets the name.

    Raises:
        ValueError: the name is already registered (two families claiming one name).
    """

    def deco(factory: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name].factory is not factory:
            raise ValueError(f"encoder {name!r} is registered twice")
        _REGISTRY[name] = _Entry(name, factory, prefix, help)
        return factory

    return deco


def _load_families() -> None:
    global _loaded
    if _loaded:
        return
    import fedhype.encoders as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{mod.name}")
    _loaded = True


def list_encoders() -> list[str]:
    """Known encoder specs: exact names, then prefix forms like ``hf:<hub-id-or-local-dir>``."""
    _load_families()
    exact = sorted(e.name for e in _REGISTRY.values() if not e.prefix)
    prefixed = sorted(f"{e.name}:{e.help or '<ref>'}" for e in _REGISTRY.values() if e.prefix)
    return exact + prefixed


def create_encoder(
    spec: str,
    *,
    device: str = "auto",
    dtype: str | None = None,
    pooling: str = "cls",
    image_size: int | None = None,
    weights: str | None = None,
):
    """Build a frozen :class:`~fedhype.encoders.base.Encoder` from an ``--encoder`` string.

    Args:
        spec: ``"dinov2-vits14"``, ``"efficientnet-lite0"``, ``"hf:<hub-id-or-dir>"`` or ``"timm:<name>"``.
        device: ``"auto"`` (CUDA if available), ``"cpu"`` or ``"cuda"``.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"``; ``None`` → bfloat16 on GPU, float32 on CPU.
        pooling: ``"cls"`` (class token) or ``"mean"`` (mean of patch tokens) for transformers.
        image_size: square input side in pixels; ``None`` → the family's default.
        weights: a weights file (safetensors or torch state dict) for ``timm:`` encoders.

    Raises:
        ValidationError: unknown spec (the message lists the known ones), bad option or missing weights.
    """
    if pooling not in POOLINGS:
        raise ValidationError(f"--pooling must be one of {list(POOLINGS)}, got {pooling!r}")
    if image_size is not None and int(image_size) < 1:
        raise ValidationError(f"--image-size must be a positive number of pixels, got {image_size}")
    entry, ref = _lookup(spec)
    return entry.factory(ref, device=device, dtype=dtype, pooling=pooling, image_size=image_size, weights=weights)


def _lookup(spec: str) -> tuple[_Entry, str]:
    _load_families()
    spec = (spec or "").strip()
    entry = _REGISTRY.get(spec)
    ref = spec
    if entry is None or entry.prefix:
        head, sep, rest = spec.partition(":")
        entry = _REGISTRY.get(head) if sep else None
        if entry is None or not entry.prefix:
            entry = None
        elif not rest.strip():
            raise ValidationError(f"encoder {spec!r} names no model; use {head}:{entry.help}")
        ref = rest.strip()
    if entry is None:
        raise ValidationError(f"unknown encoder {spec!r}; known encoders: {', '.join(list_encoders())}")
    return entry, ref


def check_encoder_spec(spec: str) -> str:
    """Check that ``spec`` names a registered encoder family, without loading any weights.

    Returns the spec stripped. (Whether a ``hf:`` hub id or a ``timm:`` name exists is only known
    when :func:`create_encoder` loads it.)

    Raises:
        ValidationError: an unknown name (the message lists the known ones) or a prefix without a model.
    """
    _lookup(spec)
    return (spec or "").strip()
