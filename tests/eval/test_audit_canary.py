"""One-run canary audits: the binomial bound, white-box Dirac canaries, black-box input canaries."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from scipy.stats import binom

from fedhype.data.partition import make_partition
from fedhype.errors import ValidationError
from fedhype.eval.canary import phases_from_ledger, run_mechanism, white_box_audit
from fedhype.eval.canary_blackbox import black_box_audit
from fedhype.eval.canary_bound import audit_from_scores, epsilon_lower_bound, p_value
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.privacy.ledger import PrivacyLedger

from conftest import AUDIT_CFG as CFG  # noqa: E402


# ---------------------------------------------------------------------------- the bound
def test_all_correct_without_delta_is_the_closed_form():
    for r, beta in ((100, 0.05), (20, 0.05), (1000, 0.01)):
        root = beta ** (1 / r)
        assert epsilon_lower_bound(r, r, r, 0.0, beta) == pytest.approx(math.log(root / (1 - root)), abs=1e-5)
    assert epsilon_lower_bound(100, 100, 100, 0.0, 0.05) == pytest.approx(3.49296543, abs=1e-5)
    # too few guesses to reject ε = 0: 4 correct of 4 happen with probability 1/16 > 0.05 under ε = 0
    assert epsilon_lower_bound(4, 4, 4, 0.0, 0.05) == 0.0
    assert epsilon_lower_bound(5, 5, 5, 0.0, 0.05) == pytest.approx(math.log(0.05 ** 0.2 / (1 - 0.05 ** 0.2)), abs=1e-5)


def test_p_value_with_delta_by_hand():
    # r = v = 2, m = 10, δ = 0.01, ε = 1: q = e/(1+e); tail = q²; α = max(P[Bin = 1], P[Bin ∈ {0, 1}]/2)
    q = math.e / (1 + math.e)
    pmf1, pmf0 = 2 * q * (1 - q), (1 - q) ** 2
    expected = q * q + 2 * 10 * 0.01 * max(pmf1, (pmf1 + pmf0) / 2)
    assert p_value(10, 2, 2, 1.0, 0.01) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.6131, abs=1e-4)
    assert p_value(10, 2, 2, 1.0, 0.0) == pytest.approx(q * q, rel=1e-12)
    assert p_value(50, 40, 30, 0.5, 0.0) == pytest.approx(binom.sf(29, 40, 1 / (1 + math.exp(-0.5))), rel=1e-12)


def test_bound_properties():
    # δ only weakens the bound; half correct proves nothing; errors name the problem
    assert epsilon_lower_bound(1000, 100, 100, 1e-4, 0.05) < epsilon_lower_bound(1000, 100, 100, 0.0, 0.05)
    assert epsilon_lower_bound(1000, 100, 100, 1e-4, 0.05) == pytest.approx(3.2023, abs=1e-3)
    assert epsilon_lower_bound(1000, 200, 100, 0.0, 0.05) == 0.0
    assert epsilon_lower_bound(1000, 200, 0, 0.0, 0.05) == 0.0
    with pytest.raises(ValidationError, match="correct"):
        epsilon_lower_bound(10, 5, 6)


def test_randomized_response_is_bounded_by_its_epsilon():
    """ε-DP randomized response on every canary: the bound exceeds ε in at most ~β of the trials,
    and with many guesses it comes close to ε (the test is valid and has power)."""
    rng = np.random.default_rng(0)
    eps, m, trials = 1.0, 500, 200
    p_right = math.exp(eps) / (1 + math.exp(eps))
    over = 0
    for _ in range(trials):
        v = int(rng.binomial(m, p_right))
        over += epsilon_lower_bound(m, m, v, 0.0, 0.05) > eps
    assert over / trials <= 0.1  # nominal 0.05
    v_typical = round(m * p_right)
    assert 0.6 < epsilon_lower_bound(m, m, v_typical, 0.0, 0.05) < eps


def test_audit_from_scores_guesses_the_top_fraction():
    rng = np.random.default_rng(1)
    included = rng.random(1000) < 0.5
    perfect = included.astype(float) + rng.random(1000) * 0.1
    res = audit_from_scores(perfect, included, delta=0.0, claimed_epsilon=1.0, seed=0)
    assert (res["guesses"], res["correct"]) == (100, 100)
    assert res["empirical_epsilon_lower_bound"] == pytest.approx(3.49296543, abs=1e-5) and res["exceeds_claim"]
    both = audit_from_scores(perfect, included, delta=0.0, claimed_epsilon=None, guess_in=0.1, guess_out=0.1)
    assert (both["guesses"], both["correct"], both["exceeds_claim"]) == (200, 200, False)


# ---------------------------------------------------------------------------- audits of a real run
@pytest.fixture(scope="module")
def shared(audit_run, real_store, tmp_path_factory):
    """The run shared with test_audit_ledger.py (same settings, trained once per session)."""
    run_dir, part = audit_run
    return run_dir, part


@pytest.fixture(scope="module")
def mech(shared, real_store):
    run, part = shared
    m = run_mechanism(run)
    tr = part.client_store(real_store, int(m["client"]), "train")
    return {**m, "records": (tr.embeddings, tr.labels)}


def _audit(mech, breakage=None, seed=0):
    return white_box_audit(mech["phases"], delta=mech["delta"], model_cfg=mech["model_cfg"], theta=mech["theta"],
                           records=mech["records"], n_canaries=1000, breakage=breakage, seed=seed)


def test_white_box_replays_the_ledger(shared, mech):
    led = PrivacyLedger.load(shared[0] / "ledger.json")
    (ph,) = mech["phases"]
    assert (ph.noise_multiplier, ph.sample_rate, ph.steps, ph.clip_norm) == (1.0, 32 / 240, 4, 1.5)
    assert phases_from_ledger(led, "1") == mech["phases"]
    assert mech["delta"] == 1e-4


def test_white_box_correct_mechanism_stays_below_its_epsilon(mech, shared):
    res = _audit(mech)
    claim = PrivacyLedger.load(shared[0] / "ledger.json").epsilon(mech["client"])
    assert res["claimed_epsilon"] == pytest.approx(claim) and claim == pytest.approx(2.1016, abs=1e-3)
    assert 0.0 <= res["empirical_epsilon_lower_bound"] <= claim and not res["exceeds_claim"]
    assert res["n_canaries"] == 1000 and res["guesses"] == 100 and res["steps"] == 4 and res["n_real_records"] == 240
    assert res["correct"] < 85  # far from the 100 / 100 that a leak gives


@pytest.mark.parametrize("breakage", ["noise", "clipping"])
def test_white_box_flags_a_broken_mechanism(mech, breakage):
    res = _audit(mech, breakage)
    # every "in" guess is right: the bound is the 100-of-100 value at δ = 1e-4, above the claimed 2.10
    assert (res["guesses"], res["correct"]) == (100, 100)
    assert res["empirical_epsilon_lower_bound"] == pytest.approx(epsilon_lower_bound(1000, 100, 100, 1e-4, 0.05))
    assert res["empirical_epsilon_lower_bound"] > res["claimed_epsilon"] and res["exceeds_claim"]
    assert res["breakage"] == breakage


def test_white_box_needs_enough_parameters(mech):
    with pytest.raises(ValidationError, match="--n-canaries 1000000: each white-box canary needs its own model coordinate"):
        white_box_audit(mech["phases"], delta=1e-4, model_cfg=mech["model_cfg"], theta=mech["theta"],
                        n_canaries=10**6)


def test_black_box_bound_of_a_dp_run_is_weak(real_store, shared, tmp_path):
    _, part = shared
    cfg = TrainConfig(**{**CFG, "rounds": 1})
    res = black_box_audit(real_store, part, cfg, tmp_path / "bb", n_canaries=100, per_class=20, seed=0)
    led = PrivacyLedger.load(tmp_path / "bb" / "ledger.json")
    assert res["claimed_epsilon"] == pytest.approx(led.epsilon("0")) and res["claimed_epsilon"] > 0
    assert res["n_canaries"] == 100 and res["guesses"] == 10 and res["n_synthetic"] == 200
    # client 0 trained on its 240 records plus the included canaries (recorded in the ledger's q)
    assert led.events[0].sample_rate == pytest.approx(32 / (240 + res["n_included"]))
    assert 0.0 <= res["empirical_epsilon_lower_bound"] <= res["claimed_epsilon"] and not res["exceeds_claim"]
