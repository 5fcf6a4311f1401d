"""``model.pooling = "inverse-variance"``: the clients' released class sums pooled with weights ∝ their DP counts.

Post-processing of the per-client releases (no ε): the tests check the noise it states (the James–Stein factor, the
within-class step and the located share read it), that it carries less noise than the plain sum on label-skewed
clients of one population, and that it leaves every release it cannot improve (one release, a secure-aggregation sum,
no DP) exactly as the plain sum does.
"""

import numpy as np
import pytest
import torch

from fedhype.errors import ValidationError
from fedhype.federated.class_stats import aggregate_class_stats, release_moments
from fedhype.models.config import ModelConfig
from fedhype.privacy.dp_step import LEGACY_WEIGHTS, DPConfig, privatize_class_sums

K = 10
SIGMA = 2.0
EXACT = DPConfig(None, 1.0, enabled=False)


@pytest.fixture(scope="module")
def skewed_clients(real_store):
    """Five label-skewed clients of one population: per class, shares ~ Dirichlet(0.3) over a random order of records."""
    rng = np.random.default_rng(0)
    x, y = real_store.embeddings, real_store.labels.numpy()
    owner = np.empty(len(y), dtype=np.int64)
    for k in range(K):
        idx = rng.permutation(np.flatnonzero(y == k))
        cuts = (np.cumsum(rng.dirichlet(np.full(5, 0.3)))[:-1] * len(idx)).astype(int)
        for i, piece in enumerate(np.split(idx, cuts)):
            owner[piece] = i
    return [(x[owner == i], real_store.labels[owner == i]) for i in range(5)]


def _release(clients, dp, seed):
    return [privatize_class_sums(str(i), a, b, K, dp, torch.Generator().manual_seed(seed * 100 + i), LEGACY_WEIGHTS)
            for i, (a, b) in enumerate(clients)]


def test_inverse_variance_pooling_states_its_noise_and_carries_less_of_it(skewed_clients):
    dp = DPConfig(SIGMA, 1.0)
    truth = release_moments(_release(skewed_clients, EXACT, 0), EXACT, LEGACY_WEIGHTS)["class_means"].to(torch.float64)
    draws = {"sum": [], "inverse-variance": [], "random-effects": []}
    stated = {}
    for seed in range(150):
        ups = _release(skewed_clients, dp, seed)
        for rule in draws:
            mo = release_moments(ups, dp, LEGACY_WEIGHTS, pooling=rule)
            draws[rule].append(mo["class_means"].to(torch.float64))
            stated.setdefault(rule, []).append(torch.as_tensor(mo["sums_noise_var"], dtype=torch.float64)
                                               / mo["counts"].to(torch.float64) ** 2)
    var, mse, said = {}, {}, {}
    for rule, d in draws.items():
        d = torch.stack(d)  # [draws, K, D]
        var[rule] = d.var(0).mean(1)  # [K]: noise variance per coordinate of each class mean
        mse[rule] = float((d - truth).pow(2).sum(2).mean())
        said[rule] = torch.stack(stated[rule]).mean(0).expand(K)  # [K]
        # the stated per-coordinate noise variance of every class mean is the measured one (150 draws × 384
        # coordinates: measured within 2 %; a 1.1× error would be caught)
        ratio = var[rule] / said[rule]
        assert float(ratio.min()) > 0.93 and float(ratio.max()) < 1.07, (rule, ratio)
    gain = var["sum"] / var["inverse-variance"]  # Cauchy–Schwarz: never below 1 with exact counts
    assert float(gain.min()) > 1.3 and float(gain.mean()) > 1.8, gain  # measured 1.6–2.6
    # closer to the exact pooled class means (its weighting's bias on one population is far below the noise it removes)
    assert mse["inverse-variance"] < 0.6 * mse["sum"], mse  # measured 1.15 against 2.43


