"""hf: encoders: tiny random DINOv2 / ViT / CLIP vision models saved to disk and loaded by path."""

from __future__ import annotations

import pytest
import torch

from fedhype.encoders import create_encoder
from fedhype.errors import ValidationError


def _pixels(n: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_dinov2_by_path_cls_is_the_class_token(tiny_dinov2_dir):
    from transformers import Dinov2Model

    enc = create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu", image_size=56)
    assert enc.dim == 32 and enc.id == f"hf:{tiny_dinov2_dir}"
    x = _pixels(3, 56)
    ref = Dinov2Model.from_pretrained(tiny_dinov2_dir).eval()
    with torch.no_grad():
        tokens = ref(pixel_values=x).last_hidden_state
    out = enc(x)
    assert out.dtype == torch.float32 and out.shape == (3, 32)
    torch.testing.assert_close(out, tokens[:, 0], rtol=1e-5, atol=1e-5)


def test_dinov2_mean_pooling_is_the_patch_mean_and_differs_from_cls(tiny_dinov2_dir):
    from transformers import Dinov2Model

    x = _pixels(2, 56, seed=1)
    cls = create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu", image_size=56, pooling="cls")(x)
    mean = create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu", image_size=56, pooling="mean")(x)
    with torch.no_grad():
        tokens = Dinov2Model.from_pretrained(tiny_dinov2_dir).eval()(pixel_values=x).last_hidden_state
    torch.testing.assert_close(mean, tokens[:, 1:].mean(1), rtol=1e-5, atol=1e-5)
    assert (cls - mean).abs().max() > 1e-2


@pytest.mark.parametrize("size", [28, 84, 112])
def test_dinov2_other_input_sizes_interpolate(tiny_dinov2_dir, size):
    enc = create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu", image_size=size)
    out = enc(_pixels(2, size))
    assert out.shape == (2, 32) and torch.isfinite(out).all()
    assert enc.preprocess["crop"] == size


def test_image_size_not_a_patch_multiple_is_refused(tiny_dinov2_dir):
    with pytest.raises(ValidationError, match="multiple of the patch size 14; use 98 or 112"):
        create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu", image_size=100)


def test_encoder_is_frozen(tiny_dinov2_dir):
    enc = create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu")
    assert not enc.model.training
    assert all(not p.requires_grad for p in enc.model.parameters())
    out = enc(_pixels(1, 56))
    assert not out.requires_grad and not out.is_inference()
    out += 1  # an ordinary tensor that later stages may modify in place
    with pytest.raises(ValidationError, match=r"\[B, 3, H, W\]"):
        enc(torch.zeros(3, 56, 56))


def test_preprocess_read_from_saved_image_processor(tmp_path, tiny_dinov2_dir):
    import shutil

    from transformers import BitImageProcessor

    d = tmp_path / "with-processor"
    shutil.copytree(tiny_dinov2_dir, d)
    BitImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 56, "width": 56}, do_center_crop=True,
                      image_mean=[0.1, 0.2, 0.3], image_std=[0.5, 0.5, 0.5], resample=2).save_pretrained(d)
    enc = create_encoder(f"hf:{d}", device="cpu")
    assert enc.preprocess == {"size": 64, "crop": 56, "mean": [0.1, 0.2, 0.3], "std": [0.5, 0.5, 0.5],
                              "resample": "bilinear"}


def test_tiny_vit_by_path(tmp_path):
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    image_size=32, patch_size=8)
    ViTModel(cfg, add_pooling_layer=False).save_pretrained(tmp_path)
    enc = create_encoder(f"hf:{tmp_path}", device="cpu")
    assert enc.dim == 32 and enc.preprocess["crop"] == 32
    x = _pixels(2, 32)
    with torch.no_grad():
        tokens = ViTModel.from_pretrained(tmp_path, add_pooling_layer=False).eval()(pixel_values=x).last_hidden_state
    torch.testing.assert_close(enc(x), tokens[:, 0], rtol=1e-5, atol=1e-5)
    big = create_encoder(f"hf:{tmp_path}", device="cpu", image_size=64, pooling="mean")
    assert big(_pixels(2, 64)).shape == (2, 32)  # 8×8 patches from a 4×4 table: interpolated


