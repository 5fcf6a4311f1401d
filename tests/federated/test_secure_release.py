"""The release before round 0 through the integer path (what a Flower deployment with secure aggregation runs),
driven by the real engine in process: SecAgg+'s ideal sum stands in for the protocol
(:class:`fedhype.federated.secure_release.LocalIntegerSession`). Checked: the ledger records Skellam releases and
ε stays at the plan; the server sees only aggregates; a dropout within t is charged only to the clients that went
on; one beyond t stops the run with nothing charged or committed."""

import json

import pytest
import torch

from fedhype.data.partition import make_partition
from fedhype.federated import class_stats
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import _build_clients, describe_store, plan_privacy, run_federation
from fedhype.federated.rundir import RunDir
from fedhype.federated.secure_release import attach_local_session, planned_tails
from fedhype.federated.transport import InProcessTransport
from fedhype.privacy.accountant import epsilon
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.privacy.secure_agg import SecureAggregationError

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="iid", n_clients=3, seed=0)


def _run(real_store, part, cfg, out, drop=(), **kw):
    def connect(run):
        clients, _ = _build_clients(real_store, part, run, cfg)
        attach_local_session(clients, cfg.distributed_noise(len(clients)), cfg.delta,
                             planned_tails(cfg, [len(c.train) for c in part.clients]), drop=drop)
        return InProcessTransport(clients, None)

    return run_federation(part, cfg, out, store_info=describe_store(real_store), n_classes=real_store.n_classes,
                          connect=connect, **kw)


@pytest.mark.parametrize("method", ["dp-gaussian", "fedhypevae"])
def test_the_integer_release_is_recorded_as_skellam_and_keeps_the_planned_epsilon(real_store, part, tmp_path,
                                                                                 monkeypatch, method):
    seen = []
    real = class_stats.aggregate_class_stats

    def spy(updates, *a, **k):
        seen.append(type(updates).__name__)
        return real(updates, *a, **k)

    monkeypatch.setattr(class_stats, "aggregate_class_stats", spy)
    cfg = TrainConfig(method=method, rounds=1, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=0,
                      model=SMALL, secure_aggregation=True, dropout_tolerance=1)
    res = _run(real_store, part, cfg, tmp_path / "run")
    assert seen == ["PrivatizedAggregate"]  # the server's statistics: the aggregate only
    led = PrivacyLedger.load(tmp_path / "run" / "ledger.json")
    rel = [e for e in led.events if e.round == -1]
    assert [(e.client, e.mechanism, e.noise) for e in rel] == \
        [(c, m, "skellam") for m in ("dp-release-centre", "dp-class-stats") for c in ("0", "1", "2")]
    assert all("m = 3 clients, dropout tolerance t = 1" in e.note and "Agarwal, Kairouz & Liu" in e.note for e in rel)
    # σ of each step: the Gaussian plan's times the calibration factor k ≥ 1, the same k for both steps
    plan = plan_privacy(cfg, [len(c.train) for c in part.clients])
    k = [e.noise_multiplier / s for e, (s, _, _) in zip(rel[::3], plan["prefix"])]
    assert k[0] == pytest.approx(k[1]) and 1.0 <= k[0] < 1.3
    # ε is the RDP figure of the Skellam releases (+ DP-SGD), at or below the plan's (and the target)
    planned = max(epsilon(plan["prefix"] + t, cfg.delta) for t in planned_tails(cfg, [len(c.train) for c in part.clients]))
    assert res["epsilon"] <= planned + 1e-9 <= cfg.epsilon + 1e-6
    assert res["epsilon"] == pytest.approx(led.worst()[1]) and res["epsilon"] > 0.9 * planned
    assert RunDir(tmp_path / "run").committed_round() == cfg.rounds_run()


def test_a_dropout_within_t_is_charged_to_the_clients_that_went_on(real_store, part, tmp_path):
    cfg = TrainConfig(method="dp-gaussian", epsilon=2.0, delta=1e-4, seed=0, model=SMALL, secure_aggregation=True,
                      dropout_tolerance=1)
    _run(real_store, part, cfg, tmp_path / "run", drop=[2])
    led = PrivacyLedger.load(tmp_path / "run" / "ledger.json")
    assert sorted({e.client for e in led.events}) == ["0", "1"]  # client 2 computed nothing: not charged
    assert RunDir(tmp_path / "run").committed_round() == 0 and (tmp_path / "run" / "model.safetensors").exists()


