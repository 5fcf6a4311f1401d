"""Bundled EfficientNet-Lite0: real ImageNet weights give sensible predictions on real photos."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from fedhype.encoders import create_encoder
from fedhype.encoders.efficientnet_bundled import lite0_model

CATS = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat
COFFEE = {967, 968, 504}  # espresso, cup, coffee mug


@pytest.fixture(scope="module")
def encoder():
    return create_encoder("efficientnet-lite0", device="cpu")


@pytest.fixture(scope="module")
def full():
    return lite0_model(with_head=True)


@pytest.mark.parametrize("photo,classes", [("chelsea", CATS), ("coffee", COFFEE)])
def test_real_weights_classify_sample_photos(encoder, full, photo, classes):
    import skimage.data

    img = Image.fromarray(getattr(skimage.data, photo)()).convert("RGB")
    x = encoder.transform(img)[None]
    with torch.no_grad():
        probs = full(x).softmax(-1)[0]
    top5 = set(probs.topk(5).indices.tolist())
    assert len(top5 & classes) >= 2 and probs.argmax().item() in classes, top5
    assert probs[list(classes)].sum() > 0.5  # measured ≈ 0.8 (cat) and ≈ 0.97 (coffee)


def test_embedding_is_the_pooled_pre_logits(encoder, full):
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = full.forward_head(full.forward_features(x), pre_logits=True)
    out = encoder(x)
    assert encoder.dim == 1280 and out.shape == (2, 1280)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert encoder.preprocess == {"size": 256, "crop": 224, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                                  "resample": "bicubic"}
