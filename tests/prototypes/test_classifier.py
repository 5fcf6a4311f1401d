"""HyperPrototypeClassifier: sklearn contract, input validation, save/load, federated training, downstream."""

import json

import numpy as np
import pytest
import torch
from sklearn.base import clone

from fedhype.data.partition import make_partition
from fedhype.errors import ArtifactError, ValidationError
from fedhype.prototypes import HyperPrototypeClassifier, fedavg, fit_federated, prototypes_downstream
from fedhype.prototypes.network import AdapterNet, init_parameters, orthogonal_anchors

FAST = dict(epochs=6, match_steps=3)


@pytest.fixture(scope="module")
def split(real_store):
    part = make_partition(real_store, scheme="domain", seed=0)
    return part, part.split_store(real_store, "train"), part.split_store(real_store, "test")


@pytest.fixture(scope="module")
def fitted(split):
    _, train, _ = split
    labels = train.labels.numpy() + 100                     # arbitrary integer labels
    return HyperPrototypeClassifier(**FAST, seed=0).fit(train.embeddings.numpy(), labels)


def test_fit_predict_on_real_embeddings(fitted, split):
    _, _, test = split
    assert fitted.classes_.tolist() == list(range(100, 110))
    assert fitted.prototypes_.shape == (10, 5, 128) and fitted.n_features_in_ == 384
    pred = fitted.predict(test.embeddings)                  # torch input works as well as numpy
    assert set(pred.tolist()) <= set(range(100, 110))
    assert fitted.score(test.embeddings.numpy(), test.labels.numpy() + 100) > 0.5   # chance 0.1
    for head in ("linear", "prototype", "both"):
        p = fitted.predict_proba(test.embeddings, head=head)
        assert p.shape == (len(test), 10) and np.allclose(p.sum(1), 1.0)
    assert fitted.transform(test.embeddings[:3]).shape == (3, 128)
    assert len(fitted.history_) == 6 and fitted.privacy_["dp_matching"] is False


def test_default_keeps_the_orthonormal_anchors(fitted):
    """matching="none" is the default (benchmarks/prototypes.py): no matching phase, P = the initial anchors."""
    assert HyperPrototypeClassifier().matching == "none"
    assert all("match_before" not in r for r in fitted.history_)
    p = fitted.prototypes_.flatten(0, 1)
    assert torch.allclose(p @ p.T, torch.eye(50), atol=1e-5)
    g = torch.Generator().manual_seed(0)
    init_parameters(AdapterNet(384, 10), g)
    assert torch.allclose(fitted.prototypes_, orthogonal_anchors(10, 5, 128, g), atol=1e-6)   # drawn after the net


def test_same_seed_same_model_and_sklearn_clone(split):
    _, train, _ = split
    x, y = train.embeddings[:200], train.labels.numpy()[:200]
    a = HyperPrototypeClassifier(epochs=2, matching="synthetic", match_steps=2, seed=3).fit(x, y)
    b = clone(a).fit(x, y)
    assert torch.equal(a.prototypes_, b.prototypes_)
    assert np.array_equal(a.predict_proba(x), b.predict_proba(x))
    assert clone(a).get_params()["seed"] == 3


def test_input_validation_names_the_argument(fitted):
    clf = HyperPrototypeClassifier(epochs=1)
    x = np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32)
    y = np.arange(20) % 2
    with pytest.raises(ValidationError, match="X must be a 2-D"):
        clf.fit(x[0], y)
    with pytest.raises(ValidationError, match="y must be 1-D with 20"):
        clf.fit(x, y[:5])
    with pytest.raises(ValidationError, match="y must hold integer"):
        clf.fit(x, y + 0.5)
    bad = x.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValidationError, match="X contains NaN"):
        clf.fit(bad, y)
    with pytest.raises(ValidationError, match="at least two classes"):
        clf.fit(x, np.zeros(20, dtype=int))
    with pytest.raises(ValidationError, match="head must be one of"):
        HyperPrototypeClassifier(head="knn").fit(x, y)
    with pytest.raises(ValidationError, match="lambda_consistency"):
        HyperPrototypeClassifier(lambda_consistency=-1).fit(x, y)
    with pytest.raises(ValidationError, match="X has 8 features"):
        fitted.predict(x)


