"""The numeric settings of :class:`TrainConfig` and :class:`ModelConfig` refuse a value of the wrong kind naming the
key (a reviewer's finding: ``--set train.min_records='"20"'``, 8.5 and ``true`` were accepted, and a quoted
``train.local_steps`` failed inside TrainConfig with a TypeError that did not name it)."""

import math

import numpy as np
import pytest

from fedhype.errors import ValidationError
from fedhype.federated.config import TrainConfig
from fedhype.models.config import ModelConfig

#: every whole-number field of TrainConfig: (name, its flag, the smallest value, a valid value)
WHOLE = [("rounds", "--rounds", 1, 8), ("local_steps", "--local-steps", 1, 10), ("batch_size", "--batch-size", 1, 256),
         ("min_records", "--min-records", 0, 20), ("dp_sgd_min_records", "--dp-sgd-min-records", 0, 1500),
         ("dropout_tolerance", "--dropout-tolerance", 0, 0)]


def _refusal(**kw) -> str:
    with pytest.raises(ValidationError) as e:
        TrainConfig(**kw)
    return str(e.value)


@pytest.mark.parametrize("name, flag, minimum, good", WHOLE)
def test_a_whole_number_setting_refuses_a_string_a_float_a_bool_and_a_value_below_its_minimum(name, flag, minimum, good):
    key = f"train.{name}"
    head = f"{key} ({flag}) must be a whole number ≥ {minimum}"
    said = _refusal(**{name: str(good)})  # a quoted number: say to unquote it
    assert said.startswith(head) and f"got '{good}': write it unquoted, e.g. {key} = {good}" in said, said
    said = _refusal(**{name: "eight"})
    assert said.startswith(head) and f"got 'eight': give a whole number, e.g. {key} = " in said, said
    said = _refusal(**{name: good + 0.5})
    assert said.startswith(head) and f"got {good + 0.5}" in said and "unquoted" not in said, said
    said = _refusal(**{name: float(good)})  # 8.0: refused as dp_sgd_min_records always did, saying what to give
    assert said.startswith(head) and f"got {float(good)}: write it without a decimal point, e.g. {key} = {good}" in said
    for flag_value in (True, False):
        said = _refusal(**{name: flag_value})
        assert said.startswith(head) and f"got {flag_value}: give a number, not true/false, e.g. {key} = " in said
    said = _refusal(**{name: minimum - 1})
    assert said.startswith(head) and said.endswith(f"got {minimum - 1}"), said
    if name == "dropout_tolerance":  # t only means something under secure aggregation
        assert TrainConfig(secure_aggregation=True, dropout_tolerance=np.int64(1)).dropout_tolerance == 1
        return
    # a numpy integer (the Python API) is accepted as seed always was, and kept as a plain int (config.json)
    cfg = TrainConfig(**{name: np.int64(good)})
    assert getattr(cfg, name) == good and type(getattr(cfg, name)) is int
    assert getattr(TrainConfig(**{name: minimum}), name) == minimum


def test_the_whole_number_settings_keep_their_valid_values_and_defaults():
    cfg = TrainConfig()
    assert (cfg.rounds, cfg.local_steps, cfg.batch_size, cfg.min_records, cfg.dropout_tolerance) == (8, None, 256, 20, 0)
    assert TrainConfig(local_steps=None).local_steps is None  # unset: local_epochs sets the steps
    assert "train.local_steps (--local-steps) must be a whole number ≥ 1 or unset" in _refusal(local_steps=0)
    assert "(0: no minimum)" in _refusal(min_records=-1)
    assert "(0: always run the DP-SGD stage)" in _refusal(dp_sgd_min_records=-1)


