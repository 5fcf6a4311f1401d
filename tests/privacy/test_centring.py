"""The centred statistics release (fedhype.privacy.centring): sensitivity, noise scale, accounting, mapping back."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from fedhype.errors import ValidationError
from fedhype.federated.class_stats import aggregate_class_stats
from fedhype.privacy.accountant import epsilon
from fedhype.privacy.centring import (CENTRE_WEIGHTS, Centring, centring_from, client_centrings, privatize_centre,
                                     release_steps)
from fedhype.privacy.dp_step import DPConfig, ReleaseWeights, privatize_class_sums

K = 10


def _records(real_store, n=300):
    x = real_store.embeddings[:n].to(torch.float32)
    return x, real_store.labels[:n].to(torch.int64)


def _weighted(update, w: ReleaseWeights) -> torch.Tensor:
    """The released vector (a·S, b·n, c·m(M)) of an exact (noise-free) release."""
    t = update.tensors
    m = t["second_moment"].to(torch.float64)
    iu = torch.triu_indices(m.shape[0], m.shape[0], 1)
    vec_m = torch.cat([m.diagonal(), math.sqrt(2.0) * m[iu[0], iu[1]]])
    return torch.cat([w.sums * t["class_sums"].flatten().double(), w.counts * t["class_counts"].double(),
                      w.second_moment * vec_m])


def test_centred_statistics_have_sensitivity_one_for_any_record(real_store):
    """Adding one record — near the centre, far from it (clipped), or the farthest possible — moves the
    released vector by at most 1; without the division by R (a broken variant) a clipped record would move it by > 1."""
    x, y = _records(real_store)
    w = ReleaseWeights.split(0.3)
    off = DPConfig(None, 1.0, enabled=False)
    gen = torch.Generator().manual_seed(0)
    c = torch.nn.functional.normalize(x, dim=-1).mean(0)
    cen = Centring(c, 0.3)
    base = _weighted(privatize_class_sums("a", x, y, K, off, gen, w, centring=cen), w)
    far = -c / c.norm()  # the unit vector farthest from the centre
    moves = []
    for extra in (x[:1], far[None], torch.randn(1, x.shape[1], generator=gen)):
        xa, ya = torch.cat([x, extra]), torch.cat([y, torch.tensor([3])])
        moves.append(float((_weighted(privatize_class_sums("a", xa, ya, K, off, gen, w, centring=cen), w) - base).norm()))
    assert max(moves) <= 1.0 + 1e-5
    assert max(moves) > 0.99  # a clipped record uses the whole sensitivity: the bound is tight, not loose
    y_far, clipped = cen.transform(far[None])
    assert clipped == 1.0 and float(y_far.norm()) == pytest.approx(1.0, abs=1e-6)


def test_centre_release_sensitivity_and_noise_scale(real_store):
    x, _ = _records(real_store)
    a, b = CENTRE_WEIGHTS
    assert a * a + b * b == pytest.approx(1.0)
    exact = privatize_centre("a", x, None, torch.Generator().manual_seed(0))
    plus = privatize_centre("a", torch.cat([x, x[:1] * 7.0]), None, torch.Generator().manual_seed(0))
    move = torch.cat([a * (plus.tensors["sum"] - exact.tensors["sum"]), b * (plus.tensors["count"] - exact.tensors["count"])])
    assert float(move.norm()) == pytest.approx(1.0, abs=1e-5)  # a unit record (normalised first) and one count
    assert not exact.private and exact.noise_multiplier is None
    sigma = 3.0
    draws = [privatize_centre("a", x, sigma, torch.Generator().manual_seed(s)) for s in range(1, 11)]
    noisy = draws[0]
    z = torch.cat([d.tensors["sum"] - exact.tensors["sum"] for d in draws]).double().numpy()  # 10 × D draws
    assert stats.kstest(z / (sigma / a), "norm").pvalue > 1e-3
    assert stats.kstest(z / (1.5 * sigma / a), "norm").pvalue < 1e-6  # 1.5× the scale would be caught
    assert noisy.private and noisy.noise_multiplier == sigma and noisy.steps == 1 and noisy.sample_rate == 1.0


@pytest.mark.parametrize("s0", [0.8, 2.0, 6.0])
def test_two_steps_cost_what_one_release_at_sigma0_costs(s0):
    steps = release_steps(s0, 0.06)
    (sa, qa, ta), (sb, qb, tb) = steps
    assert 1 / sa ** 2 + 1 / sb ** 2 == pytest.approx(1 / s0 ** 2) and qa == qb == 1.0 and ta == tb == 1
    one = epsilon([(s0, 1.0, 1)], 1e-4)
    assert epsilon(steps, 1e-4) == pytest.approx(one, abs=0.01)
    assert epsilon(steps, 1e-4, accountant="pld") == pytest.approx(epsilon([(s0, 1.0, 1)], 1e-4, accountant="pld"), abs=0.01)
    assert release_steps(s0, 0.0) == [(s0, 1.0, 1)]
    with pytest.raises(ValidationError, match="centre_share"):
        release_steps(s0, 1.0)


def test_centred_moments_map_back_to_the_uncentred_ones_without_noise(real_store):
    """No noise, a radius no record reaches: the centred release gives the same class means and covariance."""
    x, y = _records(real_store)
    w = ReleaseWeights.split(0.3)
    off = DPConfig(None, 1.0, enabled=False)
    gen = torch.Generator().manual_seed(0)
    cen = centring_from([privatize_centre("a", x, None, gen)], radius=10.0)
    assert float(cen.transform(x)[0].norm(dim=1).max()) < 1.0  # nothing clipped
    plain = aggregate_class_stats([privatize_class_sums("a", x, y, K, off, gen, w)], 0.0, max_rank=8)
    centred = aggregate_class_stats([privatize_class_sums("a", x, y, K, off, gen, w, centring=cen)], 0.0, max_rank=8,
                                    centring=cen)
    for k in ("space_mean", "space_scale", "class_bias", "residual_var"):
        torch.testing.assert_close(centred[k], plain[k], atol=2e-4, rtol=1e-4, msg=k)
    cp, cc = plain["cov_factor"].double(), centred["cov_factor"].double()
    torch.testing.assert_close(cc @ cc.T, cp @ cp.T, atol=2e-3, rtol=1e-3)


def test_centring_from_refuses_what_is_not_a_release_and_keeps_the_centre_inside_the_ball(real_store):
    x, _ = _records(real_store)
    with pytest.raises(TypeError, match="PrivatizedUpdate"):
        centring_from([{"sum": torch.zeros(3), "count": torch.ones(1)}])
    # a huge noise can push the noisy centre outside the unit ball: it is pulled back, R stays positive
    noisy = privatize_centre("a", x[:5], 1e4, torch.Generator().manual_seed(0))
    cen = centring_from([noisy], radius=0.8)
    assert float(cen.centre.norm()) < 1.0 and cen.radius == pytest.approx(0.8 * math.sqrt(0.05), rel=1e-3)
    with pytest.raises(ValidationError, match="release_radius"):
        centring_from([noisy], radius=0.0)


def _domains(real_store):
    """The real store's records per domain (4 digit domains), unit-normalised float32, with labels."""
    x = torch.nn.functional.normalize(real_store.embeddings.to(torch.float32), dim=-1)
    d, y = real_store.domains, real_store.labels.to(torch.int64)
    return [(x[d == i], y[d == i]) for i in range(len(real_store.domain_names))]


