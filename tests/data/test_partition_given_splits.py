"""Partitions keep the splits an image folder gives (train/, val/, test/) instead of drawing them."""

from __future__ import annotations

import numpy as np
import pytest

from fedhype.data.partition import SPLITS, given_splits, make_partition
from fedhype.data.store import EmbeddingStore, opaque_id
from fedhype.errors import ValidationError


def _with_folders(store: EmbeddingStore, split_of, folders: dict[str, str]) -> EmbeddingStore:
    """``store`` (real DINOv2 digits) with sample ids ``<split folder>/<domain>/<label>/<i>.png`` and the
    split spec an image-folder scan records (``meta.source.splits``)."""
    ids = [f"{split_of(i)}/{store.domain_names[int(d)]}/{int(y)}/{i}.png"
           for i, (d, y) in enumerate(zip(store.domains, store.labels))]
    meta = {**store.meta, "source": {"dataset": "image-folder", "splits": {"component": 0, "folders": folders}}}
    return EmbeddingStore(store.embeddings, store.labels, store.domains, ids, store.class_names, store.domain_names, meta)


def test_given_train_and_test_are_kept_and_val_is_drawn_from_train(real_store):
    store = _with_folders(real_store, lambda i: "test" if i % 4 == 0 else "train", {"train": "train", "test": "test"})
    given = given_splits(store)
    assert (given == "test").sum() == 200 and (given == "train").sum() == 600
    part = make_partition(store, scheme="domain", seed=0)
    assert part.params["given_splits"] == {"given": ["train", "test"], "drawn_from_train": {"val": 0.25}}
    assert [c.name for c in part.clients] == ["mnist", "optdigits", "mnist-m", "rotated-mnist"]
    folder = {opaque_id(s): s.split("/")[0] for s in store.sample_ids}  # the partition lists opaque ids
    for c in part.clients:
        assert c.test and all(folder[s] == "test" for s in c.test)
        assert all(folder[s] == "train" for s in c.train + c.val)
        n_given_train = len(c.train) + len(c.val)
        assert abs(len(c.val) - 0.25 * n_given_train) <= len(store.class_names)  # stratified, within a record per class
    every_test = sorted(s for c in part.clients for s in c.test)
    assert every_test == sorted(opaque_id(s) for s in store.sample_ids if s.startswith("test/"))  # nothing moved
    # the fractions draw every split when asked to
    drawn = make_partition(store, scheme="domain", seed=0, use_given_splits=False)
    assert "given_splits" not in drawn.params
    assert any(folder[s] == "train" for c in drawn.clients for s in c.test)


def test_all_three_given_and_dirichlet_clients(real_store):
    names = {0: "test", 1: "val"}
    store = _with_folders(real_store, lambda i: names.get(i % 5, "train"), {"train": "train", "val": "val", "test": "test"})
    part = make_partition(store, scheme="dirichlet", n_clients=3, alpha=0.5, seed=1, min_train_per_client=10)
    assert part.params["given_splits"] == {"given": list(SPLITS), "drawn_from_train": {}}
    folder = {opaque_id(s): s.split("/")[0] for s in store.sample_ids}
    for c in part.clients:
        for split in SPLITS:
            assert all(folder[s] == split for s in c.ids(split))
    assert sum(len(c.val) for c in part.clients) == 160 and sum(len(c.test) for c in part.clients) == 160


def test_given_splits_without_train_are_refused(real_store):
    store = _with_folders(real_store, lambda i: "test" if i % 2 else "val", {"val": "val", "test": "test"})
    with pytest.raises(ValidationError, match=r"give the split\(s\) \['val', 'test'\] but no train split.*--draw-splits"):
        make_partition(store, scheme="domain")
    assert given_splits(real_store) is None  # a bundled dataset gives no splits
