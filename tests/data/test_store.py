"""EmbeddingStore validation: a NaN/Inf embedding is named by its first row and sample id."""

from __future__ import annotations

import math

import pytest
import torch

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, ValidationError


def _store(emb: torch.Tensor) -> EmbeddingStore:
    n = emb.shape[0]
    return EmbeddingStore(emb, torch.zeros(n), torch.zeros(n), [f"img/{i:03d}" for i in range(n)], ["a"], ["d"])


def test_nan_and_inf_name_the_first_bad_row():
    emb = torch.ones(6, 3)
    emb[4, 2], emb[2, 0], emb[5, 1] = math.nan, math.inf, -math.inf
    with pytest.raises(ValidationError) as info:
        _store(emb)
    assert str(info.value) == ("embeddings store: embeddings contain NaN or Inf: first at row 2 "
                               "(sample id 'img/002'), 3 of 6 rows in all")


def test_a_stored_file_with_nan_is_refused_naming_the_file_and_row(tmp_path):
    good = _store(torch.ones(4, 3))
    good.save(tmp_path / "s.safetensors")
    # a file whose tensors were written with a NaN (digest recomputed, as a buggy writer would)
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open

    with safe_open(str(tmp_path / "s.safetensors"), framework="pt") as fh:
        meta = fh.metadata()
    t = load_file(str(tmp_path / "s.safetensors"))
    t["embeddings"][3, 1] = math.nan
    import json

    from fedhype.io import tensor_digest

    header = json.loads(meta["fedhype"])
    header["digest"] = tensor_digest(t)
    save_file(t, str(tmp_path / "bad.safetensors"), metadata={"fedhype": json.dumps(header)})
    with pytest.raises(ArtifactError, match=r"bad.safetensors: .*first at row 3 \(sample id 'img/003'\), 1 of 4 rows"):
        EmbeddingStore.load(tmp_path / "bad.safetensors")


def test_positions_are_looked_up_in_a_table_built_once_and_rebuilt_when_the_ids_change(real_store):
    """``positions`` used to rebuild its id → row table on every call (quadratic in the clients: a 10,000-client
    run did not finish in an hour); the table is built once, and a store whose ids are replaced answers for them."""
    import dataclasses

    from fedhype.data.partition import opaque_id

    store = dataclasses.replace(real_store)
    ids = [store.sample_ids[i] for i in (5, 0, 799, 17)]
    assert store.positions(ids).tolist() == [5, 0, 799, 17]
    table = store.__dict__["_lookups"][2][False]
    assert store.positions(ids[:2]).tolist() == [5, 0] and store.__dict__["_lookups"][2][False] is table  # reused
    assert store.positions([opaque_id(i) for i in ids]).tolist() == [5, 0, 799, 17]  # a partition's opaque ids
    store.sample_ids = [f"new{i}" for i in range(len(store.sample_ids))]
    assert store.positions(["new3", "new0"]).tolist() == [3, 0]
    with pytest.raises(ArtifactError, match="is not in this embeddings store"):
        store.positions([ids[0]])


def test_a_json_or_text_file_given_as_a_store_is_named_as_such(real_store, tmp_path):
    """A partition JSON passed as the store said "corrupt or truncated … header too large" (a new user's probe)."""
    from fedhype.io import load_tensors

    (tmp_path / "part.json").write_text('{"format": "fedhype-partition/1"}')
    (tmp_path / "notes.txt").write_text("these are not embeddings, just some notes\n")
    (tmp_path / "job.toml").write_text('[train]\nepsilon = 1\n')  # was called "a JSON file" (a probe)
    (tmp_path / "list.json").write_text('[1, 2]')
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "digit.png")  # was "header too large" (a probe)
    Image.new("RGB", (8, 8)).save(tmp_path / "digit.jpg")
    for name, what in (("part.json", "it is a JSON file"), ("notes.txt", "it is a text file"),
                       ("job.toml", "it is a TOML file"), ("list.json", "it is a JSON file"),
                       ("digit.png", "it is a PNG image, not a safetensors file \\(images are embedded into a store "
                                     "with `fedhype embed`\\)"), ("digit.jpg", "it is a JPEG image")):
        with pytest.raises(ArtifactError, match=what):
            EmbeddingStore.load(tmp_path / name)
        with pytest.raises(ArtifactError, match=what):
            load_tensors(tmp_path / name, "model")
    real_store.save(tmp_path / "s.safetensors")
    raw = (tmp_path / "s.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ArtifactError, match="corrupt or truncated"):  # a real but cut store keeps its message
        EmbeddingStore.load(tmp_path / "cut.safetensors")


def test_a_store_given_as_a_json_file_is_named_as_such(real_store, tmp_path):
    """The reverse mistake: a store as --partition said "not valid JSON ('utf-8' codec can't decode …)"."""
    from fedhype.data.partition import Partition
    from fedhype.errors import ArtifactError

    real_store.save(tmp_path / "emb.safetensors")
    with pytest.raises(ArtifactError, match=r"emb.safetensors is a safetensors file \(an embeddings store or a model\?\)"):
        Partition.load(tmp_path / "emb.safetensors")
    (tmp_path / "bad.json").write_text('{"format": ')
    with pytest.raises(ArtifactError, match="is not valid JSON"):  # a broken JSON file is still called that
        Partition.load(tmp_path / "bad.json")


def test_the_same_images_are_found_by_their_embeddings_and_distinct_ones_are_not(real_store):
    """near_duplicates / same_images (evaluate's test-record check; site --same-records): every record of a store
    is its own duplicate at 1e-4 (float32 cdist's matrix-product path put rows ~3e-4 from themselves, so a store
    against itself found only some), a copy with bfloat16-sized perturbations is the same images, another half of
    the store is not."""
    import torch

    from fedhype.data.store import near_duplicates, same_images

    half = len(real_store) // 2
    first, second = real_store.subset(list(range(half))), real_store.subset(list(range(half, len(real_store))))
    assert near_duplicates(first, first, 1e-4) == half
    assert near_duplicates(first, second, 1e-4) == 0
    g = torch.Generator().manual_seed(0)
    noisy = first.subset(list(range(half)))
    unit = torch.nn.functional.normalize(noisy.embeddings, dim=1)
    step = torch.randn(unit.shape, generator=g)
    noisy.embeddings = torch.nn.functional.normalize(unit + 0.02 * step / step.norm(dim=1, keepdim=True), dim=1)
    assert same_images(noisy, first, 0.06) == half  # 0.02 apart: a re-embedding in another dtype
    assert same_images(second, first, 0.06) == 0
    assert same_images(first, first.subset([]), 0.06) == 0
