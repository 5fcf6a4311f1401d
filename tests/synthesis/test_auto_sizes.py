"""``model.latent = "auto"`` and ``synthesis.per_class = "auto"``: the rank of the model and the synthetic set's size
follow the run's privacy and size (64 and 300 with DP below 500 training records per class, 128 and 3,000 from
500: benchmarks/results/release_scale.md; D and 3,000 without DP: benchmarks/results/no_dp_rank.md)."""

from dataclasses import replace

import pytest

from fedhype.errors import FedhypeWarning, ValidationError
from fedhype.federated.config import TrainConfig
from fedhype.models.config import (DP_LATENT, MAX_AUTO_CODE_DIM, SCALE_LATENT, SCALE_RECORDS_PER_CLASS, ModelConfig,
                                   resolve_code_dim, resolve_latent)
from fedhype.pipeline.config import DEFAULTS, resolve


def test_latent_auto_is_64_with_dp_and_full_rank_without():
    assert DEFAULTS["model"]["latent"] == "auto" and DEFAULTS["synthesis"]["per_class"] == "auto"
    assert TrainConfig().model_config(384, 10).latent == DP_LATENT == 64
    assert TrainConfig(no_dp=True, epsilon=None).model_config(384, 10).latent == 384
    # a size the user gives wins, with or without DP
    assert TrainConfig(no_dp=True, epsilon=None, model={"latent": 32}).model_config(384, 10).latent == 32
    assert TrainConfig(model={"latent": 100}).model_config(384, 10).latent == 100
    assert ModelConfig(dim=384, n_classes=10).latent == 64  # built directly: the DP size
    for bad in (0, -3, "big", 2.5, True):
        with pytest.raises(ValidationError, match="model.latent"):
            resolve_latent(bad, 384, private=True)


def test_latent_auto_is_128_with_dp_from_500_training_records_per_class():
    """The scale rule reads only public values: the roster's training-set sizes summed over the number of classes."""
    assert SCALE_RECORDS_PER_CLASS == 500 and SCALE_LATENT == 128
    dp, no_dp = TrainConfig(), TrainConfig(no_dp=True, epsilon=None)
    assert dp.model_config(384, 10, n_train=4999).latent == 64  # 499.9 per class
    assert dp.model_config(384, 10, n_train=5000).latent == 128
    assert dp.model_config(384, 10, n_train=42_000).latent == 128  # all 70,000 Fashion-MNIST images
    assert dp.model_config(384, 10, n_train=4_100).latent == 64  # the bundled digits job
    assert dp.model_config(384, 10).latent == 64  # sizes not known: the small-data size
    assert no_dp.model_config(384, 10, n_train=5000).latent == 384  # without DP: full rank, whatever the size
    assert dp.model_config(96, 10, n_train=50_000).latent == 96  # never above D
    assert TrainConfig(model={"latent": 32}).model_config(384, 10, n_train=50_000).latent == 32  # a given size wins
    assert resolve_latent("auto", 384, private=True, records_per_class=500.0) == 128
    assert resolve_latent("auto", 384, private=True, records_per_class=499.5) == 64


def test_the_plan_resolves_the_latent_from_the_roster_sizes():
    from types import SimpleNamespace

    from fedhype.federated.run_plan import check_plan

    def roster(sizes):
        return SimpleNamespace(clients=[SimpleNamespace(name=str(i), n_train=n, n_records=n) for i, n in enumerate(sizes)])

    cfg = TrainConfig(epsilon=1.0, delta=1e-5)
    assert check_plan(roster([2500, 2499]), cfg, 384, 10)[0].latent == 64
    assert check_plan(roster([2500, 2500]), cfg, 384, 10)[0].latent == 128
    assert check_plan(roster([2500, 2500]), cfg, 384, 11)[0].latent == 64  # 454.5 per class
    # local-cvae fits one model per client: its records per class are one client's (2,500 / 10 here)
    local = TrainConfig(method="local-cvae", epsilon=1.0, delta=1e-5)
    assert check_plan(roster([2500, 2500]), local, 384, 10)[0].latent == 64
    assert check_plan(roster([5000, 5000]), local, 384, 10)[0].latent == 128
    central = TrainConfig(method="central-cvae", epsilon=1.0, delta=1e-5)  # pooled: every record in one model
    assert check_plan(roster([5000]), central, 384, 10)[0].latent == 128


