"""The per-client downstream table: local-only, synthetic-only, local + synthetic, λ protocol; own and union tests."""

import numpy as np
import pytest
import torch

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.eval import client_downstream
from fedhype.eval.client_downstream import ROWS, augmentation_weights, union_store
from fedhype.eval.interpolation import ClientSplits, interpolation_protocol
from fedhype.eval.utility import METRICS, Probe, classification_metrics


@pytest.fixture(scope="module")
def table(skewed_federation):
    _, clients, syn = skewed_federation
    return client_downstream(clients, syn, seed=0)


def test_every_client_gets_every_row_on_its_own_and_the_union_test_set(skewed_federation, table):
    _, clients, syn = skewed_federation
    assert table["rows"] == list(ROWS) and list(table["clients"]) == list(clients)
    assert table["n_union_test"] == sum(len(c.test) for c in clients.values())
    assert table["n_synthetic"] == len(syn) and table["private"] is False and "not covered by DP" in table["note"]
    for name, c in table["clients"].items():
        assert (c["n_train"], c["n_val"], c["n_test"]) == tuple(len(getattr(clients[name], s)) for s in ("train", "val", "test"))
        for where in ("own", "union"):
            assert set(c[where]) == set(ROWS)
            assert all(set(v) == set(METRICS) and all(0.0 <= x <= 1.0 for x in v.values()) for v in c[where].values())
        assert c["real_share"] in table["real_shares"] and len(c["real_share_val_scores"]) == len(table["real_shares"])
    for where in ("own", "union"):
        for row in ROWS:
            for m in METRICS:
                assert table["mean"][where][row][m] == pytest.approx(
                    np.mean([c[where][row][m] for c in table["clients"].values()]))
    # the synthetic-only probe is one probe for all: the same figure on the union for every client
    assert len({c["union"]["synthetic_only"]["accuracy"] for c in table["clients"].values()}) == 1


def test_missing_classes_are_named_and_local_only_cannot_predict_them(skewed_federation, table):
    _, clients, syn = skewed_federation
    union = union_store({n: c.test for n, c in clients.items()})
    y = union.labels.numpy()
    lacking = 0
    for name, c in table["clients"].items():
        held = set(clients[name].train.labels.tolist())
        assert c["missing_classes"] == [syn.class_names[k] for k in range(syn.n_classes) if k not in held]
        lacking += bool(c["missing_classes"])
        # a local-only probe never predicts a class it has no record of: its union accuracy is at most the share
        # of the union's records in the classes it holds
        assert c["union"]["local_only"]["accuracy"] <= np.isin(y, sorted(held)).mean() + 1e-12
    assert lacking == len(clients)  # α = 0.2: every client lacks a class


def test_local_plus_synthetic_beats_local_only_on_the_union_for_clients_missing_classes(table):
    """The value of the shared store: each client lacks classes, the synthetic records bring them."""
    for name, c in table["clients"].items():
        assert c["union"]["local_synthetic"]["accuracy"] > c["union"]["local_only"]["accuracy"] + 0.15, name
        assert c["union"]["local_synthetic"]["balanced_accuracy"] > c["union"]["local_only"]["balanced_accuracy"], name
    assert table["gain_union_accuracy"] == pytest.approx(
        table["mean"]["union"]["local_synthetic"]["accuracy"] - table["mean"]["union"]["local_only"]["accuracy"])
    assert table["gain_union_accuracy"] > 0.25


def test_local_only_is_lambda_one_and_synthetic_only_lambda_zero_of_the_interpolation_protocol(skewed_federation, table):
    _, clients, syn = skewed_federation
    union = union_store({n: c.test for n, c in clients.items()})
    lam = interpolation_protocol(clients, syn, seed=0, union_test=union)
    for name, c in table["clients"].items():
        li = lam["clients"][name]
        assert c["own"]["local_only"] == li["local_only"] and c["union"]["local_only"] == li["union"]["local_only"]
        assert c["own"]["synthetic_only"] == li["synthetic_only"]
        assert c["union"]["synthetic_only"] == li["union"]["synthetic_only"]
        assert c["lambda"] == li["lambda"] and c["own"]["interpolation"] == {m: li[m] for m in METRICS}
    assert lam["mean_union_accuracy"] == pytest.approx(table["mean"]["union"]["interpolation"]["accuracy"])


def test_the_real_share_is_chosen_on_validation_not_on_test(skewed_federation):
    """Replacing every client's test split by garbage changes no choice (r, λ); only the scores move."""
    _, clients, syn = skewed_federation
    rng = np.random.default_rng(0)
    shuffled = {}
    for n, c in clients.items():
        t = c.test
        fake = EmbeddingStore(t.embeddings, torch.from_numpy(rng.permutation(t.labels.numpy())), t.domains,
                              t.sample_ids, t.class_names, t.domain_names, dict(t.meta))
        shuffled[n] = ClientSplits(c.train, c.val, fake)
    a, b = client_downstream(clients, syn, seed=0), client_downstream(shuffled, syn, seed=0)
    for n in clients:
        for k in ("real_share", "real_share_val_scores", "lambda"):
            assert a["clients"][n][k] == b["clients"][n][k]


