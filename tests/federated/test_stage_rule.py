"""The DP-SGD stage rule (``train.dp_sgd_min_records``, docs/method.md decision 22): ``fedhypevae`` runs without its
DP-SGD stage — the ``no-dp-sgd`` model, the release taking the whole ε — where the median client has fewer training
records than the threshold; client sizes are public, so the rule spends nothing."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHIPPED_DP_SGD_MIN_RECORDS

from fedhype.data.partition import make_partition
from fedhype.errors import ValidationError
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.federated.rundir import load_model
from fedhype.privacy.ledger import PrivacyLedger

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="domain", seed=0)


def test_the_rule_is_the_median_client_against_the_threshold_for_ours_under_dp_per_client_only():
    cfg = TrainConfig(dp_sgd_min_records=1000)
    assert cfg.for_clients([999, 10, 5000]).method == "no-dp-sgd"  # median 999 < 1000
    assert cfg.for_clients([1000, 10, 5000]).method == "fedhypevae"  # median 1000: the stage runs
    assert cfg.for_clients({"a": 400, "b": 1600}).method == "fedhypevae"  # median of two: 1000
    assert cfg.for_clients({"a": 400, "b": 1598}).method == "no-dp-sgd"
    off = cfg.stage_off_reason([750, 750, 1078, 1500])  # the bundled digits job's sizes
    assert off.startswith("the median client has 914 training records, fewer than train.dp_sgd_min_records = 1,000")
    # idempotent, and nothing else of the configuration moves
    once = cfg.for_clients([10])
    assert once.for_clients([10]) == once and {k: v for k, v in once.to_dict().items() if k != "method"} == \
        {k: v for k, v in cfg.to_dict().items() if k != "method"}
    # only ours, with per-client releases: the rule was measured there only
    for other in (TrainConfig(dp_sgd_min_records=1000, method="no-mmd"),
                  TrainConfig(dp_sgd_min_records=1000, secure_aggregation=True),
                  TrainConfig(dp_sgd_min_records=1000, model={"class_bias": False}),  # no release: the stage is all
                  TrainConfig(dp_sgd_min_records=0),
                  TrainConfig(dp_sgd_min_records=0, no_dp=True, epsilon=None)):  # 0 runs the stage without DP too
        assert other.for_clients([10, 10]) is other and other.stage_off_reason([10, 10]) is None
    # without DP the stage is off whatever the sizes: the exact statistics' Gaussian was ahead on every validation
    # set (docs/method.md, decision 25)
    no_dp = TrainConfig(dp_sgd_min_records=1000, no_dp=True, epsilon=None)
    for sizes in ([10, 10], [5000, 5000]):
        assert no_dp.for_clients(sizes).method == "no-dp-sgd"
        assert no_dp.stage_off_reason(sizes).startswith("without DP the statistics release is exact")
    assert "decision 25" in no_dp.stage_off_reason([5000]) and "train.dp_sgd_min_records = 0 runs the training " \
        "stage" in no_dp.stage_off_reason([5000])
    for bad in (-1, 1.5, "auto", True):
        with pytest.raises(ValidationError, match="train.dp_sgd_min_records"):
            TrainConfig(dp_sgd_min_records=bad)


def test_stage_rule_applies_is_the_rule_without_the_sizes():
    """The conditions under which the client sizes decide (``fedhype run`` announces the rule on them), in one place
    with :meth:`stage_off_reason` (which adds the median against the threshold)."""
    assert TrainConfig(dp_sgd_min_records=1000).stage_rule_applies() is True
    assert TrainConfig(dp_sgd_min_records=1000, epsilon=None, noise_multiplier=2.0).stage_rule_applies() is True
    assert TrainConfig(dp_sgd_min_records=1000, no_dp=True, epsilon=None).stage_rule_applies() is True
    for other in (TrainConfig(dp_sgd_min_records=1000, method="no-mmd"),
                  TrainConfig(dp_sgd_min_records=1000, method="no-dp-sgd"),
                  TrainConfig(dp_sgd_min_records=1000, secure_aggregation=True),
                  TrainConfig(dp_sgd_min_records=1000, model={"class_bias": False}),
                  TrainConfig(dp_sgd_min_records=0)):
        assert other.stage_rule_applies() is False
        assert other.stage_off_reason([1]) is None  # whatever the sizes
    cfg = TrainConfig(dp_sgd_min_records=1000)
    assert cfg.stage_off_reason([999]) is not None and cfg.stage_off_reason([1000]) is None
    assert cfg.stage_off_reason([]) is None  # no sizes, no median: the rule applies but says nothing


def test_a_quoted_or_fractional_threshold_is_refused_naming_the_key_and_what_to_give(tmp_path):
    """``--set train.dp_sgd_min_records='"1500"'`` (a TOML string) must be refused, as 1500.5, true and -1, naming the
    key and a whole number ≥ 0; the string with how to write it."""
    from typer.testing import CliRunner

    from fedhype.cli.main import app
    from fedhype.pipeline.config import resolve, train_config

    with pytest.raises(ValidationError, match=r"train\.dp_sgd_min_records .*must be a whole number ≥ 0 .*got '1500': "
                                              r"write it unquoted, e\.g\. train\.dp_sgd_min_records = 1500"):
        TrainConfig(dp_sgd_min_records="1500")
    for bad in (1500.5, 1500.0, True, -1):
        with pytest.raises(ValidationError, match=r"train\.dp_sgd_min_records .*must be a whole number ≥ 0") as e:
            TrainConfig(dp_sgd_min_records=bad)
        assert "unquoted" not in str(e.value)
    conf = resolve(None, ['train.dp_sgd_min_records="1500"'])
    with pytest.raises(ValidationError, match=r"train\.dp_sgd_min_records .*got '1500': write it unquoted"):
        train_config(conf)
    assert train_config(resolve(None, ["train.dp_sgd_min_records=1500"])).dp_sgd_min_records == 1500
    r = CliRunner().invoke(app, ["run", "--out", str(tmp_path / "job"), "--set", 'train.dp_sgd_min_records="1500"'])
    assert r.exit_code == 2, r.output
    assert "train.dp_sgd_min_records must be a whole number ≥ 0" in r.output  # `fedhype run` has no such option
    assert "--dp-sgd-min-records" not in r.output
    assert not (tmp_path / "job").exists()  # refused before anything was embedded or written


def test_without_dp_the_notes_give_decision_25_and_a_resume_keeps_its_recorded_threshold(monkeypatch):
    """A reviewer's findings: round settings given to a no-DP run were said to have no effect "because the median
    client is below train.dp_sgd_min_records", and a no-DP run begun under another threshold lost it on resume."""
    from fedhype.federated import config
    from fedhype.federated.run_plan import resolve_stage

    monkeypatch.setattr(config, "DEFAULT_DP_SGD_MIN_RECORDS", SHIPPED_DP_SGD_MIN_RECORDS)
    cfg = TrainConfig(no_dp=True, epsilon=None, rounds=3)
    notes = " ".join(cfg.plan_warnings({"a": 5000, "b": 5000}, "train.batch_size"))
    assert "no training round runs (without DP the exact statistics' Gaussian is the model: docs/method.md " \
        "decision 25): train.rounds has no effect" in notes and "median client" not in notes
    begun = {"train": {"method": "fedhypevae", "dp_sgd_min_records": 0, "no_dp": True}}
    kept = resolve_stage(TrainConfig(no_dp=True, epsilon=None), [10, 10], begun)
    assert kept.method == "fedhypevae" and kept.dp_sgd_min_records == 0
    before_rule = {"train": {"method": "fedhypevae", "dp_sgd_min_records": SHIPPED_DP_SGD_MIN_RECORDS, "no_dp": True}}
    assert resolve_stage(TrainConfig(no_dp=True, epsilon=None), [10, 10], before_rule).method == "fedhypevae"
    assert resolve_stage(TrainConfig(no_dp=True, epsilon=None), [10, 10], None).method == "no-dp-sgd"


