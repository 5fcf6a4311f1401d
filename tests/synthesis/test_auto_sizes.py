"""``model.latent = "auto"`` and ``synthesis.per_class = "auto"``: the rank of the model and the synthetic set's size
follow the run's privacy (64 and 300 with DP; D and 3,000 without: benchmarks/results/no_dp_rank.md)."""

import pytest

from fedhype.errors import ValidationError
from fedhype.federated.config import TrainConfig
from fedhype.models.config import DP_LATENT, ModelConfig, resolve_latent
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
