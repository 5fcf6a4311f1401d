"""``hf:<hub-id-or-local-dir>``: Hugging Face transformers vision models as frozen encoders.

Loads DINOv2 / ViT / DeiT through ``AutoModel`` and CLIP / SigLIP image towers through their
``*VisionModel`` classes, with the preprocessing read from the saved image processor (or
ImageNet defaults when the directory has none). Pooling: ``cls`` = the class token of the final
(layer-normed) hidden states, ``mean`` = the mean of the patch tokens. Other input sizes use
position-embedding interpolation (``interpolate_pos_encoding=True``; DINOv2 always interpolates,
Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", §3.2 "Fine-tuning and higher resolution").
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from fedhype.encoders.base import Encoder
from fedhype.encoders.preprocess import IMAGENET_MEAN, IMAGENET_STD, make_preprocess, resample_name
from fedhype.encoders.registry import register_encoder
from fedhype.errors import ValidationError, listed

# Vision towers loaded from a full two-tower checkpoint.
_TOWERS = {"clip": "CLIPVisionModel", "clip_vision_model": "CLIPVisionModel",
           "siglip": "SiglipVisionModel", "siglip_vision_model": "SiglipVisionModel"}


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' own progress bars and info logs while loading (our logs go to stderr)."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _offline_hint(ref: str) -> str:
    return (
        f"could not load {ref!r} from the Hugging Face hub (no network, or not in the local hub cache). "
        f"Offline, pass a local directory saved with save_pretrained: --encoder hf:/path/to/{ref.split('/')[-1]}"
    )


def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    try:
        from huggingface_hub import constants

        host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
        socket.getaddrinfo(host, 443)
        return True
    except (OSError, ImportError):
        return False


def _load_config(ref: str):
    from transformers import AutoConfig

    if Path(ref).expanduser().is_dir():
        try:
            return AutoConfig.from_pretrained(str(Path(ref).expanduser())), str(Path(ref).expanduser()), True
        except (OSError, ValueError) as exc:
            raise ValidationError(f"hf:{ref}: not a transformers model directory (config.json unreadable: {exc})") from None
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise ValidationError(f"hf:{ref}: directory not found; pass a folder written by save_pretrained")
    try:  # a hub id: the local hub cache first, the network only if it answers
        return AutoConfig.from_pretrained(ref, local_files_only=True), ref, True
    except (OSError, ValueError):
        pass
    if not hub_reachable():
        raise ValidationError(_offline_hint(ref))
    try:
        return AutoConfig.from_pretrained(ref), ref, False
    except (OSError, ValueError) as exc:
        raise ValidationError(f"{_offline_hint(ref)} ({exc})") from None


def _names(keys: list[str], shown: int = 5) -> str:
    return f"{len(keys)} ({listed(keys, shown)})"


def check_loading_info(ref: str, model: nn.Module, info: dict[str, Any]) -> None:
    """Refuse a model whose saved weights do not cover it: transformers would fill the gaps with random values.

    ``info`` is ``from_pretrained(..., output_loading_info=True)``'s report. Refused: any missing
    weight (except those of a ``pooler`` that the encoder never reads: with a class token, ``cls``
    pooling takes the token itself), any weight of the wrong shape, any loading error, and any
    unexpected weight inside the model's own modules (e.g. an extra layer: the config and the
    weights disagree). Unexpected weights outside them — a classification head, the text tower of a
    two-tower checkpoint — are parts of the checkpoint the vision encoder does not use.

    Raises:
        ValidationError: naming the weights (the first few of each kind and how many).
    """
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    own = {k.split(".")[0] for k in model.state_dict()} | {name for name, _ in model.named_children()}
    reads_pooler = getattr(model.config, "model_type", "").startswith("siglip")  # no class token: pooler_output
    missing = sorted(k for k in info.get("missing_keys") or () if reads_pooler or not k.startswith("pooler."))
    unexpected = sorted(k for k in info.get("unexpected_keys") or ()
                        if (k[len(prefix):] if k.startswith(prefix) else k).split(".")[0] in own)
    wrong = sorted(str(k[0] if isinstance(k, (tuple, list)) else k) for k in info.get("mismatched_keys") or ())
    errors = [str(e) for e in info.get("error_msgs") or ()]
    problems = [f"{what} {_names(keys)}" for what, keys in (("missing", missing), ("unexpected", unexpected),
                                                          ("of the wrong shape", wrong)) if keys]
    if errors:
        problems.append(f"loading errors: {'; '.join(errors)[:300]}")
    if problems:
        raise ValidationError(
            f"hf:{ref}: the saved weights do not match the model its config.json describes: weights "
            f"{'; '.join(problems)}. transformers would fill missing weights with random values, so fedhype refuses; "
            "save the complete model again with save_pretrained, or fix config.json")


def load_hf_model(ref: str) -> tuple[nn.Module, Any, str]:
    """Load a transformers vision model (and its config) from a hub id or a local directory.

    The saved weights must cover the model (:func:`check_loading_info`): nothing is left randomly
    initialised.

    Returns:
        ``(model, config, resolved_ref)``.

    Raises:
        ValidationError: directory missing, hub unreachable (the message says to pass a local
            directory), a model type with no vision tower, or weights missing, unexpected or of
            the wrong shape (named).
    """
    import transformers

    config, where, local = _load_config(ref)
    cls_name = _TOWERS.get(config.model_type)
    cls = getattr(transformers, cls_name) if cls_name else transformers.AutoModel
    try:  # a weight of the wrong shape is reported (mismatched_keys) instead of raised, and then refused
        model, info = cls.from_pretrained(where, local_files_only=local, output_loading_info=True,
                                          ignore_mismatched_sizes=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ValidationError(f"hf:{ref}: could not load the weights ({exc})") from None
    if getattr(model.config, "model_type", "") in ("clip", "siglip"):
        raise ValidationError(f"hf:{ref}: expected a vision model, got a two-tower {model.config.model_type} model")
    check_loading_info(ref, model, info)
    return model, model.config, where


def processor_preprocess(where: str, config: Any, image_size: int | None) -> dict[str, Any]:
    """Preprocessing from the saved image processor; ImageNet defaults and ``config.image_size`` without one."""
    from transformers import AutoImageProcessor

    mean, std, resample = IMAGENET_MEAN, IMAGENET_STD, "bicubic"
    crop = int(getattr(config, "image_size", 224))
    crop_pct = 1.0
    try:
        proc = AutoImageProcessor.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError, KeyError):
        proc = None
    if proc is not None:
        mean = getattr(proc, "image_mean", None) or mean
        std = getattr(proc, "image_std", None) or std
        resample = resample_name(getattr(proc, "resample", resample))
        size = dict(getattr(proc, "size", None) or {})
        resize = size.get("shortest_edge") or size.get("height") or crop
        crop_size = dict(getattr(proc, "crop_size", None) or {})
        if getattr(proc, "do_center_crop", False) and crop_size.get("height"):
            crop = int(crop_size["height"])
            crop_pct = min(1.0, crop / float(resize))
        else:
            crop = int(resize)
    if image_size is not None:
        crop = int(image_size)
    return make_preprocess(crop, crop_pct=crop_pct, mean=mean, std=std, resample=resample)


def _post_layernorm(model: nn.Module) -> str | None:
    """Dotted name of CLIP's final LayerNorm, applied outside ``last_hidden_state``."""
    for name in ("post_layernorm", "vision_model.post_layernorm"):
        try:
            model.get_submodule(name)
            return name
        except AttributeError:
            continue
    return None