def test_a_dropout_beyond_t_stops_with_nothing_charged_or_committed(real_store, part, tmp_path):
    cfg = TrainConfig(method="dp-gaussian", epsilon=2.0, delta=1e-4, seed=0, model=SMALL, secure_aggregation=True,
                      dropout_tolerance=1)
    with pytest.raises(SecureAggregationError, match="1 of 3 clients took part, fewer than m − t = 2"):
        _run(real_store, part, cfg, tmp_path / "run", drop=[1, 2])
    led = json.loads((tmp_path / "run" / "ledger.json").read_text())["events"] if (tmp_path / "run" / "ledger.json").exists() else []
    assert led == []
    assert not (tmp_path / "run" / "checkpoint.json").exists() and not (tmp_path / "run" / "model.safetensors").exists()


def test_max_epsilon_refuses_a_resume_that_would_release_again_through_the_integer_path(real_store, part, tmp_path):
    """As in process (tests/federated/test_integrity.py): a run interrupted after its release was charged and before
    its outputs were saved releases again on an unseeded resume; with --max-epsilon that would be exceeded, the
    integer (Flower SecAgg+) path refuses too, before anything is charged."""
    from fedhype.errors import BudgetExceededError

    cfg = TrainConfig(method="fedhypevae", rounds=2, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=None,
                      model=SMALL, secure_aggregation=True, dropout_tolerance=1)
    run = tmp_path / "run"
    _run(real_store, part, cfg, run, stop_after=0)
    for f in ("release-state", "release-outputs"):  # as if interrupted after the charge, before the sums arrived
        (run / "ckpt" / f"{f}.safetensors").unlink()
    before = (run / "ledger.json").read_bytes()
    spent = PrivacyLedger.load(run / "ledger.json").worst()[1]
    with pytest.raises(BudgetExceededError, match=r"the statistics release \(interrupted before, charged again"):
        _run(real_store, part, TrainConfig(**{**cfg.__dict__, "max_epsilon": 2.1}), run, resume=True)
    assert (run / "ledger.json").read_bytes() == before and spent < 2.1


@pytest.mark.parametrize("centre_share", [0.0, 0.06])
def test_sums_received_through_the_integer_path_are_reused_on_resume_not_released_again(real_store, part, tmp_path,
                                                                                       centre_share):
    """The Flower SecAgg+ path saves the sums it unmasked (ckpt/release-outputs.safetensors) before its
    post-processing, as the in-process secure path does: an unseeded run interrupted after them and before the
    model was saved resumes from them (no session opened, the ledger byte-identical, the same model); it released
    and was charged again before."""
    from fedhype.io import load_tensors

    cfg = TrainConfig(method="fedhypevae", rounds=2, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=None,
                      model=SMALL, secure_aggregation=True, dropout_tolerance=1, centre_share=centre_share)
    run = tmp_path / "run"
    _run(real_store, part, cfg, run, stop_after=0)
    assert (run / "ckpt" / "release-outputs.safetensors").exists()
    whole = load_tensors(run / "ckpt" / "release-state.safetensors")
    (run / "ckpt" / "release-state.safetensors").unlink()  # the sums arrived; the model was not saved
    assert RunDir(run).release_stage() == "saved"
    before = (run / "ledger.json").read_bytes()
    opened = []

    def connect_spy(real_open):
        def spy(self, stage):
            opened.append(stage)
            return real_open(self, stage)
        return spy

    from fedhype.federated.secure_release import LocalIntegerSession

    real_open = LocalIntegerSession.open
    LocalIntegerSession.open = connect_spy(real_open)
    try:
        _run(real_store, part, cfg, run, resume=True, stop_after=0)
    finally:
        LocalIntegerSession.open = real_open
    assert opened == []  # no secure-aggregation session: nothing left the clients again
    assert (run / "ledger.json").read_bytes() == before  # nothing charged again
    again = load_tensors(run / "ckpt" / "release-state.safetensors")
    for k in ("hnet.space_mean", "hnet.base.cb"):
        assert torch.equal(again[k], whole[k]), k  # the same sums, post-processed again
