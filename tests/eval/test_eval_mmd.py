"""MMD²: exact formula, unbiasedness, permutation test on real digits features."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from sklearn.datasets import load_digits

from fedhype.errors import ValidationError
from fedhype.eval.mmd import MULTI_SCALES, _kernel, _perm_stats, _sq_dists, median_heuristic, mmd2_unbiased, mmd_report


def _digits() -> tuple[torch.Tensor, np.ndarray]:
    d = load_digits()
    return torch.from_numpy((d.data / 16.0).astype(np.float32)), d.target


def _halves(seed=0):
    x, _ = _digits()
    perm = np.random.default_rng(seed).permutation(len(x))
    return x[perm[:800]], x[perm[800:1600]]


def _naive_mmd2(x, y, bw, scales=(1.0,)):
    """Double loop over pairs, straight from Gretton et al. (2012) eq. 3."""
    x, y = x.double().numpy(), y.double().numpy()

    def k(a, b):
        return sum(np.exp(-((a - b) ** 2).sum() / (2 * (bw * s) ** 2)) for s in scales)

    m, n = len(x), len(y)
    xx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    yy = sum(k(y[i], y[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    xy = sum(k(x[i], y[j]) for i in range(m) for j in range(n)) / (m * n)
    return xx + yy - 2 * xy


def test_matches_naive_formula_single_and_multi_bandwidth():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 4, generator=g), torch.randn(9, 4, generator=g) + 0.5
    assert mmd2_unbiased(x, y, 1.3) == pytest.approx(_naive_mmd2(x, y, 1.3), rel=1e-5, abs=1e-7)
    assert mmd2_unbiased(x, y, 1.3, MULTI_SCALES) == pytest.approx(_naive_mmd2(x, y, 1.3, MULTI_SCALES), rel=1e-5)


def test_median_heuristic_is_the_median_pairwise_distance():
    x, _ = _digits()
    rng = np.random.default_rng(0)
    sub = x[:300]
    assert median_heuristic(sub, rng, max_n=1000) == pytest.approx(np.median(pdist(sub.double().numpy())), rel=1e-9)


def test_same_distribution_small_and_not_significant():
    x, y = _halves()
    r = mmd_report(x, y, n_permutations=200, seed=0)
    assert abs(r["mmd2"]) < 2e-3
    assert r["mmd2_p_value"] > 0.05
    assert r["mmd2_multi_p_value"] > 0.05
    assert (r["mmd2_n_real"], r["mmd2_n_synthetic"], r["mmd2_permutations"]) == (800, 800, 200)


def test_shifted_distribution_large_and_significant():
    x, labels = _digits()
    low, high = x[labels < 5][:400], x[labels >= 5][:400]  # a real class shift
    r = mmd_report(low, high, n_permutations=200, seed=0)
    assert r["mmd2"] > 0.02
    assert r["mmd2_p_value"] == pytest.approx(1 / 201)
    low = low[torch.from_numpy(np.random.default_rng(0).permutation(len(low)))]
    same = mmd_report(low[:200], low[200:], n_permutations=50, seed=0)
    assert r["mmd2"] > 20 * abs(same["mmd2"])


def test_unbiased_mean_zero_while_biased_statistic_is_not():
    g = torch.Generator().manual_seed(0)
    u_vals, v_vals = [], []
    m = 20
    for _ in range(300):
        x, y = torch.randn(m, 3, generator=g), torch.randn(m, 3, generator=g)
        u = mmd2_unbiased(x, y, 1.0)
        u_vals.append(u)
        # V-statistic (diagonal k(x,x) = 1 included): biased upward by 2(1 - mean offdiag)/m roughly.
        k = torch.exp(-_sq_dists(torch.cat([x, y])) / 2.0).double()
        v_vals.append(float(k[:m, :m].mean() + k[m:, m:].mean() - 2 * k[:m, m:].mean()))
    se = np.std(u_vals, ddof=1) / np.sqrt(len(u_vals))
    assert abs(np.mean(u_vals)) < 3 * se
    assert np.mean(v_vals) > 10 * se


def test_vectorised_permutation_equals_recomputation():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(15, 5, generator=g), torch.randn(11, 5, generator=g)
    z = torch.cat([x, y])
    k = _kernel(_sq_dists(z), 1.7, (1.0,))
    rng = np.random.default_rng(0)
    for _ in range(5):
        perm = rng.permutation(26)
        u = torch.zeros(1, 26)
        u[0, perm[:15]] = 1.0
        got = float(_perm_stats(k, u, 15)[0])
        assert got == pytest.approx(mmd2_unbiased(z[perm[:15]], z[perm[15:]], 1.7), rel=1e-4, abs=1e-6)


def test_subsampling_reports_n_and_is_seeded():
    x, y = _halves()
    a = mmd_report(x, y, n_permutations=20, max_samples=300, seed=5)
    b = mmd_report(x, y, n_permutations=20, max_samples=300, seed=5)
    assert a == b
    assert (a["mmd2_n_real"], a["mmd2_n_synthetic"]) == (300, 300)
    assert mmd_report(x, y, n_permutations=0, max_samples=300)["mmd2_p_value"] is None


def test_errors():
    x, _ = _halves()
    with pytest.raises(ValidationError, match="at least 2"):
        mmd_report(x[:1], x, n_permutations=10)
    with pytest.raises(ValidationError, match="median pairwise distance is 0"):
        mmd_report(torch.ones(10, 3), x[:10, :3], n_permutations=10)
    with pytest.raises(ValidationError, match="max_samples"):
        mmd_report(x, x, max_samples=1)
