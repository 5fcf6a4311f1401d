"""A job folder whose training started refuses other settings, naming what differs."""

import json

import pytest

from fedhype.errors import ValidationError
from fedhype.pipeline.config import resolve
from fedhype.pipeline.job import run_job


def test_a_started_job_names_the_setting_that_differs(tmp_path):
    out = tmp_path / "job"
    (out / "run").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(resolve(None, ["train.epsilon=1"])))
    (out / "run" / "config.json").write_text("{}")  # training had started
    with pytest.raises(ValidationError, match=r"train\.epsilon: 1 → 4"):
        run_job(resolve(None, ["train.epsilon=4"]), out, log=lambda s: None)


def test_config_toml_round_trips_any_string_and_lists_what_is_unset(tmp_path):
    import tomllib

    from fedhype.pipeline.config import resolve, to_toml

    odd = 'C:\\images\\site "a"\\'  # backslashes and quotes: the old hand-written writer emitted invalid TOML
    conf = resolve(None, [f"data.images='{odd}'"])  # a TOML literal string: taken as written
    assert conf["data"]["images"] == odd
    text = to_toml(conf)
    back = tomllib.loads(text)
    assert back["data"]["images"] == conf["data"]["images"]
    assert text.startswith("# not set (none): ") and "train.noise_multiplier" in text.splitlines()[0]
    (tmp_path / "job.toml").write_text(text)
    assert resolve(tmp_path / "job.toml") == conf  # the written file reproduces the job


def test_data_store_takes_an_existing_real_store_and_refuses_the_rest(real_store, tmp_path):
    import pytest
    import torch

    from fedhype.data.store import EmbeddingStore
    from fedhype.errors import ValidationError
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import embed_store

    real_store.save(tmp_path / "emb.safetensors")
    conf = resolve(None, [f"data.store='{tmp_path / 'emb.safetensors'}'"])
    got = embed_store(conf["data"], progress=False)
    assert torch.equal(got.embeddings, real_store.embeddings) and got.sample_ids == real_store.sample_ids
    syn = EmbeddingStore(real_store.embeddings[:10], real_store.labels[:10], real_store.domains[:10],
                         real_store.sample_ids[:10], real_store.class_names, real_store.domain_names, {"kind": "synthetic"})
    syn.save(tmp_path / "syn.safetensors")
    with pytest.raises(ValidationError, match="is a 'synthetic' store"):
        embed_store(resolve(None, [f"data.store='{tmp_path / 'syn.safetensors'}'"])["data"])
    with pytest.raises(ValidationError, match="data.store = .*: no such file"):
        embed_store(resolve(None, [f"data.store='{tmp_path / 'nope.safetensors'}'"])["data"])
    with pytest.raises(ValidationError, match="data.images .* and data.store .* both name the real data"):
        resolve(None, [f"data.store='{tmp_path / 'emb.safetensors'}'", f"data.images='{tmp_path}'"])


def test_no_dp_of_a_later_layer_overrides_a_config_files_epsilon(tmp_path):
    """--set train.no_dp=true over a config file with a target ε (configs/fashion-mnist.toml) runs without
    DP; asking both in one layer, or ε in a later layer than no_dp, is refused."""
    from pathlib import Path

    fashion = Path(__file__).resolve().parents[2] / "configs" / "fashion-mnist.toml"
    conf = resolve(fashion, ["train.no_dp=true"])
    assert conf["train"]["no_dp"] is True and conf["train"]["epsilon"] is None
    both = tmp_path / "both.toml"
    both.write_text("[train]\nno_dp = true\nepsilon = 2.0\n")
    with pytest.raises(ValidationError, match="asks for privacy but train.no_dp"):
        resolve(both)
    off = tmp_path / "off.toml"
    off.write_text("[train]\nno_dp = true\n")
    with pytest.raises(ValidationError, match=r"--set train.epsilon=4: train.epsilon asks for privacy"):
        resolve(off, ["train.epsilon=4"])