def test_save_load_round_trip_and_corruption(fitted, split, tmp_path):
    _, _, test = split
    fitted.save(tmp_path / "m", meta={"class_names": [str(i) for i in range(10)]})
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = HyperPrototypeClassifier.load(tmp_path / "m")
    assert loaded.get_params() == fitted.get_params()
    assert loaded.classes_.tolist() == fitted.classes_.tolist() and loaded.meta_["class_names"][0] == "0"
    for head in ("linear", "prototype", "both"):
        assert np.array_equal(loaded.predict_proba(test.embeddings, head), fitted.predict_proba(test.embeddings, head))
    with pytest.raises(ArtifactError, match="not found"):
        HyperPrototypeClassifier.load(tmp_path / "nothing")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    # an edit by hand (a helper set meta.private and data_kind, and swapped class names: evaluate trusted them)
    for key, value in (("meta", {**cfg["meta"], "private": True, "data_kind": "synthetic"}),
                       ("classes", cfg["classes"][::-1])):
        (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(ArtifactError, match=r"config\.json: edited after it was written"):
            HyperPrototypeClassifier.load(tmp_path / "m")
    old = {k: v for k, v in cfg.items() if k != "config_sha256"}  # a model saved before the digest: loads as before
    (tmp_path / "m" / "config.json").write_text(json.dumps(old))
    assert HyperPrototypeClassifier.load(tmp_path / "m").meta_ == cfg["meta"]
    old["params"]["feature_dim"] = 64
    (tmp_path / "m" / "config.json").write_text(json.dumps(old))
    with pytest.raises(ArtifactError, match="disagree"):
        HyperPrototypeClassifier.load(tmp_path / "m")
    raw = (tmp_path / "m" / "model.safetensors").read_bytes()
    (tmp_path / "m" / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ArtifactError, match="corrupt or truncated"):
        HyperPrototypeClassifier.load(tmp_path / "m")


def test_fedavg_weights_by_size():
    out = fedavg([{"w": torch.tensor([0.0, 2.0])}, {"w": torch.tensor([4.0, 2.0])}], [3.0, 1.0])
    assert out["w"].tolist() == [1.0, 2.0]
    with pytest.raises(ValidationError):
        fedavg([], [])


def test_federated_training_over_domain_clients(split, real_store):
    part, _, test = split
    clients = {str(c.id): (part.client_store(real_store, c.id, "train").embeddings,
                           part.client_store(real_store, c.id, "train").labels.numpy()) for c in part.clients}
    clf = fit_federated(HyperPrototypeClassifier(epochs=6, matching="synthetic", match_steps=3, seed=0), clients,
                        classes=np.arange(10), local_epochs=2)
    acc = float((clf.predict(test.embeddings) == test.labels.numpy()).mean())
    assert acc > 0.3, acc                                     # chance 0.1; 6 short rounds on ~120 records/client
    assert clf.privacy_["model_private"] is False and clf.privacy_["federated"] is True
    assert set(clf.history_[-1]["margins"]) == set(clients)
    assert len({round(m, 6) for m in clf.history_[-1]["margins"].values()}) > 1   # margins are per client
    with pytest.raises(ValidationError, match="class_means"):
        fit_federated(HyperPrototypeClassifier(init="class_means"), clients, classes=np.arange(10))
    dp = fit_federated(HyperPrototypeClassifier(epochs=2, match_steps=1, matching="dp", delta=1e-4, seed=0), clients,
                       classes=np.arange(10))
    assert len(dp.ledger_) == 2 * len(clients) and dp.privacy_["model_private"] is False
    assert dp.privacy_["epsilon"] == pytest.approx(max(dp.ledger_.epsilon(c) for c in clients))


def test_prototypes_downstream_keys_and_values(split):
    _, train, test = split
    r = prototypes_downstream(train, test, real_train=train, seed=0, epochs=6)
    for key in ("hyperproto_accuracy", "hyperproto_balanced_accuracy", "hyperproto_macro_f1",
                "linear_probe_accuracy", "linear_probe_balanced_accuracy", "linear_probe_macro_f1",
                "hyperproto_trtr_accuracy", "linear_probe_trtr_accuracy"):
        assert 0.4 < r[key] <= 1.0, (key, r[key])
    assert r["hyperproto_accuracy"] == r["hyperproto_trtr_accuracy"]    # same training set, same seed
    assert set(r["per_domain"]) == set(test.domain_names)
    assert sum(d["n"] for d in r["per_domain"].values()) == len(test)
    assert r["n_train"] == len(train) and r["hyperproto_epsilon_matching"] == 0.0
