"""timm: encoders with a --weights file (safetensors and torch state dict round trips)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from fedhype.encoders import create_encoder
from fedhype.errors import ValidationError
from fedhype.io import tensor_digest


@pytest.fixture(scope="module")
def vit_and_weights(tmp_path_factory):
    import timm

    torch.manual_seed(0)
    model = timm.create_model("test_vit", pretrained=False).eval()  # with its classifier head
    d = tmp_path_factory.mktemp("timm")
    sd = model.state_dict()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "test_vit.safetensors"))
    torch.save({"state_dict": sd}, d / "test_vit.pth")
    return model, d


@pytest.mark.parametrize("fname", ["test_vit.safetensors", "test_vit.pth"])
def test_weights_file_round_trip(vit_and_weights, fname):
    model, d = vit_and_weights
    enc = create_encoder("timm:test_vit", device="cpu", weights=str(d / fname))
    assert enc.dim == model.num_features == 64
    assert enc.preprocess["crop"] == 160 and enc.preprocess["mean"] == [0.5, 0.5, 0.5]
    x = torch.randn(2, 3, 160, 160, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model.forward_head(model.forward_features(x), pre_logits=True)
    torch.testing.assert_close(enc(x), ref, rtol=1e-5, atol=1e-5)
    headless = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    assert enc.weights_hash == tensor_digest(headless)
    assert not enc.model.training and all(not p.requires_grad for p in enc.model.parameters())


def test_mean_pooling_and_other_size(vit_and_weights):
    _, d = vit_and_weights
    w = str(d / "test_vit.safetensors")
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(2))
    cls = create_encoder("timm:test_vit", device="cpu", weights=w, image_size=96)
    mean = create_encoder("timm:test_vit", device="cpu", weights=w, image_size=96, pooling="mean")
    assert cls.pooling == "cls" and mean.pooling == "avg"
    a, b = cls(x), mean(x)
    assert a.shape == b.shape == (2, 64) and (a - b).abs().max() > 1e-3


def test_weights_of_another_model_are_refused(tmp_path):
    import timm

    other = timm.create_model("test_resnet", pretrained=False)
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(tmp_path / "resnet.safetensors"))
    with pytest.raises(ValidationError, match="weights do not fit the model"):
        create_encoder("timm:test_vit", device="cpu", weights=str(tmp_path / "resnet.safetensors"))


def test_bad_weight_files(tmp_path):
    with pytest.raises(ValidationError, match="not found"):
        create_encoder("timm:test_vit", device="cpu", weights=str(tmp_path / "missing.safetensors"))
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ValidationError, match="not a readable"):
        create_encoder("timm:test_vit", device="cpu", weights=str(tmp_path / "junk.pth"))


def test_unknown_timm_name_and_offline_without_weights(monkeypatch):
    with pytest.raises(ValidationError, match="unknown timm model"):
        create_encoder("timm:no_such_model_xyz", device="cpu", weights="x.safetensors")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValidationError, match="pass --weights"):
        create_encoder("timm:test_vit", device="cpu")


def test_a_missing_or_extra_tensor_in_the_weights_file_is_named(vit_and_weights, tmp_path):
    model, _ = vit_and_weights
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    partial = {k: v for k, v in sd.items() if k != "blocks.0.norm1.weight"}
    save_file(partial, str(tmp_path / "partial.safetensors"))
    with pytest.raises(ValidationError, match=r"missing \['blocks.0.norm1.weight'\], unexpected \[\]"):
        create_encoder("timm:test_vit", device="cpu", weights=str(tmp_path / "partial.safetensors"))
    save_file({**sd, "blocks.9.extra": torch.zeros(2)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(ValidationError, match=r"missing \[\], unexpected \['blocks.9.extra'\]"):
        create_encoder("timm:test_vit", device="cpu", weights=str(tmp_path / "extra.safetensors"))