def test_pooling_leaves_one_release_and_exact_statistics_as_the_sum(skewed_clients):
    dp = DPConfig(SIGMA, 1.0)
    ups = _release(skewed_clients, dp, 0)
    exact = _release(skewed_clients, EXACT, 0)
    for updates, setting in (([ups[0]], dp), (exact, EXACT)):
        a = release_moments(updates, setting, LEGACY_WEIGHTS, pooling="sum")
        b = release_moments(updates, setting, LEGACY_WEIGHTS, pooling="inverse-variance")
        torch.testing.assert_close(a["class_means"], b["class_means"])
        assert float(torch.as_tensor(a["sums_noise_var"]).max()) == float(torch.as_tensor(b["sums_noise_var"]).max())
    # the global mean and the total variance are the plain sum's in every case
    a = aggregate_class_stats(ups, 0.0, sums_std=SIGMA * 1.5)
    b = aggregate_class_stats(ups, 0.0, sums_std=SIGMA * 1.5, pooling="inverse-variance")
    torch.testing.assert_close(a["space_mean"], b["space_mean"])
    torch.testing.assert_close(a["space_scale"], b["space_scale"])
    assert not torch.allclose(a["class_bias"], b["class_bias"])


def test_model_pooling_is_checked():
    assert ModelConfig(dim=8, n_classes=2).pooling in ("sum", "inverse-variance")
    with pytest.raises(ValidationError, match="model.pooling must be one of"):
        ModelConfig(dim=8, n_classes=2, pooling="mean")


def test_dersimonian_laird_recovers_a_known_scatter_of_the_clients_class_means(real_store):
    """Real class means, real label-skewed counts, a known τ² of the clients' class means and known noise σ."""
    from fedhype.federated.pooling import _tau2

    x = torch.nn.functional.normalize(real_store.embeddings.to(torch.float64), dim=1)
    mu = torch.stack([x[real_store.labels == k].mean(0) for k in range(K)])  # [K, D]
    rng = torch.Generator().manual_seed(0)
    counts = torch.tensor(np.random.default_rng(0).dirichlet(np.full(8, 0.3), size=K).T * 600)  # [8 clients, K]
    sigma, radius = 1.5, 0.7
    for tau in (0.0, 0.02, 0.05):
        rel = []
        for n in counts:
            means = mu + tau * torch.randn(mu.shape, generator=rng, dtype=torch.float64)
            s = n[:, None] * means + sigma * radius * torch.randn(mu.shape, generator=rng, dtype=torch.float64)
            rel.append((s, n, radius))
        est, q, m = _tau2(rel, sigma ** 2)
        assert torch.equal(m, (counts > 0).sum(0).to(torch.float64))
        if tau == 0:
            assert float(est.mean()) < 2e-5 and float(est.max()) < 1e-4, est  # its noise floor (τ = 0.02: 4e-4)
        else:
            assert float(est.mean()) == pytest.approx(tau ** 2, rel=0.15), (tau, est)


def test_random_effects_pooling_is_inverse_variance_on_one_population_and_nearer_the_sum_across_domains(
        real_store, skewed_clients):
    from fedhype.data.partition import make_partition

    # one population, label skew: τ² ≈ 0, the weights (and class means) those of inverse-variance
    dp = DPConfig(SIGMA, 1.0)
    ups = _release(skewed_clients, dp, 0)
    iv = release_moments(ups, dp, LEGACY_WEIGHTS, pooling="inverse-variance")
    re = release_moments(ups, dp, LEGACY_WEIGHTS, pooling="random-effects")
    plain = release_moments(ups, dp, LEGACY_WEIGHTS, pooling="sum")
    near = float((re["class_means"] - iv["class_means"]).norm(dim=1).mean())
    far = float((plain["class_means"] - iv["class_means"]).norm(dim=1).mean())
    assert near < 0.06 * far, (near, far)  # measured 0.028 against 1.05
    # distinct domains at little noise: the scatter is found, and the class means move from inverse-variance
    # toward the plain sum's (the pooled class means every client's records define)
    part = make_partition(real_store, scheme="domain", seed=0)
    domains = [(d.embeddings, d.labels) for d in (real_store.subset(real_store.positions(list(c.ids("train"))))
                                                  for c in part.clients)]
    low = DPConfig(0.05, 1.0)
    ups = _release(domains, low, 0)
    got = {rule: release_moments(ups, low, LEGACY_WEIGHTS, pooling=rule) for rule in ("sum", "inverse-variance",
                                                                                       "random-effects")}
    assert float(got["random-effects"]["pooling_tau2"].min()) > 1e-4
    gap = lambda r: float((got[r]["class_means"] - got["sum"]["class_means"]).norm(dim=1).mean())
    # measured 0.0037 against 0.037
    assert gap("random-effects") < 0.25 * gap("inverse-variance"), (gap("random-effects"), gap("inverse-variance"))