def test_clip_vision_tower_uses_post_layernorm(tmp_path):
    from transformers import CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(0)
    cfg = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8, projection_dim=16)
    CLIPVisionModel(cfg).save_pretrained(tmp_path)
    enc = create_encoder(f"hf:{tmp_path}", device="cpu")
    x = _pixels(2, 32)
    with torch.no_grad():
        pooled = CLIPVisionModel.from_pretrained(tmp_path).eval()(pixel_values=x).pooler_output
    torch.testing.assert_close(enc(x), pooled, rtol=1e-5, atol=1e-5)


def test_hub_id_offline_says_to_pass_a_local_directory(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValidationError, match="pass a local directory"):
        create_encoder("hf:facebook/dinov2-small-not-cached", device="cpu")


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ValidationError, match="directory not found"):
        create_encoder(f"hf:{tmp_path / 'nope'}", device="cpu")


def test_weights_flag_is_refused_for_hf(tiny_dinov2_dir, tmp_path):
    with pytest.raises(ValidationError, match="--weights is for timm"):
        create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu", weights=str(tmp_path / "w.safetensors"))


# ----------------------------------------------------------------------------- weights that do not cover the model
def _edit_weights(src, dst, edit):
    """Copy a save_pretrained directory and rewrite its model.safetensors with ``edit(tensors)``."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_a_missing_weight_is_refused_not_filled_with_random_values(tiny_dinov2_dir, tmp_path):
    d = _edit_weights(tiny_dinov2_dir, tmp_path / "partial", lambda t: t.pop("encoder.layer.1.mlp.fc1.weight"))
    with pytest.raises(ValidationError) as info:
        create_encoder(f"hf:{d}", device="cpu")
    msg = str(info.value)
    assert "saved weights do not match the model" in msg and "missing 1 (encoder.layer.1.mlp.fc1.weight)" in msg
    assert "random values" in msg


def test_unexpected_weights_inside_the_model_are_refused(tiny_dinov2_dir, tmp_path):
    def add(t):
        t["encoder.layer.2.mlp.fc1.weight"] = torch.zeros(64, 32)  # a third layer the config does not have
        t["encoder.layer.2.mlp.fc1.bias"] = torch.zeros(64)
    d = _edit_weights(tiny_dinov2_dir, tmp_path / "extra", add)
    with pytest.raises(ValidationError, match=r"unexpected 2 \(encoder.layer.2.mlp.fc1.bias, "
                                              r"encoder.layer.2.mlp.fc1.weight\)"):
        create_encoder(f"hf:{d}", device="cpu")


def test_a_weight_of_the_wrong_shape_is_refused(tiny_dinov2_dir, tmp_path):
    d = _edit_weights(tiny_dinov2_dir, tmp_path / "shape",
                      lambda t: t.__setitem__("encoder.layer.0.mlp.fc1.bias", torch.zeros(3)))
    with pytest.raises(ValidationError, match=r"of the wrong shape 1 \(encoder.layer.0.mlp.fc1.bias\)"):
        create_encoder(f"hf:{d}", device="cpu")


def test_a_classification_checkpoint_loads_its_backbone(tmp_path):
    """Weights outside the encoder (a classifier head) are not the encoder's: the backbone loads exactly."""
    from transformers import Dinov2Config, Dinov2ForImageClassification

    torch.manual_seed(0)
    cfg = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=14,
                       image_size=56, num_labels=3)
    full = Dinov2ForImageClassification(cfg).eval()
    full.save_pretrained(tmp_path)
    enc = create_encoder(f"hf:{tmp_path}", device="cpu")
    x = _pixels(2, 56)
    with torch.no_grad():
        ref = full.dinov2(pixel_values=x).last_hidden_state[:, 0]
    torch.testing.assert_close(enc(x), ref, rtol=1e-5, atol=1e-5)


def test_a_two_tower_clip_checkpoint_loads_its_vision_tower(tmp_path):
    """The text tower of a full CLIP checkpoint is unexpected for the vision model, and not refused."""
    from transformers import CLIPConfig, CLIPModel, CLIPVisionModel

    torch.manual_seed(0)
    cfg = CLIPConfig(text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      vocab_size=100),
                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                        image_size=32, patch_size=8), projection_dim=16)
    full = CLIPModel(cfg).eval()
    full.save_pretrained(tmp_path)
    enc = create_encoder(f"hf:{tmp_path}", device="cpu")
    x = _pixels(2, 32)
    with torch.no_grad():
        ref = full.vision_model(pixel_values=x).pooler_output
    torch.testing.assert_close(enc(x), ref, rtol=1e-5, atol=1e-5)
