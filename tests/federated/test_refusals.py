"""Refusals that must happen before any privacy budget is spent (fresh-user findings)."""

import json

import pytest

from fedhype.data.partition import make_partition
from fedhype.errors import ArtifactError, ValidationError
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import plan_privacy, train

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


@pytest.mark.parametrize("kw, match", [
    (dict(noise_multiplier=0.0, epsilon=None), "use --no-dp"),
    (dict(noise_multiplier=float("inf"), epsilon=None), "finite"),
    (dict(lr_local=float("nan")), "lr_local"),
    (dict(lr_code=0.0), "lr_code"),
])
def test_no_privacy_or_nonsense_settings_are_refused_up_front(kw, match):
    with pytest.raises(ValidationError, match=match):
        TrainConfig(**kw)


def test_budget_plan_is_the_engines_plan_including_the_class_statistics():
    from fedhype.cli.budget_cmd import budget_plan

    sizes = [1500, 750]
    res = budget_plan(1e-4, 8, 256, [(str(i), str(i), n) for i, n in enumerate(sizes)], local_epochs=2,
                      target_epsilon=1.0, class_stats_share=0.8)
    eng = plan_privacy(TrainConfig(rounds=8, local_epochs=2, batch_size=256, epsilon=1.0, delta=1e-4,
                                   class_stats_share=0.8), sizes)
    assert res["noise_multiplier"] == pytest.approx(eng["noise_multiplier"], rel=1e-12)
    assert res["class_stats_noise_multiplier"] == pytest.approx(eng["class_stats_noise_multiplier"], rel=1e-12)
    assert 0.78 < res["class_stats_epsilon"] <= 0.8 + 0.02 and res["epsilon"] <= 1.0
    # without the release (dp-cvae) σ is smaller
    plain = budget_plan(1e-4, 8, 256, [(str(i), str(i), n) for i, n in enumerate(sizes)], local_epochs=2,
                        target_epsilon=1.0)
    assert plain["noise_multiplier"] < res["noise_multiplier"] and plain["class_stats_noise_multiplier"] is None


def test_corrupt_client_state_on_resume_is_refused_before_charging(real_store, tmp_path):
    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    cfg = TrainConfig(rounds=3, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=None, model=SMALL)
    train(real_store, part, cfg, tmp_path / "r", diagnostics=False, stop_after=1)
    ledger = tmp_path / "r" / "ledger.json"
    before = json.loads(ledger.read_text())["events"]
    state = next((tmp_path / "r" / "clients").glob("*/state-r1.safetensors"))
    state.write_bytes(state.read_bytes()[:100])
    for _ in range(2):
        with pytest.raises(ArtifactError):
            train(real_store, part, cfg, tmp_path / "r", diagnostics=False, resume=True)
    assert json.loads(ledger.read_text())["events"] == before  # nothing charged for releases that never happened


def test_resume_with_other_settings_names_what_differs(real_store, tmp_path):
    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    cfg = TrainConfig(rounds=2, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=0, model=SMALL)
    train(real_store, part, cfg, tmp_path / "r", diagnostics=False, stop_after=1)
    other = TrainConfig(rounds=2, local_steps=1, batch_size=32, epsilon=3.0, delta=1e-4, seed=0, model=SMALL)
    with pytest.raises(ValidationError, match=r"train\.epsilon: 2\.0 → 3\.0"):
        train(real_store, part, other, tmp_path / "r", diagnostics=False, resume=True)


def test_job_set_values_keep_their_types():
    from fedhype.pipeline.config import resolve

    with pytest.raises(ValidationError, match="train.rounds must be a number"):
        resolve(None, ["train.rounds=abc"])
    with pytest.raises(ValidationError, match="must be true or false"):
        resolve(None, ["train.no_dp=1"])
    assert resolve(None, ["train.rounds=3.0"])["train"]["rounds"] == 3


def test_a_latent_size_above_the_embedding_dimension_is_refused_before_anything_is_spent(real_store, tmp_path):
    """``--latent 500`` on 384-d embeddings was accepted (a new user's probe): the linear-Gaussian path has rank
    ≤ D, so it is refused with the key named, before the ledger exists. ``auto`` and ``latent = D`` are fine."""
    part = make_partition(real_store, scheme="domain", seed=0)
    cfg = TrainConfig(rounds=1, local_steps=1, epsilon=1.0, seed=0, model={**SMALL, "latent": real_store.dim + 1})
    with pytest.raises(ValidationError, match=f"model.latent \\(--latent\\) = {real_store.dim + 1} exceeds .* D = {real_store.dim}"):
        train(real_store, part, cfg, tmp_path / "run", diagnostics=False)
    assert not (tmp_path / "run" / "ledger.json").exists()
    from fedhype.models.config import DP_LATENT, resolve_latent

    assert resolve_latent("auto", 32, private=True) == min(DP_LATENT, 32) == 32  # a small encoder: auto fits D
    assert TrainConfig(model={"latent": real_store.dim}).model_config(real_store.dim, 10).latent == real_store.dim


def test_a_new_run_is_never_written_into_a_folder_holding_other_files(real_store, tmp_path):
    """The engine itself (not only the CLI's --out check) refuses a folder with foreign files: the Flower
    ServerApp's run-dir= had trained a whole run into a site folder beside its private site.json."""
    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "site.json").write_text("{}")
    with pytest.raises(ValidationError, match=r"already holds files that are not a fedhype run \(site.json\)"):
        train(real_store, part, TrainConfig(rounds=1, local_steps=1, batch_size=32, epsilon=4.0, model=SMALL), folder,
              diagnostics=False)
    assert sorted(p.name for p in folder.iterdir()) == ["site.json"]  # not even the writer lock
