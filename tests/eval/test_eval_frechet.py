"""Fréchet distance: closed forms, a scipy sqrtm cross-check, singular covariances."""

import numpy as np
import pytest
import scipy.linalg
import torch
from sklearn.datasets import load_digits

from fedhype.errors import ValidationError
from fedhype.eval.frechet import fd_from_moments, frechet_distance, trace_sqrt_product


def _digits() -> torch.Tensor:
    return torch.from_numpy((load_digits().data / 16.0).astype(np.float32))


def test_identical_sets_give_zero():
    x = _digits()
    r = frechet_distance(x, x.clone())
    assert r["fd"] == pytest.approx(0.0, abs=1e-8)
    assert r["fd_warning"] is None


def test_diagonal_gaussians_closed_form():
    a, b = np.array([1.0, 4.0, 0.25, 2.0]), np.array([9.0, 1.0, 0.25, 0.5])
    mu1, mu2 = np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.0, -1.0, 2.0, 0.0])
    expected = ((np.sqrt(a) - np.sqrt(b)) ** 2).sum() + ((mu1 - mu2) ** 2).sum()  # = 4+1+0+0.0858+1+4+0+9
    assert fd_from_moments(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(expected, rel=1e-12)


def test_full_covariances_match_scipy_sqrtm():
    rng = np.random.default_rng(0)
    d = 6
    a, b = rng.normal(size=(d, d)), rng.normal(size=(d, d))
    s1, s2 = a @ a.T + 0.1 * np.eye(d), b @ b.T + 0.1 * np.eye(d)
    ref = np.trace(scipy.linalg.sqrtm(s1 @ s2)).real
    assert trace_sqrt_product(s1, s2) == pytest.approx(ref, rel=1e-9)
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    expected = ((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2 - 2 * scipy.linalg.sqrtm(s1 @ s2).real)
    assert fd_from_moments(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-9)


def test_singular_covariances_closed_form():
    # Rank-deficient: the last coordinate is constant in both.
    s1, s2 = np.diag([4.0, 1.0, 0.0]), np.diag([1.0, 9.0, 0.0])
    expected = (2 - 1) ** 2 + (1 - 3) ** 2
    assert fd_from_moments(np.zeros(3), s1, np.zeros(3), s2) == pytest.approx(expected, rel=1e-12)


def test_samples_of_known_gaussians_converge_to_closed_form():
    g = torch.Generator().manual_seed(0)
    n = 20000
    x = torch.randn(n, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 2.0, 0.5])
    y = torch.randn(n, 3, generator=g, dtype=torch.float64) * torch.tensor([3.0, 1.0, 0.5])
    y = y + torch.tensor([1.0, 0.0, 0.0])
    expected = (1 - 3) ** 2 + (2 - 1) ** 2 + 0 + 1.0
    assert frechet_distance(x, y)["fd"] == pytest.approx(expected, rel=0.05)


def test_n_not_above_d_still_computes_with_warning():
    x = _digits()
    r = frechet_distance(x[:40], x[40:100])  # D = 64 ≥ both N
    assert np.isfinite(r["fd"]) and r["fd"] > 0
    assert "real has N=40" in r["fd_warning"] and "synthetic has N=60" in r["fd_warning"]


def test_fewer_than_two_samples_is_a_validation_error():
    x = _digits()
    with pytest.raises(ValidationError, match="at least 2 samples"):
        frechet_distance(x[:1], x)
    with pytest.raises(ValidationError, match="dimensions differ"):
        frechet_distance(x[:, :10], x)
