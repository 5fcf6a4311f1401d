"""TSTR / TRTR on real digits features and the per-client λ-interpolation protocol."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.eval.interpolation import ClientSplits, interpolation_protocol
from fedhype.eval.utility import Probe, classification_metrics, utility_report

CLASSES = [str(i) for i in range(10)]
DOMAINS = ["w0", "w1", "w2"]


def _digits():
    d = load_digits()
    perm = np.random.default_rng(0).permutation(len(d.target))
    return (d.data[perm] / 16.0).astype(np.float32), d.target[perm]


def _store(x, y, prefix, domains=None):
    n = len(y)
    dom = np.arange(n) % 3 if domains is None else domains
    return EmbeddingStore(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)), torch.from_numpy(dom),
                          [f"{prefix}/{i}" for i in range(n)], CLASSES, DOMAINS, {"kind": "real"})


def test_tstr_close_to_trtr_when_synthetic_is_real_data():
    x, y = _digits()
    test, train = _store(x[:500], y[:500], "te"), _store(x[500:1100], y[500:1100], "tr")
    other = _store(x[1100:1700], y[1100:1700], "sy")
    r = utility_report(test, other, real_train=train, space="raw")
    assert r["trtr_accuracy"] > 0.93
    assert abs(r["tstr_accuracy"] - r["trtr_accuracy"]) < 0.03
    assert abs(r["tstr_macro_f1"] - r["trtr_macro_f1"]) < 0.03
    same = utility_report(test, train, real_train=train, space="raw")
    assert same["tstr_accuracy"] == same["trtr_accuracy"]  # the identical classifier
    assert r["synthetic_missing_classes"] == []


def test_per_domain_metrics_add_up_to_pooled():
    x, y = _digits()
    test, syn = _store(x[:600], y[:600], "te"), _store(x[600:1200], y[600:1200], "sy")
    r = utility_report(test, syn)
    per = r["per_domain"]
    assert set(per) == set(DOMAINS) and sum(v["n"] for v in per.values()) == 600
    pooled = sum(v["n"] * v["tstr_accuracy"] for v in per.values()) / 600
    assert pooled == pytest.approx(r["tstr_accuracy"])
    assert r["trtr_accuracy"] is None and per["w0"]["trtr_accuracy"] is None


def test_classes_absent_from_synthetic():
    x, y = _digits()
    test = _store(x[:500], y[:500], "te")
    keep = y[500:1200] < 5
    syn = _store(x[500:1200][keep], y[500:1200][keep], "sy")
    r = utility_report(test, syn)
    assert r["synthetic_missing_classes"] == ["5", "6", "7", "8", "9"]
    frac_low = (y[:500] < 5).mean()
    assert 0.9 * frac_low < r["tstr_accuracy"] <= frac_low + 1e-12
    p = Probe(10).fit(x[500:1200][keep], y[500:1200][keep]).predict_proba(x[:20])
    assert p.shape == (20, 10) and np.all(p[:, 5:] == 0) and np.allclose(p.sum(1), 1)


def test_single_class_training_set_predicts_that_class():
    x, y = _digits()
    probe = Probe(10).fit(x[y == 3][:50], y[y == 3][:50])
    assert set(probe.predict(x[:100]).tolist()) == {3}


def test_classification_metrics_values():
    y_true = np.array([0, 0, 0, 1, 1, 2])
    y_pred = np.array([0, 0, 1, 1, 1, 0])
    m = classification_metrics(y_true, y_pred)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["balanced_accuracy"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert m["macro_f1"] == pytest.approx((2 * (2 / 3) * (2 / 3) / (4 / 3) + 0.8 + 0) / 3)


def _clients(x, y, n_train=120, start=0, shuffle_train=False, rng=None):
    clients = {}
    for c in range(3):
        o = start + c * 200
        ytr = y[o : o + n_train].copy()
        if shuffle_train:
            rng.shuffle(ytr)
        clients[f"client{c}"] = ClientSplits(
            _store(x[o : o + n_train], ytr, f"c{c}tr"),
            _store(x[o + n_train : o + 160], y[o + n_train : o + 160], f"c{c}va"),
            _store(x[o + 160 : o + 200], y[o + 160 : o + 200], f"c{c}te"),
        )
    return clients


def test_lambda_is_one_when_synthetic_labels_are_noise():
    x, y = _digits()
    rng = np.random.default_rng(1)
    garbage = _store(x[1000:1600], rng.permutation(y[1000:1600]), "sy")
    r = interpolation_protocol(_clients(x, y), garbage, space="raw")
    for c in r["clients"].values():
        assert c["lambda"] == 1.0
        assert c["val_scores"][-1] > c["val_scores"][0] + 0.5  # local-only ≫ synthetic-only
        assert c["accuracy"] == c["local_only"]["accuracy"]
    assert r["mean_lambda"] == 1.0 and r["mean_accuracy"] > 0.85


def test_lambda_leans_on_synthetic_when_local_labels_are_noise():
    x, y = _digits()
    rng = np.random.default_rng(2)
    good = _store(x[1000:1700], y[1000:1700], "sy")
    r = interpolation_protocol(_clients(x, y, shuffle_train=True, rng=rng), good, space="raw")
    assert r["mean_lambda"] <= 0.5
    assert r["mean_accuracy"] > 0.85
    for c in r["clients"].values():
        assert c["accuracy"] >= c["local_only"]["accuracy"]


def test_lambda_protocol_validation():
    x, y = _digits()
    syn = _store(x[1000:1200], y[1000:1200], "sy")
    with pytest.raises(ValidationError, match="λ grid"):
        interpolation_protocol(_clients(x, y), syn, grid=[0.0, 1.5])
    with pytest.raises(ValidationError, match="at least one client"):
        interpolation_protocol({}, syn)
    bad = EmbeddingStore(torch.zeros(5, 3), torch.zeros(5, dtype=torch.int64), torch.zeros(5, dtype=torch.int64),
                         [str(i) for i in range(5)], CLASSES, DOMAINS)
    with pytest.raises(ValidationError, match="D=3"):
        interpolation_protocol([ClientSplits(bad, bad, bad)], syn)
