"""Secure aggregation of the statistics release: the noise split, the refusals, the guarantee the sum
carries (a broken split is caught), the engine boundary (the server sees only the sum) and the plan."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedhype.data.partition import make_partition
from fedhype.errors import ValidationError
from fedhype.federated import class_stats
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import plan_privacy, train
from fedhype.privacy.dp_step import DPConfig, PrivatizedUpdate, ReleaseWeights, privatize_class_sums
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.privacy.secure_agg import (DistributedNoise, PrivatizedAggregate, SecureAggregationError, SecureShare,
                                        secure_sum)

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}
W = ReleaseWeights.split(0.3)
SIGMA0 = 2.0
DIM, K = 384, 10


def _shares(real_store, noise: DistributedNoise, *, sigma0: float = SIGMA0, seed: int = 0, zero: bool = True):
    """One share per client; with ``zero`` every client's records are the same fixed set (noise = share − exact)."""
    x, y = real_store.embeddings[:60], real_store.labels[:60]
    exact = privatize_class_sums("c", x, y, K, DPConfig(None, 1.0, enabled=False), torch.Generator(), W)
    shares = [privatize_class_sums(f"c{i}", x, y, K, DPConfig(sigma0, 1.0), torch.Generator().manual_seed(seed + i), W,
                                   distributed=noise) for i in range(noise.clients)]
    return shares, exact


def _noise(share: SecureShare, exact: PrivatizedUpdate) -> np.ndarray:
    return (share._tensors["class_sums"] - exact.tensors["class_sums"]).flatten().numpy().astype(np.float64)


def test_the_plan_is_validated_with_the_flag_names():
    assert DistributedNoise(4, 1).min_contributions == 3
    assert DistributedNoise(4, 1).share_std_factor == pytest.approx(1 / math.sqrt(3))
    with pytest.raises(ValidationError, match="at least 2 clients"):
        DistributedNoise(1, 0)
    with pytest.raises(ValidationError, match="--dropout-tolerance must be in \\[0, 3\\]"):
        DistributedNoise(4, 4)
    with pytest.raises(ValidationError, match="--dropout-tolerance"):
        DistributedNoise(4, -1)
    with pytest.raises(ValidationError, match="applies to secure aggregation"):
        TrainConfig(dropout_tolerance=1)
    with pytest.raises(ValidationError, match="local-cvae"):
        TrainConfig(secure_aggregation=True, method="local-cvae")
    # client centres need each client's centre release, which the server never sees under secure aggregation
    with pytest.raises(ValidationError, match="release_centre.*sees only their sum"):
        TrainConfig(secure_aggregation=True, release_centre="client")
    assert TrainConfig(secure_aggregation=True).centre_mode() == "pooled" and TrainConfig().centre_mode() == "client"
    with pytest.raises(ValidationError, match="release_centre must be one of"):
        TrainConfig(release_centre="own")


def test_each_share_carries_sigma0_over_root_m_minus_t(real_store):
    """KS: a share's noise on the class sums is N(0, (σ₀/(a·√(m − t)))²); 1.5× that would be rejected."""
    noise = DistributedNoise(4, 1)
    shares, exact = _shares(real_store, noise)
    want = SIGMA0 / W.sums / math.sqrt(3)
    z = _noise(shares[0], exact)
    assert stats.kstest(z / want, "norm").pvalue > 1e-3
    assert stats.kstest(z / (1.5 * want), "norm").pvalue < 1e-6


def test_a_share_is_not_readable_and_the_server_refuses_it(real_store):
    shares, _ = _shares(real_store, DistributedNoise(2, 0))
    with pytest.raises(TypeError, match="not readable on its own"):
        shares[0].tensors
    with pytest.raises(TypeError, match="PrivatizedUpdate or PrivatizedAggregate"):
        class_stats.aggregate_class_stats(shares, 0.1)
    with pytest.raises(TypeError):
        SecureShare(_token=object(), client="x", tensors={}, noise=DistributedNoise(2, 0), noise_multiplier=1.0, private=True)


def test_the_sum_of_the_honest_clients_carries_sigma0_and_a_broken_split_is_caught(real_store, monkeypatch):
    """Worst case of the guarantee: t of the m clients collude (their noise is known and removed), the
    sum over the m − t honest ones must still carry N(0, σ₀²/a²). Splitting by m instead of m − t
    (with t = 1 claimed) leaves only (m − 1)/m of that variance: the same check rejects it."""

    def honest_sum_ok(noise: DistributedNoise) -> float:
        shares, exact = _shares(real_store, noise, seed=100)
        honest = shares[noise.dropout_tolerance:]  # the first t collude
        z = sum(_noise(s, exact) for s in honest)
        # one-sided: the honest noise variance must be ≥ σ₀²/a² (chi-square lower tail)
        n = z.size
        stat = float((z ** 2).sum()) / (SIGMA0 / W.sums) ** 2
        return float(stats.chi2.cdf(stat, n))  # small = variance below the claim

    noise = DistributedNoise(4, 1)
    assert honest_sum_ok(noise) > 1e-3
    monkeypatch.setattr(DistributedNoise, "share_std_factor", property(lambda self: 1 / math.sqrt(self.clients)))
    assert honest_sum_ok(noise) < 1e-6  # each client adds σ₀²/m: the 3 honest carry 3/4 σ₀², caught