def test_the_seed_is_checked_by_the_same_rule_with_its_upper_bound():
    head = "train.seed must be a whole number ≥ 0 and below 2^63, or none (noise from OS entropy), got "
    assert _refusal(seed="7") == head + "'7': write it unquoted, e.g. train.seed = 7"
    assert _refusal(seed=3.0) == head + "3.0: write it without a decimal point, e.g. train.seed = 3"
    assert _refusal(seed=2 ** 63) == head + str(2 ** 63) and _refusal(seed=-1) == head + "-1"
    assert TrainConfig(seed=np.uint64(2 ** 63 - 1)).seed == 2 ** 63 - 1 and TrainConfig(seed=None).seed is None


@pytest.mark.parametrize("name", ["local_epochs", "participation", "delta", "clip_norm", "lr_server", "lr_hyper",
                                  "lr_code", "lr_local", "class_stats_share", "second_moment_share", "centre_share",
                                  "release_radius", "class_stats_noise_multiplier", "max_epsilon", "epsilon",
                                  "noise_multiplier"])
def test_a_real_setting_refuses_a_string_and_a_bool_naming_the_key(name):
    """A quoted number raised a TypeError (``'<' not supported``) or passed (``lr_server = "1"`` said "got 1");
    true passed as 1 (ε = 1, σ = 1, participation 1) and false as 0 (second_moment_share, centre_share)."""
    kw = {"epsilon": None} if name == "noise_multiplier" else {}
    said = _refusal(**kw, **{name: "0.5"})
    assert f"train.{name}" in said and "got '0.5': write it unquoted" in said, said
    for flag_value in (True, False):
        said = _refusal(**kw, **{name: flag_value})
        assert f"train.{name}" in said and f"got {flag_value}: give a number, not true/false" in said, said
    said = _refusal(**kw, **{name: "abc"})
    assert f"train.{name}" in said and "got 'abc'" in said and "unquoted" not in said, said


@pytest.mark.parametrize("name", ["local_epochs", "clip_norm", "release_radius", "class_stats_noise_multiplier",
                                  "lr_server"])
def test_an_infinite_or_nan_real_setting_is_refused(name):
    """``train.clip_norm = inf`` (no clipping: no bound on a record's influence) and ``local_epochs = inf`` were
    accepted; NaN fails every range."""
    for bad in (math.inf, math.nan):
        assert f"train.{name}" in _refusal(**{name: bad})


def test_the_real_settings_keep_their_valid_values_and_accept_numpy_numbers():
    cfg = TrainConfig(lr_server=1, clip_norm=np.float32(0.5), second_moment_share=0, centre_share=0.0)
    assert cfg.lr_server == 1 and type(cfg.lr_server) is int  # as given (config.json unchanged)
    assert cfg.clip_norm == 0.5 and type(cfg.clip_norm) is float  # a numpy float as the float config.json records
    assert cfg.second_moment_share == 0 and cfg.centre_share == 0.0
    assert TrainConfig(epsilon=np.float64(2.0)).epsilon == 2.0
    assert TrainConfig(no_dp=True, epsilon=None).epsilon is None
    assert "train.participation must be in (0, 1]" in _refusal(participation=1.5)


def test_no_dp_must_be_a_switch():
    """``no_dp = "false"`` (a string, truthy) would have trained WITHOUT privacy."""
    assert "train.no_dp must be true or false, got 'false'" in _refusal(no_dp="false")


