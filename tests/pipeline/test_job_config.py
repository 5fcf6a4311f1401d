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
