"""Image preprocessing: resize shorter side, centre crop, to tensor, normalise.

The preprocessing of an encoder is plain data (a dict stored in every embeddings store), and
:func:`build_transform` turns that dict back into the torchvision transform, so a store says
exactly how its images were prepared.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from torchvision import transforms as T

from fedhype.errors import ValidationError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_RESAMPLE = {
    "nearest": T.InterpolationMode.NEAREST,
    "bilinear": T.InterpolationMode.BILINEAR,
    "bicubic": T.InterpolationMode.BICUBIC,
    "lanczos": T.InterpolationMode.LANCZOS,
}
# PIL resample codes as used by Hugging Face image processors.
_PIL_CODES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}


def resample_name(value: Any) -> str:
    """Normalise a resample given as a PIL code (``3``), an enum or a name to a lowercase name."""
    if isinstance(value, int):
        return _PIL_CODES.get(value, "bicubic")
    name = str(getattr(value, "value", value)).lower().split(".")[-1]
    return name if name in _RESAMPLE else "bicubic"


def make_preprocess(
    crop: int,
    *,
    crop_pct: float = 1.0,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    resample: Any = "bicubic",
) -> dict[str, Any]:
    """The preprocessing dict for a square input of ``crop`` pixels.

    The shorter image side is resized to ``floor(crop / crop_pct)`` (timm's convention), then the
    centre ``crop`` × ``crop`` is kept.

    Raises:
        ValidationError: ``crop`` < 1 or ``crop_pct`` outside (0, 1].
    """
    if int(crop) < 1:
        raise ValidationError(f"--image-size must be a positive number of pixels, got {crop}")
    if not 0 < crop_pct <= 1:
        raise ValidationError(f"crop_pct must be in (0, 1], got {crop_pct}")
    return {
        "size": int(math.floor(int(crop) / crop_pct)),
        "crop": int(crop),
        "mean": [float(m) for m in mean],
        "std": [float(s) for s in std],
        "resample": resample_name(resample),
    }


class _ToRGB:
    """Convert any PIL mode to RGB (picklable, for DataLoader workers)."""

    def __call__(self, img):
        return img if img.mode == "RGB" else img.convert("RGB")

    def __repr__(self) -> str:
        return "ToRGB()"


def build_transform(preprocess: dict[str, Any]) -> T.Compose:
    """PIL image → float32 tensor ``[3, crop, crop]`` for a preprocessing dict.

    Raises:
        ValidationError: a key is missing or the resample name is unknown.
    """
    try:
        size, crop = int(preprocess["size"]), int(preprocess["crop"])
        mean, std = list(preprocess["mean"]), list(preprocess["std"])
        mode = _RESAMPLE[preprocess.get("resample", "bicubic")]
    except KeyError as exc:
        raise ValidationError(f"preprocess dict is missing or has a bad value for {exc}") from None
    return T.Compose(
        [
            _ToRGB(),
            T.Resize(size, interpolation=mode, antialias=True),
            T.CenterCrop(crop),
            T.ToTensor(),
            T.Normalize(mean, std),
        ]
    )
