"""``timm:<model-name>``: any timm image model as a frozen encoder (pooled features, no head).

Weights come from ``--weights FILE`` (safetensors, or a torch state dict read with
``weights_only=True``), or from timm's hub download when there is a network. Preprocessing is
timm's ``resolve_data_config`` for the model (input size, interpolation, mean/std, crop_pct).
Features are the pooled pre-logits (``num_classes=0``); for ViTs ``--pooling cls`` keeps the
class token and ``mean`` averages the patch tokens (timm ``global_pool="avg"``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedhype.encoders.base import Encoder
from fedhype.encoders.preprocess import make_preprocess
from fedhype.encoders.registry import register_encoder
from fedhype.errors import ValidationError


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a weights file: safetensors, or a torch state dict (``weights_only=True``, no pickle code).

    A checkpoint wrapping the weights under ``"state_dict"`` or ``"model"`` is unwrapped.

    Raises:
        ValidationError: missing file, or a file that is neither (names the file).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValidationError(f"--weights file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd: Any = load_file(str(path))
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
        raise ValidationError(f"--weights {path}: not a readable safetensors file or torch state dict ({exc})") from None
    for key in ("state_dict", "model"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValidationError(f"--weights {path}: expected a mapping of tensor names to tensors")
    return sd


def load_weights(model: nn.Module, sd: dict[str, torch.Tensor], where: str, head_prefixes: tuple[str, ...] = ()) -> None:
    """Load ``sd`` into ``model``; keys of a dropped classifier head (``head_prefixes``) are ignored.

    Raises:
        ValidationError: missing or unexpected keys, or shape mismatches (names the first few).
    """
    own = model.state_dict()
    sd = {k: v for k, v in sd.items() if not (head_prefixes and k.startswith(head_prefixes))}
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    wrong = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        raise ValidationError(
            f"{where}: weights do not fit the model (missing {missing[:4]}, unexpected {unexpected[:4]}, "
            f"wrong shape {wrong[:4]}); check the model name and the file"
        )
    model.load_state_dict(sd, strict=True)


def _pooled(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def timm_encoder(
    spec: str, model: nn.Module, *, pooling: str, image_size: int | None, device: str, dtype: str | None,
    extra: dict[str, Any] | None = None,
) -> Encoder:
    """Wrap a headless timm model (``num_classes=0``) as a frozen :class:`Encoder`."""
    import timm.data

    cfg = timm.data.resolve_data_config({}, model=model)
    crop = int(image_size or cfg["input_size"][-1])
    preprocess = make_preprocess(
        crop, crop_pct=float(cfg.get("crop_pct") or 1.0), mean=cfg["mean"], std=cfg["std"],
        resample=cfg.get("interpolation", "bicubic"),
    )
    gp = getattr(model, "global_pool", "avg")
    used = str(getattr(gp, "pool_type", gp)) or "avg"
    used = "cls" if used == "token" else used
    enc = Encoder(id=spec, model=model, features=_pooled, dim=0, preprocess=preprocess, pooling=used,
                  device=device, dtype=dtype, extra=extra)
    enc.dim = int(enc(torch.zeros(1, 3, crop, crop)).shape[1])
    return enc


def create_timm_model(name: str, *, pooling: str, image_size: int | None, pretrained: bool = False) -> nn.Module:
    """A headless timm model; ViTs get ``global_pool="avg"`` for ``pooling="mean"`` and dynamic image size.

    Raises:
        ValidationError: unknown timm model name.
    """
    import timm

    if not timm.is_model(name):
        raise ValidationError(f"timm:{name}: unknown timm model name (see timm.list_models())")
    kwargs: dict[str, Any] = {"num_classes": 0}
    if image_size is not None:
        kwargs["dynamic_img_size"] = True
    try:
        model = timm.create_model(name, pretrained=pretrained, **kwargs)
    except TypeError:  # CNNs take any input size and have no such option
        kwargs.pop("dynamic_img_size", None)
        model = timm.create_model(name, pretrained=pretrained, **kwargs)
    if pooling == "mean" and getattr(model, "global_pool", None) == "token":
        model.reset_classifier(0, global_pool="avg")
    return model


@register_encoder("timm", prefix=True, help="<model-name> [--weights FILE]")
def create_timm(ref: str, *, device: str, dtype: str | None, pooling: str, image_size: int | None, weights: str | None) -> Encoder:
    """``timm:<model-name>`` with ``--weights FILE`` (or timm's download when online)."""
    if weights:
        model = create_timm_model(ref, pooling=pooling, image_size=image_size)
        head = model.default_cfg.get("classifier") or ()
        heads = tuple(f"{h}." for h in ([head] if isinstance(head, str) else head))
        load_weights(model, read_state_dict(weights), f"--weights {weights}", heads)
        source = str(Path(weights).expanduser().resolve())
    else:
        from fedhype.encoders.hf import hub_reachable

        if not hub_reachable():
            raise ValidationError(
                f"timm:{ref}: no --weights FILE given and no network to download pretrained weights; "
                "pass --weights model.safetensors (or a torch state dict)"
            )
        try:
            model = create_timm_model(ref, pooling=pooling, image_size=image_size, pretrained=True)
        except (OSError, RuntimeError) as exc:
            raise ValidationError(f"timm:{ref}: could not download pretrained weights ({exc}); pass --weights FILE") from None
        source = "timm pretrained download"
    return timm_encoder(f"timm:{ref}", model, pooling=pooling, image_size=image_size, device=device, dtype=dtype,
                        extra={"weights_source": source})
