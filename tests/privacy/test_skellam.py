"""The integer-domain release (distributed Skellam noise for SecAgg+): quantisation, sensitivity after rounding,
noise scale (per share, and the honest sum — a broken split is caught), the RDP accounting, the ledger's
record of it and the boundary types."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedhype.errors import ValidationError
from fedhype.privacy.accountant import epsilon, epsilon_discrete
from fedhype.privacy.centring import Centring
from fedhype.privacy.dp_step import DPConfig, ReleaseWeights, privatize_class_sums
from fedhype.privacy.events import skellam_release_events
from fedhype.privacy.ledger import LedgerEvent, PrivacyLedger, as_rerun
from fedhype.privacy.secure_agg import DistributedNoise, SecureAggregationError
from fedhype.privacy.skellam import (IntegerShare, Layout, SkellamPlan, aggregate_from_sum, calibrate_factor,
                                     check_deployment, integer_secure_sum, pack_symmetric, privatize_centre_integer,
                                     privatize_class_stats_integer, privatize_integer, skellam_rdp, unpack_symmetric)

W = ReleaseWeights.split(0.3)
K = 10


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _records(real_store, n=60, start=0):
    return real_store.embeddings[start:start + n], real_store.labels[start:start + n]


def test_pack_and_unpack_are_inverse_and_keep_the_frobenius_norm():
    rng = np.random.default_rng(0)
    y = rng.normal(size=7)
    m = np.outer(y, y)
    p = pack_symmetric(m)
    assert p.shape == (7 * 8 // 2,)
    assert np.linalg.norm(p) == pytest.approx(np.linalg.norm(m)) == pytest.approx(float(y @ y))
    assert np.allclose(unpack_symmetric(p, 7), m)


@pytest.mark.parametrize("centred", [False, True])
def test_quantisation_alone_reproduces_the_exact_statistics_within_one_step(real_store, centred):
    """σ = 0 (quantisation alone, not private): the decoded sum of 3 clients' integer vectors equals the exact
    class sums, counts and second moments within 3/γ per weighted entry (each client's rounding error is < 1)."""
    dim = real_store.dim
    cen = Centring(torch.nn.functional.normalize(real_store.embeddings[:200], dim=-1).mean(0), 0.4) if centred else None
    lay = Layout.statistics(K, dim, W)
    plan = SkellamPlan.for_layout(lay, DistributedNoise(3, 1), 0.0, scale=2 ** 10)
    parts = [_records(real_store, 60, 60 * i) for i in range(3)]
    shares = [privatize_class_stats_integer(f"c{i}", x, y, K, W, plan, _gen(i), centring=cen) for i, (x, y) in enumerate(parts)]
    agg = integer_secure_sum(shares, lay)
    assert not agg.private
    exact = [privatize_class_sums("c", x, y, K, DPConfig(None, 1.0, enabled=False), _gen(0), W, centring=cen)
             for x, y in parts]
    a, b, c = W.as_list()
    tol = {"class_sums": 3 / (plan.scale * a), "class_counts": 3 / (plan.scale * b),
           "second_moment": 3 / (plan.scale * c)}
    for k, t in tol.items():
        want = sum(u.tensors[k].double() for u in exact)
        err = float((agg.tensors[k].double() - want).abs().max())
        assert err <= t + 1e-4 * float(want.abs().max()), (k, err, t)  # + float32 rounding of the decoded values
    # counts are integers: exact up to float32
    assert torch.allclose(agg.tensors["class_counts"], sum(u.tensors["class_counts"] for u in exact), atol=3 / (plan.scale * b))


@pytest.mark.parametrize("where", ["near", "far", "antipodal"])
@pytest.mark.parametrize("centred", [False, True])
def test_sensitivity_after_rounding_is_at_most_gamma_plus_root_d(real_store, where, centred):
    """Adding one record changes the rounded integer vector (same dither) by Δ with ‖Δ‖₂ ≤ γ + √d and
    ‖Δ‖₁ ≤ min(Δ₂², √d·Δ₂): the sensitivity the accountant uses. A small γ makes the √d term count."""
    x, y = _records(real_store, 40)
    dim = x.shape[1]
    mean = torch.nn.functional.normalize(x, dim=-1).mean(0)
    new = {"near": x[0] + 0.01 * torch.randn(dim, generator=_gen(1)), "far": torch.randn(dim, generator=_gen(2)),
           "antipodal": -mean}[where]
    cen = Centring(mean, 0.3) if centred else None
    for kind in ("centre", "statistics"):
        lay = Layout.centre(dim) if kind == "centre" else Layout.statistics(K, dim, W)
        plan = SkellamPlan.for_layout(lay, DistributedNoise(2, 0), 0.0, scale=2 ** 8)
        worst = 0.0
        for seed in range(5):
            if kind == "centre":
                s0 = privatize_centre_integer("c", x, plan, _gen(seed))
                s1 = privatize_centre_integer("c", torch.cat([x, new[None]]), plan, _gen(seed))
            else:
                s0 = privatize_class_stats_integer("c", x, y, K, W, plan, _gen(seed), centring=cen)
                s1 = privatize_class_stats_integer("c", torch.cat([x, new[None]]), torch.cat([y, y[:1]]), K, W, plan,
                                                   _gen(seed), centring=cen)
            d = (s1._ints - s0._ints).astype(np.float64)
            l2 = float(np.linalg.norm(d))
            assert l2 <= plan.l2_sensitivity + 1e-9
            assert float(np.abs(d).sum()) <= plan.l1_sensitivity + 1e-9
            worst = max(worst, l2)
        # the real contribution has norm 1 for a record outside the clip radius (tight), so Δ₂ ≥ γ − √d
        if where != "near" or not centred:
            assert worst >= plan.scale - math.sqrt(plan.record_dim)


def test_a_share_carries_skellam_noise_of_variance_mu_over_m_minus_t():
    """Chi-square on the variance of one share's noise (v = 0: rounding exact): Sk(μ/(m − t)); 1.5× too little
    noise std is rejected. The noise is integer and symmetric (a difference of two equal Poissons)."""
    noise = DistributedNoise(4, 1)
    lay = Layout.statistics(K, 64, W)
    plan = SkellamPlan.for_layout(lay, noise, 2.0, scale=2 ** 10)
    z = privatize_integer("c", np.zeros(plan.length), plan, _gen(3))._ints.astype(np.float64)
    want = plan.variance / 3
    n = z.size
    stat = float((z ** 2).sum()) / want
    assert 1e-3 < stats.chi2.cdf(stat, n) < 1 - 1e-3
    assert stats.chi2.cdf(float((z ** 2).sum()) / (want / 2.25), n) > 1 - 1e-9  # 1.5× less std: far off
    assert abs(float(stats.skew(z))) < 0.05 and abs(float(z.mean())) < 5 * math.sqrt(want / n)


def test_the_honest_sum_carries_mu_and_a_broken_split_is_caught(monkeypatch):
    """t clients collude (their noise removed): the m − t honest shares still carry Sk(≥ μ). Splitting by m with
    t = 1 claimed leaves (m − 1)/m of it: the same one-sided check rejects it."""
    noise = DistributedNoise(4, 1)
    lay = Layout.statistics(K, 64, W)

    def honest_ok() -> float:
        plan = SkellamPlan.for_layout(lay, noise, 2.0, scale=2 ** 10)
        z = sum(privatize_integer(f"c{i}", np.zeros(plan.length), plan, _gen(100 + i))._ints.astype(np.float64)
                for i in range(noise.dropout_tolerance, noise.clients))
        return float(stats.chi2.cdf(float((z ** 2).sum()) / plan.variance, z.size))

    assert honest_ok() > 1e-3
    monkeypatch.setattr(SkellamPlan, "client_mean", property(lambda self: self.variance / (2.0 * self.noise.clients)))
    assert honest_ok() < 1e-6


def test_skellam_rdp_is_the_papers_bound_and_approaches_the_gaussian():
    orders = [2, 8, 32]
    s, g, d = 2.0, 2 ** 16, 1000
    mu, d2 = (s * g) ** 2, g + math.sqrt(d)
    d1 = min(d2 * d2, math.sqrt(d) * d2)
    want = [a * d2 ** 2 / (2 * mu) + min(((2 * a - 1) * d2 ** 2 + 6 * d1) / (4 * mu ** 2), 3 * d1 / (2 * mu)) for a in orders]
    assert np.allclose(skellam_rdp(orders, s, g, d), want, rtol=1e-12)
    # a Gaussian of sensitivity Δ₂/γ: the leading term; the extra term is tiny at a fine scale
    gauss = np.array(orders) * (d2 / g) ** 2 / (2 * s * s)
    assert np.all(skellam_rdp(orders, s, g, d) >= gauss) and np.allclose(skellam_rdp(orders, s, g, d), gauss, rtol=1e-3)
    with pytest.raises(ValidationError, match="integer orders"):
        skellam_rdp([1.5], s, g, d)
    assert np.isinf(skellam_rdp(orders, 0.0, g, d)).all()


def test_epsilon_discrete_composes_rdp_at_integer_orders():
    from opacus.accountants import RDPAccountant

    hist = [(1.1, 0.01, 500)]
    acc = RDPAccountant()
    acc.history = list(hist)
    assert epsilon_discrete(hist, [], 1e-5) == pytest.approx(acc.get_epsilon(1e-5, alphas=list(range(2, 257))), rel=1e-9)
    # a Skellam release costs more than its Gaussian twin by RDP only by the rounding inflation
    one = epsilon_discrete([], [(3.0, 2 ** 20, 385, 1)], 1e-4)
    assert epsilon_discrete([(3.0, 1.0, 1)], [], 1e-4) <= one <= epsilon_discrete([(3.0 / 1.001, 1.0, 1)], [], 1e-4)
    # composition: more releases, more ε; σ = 0: unbounded
    assert epsilon_discrete(hist, [(3.0, 2 ** 20, 385, 2)], 1e-4) > epsilon_discrete(hist, [(3.0, 2 ** 20, 385, 1)], 1e-4)
    assert math.isinf(epsilon_discrete([], [(0.0, 2 ** 20, 385, 1)], 1e-4))


def test_calibrated_factor_keeps_the_planned_epsilon_and_is_the_smallest():
    steps = [(13.76, 1.0, 1), (3.476, 1.0, 1)]
    like = [(2 ** 15, 385), (2 ** 19, 74305)]
    tails = [[(26.0, 0.25, 64)], [(26.0, 0.12, 128)]]
    k = calibrate_factor(steps, like, tails, 1e-4)
    target = max(epsilon(steps + t, 1e-4) for t in tails)
    got = lambda f: max(epsilon_discrete(t, [(f * s, g, d, 1) for (s, _, _), (g, d) in zip(steps, like)], 1e-4)  # noqa: E731
                        for t in tails)
    assert 1.0 < k < 1.2  # RDP alone is ~5-15 % looser than PRV here
    assert got(k) <= target < got(k - 1e-3)
    with pytest.raises(ValidationError, match="cannot reach the planned"):
        calibrate_factor(steps, like, [[(0.8, 0.5, 2000)]], 1e-4)


def test_the_ledger_records_skellam_releases_and_accounts_them_by_rdp(tmp_path):
    noise = DistributedNoise(3, 1)
    plan = SkellamPlan.for_layout(Layout.statistics(K, 32, W), noise, 2.5)
    events = skellam_release_events(["0", "1"], plan, "dp-class-stats", note=plan.describe())
    led = PrivacyLedger(1e-4)
    for e in events:
        led.record(e)
    led.record(LedgerEvent(client="0", round=0, mechanism="dp-sgd", noise_multiplier=20.0, sample_rate=0.2, steps=10,
                           clip_norm=1.5))
    led.save(tmp_path / "l.json")
    back = PrivacyLedger.load(tmp_path / "l.json")
    assert back.events[0].noise == "skellam" and back.events[0].scale == plan.scale
    assert back.events[0].record_dim == plan.record_dim and "Sk(μ/(m − t))" in back.events[0].note
    want = epsilon_discrete([(20.0, 0.2, 10)], [(2.5, float(plan.scale), plan.record_dim, 1)], 1e-4)
    for acc in ("best", "rdp", "prv"):
        assert back.epsilon("0", acc) == pytest.approx(want)
    assert back.epsilon("1") == pytest.approx(epsilon_discrete([], [(2.5, float(plan.scale), plan.record_dim, 1)], 1e-4))
    rep = back.report()["clients"]["0"]
    assert rep["accountant"] == "rdp" and rep["epsilon_prv"] is None and rep["epsilon"] == pytest.approx(want)
    assert back.would_exceed(events[:1], 0.01) == {"0": pytest.approx(epsilon_discrete(
        [(20.0, 0.2, 10)], [(2.5, float(plan.scale), plan.record_dim, 2)], 1e-4))}
    rerun = as_rerun(events[0])
    assert (rerun.noise, rerun.scale, rerun.record_dim) == ("skellam", plan.scale, plan.record_dim) and "rerun" in rerun.note
    # a Gaussian event keeps its old form (old ledgers' hashes unchanged)
    g = LedgerEvent(client="0", round=-1, mechanism="dp-class-stats", noise_multiplier=2.0, sample_rate=1.0, steps=1,
                    clip_norm=1.0)
    assert set(g.to_dict()) == {"client", "round", "mechanism", "noise_multiplier", "sample_rate", "steps", "clip_norm",
                                "note", "time"}
    with pytest.raises(ValidationError, match="belong to a Skellam release"):
        LedgerEvent(client="0", round=-1, mechanism="x", noise_multiplier=2.0, sample_rate=1.0, steps=1, clip_norm=1.0,
                    scale=8.0)
    with pytest.raises(ValidationError, match="sample_rate 1"):
        LedgerEvent(client="0", round=-1, mechanism="x", noise_multiplier=2.0, sample_rate=0.5, steps=1, clip_norm=1.0,
                    noise="skellam", scale=8.0, record_dim=3)


def test_shares_are_not_readable_and_the_sum_refuses_too_few(real_store):
    noise = DistributedNoise(3, 1)
    lay = Layout.centre(real_store.dim)
    plan = SkellamPlan.for_layout(lay, noise, 5.0)
    x = real_store.embeddings[:30]
    shares = [privatize_centre_integer(f"c{i}", x, plan, _gen(i)) for i in range(3)]
    with pytest.raises(TypeError, match="not readable on its own"):
        shares[0].values
    with pytest.raises(TypeError):
        IntegerShare(_token=object(), client="x", plan=plan, ints=np.zeros(3), private=True)
    with pytest.raises(SecureAggregationError, match="received 1 of 3 contributions, fewer than m − t = 2"):
        integer_secure_sum(shares[:1], lay)
    with pytest.raises(SecureAggregationError, match="contributed twice"):
        integer_secure_sum([shares[0], shares[0]], lay)
    with pytest.raises(ValidationError, match="uint64"):
        shares[0].masked(np.zeros(plan.length, dtype=np.int64))
    agg = integer_secure_sum(shares[:2], lay)
    assert agg.private and agg.noise_multiplier == 5.0 and agg.noise_variance_factor == pytest.approx(1.0)
    # a sum of negative values wraps modulo 2⁶⁴ and decodes back
    neg = np.array([2 ** 64 - 5] + [0] * (plan.length - 1), dtype=np.uint64)
    assert float(aggregate_from_sum(neg, plan, lay, ["a", "b"]).tensors["sum"][0]) == pytest.approx(-5 / plan.scale / lay.weights[0])
    # the pooled count carries noise of std σ/b: a per-entry check of the decoded scale
    assert abs(float(agg.tensors["count"][0]) - 60) < 8 * 5.0 / lay.weights[1]


def test_deployment_needs_2t_below_m_and_plans_are_validated():
    check_deployment(DistributedNoise(3, 1))
    with pytest.raises(ValidationError, match=r"2t < m"):
        check_deployment(DistributedNoise(4, 2))
    lay = Layout.centre(8)
    with pytest.raises(ValidationError, match="power of two"):
        SkellamPlan.for_layout(lay, DistributedNoise(2, 0), 1.0, scale=1000)
    with pytest.raises(ValidationError, match="above 2⁴⁸"):
        SkellamPlan.for_layout(lay, DistributedNoise(2, 0), 1e6, scale=2 ** 24)
    with pytest.raises(ValidationError, match="does not fit"):
        privatize_centre_integer("c", torch.randn(5, 9), SkellamPlan.for_layout(lay, DistributedNoise(2, 0), 1.0),
                                 _gen(0))