def test_client_centres_without_noise_are_each_clients_mean_with_one_radius(real_store):
    """Exact releases: c_i is client i's mean unit record; R = κ·√(Σ n_i (1 − ‖c_i‖²) / N), the same for all."""
    parts = _domains(real_store)
    gen = torch.Generator().manual_seed(0)
    cens = client_centrings([privatize_centre(str(i), x, None, gen) for i, (x, _) in enumerate(parts)], radius=0.8)
    n = torch.tensor([float(len(x)) for x, _ in parts], dtype=torch.float64)
    means = [x.double().mean(0) for x, _ in parts]
    for cen, m in zip(cens, means):
        torch.testing.assert_close(cen.centre.double(), m, atol=1e-6, rtol=0)
    spread = float(sum(ni * (1 - float(m @ m)) for ni, m in zip(n, means)) / n.sum())
    assert len({c.radius for c in cens}) == 1 and cens[0].radius == pytest.approx(0.8 * math.sqrt(spread), rel=1e-5)
    # the domains really sit apart: every client's own centre is far from the pooled one (vs the radius)
    pooled = centring_from([privatize_centre(str(i), x, None, gen) for i, (x, _) in enumerate(parts)], 0.8)
    assert min(float((c.centre - pooled.centre).norm()) for c in cens) > 0.3 * pooled.radius
    assert cens[0].radius < pooled.radius  # records are nearer their own domain's centre than the pooled one