def test_the_shipped_threshold_switches_the_stage_off_for_the_digits_job_and_keeps_it_for_large_clients(monkeypatch):
    from fedhype.federated import config

    monkeypatch.setattr(config, "DEFAULT_DP_SGD_MIN_RECORDS", SHIPPED_DP_SGD_MIN_RECORDS)
    cfg = TrainConfig()
    assert cfg.dp_sgd_min_records == SHIPPED_DP_SGD_MIN_RECORDS
    # the measured client sizes (median): digits 914, Fashion-MNIST 10,000 images ~650, 100 clients of all 70,000
    # ~400 → off; 20 and 10 clients of all 70,000 (2,287 and 4,154) → on (docs/method.md, decision 22)
    twenty = [912, 1169, 1256, 1274, 1598, 1606, 1737, 1849, 2117, 2271, 2302, 2336, 2348, 2398, 2517, 2521, 2626,
              2817, 2987, 3362]
    for sizes in ([750, 750, 1078, 1500], [650] * 10, [420] * 100):
        assert cfg.for_clients(sizes).method == "no-dp-sgd"
    for sizes in (twenty, [1570, 2276, 2579, 3187, 4142, 4165, 4678, 4868, 6430, 8105]):
        assert cfg.for_clients(sizes).method == "fedhypevae"