def test_a_model_whole_number_refuses_a_string_a_float_a_bool_and_zero():
    """``model.mmd_samples`` had no check (2.5 and true were taken); ``model.code_dim = true`` passed as 1 and
    ``int("64")`` let a quoted size through as a string."""
    for name, flag, good in (("hidden", "--hidden", 128), ("code_dim", None, 32), ("hyper_hidden", None, 128),
                             ("mmd_samples", None, 4)):
        key = f"model.{name}"
        head = f"{key} ({flag}) must be a whole number ≥ 1" if flag else f"{key} must be a whole number ≥ 1"
        for bad, says in ((str(good), f"got '{good}': write it unquoted, e.g. {key} = {good}"), (good + 0.5, None),
                          (float(good), f"write it without a decimal point, e.g. {key} = {good}"),
                          (True, "give a number, not true/false"), (0, None)):
            with pytest.raises(ValidationError) as e:
                ModelConfig(dim=8, n_classes=2, **{name: bad})
            assert str(e.value).startswith(head) and (says is None or says in str(e.value)), str(e.value)
        assert getattr(ModelConfig(dim=8, n_classes=2, **{name: np.int64(good)}), name) == good
    m = ModelConfig(dim=np.int64(8), n_classes=np.int64(2), latent=np.int64(4))  # sizes read from a store
    assert (m.dim, m.n_classes, m.latent) == (8, 2, 4) and all(type(v) is int for v in (m.dim, m.n_classes, m.latent))


def test_a_model_weight_or_bandwidth_refuses_a_string_a_bool_and_nan():
    """``model.beta = "0.5"`` passed as a string, ``"x"`` raised a bare ValueError, NaN passed every check."""
    for name in ("beta", "lambda_mmd", "lambda_lip"):
        for bad in ("0.5", True, math.nan, math.inf, -1.0):
            with pytest.raises(ValidationError, match=rf"^model\.{name} must be a finite number ≥ 0"):
                ModelConfig(dim=8, n_classes=2, **{name: bad})
        assert getattr(ModelConfig(dim=8, n_classes=2, **{name: 0}), name) == 0
    for bad in ((), (0.5, 0.0), (1.0, math.nan), ("a",), (True,), 2.0, "0.5"):
        with pytest.raises(ValidationError, match=r"^model\.mmd_bandwidths must be a list of finite numbers > 0"):
            ModelConfig(dim=8, n_classes=2, mmd_bandwidths=bad)
    assert ModelConfig(dim=8, n_classes=2, mmd_bandwidths=[1, 2]).mmd_bandwidths == (1.0, 2.0)
    with pytest.raises(ValidationError, match=r"^model\.class_bias must be true or false, got 'false'"):
        ModelConfig(dim=8, n_classes=2, class_bias="false")


def test_the_job_configuration_names_the_key_of_a_quoted_setting_without_a_job_default():
    """Through ``fedhype.pipeline.config``: a key the job does not list (no type from a default there) reached
    TrainConfig as given, and a quoted one came back as "a train.* or model.* setting has the wrong type"."""
    from fedhype.pipeline.config import resolve, train_config

    for item, says in (('train.local_steps="3"', "train.local_steps must be a whole number ≥ 1 or unset"),
                       ('train.min_records="20"', "got '20': write it unquoted, e.g. train.min_records = 20"),
                       ("train.min_records=8.5", "train.min_records must be a whole number ≥ 0"),
                       ("train.min_records=true", "train.min_records must be a whole number ≥ 0"),
                       ('train.lr_server="1"', "train.lr_server must be a finite number > 0, got '1': write it "
                                               "unquoted"),
                       ("model.mmd_samples=2.5", "model.mmd_samples must be a whole number ≥ 1, got 2.5"),
                       ("train.noise_multiplier=0", "train.noise_multiplier, the noise multiplier σ, must be a finite "
                                                    "number > 0, got 0 (σ = 0 gives no privacy: use train.no_dp = true")):
        with pytest.raises(ValidationError) as e:
            train_config(resolve(None, [item]))
        assert says in str(e.value) and "has the wrong type" not in str(e.value), (item, str(e.value))
        assert "(--" not in str(e.value) and "--no-dp" not in str(e.value)  # a job has keys, not `fedhype train`'s options
    # the job's own keys keep their conversion: rounds = 8.0 is 8 (pipeline.config._set_key), and so do the keys it
    # does not list (a probe: min_records = 20.0 was refused where rounds = 8.0 was taken)
    assert train_config(resolve(None, ["train.rounds=8.0", "train.min_records=30"])).rounds == 8
    cfg = train_config(resolve(None, ["train.min_records=30.0", "train.dp_sgd_min_records=1500.0"]))
    assert (cfg.min_records, cfg.dp_sgd_min_records) == (30, 1500) and type(cfg.min_records) is int
    # a quoted number of a key the job lists says to unquote it too
    with pytest.raises(ValidationError, match=r"train\.rounds must be a number, got '8'; write it unquoted"):
        resolve(None, ['train.rounds="8"'])


