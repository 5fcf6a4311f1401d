"""The encoder registry: one --encoder string, one lookup, clear errors."""

from __future__ import annotations

import pytest

from fedhype.encoders import create_encoder, list_encoders, register_encoder
from fedhype.encoders.base import resolve_device, resolve_dtype
from fedhype.errors import ValidationError


def test_known_encoders_are_listed():
    names = list_encoders()
    assert names[:2] == ["dinov2-vits14", "efficientnet-lite0"]
    assert "hf:<hub-id-or-local-dir>" in names and any(n.startswith("timm:") for n in names)


@pytest.mark.parametrize("spec", ["dinov2-vitb14", "clip:foo", "", "hf"])
def test_unknown_encoder_lists_the_known_ones(spec):
    with pytest.raises(ValidationError, match=r"unknown encoder .*known encoders: dinov2-vits14, efficientnet-lite0"):
        create_encoder(spec, device="cpu")


def test_prefix_without_a_model_and_bad_options():
    with pytest.raises(ValidationError, match="names no model"):
        create_encoder("hf:", device="cpu")
    with pytest.raises(ValidationError, match="--pooling must be one of"):
        create_encoder("dinov2-vits14", pooling="max")
    with pytest.raises(ValidationError, match="--image-size must be a positive"):
        create_encoder("dinov2-vits14", image_size=0)


def test_a_name_cannot_be_registered_twice():
    @register_encoder("test-only-encoder")
    def first(ref, **kw):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(ValueError, match="registered twice"):
        register_encoder("test-only-encoder")(lambda ref, **kw: None)


def test_device_and_dtype_resolution():
    import torch

    cpu = resolve_device("cpu")
    assert cpu.type == "cpu" and resolve_dtype(None, cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ValidationError, match="--dtype must be one of"):
        resolve_dtype("int8", cpu)
    with pytest.raises(ValidationError, match="--device must be"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(ValidationError, match="CUDA is not available"):
            resolve_device("cuda")


def test_bfloat16_output_is_still_float32(tiny_dinov2_dir):
    import torch

    enc = create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu", dtype="bfloat16", image_size=28)
    x = torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    out = enc(x)
    ref = create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu", image_size=28)(x)
    assert out.dtype == torch.float32 and enc.describe()["dtype"] == "bfloat16-autocast"
    assert torch.nn.functional.cosine_similarity(out, ref).min() > 0.98
    assert next(enc.model.parameters()).dtype == torch.float32  # autocast: the weights stay float32
    assert (out - ref).abs().max() > 0  # and the products really ran in bfloat16


def test_auto_dtype_follows_the_cpu(monkeypatch):
    import torch

    from fedhype.encoders import base

    cpu = torch.device("cpu")
    monkeypatch.setattr(base, "cpu_supports_bf16", lambda: True)
    assert base.resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(base, "cpu_supports_bf16", lambda: False)
    assert base.resolve_dtype("auto", cpu) == torch.float32
    assert base.resolve_dtype(None, cpu) == torch.float32  # the Python default stays the exact reference
    monkeypatch.undo()
    # AMX-BF16, or AVX512-BF16 on AMD: AVX512-BF16 on an Intel Xeon without AMX measured bfloat16 autocast at
    # 0.56× float32, on an AMD EPYC at 1.90× (embed_dtype.md)
    for flags, vendor, picked in ((["amx_bf16", "avx512_bf16"], "GenuineIntel", torch.bfloat16),
                                  (["amx_bf16"], "GenuineIntel", torch.bfloat16),
                                  (["avx512_bf16"], "GenuineIntel", torch.float32),
                                  (["avx512_bf16"], "AuthenticAMD", torch.bfloat16),
                                  ([], "AuthenticAMD", torch.float32), ([], "GenuineIntel", torch.float32),
                                  (["avx512_bf16"], "unknown", torch.float32)):
        monkeypatch.setattr(base, "cpu_bf16_flags", lambda flags=flags: flags)
        monkeypatch.setattr(base, "cpu_vendor", lambda vendor=vendor: vendor)
        assert base.resolve_dtype("auto", cpu) == picked, (flags, vendor)
        assert base.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16  # GPUs: always
    monkeypatch.undo()
    cpuinfo = __import__("pathlib").Path("/proc/cpuinfo")
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")),
                 []) if cpuinfo.exists() else []
    assert base.cpu_bf16_flags() == [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    vendor = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                   if ln.startswith("vendor_id")), "unknown") if cpuinfo.exists() else "unknown"
    assert base.cpu_vendor() == vendor