def _features(model: nn.Module, x: torch.Tensor, *, pooling: str, n_prefix: int, kwargs: dict, post_norm: str | None) -> torch.Tensor:
    out = model(pixel_values=x, **kwargs)
    tokens = out.last_hidden_state
    if tokens.ndim == 4:  # a CNN backbone: [B, C, H, W]
        return tokens.mean(dim=(2, 3))
    if post_norm:  # CLIP: the final LayerNorm is applied outside last_hidden_state
        tokens = model.get_submodule(post_norm)(tokens)
    if pooling == "cls":
        return out.pooler_output if n_prefix == 0 else tokens[:, 0]
    return tokens[:, n_prefix:].mean(dim=1)


def hf_encoder(
    spec: str,
    model: nn.Module,
    config: Any,
    preprocess: dict[str, Any],
    *,
    pooling: str,
    device: str,
    dtype: str | None,
    extra: dict[str, Any] | None = None,
) -> Encoder:
    """Wrap a transformers vision model as a frozen :class:`Encoder` (also used by bundled DINOv2).

    Raises:
        ValidationError: the input size is not a multiple of the patch size.
    """
    patch = getattr(config, "patch_size", None)
    if isinstance(patch, int) and preprocess["crop"] % patch:
        lo = max(patch, preprocess["crop"] // patch * patch)
        raise ValidationError(
            f"--image-size {preprocess['crop']} is not a multiple of the patch size {patch}; use {lo} or {lo + patch}"
        )
    mtype = getattr(config, "model_type", "")
    n_prefix = 0 if mtype.startswith("siglip") else 1 + int(getattr(config, "num_register_tokens", 0) or 0)
    params = inspect.signature(model.forward).parameters
    kwargs = {"interpolate_pos_encoding": True} if "interpolate_pos_encoding" in params else {}
    features = functools.partial(
        _features, pooling=pooling, n_prefix=n_prefix, kwargs=kwargs, post_norm=_post_layernorm(model) if mtype.startswith("clip") else None
    )
    enc = Encoder(
        id=spec, model=model, features=features, dim=0, preprocess=preprocess, pooling=pooling,
        device=device, dtype=dtype, extra={"model_type": mtype, **(extra or {})},
    )
    probe = torch.zeros(1, 3, preprocess["crop"], preprocess["crop"])
    try:
        enc.dim = int(enc(probe).shape[1])
    except (TypeError, AttributeError, RuntimeError) as exc:
        raise ValidationError(f"{spec}: not an image model this encoder can run ({type(exc).__name__}: {exc})") from None
    return enc


@register_encoder("hf", prefix=True, help="<hub-id-or-local-dir>")
def create_hf(ref: str, *, device: str, dtype: str | None, pooling: str, image_size: int | None, weights: str | None) -> Encoder:
    """``hf:<hub-id-or-local-dir>`` → frozen transformers vision encoder (see module docstring)."""
    if weights:
        raise ValidationError("--weights is for timm: encoders; an hf: model directory carries its own weights")
    with quiet_transformers():
        model, config, where = load_hf_model(ref)
    preprocess = processor_preprocess(where, config, image_size)
    return hf_encoder(f"hf:{ref}", model, config, preprocess, pooling=pooling, device=device, dtype=dtype)