def test_client_centres_follow_a_distinct_domain_and_fall_back_to_the_pool_under_noise(real_store):
    """The James–Stein factor: a domain's offset survives moderate noise (its centre stays near its own mean);
    clients of one population (an iid split of one domain) get centres near the pooled one at the same noise."""
    parts = _domains(real_store)
    sigma = 0.5  # noise norm of a domain's mean ≈ 0.05, of a half-domain's ≈ 0.1; domain offsets 0.15–0.3
    gen = torch.Generator().manual_seed(1)
    cens = client_centrings([privatize_centre(str(i), x, sigma, gen) for i, (x, _) in enumerate(parts)], 0.8, sigma)
    pool = torch.cat([x for x, _ in parts]).double().mean(0)
    for cen, (x, _) in zip(cens, parts):  # each keeps most of its domain's offset from the pool
        own = x.double().mean(0)
        assert float((cen.centre.double() - own).norm()) < 0.5 * float((own - pool).norm())
    x0 = parts[0][0]
    halves = [x0[::2], x0[1::2]]
    released = [privatize_centre(str(i), h, sigma, gen) for i, h in enumerate(halves)]
    iid, pooled = client_centrings(released, 0.8, sigma), centring_from(released, 0.8)
    noise_norm = sigma / CENTRE_WEIGHTS[0] / len(halves[0]) * math.sqrt(x0.shape[1])  # ‖noise‖ of one client's mean
    for cen in iid:  # pulled (nearly) all the way to the pool: far less than the raw noise of an own mean
        assert float((cen.centre - pooled.centre).norm()) < 0.35 * noise_norm
    with pytest.raises(TypeError, match="aggregate"):
        from fedhype.privacy.secure_agg import DistributedNoise, secure_sum

        dn = DistributedNoise(2, 0)
        client_centrings(secure_sum([privatize_centre(str(i), h, sigma, gen, distributed=dn) for i, h in enumerate(halves)],
                                    dn), 0.8, sigma)


def test_moments_with_each_clients_centre_map_back_to_the_uncentred_ones(real_store):
    """No noise, radii no record reaches, a different centre per client: the pooled class means and covariance
    equal the uncentred release's (x = c_i + R·y per client, then pooled); one shared centring for all clients
    (the wrong mapping for these releases) does not."""
    parts = _domains(real_store)
    w = ReleaseWeights.split(0.3)
    off = DPConfig(None, 1.0, enabled=False)
    gen = torch.Generator().manual_seed(0)
    cens = [Centring(c.centre, 10.0) for c in
            client_centrings([privatize_centre(str(i), x, None, gen) for i, (x, _) in enumerate(parts)], 0.8)]
    plain = aggregate_class_stats([privatize_class_sums(str(i), x, y, K, off, gen, w) for i, (x, y) in enumerate(parts)],
                                  0.0, max_rank=8)
    ups = [privatize_class_sums(str(i), x, y, K, off, gen, w, centring=c) for i, ((x, y), c) in enumerate(zip(parts, cens))]
    centred = aggregate_class_stats(ups, 0.0, max_rank=8, centring=cens)
    for k in ("space_mean", "space_scale", "class_bias", "residual_var"):
        torch.testing.assert_close(centred[k], plain[k], atol=2e-4, rtol=1e-4, msg=k)
    cp, cc = plain["cov_factor"].double(), centred["cov_factor"].double()
    torch.testing.assert_close(cc @ cc.T, cp @ cp.T, atol=2e-3, rtol=1e-3)
    wrong = aggregate_class_stats(ups, 0.0, max_rank=8, centring=cens[0])
    assert float((wrong["class_bias"] - plain["class_bias"]).abs().max()) > 0.1
    with pytest.raises(ValidationError, match="centrings"):
        aggregate_class_stats(ups, 0.0, max_rank=8, centring=cens[:2])
