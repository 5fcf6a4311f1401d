"""Accountant wrappers: known ε values, degenerate histories, validation, σ calibration."""

from __future__ import annotations

import math

import pytest

from fedhype.errors import ValidationError
from fedhype.privacy.accountant import (
    calibrate_noise,
    calibrate_noise_plan,
    canonical_history,
    check_delta,
    epsilon,
    epsilon_report,
    pld_available,
    prv_eps_error,
)

# The DP-SGD MNIST setting (Abadi et al. 2016): σ = 1.1, B = 256 of 60,000, 10,000 steps, δ = 1e-5.
MNIST = [(1.1, 256 / 60000, 10_000)]
needs_pld = pytest.mark.skipif(not pld_available(), reason="dp-accounting not installed")


def test_known_values_prv_rdp():
    assert epsilon(MNIST, 1e-5, "prv") == pytest.approx(1.99, rel=0.01)
    assert epsilon(MNIST, 1e-5, "rdp") == pytest.approx(2.16, rel=0.01)


@needs_pld
def test_known_value_pld_and_report():
    assert epsilon(MNIST, 1e-5, "pld") == pytest.approx(1.98, rel=0.01)
    rep = epsilon_report(MNIST, 1e-5)
    assert rep["accountant"] == "prv" and rep["epsilon"] == rep["epsilon_prv"]
    assert rep["steps"] == 10_000 and rep["delta"] == 1e-5
    # RDP is the loosest; PRV (an upper bound) sits just above PLD.
    assert rep["epsilon_pld"] < rep["epsilon_prv"] < rep["epsilon_rdp"]


@needs_pld
@pytest.mark.parametrize(
    "history",
    [[(0.8, 0.01, 2000)], [(1.0, 0.02, 500), (2.0, 0.1, 200)], [(2.16, 0.2133, 25)]],
    ids=["single", "heterogeneous", "small-client"],
)
def test_prv_within_one_percent_of_pld(history):
    prv, pld = epsilon(history, 1e-5, "prv"), epsilon(history, 1e-5, "pld")
    assert prv == pytest.approx(pld, rel=0.01)
    assert prv >= pld  # both are upper bounds; PRV's eps_upper adds its eps_error


def test_degenerate_histories():
    assert epsilon([], 1e-5) == 0.0
    assert epsilon([(1.0, 0.0, 100)], 1e-5) == 0.0  # q = 0: no record touched
    assert epsilon([(1.0, 0.1, 0)], 1e-5) == 0.0  # no steps
    assert epsilon([(0.0, 0.0, 5)], 1e-5) == 0.0
    for acc in ("prv", "rdp"):
        assert epsilon([(0.0, 0.1, 1)], 1e-5, acc) == math.inf  # unnoised release
        assert epsilon([(1.0, 0.1, 10), (0.0, 0.5, 1)], 1e-5, acc) == math.inf
    rep = epsilon_report([], 1e-5)
    assert rep["epsilon"] == rep["epsilon_rdp"] == 0.0 and rep["steps"] == 0


def test_composition_is_canonical():
    split = [(1.0, 0.05, 100), (2.0, 0.05, 50), (1.0, 0.05, 100)]
    assert canonical_history(split) == ((1.0, 0.05, 200), (2.0, 0.05, 50))
    assert epsilon(split, 1e-5) == epsilon([(2.0, 0.05, 50), (1.0, 0.05, 200)], 1e-5)
    assert epsilon([(1.0, 0.05, 200)], 1e-5) < epsilon(split, 1e-5)  # the σ = 2 steps still cost


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: epsilon(MNIST, 1.0), "delta"),
        (lambda: epsilon(MNIST, 0.0), "delta"),
        (lambda: epsilon([(1.0, 1.5, 10)], 1e-5), "history[0].sample_rate"),
        (lambda: epsilon([(1.0, 0.1, -1)], 1e-5), "history[0].steps"),
        (lambda: epsilon([(1.0, 0.1, 2.5)], 1e-5), "history[0].steps"),
        (lambda: epsilon([(-1.0, 0.1, 10)], 1e-5), "history[0].noise_multiplier"),
        (lambda: epsilon([(1.0, 0.1)], 1e-5), "history[0]"),
        (lambda: epsilon(MNIST, 1e-5, "gdp"), "accountant"),
        (lambda: calibrate_noise(0.0, 1e-5, 0.01, 100), "target_epsilon"),
        (lambda: calibrate_noise(1.0, 1e-5, 0.0, 100), "sample_rate"),
        (lambda: calibrate_noise(1.0, 1e-5, 0.01, -3), "steps"),
        (lambda: calibrate_noise_plan(1.0, 1e-5, [(0.01, 10), (2.0, 10)]), "plan[1].sample_rate"),
    ],
)
def test_validation_names_the_field(call, field):
    with pytest.raises(ValidationError, match=field.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_check_delta_refuses_delta_at_or_above_one_over_n():
    check_delta(1e-3, 999, "client 3")  # 1e-3 < 1/999
    with pytest.raises(ValidationError, match=r"client 3: delta = 0.001 is not below 1/n = 0.001"):
        check_delta(1e-3, 1000, "client 3")
    with pytest.raises(ValidationError, match="client 0"):
        check_delta(0.5, 0, "client 0")


def test_sigma_epsilon_sigma_round_trip():
    eps = epsilon(MNIST, 1e-5)
    sigma = calibrate_noise(eps, 1e-5, 256 / 60000, 10_000)
    assert sigma == pytest.approx(1.1, rel=0.01)
    assert epsilon([(sigma, 256 / 60000, 10_000)], 1e-5) <= eps


@pytest.mark.parametrize(("target", "q", "steps", "accountant"), [(1.0, 0.05, 300, "prv"), (3.0, 0.02, 800, "rdp")])
def test_calibrate_is_safe_and_tight(target, q, steps, accountant):
    sigma = calibrate_noise(target, 1e-5, q, steps, accountant=accountant)
    reached = epsilon([(sigma, q, steps)], 1e-5, accountant)
    assert 0.97 * target <= reached <= target
    assert epsilon([(0.97 * sigma, q, steps)], 1e-5, accountant) > target * 0.99  # no much smaller σ works


def test_calibrate_zero_steps_costs_nothing():
    assert calibrate_noise(1.0, 1e-5, 0.1, 0) == 0.0


def test_plan_calibration_binds_on_the_smallest_client():
    batch, rounds, epochs = 32, 3, 1
    sizes = [2000, 800, 250]
    plan = [(batch / n, rounds * epochs * math.ceil(n / batch)) for n in sizes]
    sigma = calibrate_noise_plan(2.0, 1e-5, plan)
    eps = [epsilon([(sigma, q, t)], 1e-5) for q, t in plan]
    assert max(eps) == eps[2] and 0.97 * 2.0 <= eps[2] <= 2.0  # smallest client binds, tightly
    assert eps[0] < eps[1] < eps[2]
    assert sigma == calibrate_noise(2.0, 1e-5, *plan[2])


def test_prv_eps_error_is_opacus_default_unless_grid_too_large():
    assert prv_eps_error(list(canonical_history(MNIST)), 1e-5) == 0.01
    assert prv_eps_error([(2.0, 0.5, 10_000)], 1e-5) > 0.01  # ε ≈ 433: grid would be ~3e7 points
