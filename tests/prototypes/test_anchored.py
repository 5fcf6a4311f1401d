"""Hyper-prototypes as anchors of a client's own local training (global model from the synthetic store)."""

import numpy as np
import pytest
import torch

from fedhype.errors import ValidationError
from fedhype.eval.utility import METRICS
from fedhype.prototypes import VARIANTS, anchored_classifier, anchored_downstream, class_mean_anchors, fit_local, synthetic_model

FAST = dict(epochs=5)


@pytest.fixture(scope="module")
def model(skewed_federation):
    _, _, syn = skewed_federation
    return synthetic_model(syn, seed=0, **FAST)


@pytest.fixture(scope="module")
def result(skewed_federation):
    _, clients, syn = skewed_federation
    return anchored_downstream(clients, syn, variants=["alone", "hyper", "class_means", "hyper+synthetic"], epochs=5,
                               local_epochs=10, seed=0)


def test_fine_tuning_keeps_the_global_model_and_its_anchors(skewed_federation, model):
    _, clients, syn = skewed_federation
    c = next(iter(clients.values()))
    before = {k: v.clone() for k, v in model.net_.state_dict().items()}
    p0 = model.prototypes_.clone()
    clf = fit_local(c.train.embeddings, c.train.labels, 10, start=model, epochs=3, seed=0)
    assert all(torch.equal(before[k], v) for k, v in model.net_.state_dict().items())  # start is not changed
    assert torch.equal(model.prototypes_, p0) and torch.equal(clf.prototypes_, p0)    # the anchors stay fixed
    assert any(not torch.equal(before[k], v) for k, v in clf.net_.state_dict().items())  # the client's copy moved
    p = clf.predict_proba(c.test.embeddings)
    assert p.shape == (len(c.test), 10) and np.allclose(p.sum(1), 1.0) and clf.classes_.tolist() == list(range(10))
    assert clf.history_[-1]["local"] is True and clf.history_[-1]["margin"] > 0   # the client's own margin m_i
    assert clf.lambda_consistency == 0.3 and clf.lambda_contrastive == 0.3


def test_class_mean_anchors_are_the_normalised_synthetic_class_means(skewed_federation, model):
    _, _, syn = skewed_federation
    a = class_mean_anchors(model, syn.embeddings, syn.labels)
    assert a.shape == (10, 1, model.feature_dim) and torch.allclose(a.norm(dim=2), torch.ones(10, 1), atol=1e-5)
    f = torch.as_tensor(model.transform(syn.embeddings[syn.labels == 4]))
    assert torch.allclose(a[4, 0], torch.nn.functional.normalize(f.mean(0), dim=0), atol=1e-5)
    # a class without records keeps the model's own prototype mean
    keep = syn.labels != 7
    b = class_mean_anchors(model, syn.embeddings[keep], syn.labels[keep])
    assert torch.allclose(b[7, 0], torch.nn.functional.normalize(model.prototypes_[7].mean(0), dim=0), atol=1e-5)


def test_structure_and_validation_keys(skewed_federation, result):
    _, clients, _ = skewed_federation
    assert result["variants"] == ["alone", "hyper", "class_means", "hyper+synthetic"]
    assert list(result["clients"]) == list(clients) and set(result["global"]) == {"hyper"}
    for c in result["clients"].values():
        for v in result["variants"]:
            assert set(c[v]) == {"own", "union", "val", "union_val"}
            assert all(set(x) == set(METRICS) and all(0 <= y <= 1 for y in x.values()) for x in c[v].values())
    assert result["mean"]["hyper"]["union"]["accuracy"] == pytest.approx(
        np.mean([c["hyper"]["union"]["accuracy"] for c in result["clients"].values()]))
    assert result["private"] is False and "not covered by DP" in result["note"]


def test_anchors_from_the_synthetic_store_beat_the_client_alone_on_the_union(result):
    """Every client lacks classes: alone it cannot know them; the global model's anchors (and, more, training with
    the synthetic records) bring them. Measured per client on the union of the clients' test splits."""
    for name, c in result["clients"].items():
        alone = c["alone"]["union"]["accuracy"]
        assert c["hyper"]["union"]["accuracy"] > alone + 0.1, name
        assert c["hyper+synthetic"]["union"]["accuracy"] > c["hyper"]["union"]["accuracy"], name
    m = result["mean"]
    assert m["hyper+synthetic"]["union"]["accuracy"] > m["alone"]["union"]["accuracy"] + 0.3


def test_anchored_classifier_none_is_the_client_alone(skewed_federation):
    _, clients, syn = skewed_federation
    c = next(iter(clients.values()))
    a = anchored_classifier(syn, c.train.embeddings, c.train.labels, anchors="none", with_synthetic=False, epochs=3)
    b = fit_local(c.train.embeddings, c.train.labels, 10, epochs=3)
    assert np.array_equal(a.predict_proba(c.test.embeddings), b.predict_proba(c.test.embeddings))
    cm = anchored_classifier(syn, c.train.embeddings, c.train.labels, anchors="class_means", epochs=2)
    assert cm.prototypes_.shape[1] == 1 and cm.lambda_contrastive == 0.0 and cm.lambda_consistency == 1.0


def test_refusals(skewed_federation, model):
    _, clients, syn = skewed_federation
    c = next(iter(clients.values()))
    x, y = c.train.embeddings, c.train.labels
    with pytest.raises(ValidationError, match="variants must be a non-empty subset"):
        anchored_downstream(clients, syn, variants=["hyper", "knn"])
    with pytest.raises(ValidationError, match="at least one client"):
        anchored_downstream({}, syn)
    with pytest.raises(ValidationError, match="matching must be 'none' or 'synthetic'"):
        synthetic_model(syn, matching="dp")
    with pytest.raises(ValidationError, match="anchors need the global model"):
        fit_local(x, y, 10, anchors=model.prototypes_)
    with pytest.raises(ValidationError, match=r"anchors must be \[K=10, L, d=128\]"):
        fit_local(x, y, 10, start=model, anchors=torch.zeros(10, 2, 64))
    with pytest.raises(ValidationError, match="the global model has D = 384"):
        fit_local(x[:, :16], y, 10, start=model)
    with pytest.raises(ValidationError, match=r"labels outside \[0, 3\)"):
        fit_local(x, y, 3)
    with pytest.raises(ValidationError, match="anchors must be one of"):
        anchored_classifier(syn, x, y, anchors="fedavg")
    assert set(VARIANTS) >= {"alone", "hyper", "hyper_matched", "class_means", "hyper+synthetic"}
