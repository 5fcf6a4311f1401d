"""Undoing the clip's shrink of a centred release (``model.clip_rescale``, ``class_stats.clip_rescale_factor``):
the factor from the unit norms, exact where nothing is clipped, the mean ‖x‖² = 1 it restores, the uniform shrink
it inverts, its bounds under noise, and a run with it charging exactly what a run without it charges."""

import pytest
import torch

from fedhype.data.partition import make_partition
from fedhype.federated.class_stats import MAX_CLIP_RESCALE, _moments, clip_rescale_factor
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.federated.rundir import load_model
from fedhype.privacy.centring import centring_from, client_centrings, privatize_centre
from fedhype.privacy.dp_step import DPConfig, ReleaseWeights, privatize_class_sums
from fedhype.privacy.ledger import PrivacyLedger

K = 10
W = ReleaseWeights.split(0.3)
EXACT = DPConfig(None, 1.0, enabled=False)
SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.to(torch.float64), dim=1)


def _release(real_store, radius: float, n: int = 600):
    """One client's exact (noise-free) centred release of the first ``n`` records, clipped at ``radius`` × spread."""
    x, y = real_store.embeddings[:n].to(torch.float32), real_store.labels[:n].to(torch.int64)
    gen = torch.Generator().manual_seed(0)
    cen = centring_from([privatize_centre("a", x, None, gen)], radius=radius)
    return x, cen, privatize_class_sums("a", x, y, K, EXACT, gen, W, centring=cen)


def _mean_square_norm(mo: dict) -> float:
    """tr(cov) + ‖mean‖² of mapped-back moments: the mean ‖x‖² of the records they describe."""
    return float(torch.trace(mo["cov"]) + mo["mean"].double().pow(2).sum())


def test_nothing_clipped_gives_factor_one_and_the_same_moments(real_store):
    x, cen, u = _release(real_store, radius=10.0)
    assert float(cen.transform(x)[0].norm(dim=1).max()) < 1.0  # no record reaches the radius
    g = clip_rescale_factor([u], cen)
    assert g == pytest.approx(1.0, abs=1e-5)
    assert _mean_square_norm(_moments([u], centring=cen)) == pytest.approx(1.0, abs=1e-5)
    # no centring (the uncentred release) or no second moments: nothing to undo
    assert clip_rescale_factor([u], None) == 1.0


def test_clipping_most_records_is_undone_to_unit_mean_square_norm(real_store):
    x, cen, u = _release(real_store, radius=0.5)
    z = _unit(x) - cen.centre.double()
    norms = z.norm(dim=1)
    assert float((norms > cen.radius).double().mean()) > 0.9  # nearly every record is clipped
    g = clip_rescale_factor([u], cen)
    # the common shrink f the clip is close to (f² = Σ‖clip_R(d)‖² / Σ‖d‖²; here f = 0.5): the norms concentrate
    # but are not equal, so g is near 1/f, not exactly it (1.87 against 2.0 on these records)
    f = float((norms.clamp(max=cen.radius) ** 2).sum() / (norms ** 2).sum()) ** 0.5
    assert 1.3 < g < MAX_CLIP_RESCALE
    assert g == pytest.approx(1.0 / f, rel=0.08)
    clipped, rescaled = _moments([u], centring=cen), _moments([u], centring=cen, rescale=g)
    assert _mean_square_norm(clipped) < 0.95
    assert _mean_square_norm(rescaled) == pytest.approx(1.0, abs=1e-6)
    # the covariance trace of the records themselves: the rescaled release lands near it (0.207 against 0.237), the clipped far below (0.059)
    xs = _unit(x)
    true = float(((xs - xs.mean(0)) ** 2).sum(1).mean())
    assert abs(float(torch.trace(rescaled["cov"])) - true) < 0.2 * abs(float(torch.trace(clipped["cov"])) - true)
    # the class means move away from the centre by about g
    d0 = (clipped["class_means"].double() - cen.centre.double()).norm(dim=1)
    d1 = (rescaled["class_means"].double() - cen.centre.double()).norm(dim=1)
    torch.testing.assert_close(d1, g * d0, rtol=1e-4, atol=1e-6)


def test_each_clients_centre_and_one_factor_for_the_pool(real_store):
    """Four domains, each clipped around its own centre: one g restores the pooled mean ‖x‖² = 1."""
    x, d, y = real_store.embeddings.to(torch.float32), real_store.domains, real_store.labels.to(torch.int64)
    data = [(x[d == i], y[d == i]) for i in range(len(real_store.domain_names))]
    gen = torch.Generator().manual_seed(0)
    cens = client_centrings([privatize_centre(str(i), x, None, gen) for i, (x, _) in enumerate(data)], 0.6)
    ups = [privatize_class_sums(str(i), x, y, K, EXACT, gen, W, centring=c) for i, ((x, y), c) in enumerate(zip(data, cens))]
    g = clip_rescale_factor(ups, cens)
    assert g > 1.2
    assert _mean_square_norm(_moments(ups, centring=cens, rescale=g)) == pytest.approx(1.0, abs=1e-6)
    assert _mean_square_norm(_moments(ups, centring=cens)) < 0.95


def test_noise_cannot_push_the_factor_outside_its_bounds(real_store):
    """A small release under heavy noise: g stays in [1, MAX_CLIP_RESCALE] whatever the noisy trace says."""
    x, y = real_store.embeddings[:40].to(torch.float32), real_store.labels[:40].to(torch.int64)
    seen = []
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        cen = centring_from([privatize_centre("a", x, None, gen)], radius=0.5)
        u = privatize_class_sums("a", x, y, K, DPConfig(3.0, 1.0), gen, W, centring=cen)
        seen.append(clip_rescale_factor([u], cen))
    assert all(1.0 <= g <= MAX_CLIP_RESCALE for g in seen)
    assert max(seen) == MAX_CLIP_RESCALE or min(seen) == 1.0  # the bounds are reached, not just the middle
    with pytest.raises(Exception, match="clip_rescale"):
        TrainConfig(model={"clip_rescale": "yes"}).model_config(8, 2)


def test_a_run_with_the_rescale_charges_the_same_and_spreads_the_class_means(real_store, tmp_path):
    """Post-processing: the same seeded release, the same ledger; the model's class means sit g farther out."""
    part = make_partition(real_store, scheme="domain", seed=0)
    runs = {}
    for on in (False, True):
        cfg = TrainConfig(rounds=1, epsilon=8.0, seed=0, method="dp-gaussian", secure_aggregation=True,
                          model={**SMALL, "clip_rescale": on})
        train(real_store, part, cfg, tmp_path / str(on), diagnostics=False)
        hnet, _, _ = load_model(tmp_path / str(on))
        ledger = PrivacyLedger.load(tmp_path / str(on) / "ledger.json")
        runs[on] = (hnet, [(e.client, e.mechanism, e.noise_multiplier, e.sample_rate) for e in ledger.events],
                    ledger.worst()[1])
    assert runs[True][1] == runs[False][1] and runs[True][2] == runs[False][2]
    assert runs[True][0].cfg.clip_rescale and not runs[False][0].cfg.clip_rescale
    spread = {on: float(runs[on][0].base["cb"].detach().double().norm(dim=1).mean() * runs[on][0].space_scale) for on in runs}
    assert 1.1 < spread[True] / spread[False] < MAX_CLIP_RESCALE
