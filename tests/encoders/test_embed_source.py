"""embed_source: real digit images → store, decode failures skipped, metadata, worker parity."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from PIL import Image

from fedhype import __version__
from fedhype.data.sources import ImageRecord, ImageSource
from fedhype.encoders import create_encoder
from fedhype.encoders.embed import embed_source
from fedhype.errors import ValidationError


def _digit(pixels: np.ndarray) -> Image.Image:
    return Image.fromarray(np.round(pixels * 255 / 16).astype(np.uint8), "L").convert("RGB")


def _broken() -> Image.Image:
    raise OSError("image file is truncated")


def _digits_source(n: int = 24, broken_at: int | None = None) -> ImageSource:
    from sklearn.datasets import load_digits

    d = load_digits()
    records = [ImageRecord(f"digits/{i:04d}", int(d.target[i]), i % 2, functools.partial(_digit, d.images[i]))
               for i in range(n)]
    if broken_at is not None:
        records[broken_at] = ImageRecord("digits/broken.png", 3, 0, _broken)
    return ImageSource(records, [str(c) for c in range(10)], ["even", "odd"], source={"dataset": "sklearn-digits"},
                       skipped=[{"file": "notes.txt", "reason": "not an image"}])


@pytest.fixture(scope="module")
def encoder(tiny_dinov2_dir):
    return create_encoder(f"hf:{tiny_dinov2_dir}", device="cpu", image_size=28)


def test_store_matches_direct_encoding_and_metadata(encoder):
    src = _digits_source(24)
    store = embed_source(src, encoder, batch_size=8, num_workers=0, progress=False)
    assert store.embeddings.shape == (24, 32) and store.embeddings.dtype == torch.float32
    assert store.sample_ids == [r.sample_id for r in src.records]
    assert store.labels.tolist() == [r.label for r in src.records]
    direct = encoder(torch.stack([encoder.transform(r.load()) for r in src.records[:5]]))
    torch.testing.assert_close(store.embeddings[:5], direct, rtol=1e-5, atol=1e-5)
    m = store.meta
    assert m["kind"] == "real" and m["encoder"] == encoder.id and m["weights_hash"] == encoder.weights_hash
    assert m["dim"] == 32 and m["pooling"] == "cls" and m["preprocess"]["crop"] == 28
    assert m["source"] == {"dataset": "sklearn-digits"} and m["fedhype_version"] == __version__
    assert m["n"] == 24 and m["class_counts"] == store.class_counts() and m["domain_counts"] == [12, 12]
    assert m["skipped"] == [{"file": "notes.txt", "reason": "not an image"}]
    assert m["elapsed_s"] > 0 and m["images_per_s"] > 0


def test_worker_processes_give_the_same_embeddings(encoder):
    src = _digits_source(20)
    a = embed_source(src, encoder, batch_size=6, num_workers=0, progress=False)
    b = embed_source(src, encoder, batch_size=6, num_workers=2, progress=True)
    torch.testing.assert_close(a.embeddings, b.embeddings)
    assert a.sample_ids == b.sample_ids


def test_decode_failure_is_skipped_and_listed(encoder):
    store = embed_source(_digits_source(12, broken_at=5), encoder, batch_size=4, num_workers=1, progress=False)
    assert len(store) == 11 and "digits/broken.png" not in store.sample_ids
    bad = [s for s in store.meta["skipped"] if s["file"] == "digits/broken.png"]
    assert bad == [{"file": "digits/broken.png", "reason": "OSError: image file is truncated"}]
    assert store.meta["n_input"] == 12


def test_strict_stops_on_a_decode_failure(encoder):
    with pytest.raises(ValidationError, match="digits/broken.png.*--strict"):
        embed_source(_digits_source(8, broken_at=2), encoder, num_workers=0, progress=False, strict=True)


def test_bad_arguments(encoder):
    empty = ImageSource([], ["0"], ["d"])
    with pytest.raises(ValidationError, match="no images to embed"):
        embed_source(empty, encoder, progress=False)
    with pytest.raises(ValidationError, match="--batch-size"):
        embed_source(_digits_source(4), encoder, batch_size=0, progress=False)
    only_broken = ImageSource([ImageRecord("x.png", 0, 0, _broken)], ["0"], ["d"])
    with pytest.raises(ValidationError, match="none of the 1 images could be decoded"):
        embed_source(only_broken, encoder, num_workers=0, progress=False)