def test_ours_below_the_threshold_is_the_no_dp_sgd_run_itself(real_store, part, tmp_path):
    """The engine resolves the rule: the run records method no-dp-sgd, spends the whole ε on the release (no DP-SGD
    event in the ledger) and, with the same seed, is the explicit ``--method no-dp-sgd`` run parameter for parameter."""
    ruled = train(real_store, part, TrainConfig(epsilon=4.0, seed=0, model=SMALL, dp_sgd_min_records=10_000),
                  tmp_path / "ruled", diagnostics=False)
    named = train(real_store, part, TrainConfig(epsilon=4.0, seed=0, model=SMALL, method="no-dp-sgd",
                                                dp_sgd_min_records=10_000), tmp_path / "named", diagnostics=False)
    assert ruled.rounds == 0 and ruled.rounds_planned == 0 and ruled.complete
    assert ruled.class_stats_noise_multiplier == pytest.approx(named.class_stats_noise_multiplier, rel=1e-12)
    assert 3.9 < ruled.epsilon <= 4.0 + 1e-6 and ruled.epsilon == pytest.approx(named.epsilon, rel=1e-12)
    conf = json.loads((tmp_path / "ruled" / "config.json").read_text())
    assert conf["train"]["method"] == "no-dp-sgd" and conf["train"]["dp_sgd_min_records"] == 10_000
    events = PrivacyLedger.load(tmp_path / "ruled" / "ledger.json").events
    assert events and not any(e.mechanism == "dp-sgd" for e in events)
    (h1, c1, m1), (h2, c2, _) = load_model(tmp_path / "ruled"), load_model(tmp_path / "named")
    assert m1["method"] == "no-dp-sgd" and torch.equal(c1, c2)
    s1, s2 = h1.state_dict(), h2.state_dict()
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)
    # at or above the threshold the stage runs (the median client here has 108 training records)
    staged = train(real_store, part, TrainConfig(epsilon=4.0, seed=0, model=SMALL, rounds=1, dp_sgd_min_records=100),
                   tmp_path / "staged", diagnostics=False)
    assert staged.rounds == 1
    assert any(e.mechanism == "dp-sgd" for e in PrivacyLedger.load(tmp_path / "staged" / "ledger.json").events)
    # the results' own claims (report.json takes them as they are): C and per-round bytes only where a round ran; the
    # ruled run and the explicit no-dp-sgd run claim the same (the result kept C = 1.5 and the model's per-round bytes)
    from fedhype.federated.result import NO_ROUND_TRAFFIC

    n_theta = staged.traffic["generated_parameters_per_client"]
    assert staged.clip_norm == 1.5 and staged.traffic["upload_bytes_per_round"] == 4 * n_theta > 0
    assert "note" not in staged.traffic
    for off in (ruled, named):
        assert off.clip_norm is None and off["clip_norm"] is None
        assert off.traffic == {"hypernetwork_parameters": staged.traffic["hypernetwork_parameters"],
                               "generated_parameters_per_client": n_theta,  # the model's size is still said
                               "download_bytes_per_round": 0, "upload_bytes_per_round": 0, "note": NO_ROUND_TRAFFIC}


