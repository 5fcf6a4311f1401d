"""DP class statistics before round 0: the mechanism, its accounting, and what it buys."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedhype.data.partition import make_partition
from fedhype.privacy.centring import MECHANISM as CENTRE_MECHANISM
from fedhype.federated.class_stats import MECHANISM, aggregate_class_stats
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.federated.rundir import load_model
from fedhype.models.cvae import to_model_space
from fedhype.privacy.accountant import epsilon
from fedhype.privacy.dp_step import DPConfig, PrivatizedUpdate, privatize_class_sums
from fedhype.privacy.ledger import PrivacyLedger

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="domain", seed=0)


def test_exact_statistics_without_dp(real_store):
    x, y = real_store.embeddings, real_store.labels
    u = privatize_class_sums("0", x, y, 10, DPConfig(None, 1.0, enabled=False), torch.Generator())
    assert type(u) is PrivatizedUpdate and not u.private and u.steps == 1 and u.sample_rate == 1.0
    xn = x.numpy() / np.linalg.norm(x.numpy(), axis=1, keepdims=True)
    for k in range(10):
        np.testing.assert_allclose(u.tensors["class_sums"][k].numpy(), xn[y.numpy() == k].sum(0), rtol=1e-4, atol=1e-4)
    assert u.tensors["class_counts"].tolist() == np.bincount(y.numpy(), minlength=10).tolist()
    s = aggregate_class_stats([u])
    np.testing.assert_allclose(s["space_mean"].numpy(), xn.mean(0), atol=1e-5)
    # model space: centred, unit mean square per coordinate (E‖x − μ‖² = 1 − ‖μ‖² for unit vectors)
    xm = to_model_space(x, (s["space_mean"], s["space_scale"]))
    assert xm.mean(0).abs().max() < 1e-3
    assert xm.pow(2).mean().item() == pytest.approx(1.0, rel=1e-3)
    # class bias = class means in model space
    for k in range(10):
        np.testing.assert_allclose(s["class_bias"][k].numpy(), xm[y == k].mean(0).numpy(), atol=1e-3)


def test_noise_has_the_gaussian_mechanism_scale(real_store):
    x, y = real_store.embeddings[:50], real_store.labels[:50]
    exact = privatize_class_sums("0", x, y, 10, DPConfig(None, 1.0, enabled=False), torch.Generator())
    sigma = 2.0
    noisy = privatize_class_sums("0", x, y, 10, DPConfig(sigma, 1.0), torch.Generator().manual_seed(0))
    # the legacy weights (1/√2, 1/√2): the weighted vector has sensitivity 1, each statistic noise std σ·√2
    assert noisy.private and noisy.clip_norm == 1.0 and noisy.noise_multiplier == sigma
    z = torch.cat([(noisy.tensors[k] - exact.tensors[k]).flatten() for k in ("class_sums", "class_counts")]).numpy()
    std = sigma * math.sqrt(2)
    assert stats.kstest(z / std, "norm").pvalue > 1e-3
    assert stats.kstest(z / (1.5 * std), "norm").pvalue < 1e-6  # 1.5× the scale would be caught


def test_release_is_in_the_ledger_and_composed_by_the_accountant(real_store, part, tmp_path):
    cfg = TrainConfig(rounds=2, local_steps=2, batch_size=32, epsilon=2.0, delta=1e-4, seed=0, class_stats_share=0.8,
                      model=SMALL)
    res = train(real_store, part, cfg, tmp_path / "run", diagnostics=False)
    ledger = PrivacyLedger.load(tmp_path / "run" / "ledger.json")
    pre = [e for e in ledger.events if e.mechanism == MECHANISM]
    assert sorted(e.client for e in pre) == sorted(str(c.id) for c in part.clients)
    sb = pre[0].noise_multiplier
    assert all(e.round == -1 and e.sample_rate == 1.0 and e.steps == 1 and e.noise_multiplier == sb for e in pre)
    # the centred release: its centre first (σ_A), charged for every client with the statistics (σ_B)
    centre = [e for e in ledger.events if e.mechanism == CENTRE_MECHANISM]
    assert sorted(e.client for e in centre) == sorted(str(c.id) for c in part.clients)
    sa = centre[0].noise_multiplier
    assert all(e.round == -1 and e.sample_rate == 1.0 and e.steps == 1 and e.noise_multiplier == sa for e in centre)
    # σ_A = σ₀/√s, σ_B = σ₀/√(1 − s): Gaussian composition, 1/σ_A² + 1/σ_B² = 1/σ₀²
    s0 = res["class_stats_noise_multiplier"]
    assert sa == pytest.approx(s0 / math.sqrt(cfg.centre_share)) and sb == pytest.approx(s0 / math.sqrt(1 - cfg.centre_share))
    # both steps together cost the release's share of ε (class_stats_share 0.8), as one step at σ₀ would
    assert epsilon([(sa, 1.0, 1), (sb, 1.0, 1)], 1e-4) == pytest.approx(0.8 * 2.0, abs=0.02)
    assert epsilon([(sa, 1.0, 1), (sb, 1.0, 1)], 1e-4) == pytest.approx(epsilon([(s0, 1.0, 1)], 1e-4), abs=0.01)
    worst = 0.0
    for c in part.clients:
        q = 32 / len(c.train)
        worst = max(worst, epsilon([(sa, 1.0, 1), (sb, 1.0, 1), (res["noise_multiplier"], q, 4)], 1e-4))
    assert res["epsilon"] == pytest.approx(worst, rel=1e-9)
    assert res["epsilon"] <= 2.0 and res["epsilon"] > 1.9
    hnet, _, _ = load_model(tmp_path / "run")
    assert hnet.space_mean.norm() > 0.5  # DP mean of the embeddings, not the default 0
    # the audit recomputes every claim from the ledger, the release included
    from fedhype.eval.audit_ledger import audit_run

    audit = audit_run(tmp_path / "run")
    assert audit["consistent"] and audit["mismatches"] == [] and audit["epsilon"] == pytest.approx(res["epsilon"])


def test_seeded_resume_does_not_charge_the_release_twice(real_store, part, tmp_path):
    cfg = TrainConfig(rounds=2, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=3, model=SMALL)
    train(real_store, part, cfg, tmp_path / "a", diagnostics=False, stop_after=0)  # interrupted right after the release
    train(real_store, part, cfg, tmp_path / "a", diagnostics=False, resume=True)
    train(real_store, part, cfg, tmp_path / "b", diagnostics=False)
    la, lb = (PrivacyLedger.load(tmp_path / r / "ledger.json") for r in "ab")
    assert len([e for e in la.events if e.mechanism == MECHANISM]) == len(part.clients)
    assert la.epsilons() == pytest.approx(lb.epsilons())
    ma, mb = load_model(tmp_path / "a")[0], load_model(tmp_path / "b")[0]
    for k, v in ma.state_dict().items():
        torch.testing.assert_close(v, mb.state_dict()[k])


def test_class_statistics_carry_class_information(real_store, part, tmp_path):
    """Synthetic embeddings of a short run classify held-out real ones far above chance, and far
    better than the same run without the class statistics (exact statistics: --no-dp; the noise
    of the DP release is tested above, its utility in benchmarks/utility.py)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from fedhype.synthesis.sample import synthesize

    test = part.split_store(real_store, "test")
    accs = {}
    for cb in (True, False):
        cfg = TrainConfig(rounds=1, local_steps=2, batch_size=64, no_dp=True, epsilon=None, seed=0,
                          model={**SMALL, "class_bias": cb})
        train(real_store, part, cfg, tmp_path / str(cb), diagnostics=False)
        syn = synthesize(tmp_path / str(cb), "mixture:" + ",".join(f"{c.id}=1" for c in part.clients), per_class=60, seed=0)
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(syn.embeddings.numpy(), syn.labels.numpy())
        accs[cb] = clf.score(test.embeddings.numpy(), test.labels.numpy())
    assert accs[True] > 0.2, accs  # chance 0.1
    assert accs[True] > accs[False] + 0.1, accs


def test_noisy_small_set_keeps_a_sane_scale(real_store):
    """A very noisy release (norm of the DP mean ≥ 1) must not collapse the model space's scale."""
    x, y = real_store.embeddings[:60], real_store.labels[:60]
    u = privatize_class_sums("0", x, y, 10, DPConfig(20.0, 1.0), torch.Generator().manual_seed(1))
    s = aggregate_class_stats([u], noise_std=20.0 * math.sqrt(2))
    assert s["space_mean"].norm() > 1.0  # the noise dominates the mean ...
    var = float(s["space_scale"] ** 2 * 384)
    assert 0.05 <= var <= 1.0  # ... but the total variance stays in its valid range
    exact = aggregate_class_stats([privatize_class_sums("0", x, y, 10, DPConfig(None, 1.0, enabled=False),
                                                         torch.Generator())])
    assert float(exact["space_scale"] ** 2 * 384) == pytest.approx(1 - float(exact["space_mean"].norm() ** 2), rel=1e-5)
