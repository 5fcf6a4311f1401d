"""``fedhype.eval.evaluate``: the keys, the checks, and a real shift ranked correctly."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.eval import HEADLINE_KEYS, evaluate

CLASSES = [str(i) for i in range(10)]


def _stores():
    d = load_digits()
    perm = np.random.default_rng(0).permutation(len(d.target))
    x, y = (d.data[perm] / 16.0).astype(np.float32), d.target[perm].astype(np.int64)

    def mk(sl, prefix, xx=None, kind="real"):
        xs = x[sl] if xx is None else xx
        n = len(xs)
        return EmbeddingStore(torch.from_numpy(xs), torch.from_numpy(y[sl]), torch.from_numpy(np.arange(n) % 2),
                              [f"{prefix}/{i}" for i in range(n)], CLASSES, ["a", "b"], {"kind": kind})

    test, train, syn = mk(slice(0, 400), "te"), mk(slice(400, 800), "tr"), mk(slice(800, 1200), "sy", kind="synthetic")
    # A real corruption of the "synthetic" set: the left half of every image blanked out.
    blank = x[800:1200].copy().reshape(-1, 8, 8)
    blank[:, :, :4] = 0.0
    bad = mk(slice(800, 1200), "bad", blank.reshape(-1, 64), kind="synthetic")
    return test, train, syn, bad


def test_keys_and_values_on_real_digits():
    test, train, syn, _ = _stores()
    r = evaluate(test, syn, real_train=train, n_permutations=50, seed=0)
    for key in (*HEADLINE_KEYS, "mmd2_multi", "mmd2_bandwidth", "tstr_balanced_accuracy", "tstr_macro_f1",
                "trtr_balanced_accuracy", "trtr_macro_f1", "per_domain", "n_real", "n_synthetic", "space"):
        assert key in r, key
    assert (r["n_real"], r["n_synthetic"], r["n_real_train"], r["space"]) == (400, 400, 400, "l2")
    assert r["mmd2_p_value"] > 0.05 and r["precision"] > 0.8 and r["coverage"] > 0.8
    assert r["tstr_accuracy"] > 0.9 and r["trtr_accuracy"] > 0.9
    assert set(r["per_domain"]) == {"a", "b"}


def test_corrupted_synthetic_scores_worse_everywhere():
    test, _, syn, bad = _stores()
    good = evaluate(test, syn, n_permutations=50, seed=0)
    worse = evaluate(test, bad, n_permutations=50, seed=0)
    assert worse["mmd2"] > 10 * max(good["mmd2"], 1e-4) and worse["mmd2_p_value"] < 0.05
    assert worse["fd"] > 5 * good["fd"]
    assert worse["precision"] < good["precision"] and worse["density"] < good["density"]
    assert worse["tstr_accuracy"] < good["tstr_accuracy"]
    assert good["trtr_accuracy"] is None


def test_seeded_and_space_matters():
    test, _, syn, _ = _stores()
    a = evaluate(test, syn, n_permutations=20, seed=3, per_domain=False)
    b = evaluate(test, syn, n_permutations=20, seed=3, per_domain=False)
    assert a == b and "per_domain" not in a
    raw = evaluate(test, syn, n_permutations=20, seed=3, space="raw", per_domain=False)
    assert raw["mmd2_bandwidth"] > 2 * a["mmd2_bandwidth"]  # digits/16 rows have norm ≈ 3-4


def test_mismatched_stores_are_validation_errors():
    test, _, syn, _ = _stores()
    narrow = EmbeddingStore(syn.embeddings[:, :32], syn.labels, syn.domains, syn.sample_ids, CLASSES, ["a", "b"])
    with pytest.raises(ValidationError, match=r"real test store has D=64, synthetic store has D=32"):
        evaluate(test, narrow)
    renamed = EmbeddingStore(syn.embeddings, syn.labels, syn.domains, syn.sample_ids,
                             [f"c{i}" for i in range(10)], ["a", "b"])
    with pytest.raises(ValidationError, match="class names differ"):
        evaluate(test, renamed)
    with pytest.raises(ValidationError, match="space"):
        evaluate(test, syn, space="cosine")
    with pytest.raises(ValidationError, match="k=500"):
        evaluate(test, syn, k=500, n_permutations=0, prdc_max_samples=None)