def test_synthetic_per_class_auto_follows_the_model_s_latent_size():
    from fedhype.synthesis import AUTO_PER_CLASS, auto_per_class

    assert AUTO_PER_CLASS == {"dp": 300, "no_dp": 3000}
    assert auto_per_class({"private": True}, 64) == 300
    assert auto_per_class({"private": True}, 128) == 3000  # the scale rule's larger DP model
    assert auto_per_class({"private": True}) == 300  # L unknown: the DP size
    assert auto_per_class({"private": False}, 64) == 3000  # without DP always the larger set


def test_job_config_takes_auto_or_a_count_and_names_the_key_otherwise():
    conf = resolve(None, ["model.latent=32", "synthesis.per_class=1000"])
    assert conf["model"]["latent"] == 32 and conf["synthesis"]["per_class"] == 1000
    assert resolve(None, ['model.latent="auto"'])["model"]["latent"] == "auto"
    for bad in ('model.latent="x"', "model.latent=0", "synthesis.per_class=2.5", "synthesis.per_class=false"):
        with pytest.raises(ValidationError, match=bad.split("=")[0] + ' must be "auto" or an integer'):
            resolve(None, [bad])
    # the other keys whose default is "auto" stay free strings
    assert resolve(None, ['data.device="cpu"'])["data"]["device"] == "cpu"


@pytest.mark.parametrize("no_dp, latent, per_class", [(False, 64, 300), (True, 384, 3000)])
def test_a_trained_run_is_sampled_at_its_privacy_s_size(real_store, tmp_path, no_dp, latent, per_class):
    from fedhype.data.partition import make_partition
    from fedhype.federated.engine import train
    from fedhype.federated.rundir import load_model
    from fedhype.synthesis import synthesize

    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    cfg = TrainConfig(method="dp-gaussian", no_dp=no_dp, epsilon=None if no_dp else 4.0, seed=0)
    train(real_store, part, cfg, tmp_path / "run", diagnostics=False)
    hnet, _, meta = load_model(tmp_path / "run")
    assert real_store.dim == 384 and hnet.cfg.latent == latent and meta["private"] is (not no_dp)
    syn = synthesize(tmp_path / "run", "neutral", per_class="auto", seed=0)
    assert syn.meta["counts"] == [per_class] * real_store.n_classes
    # an explicit size is kept; anything but "auto" or an integer is refused, naming the argument
    assert synthesize(tmp_path / "run", "neutral", per_class=7, seed=0).meta["counts"] == [7] * real_store.n_classes
    for bad in ("x", "300", 2.5, True):
        with pytest.raises(ValidationError, match='per_class must be "auto" or an integer'):
            synthesize(tmp_path / "run", "neutral", per_class=bad, seed=0)