def test_a_run_pools_by_its_setting_charges_the_same_and_records_the_scatter(real_store, tmp_path):
    """End to end: the same seeded release pooled two ways; the ledger (what was released) is identical."""
    import json

    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.federated.rundir import load_model
    from fedhype.privacy.ledger import PrivacyLedger

    part = make_partition(real_store, scheme="dirichlet", n_clients=4, alpha=0.3, seed=0)
    small = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}
    runs = {}
    for rule in ("sum", "random-effects"):
        cfg = TrainConfig(rounds=1, epsilon=2.0, seed=0, method="dp-gaussian", model={**small, "pooling": rule})
        train(real_store, part, cfg, tmp_path / rule, diagnostics=False)
        runs[rule] = load_model(tmp_path / rule)
    events = [[(e.mechanism, e.noise_multiplier, e.sample_rate, e.steps) for e in
               PrivacyLedger.load(tmp_path / r / "ledger.json").events] for r in runs]
    assert events[0] == events[1]
    assert json.loads((tmp_path / "random-effects" / "config.json").read_text())["model"]["pooling"] == "random-effects"
    notes = json.loads((tmp_path / "random-effects" / "release.json").read_text())
    assert len(notes["pooling_tau2"]) == real_store.n_classes and min(notes["pooling_tau2"]) >= 0
    assert "pooling_tau2" not in json.loads((tmp_path / "sum" / "release.json").read_text())
    a, b = (runs[r][0].base["cb"] for r in runs)  # the class bias the pooled class means set
    assert not torch.allclose(a, b)
    torch.testing.assert_close(runs["sum"][0].space_mean, runs["random-effects"][0].space_mean)


def test_weights_sum_to_one_with_unequal_radii_and_one_client_classes_have_no_scatter(real_store):
    """Noise-free releases of one common class mean, clip radii 0.5–2 and mixed counts (one class held by one client,
    counts of 0.3 and −2): both weighted rules give the common mean exactly (Σ_i a_ik = 1, whatever R_i), and a class
    only one client counts has τ² = 0, not rounding noise over rounding noise."""
    from fedhype.federated.pooling import pooled_class_means

    x = torch.nn.functional.normalize(real_store.embeddings.to(torch.float64), dim=1)
    mu = torch.stack([x[real_store.labels == k].mean(0) for k in range(K)])
    radii = [0.5, 1.0, 2.0, 0.8]
    counts = torch.tensor([[40.0] * K, [3.0] * K, [0.3] * K, [-2.0] * K])
    counts[1:, 0] = 0.0  # class 0: client 0 alone
    rel = [(n[:, None] * mu, n, r) for n, r in zip(counts, radii)]
    for rule in ("inverse-variance", "random-effects"):
        got = pooled_class_means(lambda: iter(rel), 1.3, rule)
        torch.testing.assert_close(got["class_means"], mu, atol=1e-12, rtol=0)
        assert bool(got["pooled"].all()) and float(got["tau2"][0]) == 0.0
    # the weights follow n²/R²: two clients, the second twice the count at twice the radius — equal weights
    rel = [(20.0 * (mu + 0.1), torch.full((K,), 20.0), 1.0), (40.0 * (mu - 0.1), torch.full((K,), 40.0), 2.0)]
    got = pooled_class_means(lambda: iter(rel), 1.3, "inverse-variance")
    torch.testing.assert_close(got["class_means"], mu, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="pooling rule"):
        pooled_class_means(lambda: iter(rel), 1.3, "sum")
