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