@pytest.mark.parametrize("item, says", [
    ('train.min_records="20"', "train.min_records must be a whole number ≥ 0 (0: no minimum), got "
                               "'20': write it unquoted, e.g. train.min_records = 20"),
    ("train.local_steps=2.5", "train.local_steps must be a whole number ≥ 1"),
    ("train.batch_size=0", "train.batch_size must be a whole number ≥ 1, got 0"),
])
def test_fedhype_run_refuses_a_bad_whole_number_naming_the_key_before_writing_anything(tmp_path, item, says):
    from typer.testing import CliRunner

    from fedhype.cli.main import app

    r = CliRunner().invoke(app, ["run", "--out", str(tmp_path / "job"), "--set", item])
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split()), r.output  # (the console may wrap the line)
    assert "(--" not in r.output  # `fedhype run` has no --min-records, --local-steps or --batch-size (they were named)
    assert not (tmp_path / "job").exists()  # refused before anything was embedded or written


@pytest.mark.parametrize("name, flag, minimum, good", WHOLE)
def test_a_job_configuration_takes_every_whole_number_written_with_a_decimal_point(name, flag, minimum, good):
    """In a job file (or ``--set``) 8.0 is 8 for every whole-number key, train.local_steps (unset by default)
    included: a probe's ``--set train.local_steps=2.0`` was refused where ``train.rounds=2.0`` was taken."""
    from fedhype.pipeline.config import resolve, train_config

    conf = resolve(None, [f"train.{name}={float(good)}"])
    assert conf["train"][name] == good and type(conf["train"][name]) is int
    if name != "dropout_tolerance":  # (a tolerance needs secure aggregation)
        assert getattr(train_config(conf), name) == good


def test_a_zero_noise_multiplier_is_refused_naming_the_key_and_the_non_private_switch():
    said = _refusal(noise_multiplier=0.0, epsilon=None)
    assert said.startswith("train.noise_multiplier (--noise-multiplier), the noise multiplier σ, must be a finite "
                           "number > 0, got 0.0") and "--no-dp (train.no_dp = true)" in said, said


def test_a_jobs_refusals_name_its_keys_not_fedhype_trains_options():
    """``fedhype run`` has no --epsilon, --no-dp or --secure-aggregation: a refusal of its training settings names the
    keys a job sets (a review found these left after the key-and-option forms were reworded)."""
    from fedhype.pipeline.config import job_words

    assert job_words("give --epsilon (target ε) or --noise-multiplier, or --no-dp for a non-private run") == \
        "give train.epsilon (target ε) or train.noise_multiplier, or train.no_dp = true for a non-private run"
    assert job_words("--dropout-tolerance applies to secure aggregation: add --secure-aggregation or drop it") == \
        "train.dropout_tolerance applies to secure aggregation: add train.secure_aggregation = true or drop it"
    assert job_words("train.rounds (--rounds) must be a whole number ≥ 1, got 0") == \
        "train.rounds must be a whole number ≥ 1, got 0"
    kept = "--set 'train.rounds=0' (0: no minimum) --epsilon-like"  # other options and parentheses are left alone
    assert job_words(kept) == kept
    from fedhype.pipeline.config import resolve, train_config

    with pytest.raises(ValidationError) as e:
        train_config(resolve(None, ["train.epsilon=none", "train.noise_multiplier=none"]))
    assert "--" not in str(e.value) and "train.epsilon" in str(e.value), str(e.value)
