"""Membership inference: copies are caught, independent samples are not, metric arithmetic."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.metrics import roc_auc_score

from fedhype.errors import ValidationError
from fedhype.eval.attacks import _auroc_rows, mia_report, tpr_at_fpr


def _splits():
    x = (load_digits().data / 16.0).astype(np.float32)
    x = torch.from_numpy(x[np.random.default_rng(0).permutation(len(x))])
    return x[:400], x[400:800], x[800:1200], x[1200:1600]  # members, non-members, reference, independent


def test_copies_of_members_give_auroc_near_one():
    members, non_members, reference, _ = _splits()
    r = mia_report(members.clone(), members, non_members, reference, n_bootstrap=100, seed=0)
    assert r["dcr"]["auroc"] > 0.99 and r["dcr"]["tpr_at_1pct_fpr"] > 0.9
    assert r["domias"]["auroc"] > 0.9
    assert r["domias"]["auroc_ci"][0] > 0.85
    assert (r["n_members"], r["n_non_members"], r["n_reference"], r["n_synthetic"]) == (400, 400, 400, 400)


def test_independent_synthetic_sample_gives_chance_auroc():
    members, non_members, reference, independent = _splits()
    r = mia_report(independent, members, non_members, reference, n_bootstrap=200, seed=0)
    for attack in ("dcr", "domias"):
        lo, hi = r[attack]["auroc_ci"]
        assert lo <= 0.5 <= hi, (attack, r[attack])
        assert hi - lo < 0.15
        assert abs(r[attack]["auroc"] - 0.5) < 0.07


def test_without_reference_only_dcr_runs():
    members, non_members, _, independent = _splits()
    r = mia_report(independent, members, non_members, None, n_bootstrap=0)
    assert r["domias"] is None and r["dcr"]["auroc_ci"] is None


def test_rank_auroc_equals_sklearn_with_ties():
    rng = np.random.default_rng(0)
    pos = rng.integers(0, 5, size=(4, 30)).astype(float)
    neg = rng.integers(0, 5, size=(4, 25)).astype(float)
    y = np.r_[np.ones(30), np.zeros(25)]
    expected = [roc_auc_score(y, np.r_[p, n]) for p, n in zip(pos, neg)]
    np.testing.assert_allclose(_auroc_rows(pos, neg), expected, rtol=1e-12)


def test_tpr_at_fpr():
    y = np.r_[np.ones(4), np.zeros(100)]
    s = np.r_[[10.0, 0.995, 0.5, 0.2], np.linspace(0, 1, 100)]  # negatives: 1.0 then 0.9899, ...
    assert tpr_at_fpr(y, s, 0.0) == pytest.approx(0.25)  # only 10.0 beats every negative
    assert tpr_at_fpr(y, s, 0.01) == pytest.approx(0.5)  # one false positive (1.0) buys 0.995


def test_mismatched_dimensions_and_unknown_attack():
    members, non_members, reference, _ = _splits()
    with pytest.raises(ValidationError, match="dimensions differ"):
        mia_report(members[:, :10], members, non_members, reference)
    with pytest.raises(ValidationError, match="unknown attacks"):
        mia_report(members, members, non_members, reference, attacks=("loss",))