def test_secure_sum_refuses_too_few_duplicates_and_other_plans(real_store):
    noise = DistributedNoise(4, 1)
    shares, exact = _shares(real_store, noise)
    agg = secure_sum(shares[:3], noise)  # one dropped out: within t
    assert type(agg) is PrivatizedAggregate and agg.contributors == ("c0", "c1", "c2")
    assert agg.noise_variance_factor == pytest.approx(1.0)
    x, y = real_store.embeddings[:60], real_store.labels[:60]
    plain = [privatize_class_sums(f"c{i}", x, y, K, DPConfig(None, 1.0, enabled=False), torch.Generator(), W,
                                  distributed=noise) for i in range(3)]
    summed = secure_sum(plain, noise)  # without noise the sum is exact
    assert not summed.private
    for k in ("class_sums", "class_counts", "second_moment"):
        assert torch.allclose(summed.tensors[k], 3 * exact.tensors[k], atol=1e-4)
    with pytest.raises(SecureAggregationError, match="received 2 of 4 contributions, fewer than m − t = 3"):
        secure_sum(shares[:2], noise)
    with pytest.raises(SecureAggregationError, match="contributed twice"):
        secure_sum([shares[0], shares[0], shares[1]], noise)
    with pytest.raises(SecureAggregationError, match="same \\(m, t\\)"):
        secure_sum(shares, DistributedNoise(4, 0))
    with pytest.raises(SecureAggregationError, match="SecureShare objects only"):
        secure_sum([exact, *shares[:3]], noise)


def test_pooled_means_carry_root_m_less_noise_under_secure_aggregation(real_store):
    """The point of it: the server's class sums from the aggregate have 1/m the noise variance of the
    sum of m per-client releases at the same σ₀ (t = 0)."""
    m = 4
    noise = DistributedNoise(m, 0)
    shares, exact = _shares(real_store, noise, seed=7)
    agg = secure_sum(shares, noise)
    per_client = [privatize_class_sums(f"c{i}", real_store.embeddings[:60], real_store.labels[:60], K,
                                       DPConfig(SIGMA0, 1.0), torch.Generator().manual_seed(50 + i), W) for i in range(m)]
    target = m * exact.tensors["class_sums"]
    v_agg = float((agg.tensors["class_sums"] - target).pow(2).mean())
    v_per = float((sum(u.tensors["class_sums"] for u in per_client) - target).pow(2).mean())
    assert v_agg == pytest.approx((SIGMA0 / W.sums) ** 2, rel=0.1)
    assert v_per / v_agg == pytest.approx(m, rel=0.15)


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="domain", seed=0)


def test_engine_hands_the_server_only_the_aggregate_and_the_ledger_names_the_split(real_store, part, tmp_path,
                                                                                   monkeypatch):
    seen = []
    real = class_stats.aggregate_class_stats

    def spy(updates, *a, **k):
        seen.append(type(updates).__name__ if not isinstance(updates, list) else [type(u).__name__ for u in updates])
        return real(updates, *a, **k)

    monkeypatch.setattr(class_stats, "aggregate_class_stats", spy)
    from fedhype.privacy import centring

    real_centre = centring.centring_from

    def spy_centre(updates, *a, **k):
        seen.append("centre:" + (type(updates).__name__ if not isinstance(updates, list) else "list"))
        return real_centre(updates, *a, **k)

    monkeypatch.setattr(centring, "centring_from", spy_centre)
    cfg = TrainConfig(rounds=1, local_steps=1, batch_size=32, epsilon=2.0, seed=0, model=SMALL,
                      secure_aggregation=True, dropout_tolerance=1, class_stats_share=0.9)
    res = train(real_store, part, cfg, tmp_path / "sa", diagnostics=False)
    # no single client's release reached the server: neither the centre nor the statistics
    assert seen == ["centre:PrivatizedAggregate", "PrivatizedAggregate"]
    ledger = PrivacyLedger.load(tmp_path / "sa" / "ledger.json")
    release = [e for e in ledger.events if e.mechanism == class_stats.MECHANISM]
    assert len(release) == len(part.clients)
    centre = [e for e in ledger.events if e.mechanism == centring.MECHANISM]
    assert len(centre) == len(part.clients)
    assert all("m = 4 clients, dropout tolerance t = 1" in e.note for e in release + centre)
    # ε is the accountant's figure for the σ₀ the sum is guaranteed to carry: the same plan as without
    plain = plan_privacy(TrainConfig(**{**cfg.to_dict(), "secure_aggregation": False, "dropout_tolerance": 0}),
                         [len(c.train) for c in part.clients])
    s0, share = plain["class_stats_noise_multiplier"], cfg.centre_share
    assert release[0].noise_multiplier == pytest.approx(s0 / (1 - share) ** 0.5)
    assert centre[0].noise_multiplier == pytest.approx(s0 / share ** 0.5)
    assert res["epsilon"] <= 2.0 + 1e-6


