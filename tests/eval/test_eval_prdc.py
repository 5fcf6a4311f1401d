"""PRDC: the paper's definitions on real digits features, chunking, k-NN radii, errors."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist
from sklearn.datasets import load_digits
from sklearn.neighbors import NearestNeighbors

from fedhype.errors import ValidationError
from fedhype.eval.prdc import knn_radii, prdc


def _digits() -> torch.Tensor:
    x = (load_digits().data / 16.0).astype(np.float32)
    return torch.from_numpy(x[np.random.default_rng(0).permutation(len(x))])


def _reference(x, y, k):
    """Naeem et al. (2020) eqs. 1–4 with full distance matrices (closed balls)."""
    x, y = x.double().numpy(), y.double().numpy()
    dxx, dyy, dxy = cdist(x, x), cdist(y, y), cdist(x, y)
    rx = np.sort(dxx, 1)[:, k]
    ry = np.sort(dyy, 1)[:, k]
    inside = dxy <= rx[:, None]  # [N, M]
    return {
        "precision": inside.any(0).mean(),
        "recall": (dxy <= ry[None, :]).any(1).mean(),
        "density": inside.sum(0).mean() / k,
        "coverage": (dxy.min(1) <= rx).mean(),
    }


def test_knn_radii_match_sklearn():
    x = _digits()[:300]
    dist, _ = NearestNeighbors(n_neighbors=6).fit(x.numpy()).kneighbors(x.numpy())
    np.testing.assert_allclose(knn_radii(x, 5).numpy(), dist[:, 5], rtol=1e-4, atol=1e-5)


def test_identical_sets():
    x = _digits()[:500]
    r = prdc(x, x.clone(), k=5)
    assert r["precision"] == r["recall"] == r["coverage"] == 1.0
    # Each point lies in its own ball and in those of its k neighbours: density = (k + 1) / k,
    # plus exact ties (digits has duplicate images).
    assert 1.2 <= r["density"] < 1.25


def test_two_samples_of_one_distribution_have_density_near_one():
    x = _digits()
    r = prdc(x[:800], x[800:1600], k=5)
    assert 0.85 < r["density"] < 1.15
    assert r["precision"] > 0.9 and r["coverage"] > 0.9


def test_far_apart_sets_score_zero():
    x = _digits()
    r = prdc(x[:400], x[400:800] + 100.0, k=5)
    assert (r["precision"], r["recall"], r["density"], r["coverage"]) == (0.0, 0.0, 0.0, 0.0)


def test_matches_reference_on_a_real_shift():
    x = _digits()
    labels = load_digits().target[np.random.default_rng(0).permutation(len(x))]
    real = x[:600]
    fake = x[600:1000][torch.from_numpy(labels[600:1000] < 7)]  # misses classes 7-9: recall/coverage drop
    got = prdc(real, fake, k=5)
    ref = _reference(real, fake, 5)
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=1e-9)
    assert got["coverage"] < 0.85 and got["precision"] > 0.8


def test_chunked_equals_unchunked():
    x = _digits()
    a = prdc(x[:300], x[300:550], k=3, chunk_size=37)
    b = prdc(x[:300], x[300:550], k=3, chunk_size=None)
    assert a == b


def test_k_not_below_n_is_an_error():
    x = _digits()
    with pytest.raises(ValidationError, match="k=5"):
        prdc(x[:100], x[:5], k=5)
    with pytest.raises(ValidationError, match=r"k must be ≥ 1 \(--k, evaluate.k in a job\)"):
        prdc(x[:100], x[:50], k=0)