def test_code_dim_auto_is_one_code_dimension_per_client_in_steps_of_32_up_to_128():
    """``model.code_dim = "auto"``: the client-statistics heads are exact only with code_dim ≥ clients
    (tests/federated/test_client_stats.py); the public client count sets it."""
    assert MAX_AUTO_CODE_DIM == 128 and ModelConfig(dim=384, n_classes=10).code_dim == 32  # built directly
    dp = TrainConfig()
    assert [dp.model_config(384, 10, n_clients=m).code_dim for m in (1, 4, 10, 32, 33, 40, 64, 65, 100, 128, 129, 10_000)] \
        == [32, 32, 32, 32, 64, 64, 64, 96, 128, 128, 128, 128]
    assert dp.model_config(384, 10).code_dim == 32  # clients not known
    # without client-statistics heads (secure aggregation: no client's own release; the dp-cvae baseline) it stays 32
    assert TrainConfig(secure_aggregation=True).model_config(384, 10, n_clients=100).code_dim == 32
    assert TrainConfig(method="dp-cvae").model_config(384, 10, n_clients=100).code_dim == 32
    assert TrainConfig(model={"code_dim": 16}).model_config(384, 10, n_clients=100).code_dim == 16  # a given size wins
    assert resolve(None, ["model.code_dim=auto"])["model"]["code_dim"] == "auto"
    assert resolve(None, ["model.code_dim=48.0"])["model"]["code_dim"] == 48
    for bad in (0, -3, "big", 2.5, True):
        with pytest.raises(ValidationError, match="model.code_dim"):
            resolve_code_dim(bad, 10)
    with pytest.raises(ValidationError, match="model.code_dim"):
        resolve(None, ["model.code_dim=0"])


def _roster(sizes):
    from types import SimpleNamespace

    return SimpleNamespace(clients=[SimpleNamespace(name=str(i), n_train=n, n_records=n) for i, n in enumerate(sizes)])


def test_the_plan_sizes_the_code_for_the_clients_one_server_holds():
    from fedhype.federated.run_plan import check_plan

    cfg = TrainConfig(epsilon=1.0, delta=1e-5)
    assert check_plan(_roster([100] * 40), cfg, 384, 10)[0].code_dim == 64
    assert check_plan(_roster([100] * 4), cfg, 384, 10)[0].code_dim == 32
    # fewer code dimensions than clients: the heads are a least-squares fit, said (a probe: code_dim = 8 for 48 clients
    # trained without a word)
    with pytest.warns(FedhypeWarning, match=r"model.code_dim = 8 is below the 40 clients: .* \"auto\" gives 64$"):
        check_plan(_roster([100] * 40), TrainConfig(epsilon=1.0, delta=1e-5, model={"code_dim": 8}), 384, 10)
    with pytest.warns(FedhypeWarning, match=r"below the 200 clients: .* gives 128 \(its most\)"):
        assert check_plan(_roster([100] * 200), cfg, 384, 10)[0].code_dim == 128
    # local-cvae: one server per client, so one client's code (a reviewer's finding: it was sized for all 40,
    # 64 dimensions of client heads it never fits, with model.client_stats switched on)
    local = TrainConfig(method="local-cvae", epsilon=1.0, delta=1e-5, model={"client_stats": True})
    assert check_plan(_roster([100] * 40), local, 384, 10)[0].code_dim == 32


def test_a_resumed_run_is_checked_for_memory_at_the_sizes_it_keeps(monkeypatch):
    """A run begun at code_dim 32 with 100 clients resumes at 32: the memory check must price that model, not the 128
    of today's "auto" (a reviewer's finding: a charged run was refused "nothing was written or charged")."""
    import fedhype.resources as res
    from fedhype.federated.run_plan import check_plan, training_memory

    cfg = TrainConfig(epsilon=1.0, delta=1e-5)
    roster = _roster([100] * 100)
    new = check_plan(roster, cfg, 384, 10)[0]
    kept_need = training_memory(replace(new, code_dim=32), cfg.method, 100)[1]
    assert new.code_dim == 128 and training_memory(new, cfg.method, 100)[1] > kept_need
    monkeypatch.setattr(res, "available_memory", lambda: kept_need + 1)
    with pytest.raises(ValidationError, match=r"model.code_dim = 128: the client-statistics heads hold 53,376 weights "
                                              r"per code dimension; \"auto\" gives one per client, 128 for 100 clients\)"):
        check_plan(roster, cfg, 384, 10)
    recorded = {"train": {"model": {"hidden": 128, "latent": "auto"}}, "model": {"latent": 64, "code_dim": 32}}
    assert check_plan(roster, cfg, 384, 10, recorded)[0].code_dim == 32