def test_a_run_begun_before_the_rule_resumes_with_its_stage(real_store, part, tmp_path):
    """A run whose config.json predates the rule (no train.dp_sgd_min_records) resumes with the method it began
    with, as a run keeps its latent size: a new default must not stop a paid-for run."""
    cfg = TrainConfig(epsilon=4.0, seed=0, model=SMALL, rounds=2, dp_sgd_min_records=0)
    train(real_store, part, cfg, tmp_path / "run", diagnostics=False, stop_after=1)
    path = tmp_path / "run" / "config.json"
    conf = json.loads(path.read_text())
    del conf["train"]["dp_sgd_min_records"]
    del conf["config_sha256"]  # a run from before the rule predates the file's seal too
    path.write_text(json.dumps(conf))
    res = train(real_store, part, TrainConfig(epsilon=4.0, seed=0, model=SMALL, rounds=2, dp_sgd_min_records=10_000),
                tmp_path / "run", resume=True, diagnostics=False)
    assert res.rounds == 2 and res.complete
    assert json.loads(path.read_text())["train"]["method"] == "fedhypevae"
    # a run begun under the rule resumes with the threshold it recorded: given the release's default (0 in these
    # tests), it keeps its own; given another explicitly, the resume is refused naming it (a probe's no-op resume
    # with another value rewrote the recorded one, which then reached the shareable release's config)
    train(real_store, part, TrainConfig(epsilon=4.0, seed=0, model=SMALL, dp_sgd_min_records=10_000),
          tmp_path / "ruled", diagnostics=False)
    again = train(real_store, part, TrainConfig(epsilon=4.0, seed=0, model=SMALL), tmp_path / "ruled", resume=True,
                  diagnostics=False)
    assert again.rounds == 0 and again.complete and again.method == "no-dp-sgd"
    ruled = json.loads((tmp_path / "ruled" / "config.json").read_text())["train"]
    assert ruled["dp_sgd_min_records"] == 10_000 and ruled["method"] == "no-dp-sgd"
    for other in (5_000, 50):
        with pytest.raises(ValidationError, match="train.dp_sgd_min_records: 10000 → " + str(other)):
            train(real_store, part, TrainConfig(epsilon=4.0, seed=0, model=SMALL, dp_sgd_min_records=other),
                  tmp_path / "ruled", resume=True, diagnostics=False)
    # a run without DP begun before decision 25 (its training stage recorded under the default threshold) resumes
    # with its stage; a new one trains no round
    shipped = dict(epsilon=None, no_dp=True, seed=0, model=SMALL, rounds=2,
                   dp_sgd_min_records=SHIPPED_DP_SGD_MIN_RECORDS)  # (the tests' default threshold is 0)
    train(real_store, part, TrainConfig(**{**shipped, "dp_sgd_min_records": 0}), tmp_path / "nodp", diagnostics=False,
          stop_after=1)
    path = tmp_path / "nodp" / "config.json"
    conf = json.loads(path.read_text())
    conf["train"]["dp_sgd_min_records"] = SHIPPED_DP_SGD_MIN_RECORDS  # as the shipped default recorded it before
    del conf["config_sha256"]  # (before the file's seal too)
    path.write_text(json.dumps(conf))
    res = train(real_store, part, TrainConfig(**shipped), tmp_path / "nodp", resume=True, diagnostics=False)
    assert res.rounds == 2 and res.complete and res.method == "fedhypevae"
    fresh = train(real_store, part, TrainConfig(**shipped), tmp_path / "nodp-new", diagnostics=False)
    assert fresh.rounds == 0 and fresh.method == "no-dp-sgd"


def test_a_method_without_rounds_and_a_model_without_a_release_is_refused(real_store, part, tmp_path):
    """``no-dp-sgd`` (or ``dp-gaussian``) with ``model.class_bias = false`` wrote an untrained model and no ledger:
    nothing released, nothing trained (found while building the rule, 2026-12-06)."""
    for method in ("no-dp-sgd", "dp-gaussian"):
        with pytest.raises(ValidationError, match="model.class_bias = false releases none"):
            train(real_store, part, TrainConfig(method=method, epsilon=1.0, model={**SMALL, "class_bias": False}),
                  tmp_path / method, diagnostics=False)
        assert not (tmp_path / method).exists()


def test_the_python_api_says_the_stage_is_off_and_what_it_trained(real_store, part):
    """A probe: FedHypeVAE().fit trained no-dp-sgd without a word and its repr still said fedhypevae, rounds=8."""
    import fedhype
    from fedhype.errors import FedhypeWarning

    gen = fedhype.FedHypeVAE(epsilon=4.0, seed=0, train={"dp_sgd_min_records": 10_000}, model=SMALL)
    with pytest.warns(FedhypeWarning, match="fit: the median client has 108 training records, fewer than "
                                            "train.dp_sgd_min_records = 10,000"):
        gen.fit(real_store, part, diagnostics=False)
    assert gen.result_["method"] == "no-dp-sgd" and gen.result_["rounds"] == 0
    assert gen.result_["noise_multiplier"] is None and gen.result_["class_stats_noise_multiplier"] > 0
    assert "trained as 'no-dp-sgd': no DP-SGD round" in repr(gen)