def test_engine_refuses_secure_aggregation_where_it_cannot_hold(real_store, part, tmp_path):
    one = make_partition(real_store, scheme="iid", n_clients=1, seed=0)
    with pytest.raises(ValidationError, match="at least 2 clients"):
        train(real_store, one, TrainConfig(rounds=1, local_steps=1, batch_size=32, epsilon=2.0, seed=0, model=SMALL,
                                           secure_aggregation=True), tmp_path / "one", diagnostics=False)
    assert not (tmp_path / "one" / "config.json").exists()
    with pytest.raises(ValidationError, match="--dropout-tolerance must be in \\[0, 3\\]"):
        train(real_store, part, TrainConfig(rounds=1, local_steps=1, batch_size=32, epsilon=2.0, seed=0, model=SMALL,
                                            secure_aggregation=True, dropout_tolerance=4), tmp_path / "t", diagnostics=False)
    with pytest.raises(ValidationError, match="releases none"):
        train(real_store, part, TrainConfig(rounds=1, local_steps=1, batch_size=32, epsilon=2.0, seed=0,
                                            model={**SMALL, "class_bias": False}, secure_aggregation=True),
              tmp_path / "nb", diagnostics=False)


def test_flower_deployment_takes_secure_aggregation_only_where_secagg_plus_holds(real_store, part, tmp_path):
    """As strict as in process (t < m, m ≥ 2) and stricter: SecAgg+'s threshold m − t must exceed the t colluders."""
    from fedhype.federated.flower.federation import write_federation

    write_federation(tmp_path / "ok", real_store, part, TrainConfig(secure_aggregation=True, dropout_tolerance=1,
                                                                     model=SMALL))
    with pytest.raises(ValidationError, match=r"2t < m.*--dropout-tolerance ≤ 1"):
        write_federation(tmp_path / "t2", real_store, part, TrainConfig(secure_aggregation=True, dropout_tolerance=2,
                                                                         model=SMALL))
    with pytest.raises(ValidationError, match="--dropout-tolerance must be in \\[0, 3\\]"):
        write_federation(tmp_path / "t4", real_store, part, TrainConfig(secure_aggregation=True, dropout_tolerance=4,
                                                                         model=SMALL))
    one = make_partition(real_store, scheme="iid", n_clients=1, seed=0)
    with pytest.raises(ValidationError, match="at least 2 clients"):
        write_federation(tmp_path / "one", real_store, one, TrainConfig(secure_aggregation=True, model=SMALL))
    with pytest.raises(ValidationError, match="releases none"):
        write_federation(tmp_path / "nb", real_store, part, TrainConfig(secure_aggregation=True,
                                                                         model={**SMALL, "class_bias": False}))
    assert not (tmp_path / "t2").exists() and not (tmp_path / "one").exists()


def test_bad_combinations_are_refused_with_the_flag_names():
    from fedhype.cli.budget_cmd import budget_plan

    with pytest.raises(ValidationError, match="--no-dp"):
        TrainConfig(secure_aggregation=True, no_dp=True, epsilon=None)
    with pytest.raises(ValidationError, match="--class-stats-share 0"):
        budget_plan(1e-5, 2, 32, [("0", "a", 500), ("1", "b", 400)], local_epochs=1, noise_multiplier=1.0,
                    class_stats_share=0.0, secure_aggregation=True)


def test_budget_single_mechanism_refuses_secure_aggregation_flags():
    import json

    from typer.testing import CliRunner

    from fedhype.cli.main import app

    r = CliRunner().invoke(app, ["budget", "--noise-multiplier", "1.1", "--sample-rate", "0.01", "--steps", "100",
                                 "--delta", "1e-5", "--secure-aggregation", "--json"])
    assert r.exit_code == 2 and "single mechanism has none" in json.loads(r.stdout)["error"]