def test_augmentation_weights_give_the_real_share_within_each_shared_class():
    y_real = np.array([0, 0, 1, 2, 2, 2])           # classes 0, 1, 2; class 2 is not synthetic
    y_syn = np.array([0] * 10 + [1] * 4 + [3] * 5)   # class 3 only synthetic
    assert np.array_equal(augmentation_weights(y_real, y_syn, None), np.ones(25))
    w = augmentation_weights(y_real, y_syn, 0.75)
    wr, ws = w[:6], w[6:]
    assert wr[y_real == 0].sum() == pytest.approx(0.75 * 12) and ws[y_syn == 0].sum() == pytest.approx(0.25 * 12)
    assert wr[y_real == 1].sum() == pytest.approx(0.75 * 5) and ws[y_syn == 1].sum() == pytest.approx(0.25 * 5)
    assert np.all(wr[y_real == 2] == 1.0) and np.all(ws[y_syn == 3] == 1.0)  # one source only: unchanged
    assert w.sum() == pytest.approx(25)  # class totals, hence the mean weight 1, are kept
    for bad in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ValidationError, match=r"real shares must lie in \(0, 1\)"):
            augmentation_weights(y_real, y_syn, bad)


def test_probe_sample_weight_zero_equals_leaving_records_out(real_store):
    x = torch.nn.functional.normalize(real_store.embeddings, dim=1).numpy()
    y = real_store.labels.numpy()
    w = np.ones(len(y))
    w[::3] = 0.0
    a = Probe(10).fit(x, y, sample_weight=w).predict_proba(x[:50])
    b = Probe(10).fit(x[w > 0], y[w > 0]).predict_proba(x[:50])
    assert np.allclose(a, b, atol=1e-3)
    # a heavy class is predicted more often on held-out records (the training rows are separable)
    heavy = Probe(10).fit(x[::2], y[::2], sample_weight=np.where(y[::2] == 3, 50.0, 1.0)).predict(x[1::2])
    plain = Probe(10).fit(x[::2], y[::2]).predict(x[1::2])
    assert (heavy == 3).sum() > (plain == 3).sum()
    for bad, msg in ((np.ones(3), "sample_weight must have shape"), (-w, "finite, ≥ 0"), (0 * w, "not all 0"),
                     (np.full(len(y), np.nan), "finite")):
        with pytest.raises(ValidationError, match=msg):
            Probe(10).fit(x, y, sample_weight=bad)


def test_union_store_keeps_clients_apart(skewed_federation):
    _, clients, _ = skewed_federation
    u = union_store({n: c.test for n, c in clients.items()})
    assert u.domain_names == list(clients) and len(u) == sum(len(c.test) for c in clients.values())
    first = next(iter(clients))
    assert u.sample_ids[0] == f"{first}/{clients[first].test.sample_ids[0]}"
    assert u.domain_counts() == [len(c.test) for c in clients.values()]
    with pytest.raises(ValidationError, match="at least one client"):
        union_store({})


def test_interpolation_union_scores_the_chosen_lambda_on_the_union(skewed_federation):
    _, clients, syn = skewed_federation
    union = union_store({n: c.test for n, c in clients.items()})
    lam = interpolation_protocol(clients, syn, seed=0, union_test=union)
    x, y = torch.nn.functional.normalize(union.embeddings, dim=1).numpy(), union.labels.numpy()
    for name, c in clients.items():
        local = Probe(10).fit(torch.nn.functional.normalize(c.train.embeddings, dim=1).numpy(), c.train.labels.numpy())
        assert lam["clients"][name]["union"]["local_only"] == classification_metrics(y, local.predict(x))
    assert "union" not in interpolation_protocol(clients, syn, seed=0)["clients"][name]


def test_refusals_name_what_is_wrong(skewed_federation):
    _, clients, syn = skewed_federation
    name, c = next(iter(clients.items()))
    with pytest.raises(ValidationError, match="at least one client"):
        client_downstream({}, syn)
    with pytest.raises(ValidationError, match=f"client {name}: the val split is empty"):
        client_downstream({name: ClientSplits(c.train, c.val.subset([]), c.test)}, syn)
    with pytest.raises(ValidationError, match="real_shares is empty"):
        client_downstream(clients, syn, real_shares=[])
    with pytest.raises(ValidationError, match=r"real shares must lie in \(0, 1\)"):
        client_downstream(clients, syn, real_shares=[None, 1.0])
    with pytest.raises(ValidationError, match="select_by must be one of"):
        client_downstream(clients, syn, select_by="auc")
    with pytest.raises(ValidationError, match="space must be one of"):
        client_downstream(clients, syn, space="pca")
    with pytest.raises(ValidationError, match="the synthetic store is empty"):
        client_downstream(clients, syn.subset([]))
    other = EmbeddingStore(syn.embeddings, syn.labels, syn.domains, syn.sample_ids, [f"c{i}" for i in range(10)],
                           syn.domain_names, dict(syn.meta))
    with pytest.raises(ValidationError, match=f"class names differ: client {name} train store"):
        client_downstream(clients, other)
    with pytest.raises(ValidationError, match="embedding dimension differs"):
        client_downstream({name: ClientSplits(*(EmbeddingStore(s.embeddings[:, :8], s.labels, s.domains, s.sample_ids,
                                                                s.class_names, s.domain_names) for s in
                                                 (c.train, c.val, c.test)))}, syn)
