"""report.json's per-client ε: keyed by client name, ledger ids kept, and checked by `fedhype audit`."""

from __future__ import annotations

import json
import shutil

import pytest

from fedhype.eval.audit_ledger import audit_run as audit
from fedhype.pipeline.report import by_name, client_epsilons


@pytest.fixture
def job(audit_run, tmp_path):
    """A `fedhype run`-style layout around the shared real DP run: job/run/ (2 iid clients)."""
    shutil.copytree(audit_run[0], tmp_path / "job" / "run")
    return tmp_path / "job"


def test_client_epsilons_carry_ids_and_names(job, audit_run):
    part = audit_run[1]
    eps = audit(job / "run")["epsilon_per_client"]  # ledger id → ε
    rows = client_epsilons(job / "run", eps)
    assert rows == [{"id": str(c.id), "name": c.name, "epsilon": eps[str(c.id)]} for c in part.clients]
    assert [r["name"] for r in rows] == ["client-0", "client-1"] and eps["0"] > 0
    assert by_name(rows) == {"client-0": eps["0"], "client-1": eps["1"]}
    # repeated names stay apart; a non-private run has no ε per client
    assert by_name([{"id": "0", "name": "a", "epsilon": 1.0}, {"id": "1", "name": "a", "epsilon": 2.0}]) == {
        "a [0]": 1.0, "a [1]": 2.0}
    assert [r["epsilon"] for r in client_epsilons(job / "run", None)] == [None, None]


def _write_report(job, per_name, rows, eps_worst):
    (job / "report.json").write_text(json.dumps({"epsilon": eps_worst, "delta": 1e-4, "clients": list(per_name),
                                                 "epsilon_per_client": per_name, "client_epsilons": rows}))


def _report_mismatches(job) -> dict:
    # only report.json's claims (the run's own claims are tests/eval/test_audit_ledger.py's)
    return {m["name"]: m for m in audit(job)["mismatches"] if m["name"].startswith(str(job / "report.json"))}


def test_audit_checks_name_keyed_report(job):
    res = audit(job)
    eps, worst = res["epsilon_per_client"], res["epsilon"]
    rows = client_epsilons(job / "run", eps)
    _write_report(job, by_name(rows), rows, worst)
    res = audit(job)
    assert _report_mismatches(job) == {}
    names = [r["name"] for r in res["checked"] if "report.json" in r["name"]]
    assert len(names) == 1 + 2 + 2 + 1  # epsilon, client_epsilons × 2, epsilon_per_client × 2, delta
    assert f"{job / 'report.json'}: epsilon_per_client[client-1]" in names
    assert f"{job / 'report.json'}: client_epsilons[1] (client-1)" in names
    # an edited figure under a client's name is caught, against that client's ledger ε
    per_name = by_name(rows)
    per_name["client-1"] += 0.25
    _write_report(job, per_name, rows, worst)
    got = _report_mismatches(job)
    assert set(got) == {f"{job / 'report.json'}: epsilon_per_client[client-1]"}
    assert got[f"{job / 'report.json'}: epsilon_per_client[client-1]"]["difference"] == pytest.approx(0.25)
    # a name that is no client of the run, and an edited id row, are mismatches too
    rows[0]["epsilon"] = 0.0
    _write_report(job, {**by_name(client_epsilons(job / "run", eps)), "client-9": 1.0}, rows, worst)
    got = _report_mismatches(job)
    assert set(got) == {f"{job / 'report.json'}: epsilon_per_client[client-9]",
                        f"{job / 'report.json'}: client_epsilons[0] (client-0)"}
    assert "not in client_epsilons" in got[f"{job / 'report.json'}: epsilon_per_client[client-9]"]["reason"]


def test_report_json_is_strict_json():
    import json
    import math

    from fedhype.pipeline.report import strict_json

    out = strict_json({"epsilon": math.inf, "x": [1.0, math.nan, {"y": -math.inf}], "n": 3})
    assert out == {"epsilon": None, "x": [1.0, None, {"y": None}], "n": 3}
    json.dumps(out, allow_nan=False)


def _glance_report(**kw) -> dict:
    base = {"private": True, "epsilon": 0.9991, "delta": 1e-4, "target_epsilon": 1.0, "n_classes": 10,
            "tstr_accuracy": 0.354, "trtr_accuracy": 0.882, "dp_fedavg_linear_accuracy": 0.522,
            "dp_fedavg_linear_epsilon": 0.9967, "dp_fedavg_linear_private": True, "mmd2": 0.094,
            "mmd2_p_value": 0.005, "precision": 0.0, "coverage": 0.0}
    return {**base, **kw}


def test_at_a_glance_says_what_privacy_cost_and_whether_the_data_is_useful():
    from fedhype.pipeline.report import glance

    text = "\n".join(glance(_glance_report()))
    assert "(ε = 0.9991, δ = 0.0001)-differential privacy" in text and "the target was 1" in text
    # a resumed run charged twice: ε 4.0034 above a target of 4 is printed as such (3 digits had printed "4")
    over = glance(_glance_report(epsilon=4.0034, target_epsilon=4.0))[0]
    assert "(ε = 4.003," in over and "**above the target 4**" in over and "the target was" not in over
    assert "scores 0.354" in text and "a constant guess (the most frequent class) scores 0.100" in text and "0.882" in text
    assert "carries 32% of the real data's gain over chance" in text  # (0.354 − 0.1) / (0.882 − 0.1)
    # an unbalanced test split: the best constant guess is its most frequent class, not 1/K (a probe: 0.200 for 0.25)
    skewed = "\n".join(glance(_glance_report(majority_share=0.25)))
    assert "a constant guess (the most frequent class) scores 0.250" in skewed
    assert "carries 16% of the real data's gain over chance" in skewed  # (0.354 − 0.25) / (0.882 − 0.25)
    assert "the directly trained classifier does better" in text and "tells the synthetic set from the real one" in text
    better = "\n".join(glance(_glance_report(tstr_accuracy=0.6, mmd2_p_value=0.4, coverage=0.5, precision=0.4)))
    assert "the synthetic data does better" in better and "cannot tell the two sets apart" in better
    assert "carries 64%" in better
    plain = "\n".join(glance(_glance_report(private=False)))
    assert "Privacy: none" in plain and "must not be shared as private" in plain and "ε =" not in plain.split("\n")[0]
    # a run trained with train.seed says so where the claim is made (a new user's probe: only report.json did)
    assert "noise was seeded" not in text
    seeded = glance(_glance_report(noise_seeded=True))[0]
    assert "(ε = 0.9991, δ = 0.0001)" in seeded and "**But the noise was seeded**" in seeded and "without a seed" in seeded
    # a small test split cannot tell TSTR from the direct classifier (a new user's 32 records: 12 against 8 right)
    small = "\n".join(glance(_glance_report(tstr_accuracy=0.375, dp_fedavg_linear_accuracy=0.25, n_test=32)))
    assert "within noise on these 32 test records (difference +0.125, 1.1 standard errors)" in small
    assert "does better" not in small
    large = "\n".join(glance(_glance_report(tstr_accuracy=0.375, dp_fedavg_linear_accuracy=0.25, n_test=1359)))
    assert "the synthetic data does better" in large


def test_at_a_glance_says_when_no_dp_sgd_round_ran():
    """The privacy bullet of a run that trained no round says what ε paid for: the release alone, and why (the stage
    rule's reason from report.json's ``dp_sgd_stage_off``, or the method); a run with rounds says nothing of it."""
    from fedhype.pipeline.report import glance

    why = ("the median client has 914 training records, fewer than train.dp_sgd_min_records = 1,500: without the "
           "DP-SGD stage the statistics release takes the whole ε (the 'no-dp-sgd' model; docs/method.md, decision 22)")
    ruled = glance(_glance_report(rounds=0, method="no-dp-sgd", dp_sgd_stage_off=why))[0]
    assert ("for what `release/` holds — the statistics release alone, no DP-SGD round (the median client has 914 "
            "training records, fewer than train.dp_sgd_min_records = 1,500). Smaller ε is stronger") in ruled
    assert "decision 22" not in ruled  # the short clause; the Details section gives the whole reason
    named = glance(_glance_report(rounds=0, method="dp-gaussian", dp_sgd_stage_off=None))[0]
    assert "for what `release/` holds — the statistics release alone, no DP-SGD round (`--method dp-gaussian`). " in named
    for r in (_glance_report(rounds=8, method="fedhypevae"), _glance_report()):  # rounds ran, or not recorded
        line = glance(r)[0]
        assert "no DP-SGD round" not in line and "for what `release/` holds. Smaller ε" in line
    assert "no DP-SGD round" not in glance(_glance_report(private=False, rounds=0, method="no-dp-sgd"))[0]


def test_a_run_without_a_dp_sgd_round_claims_no_clipping_and_no_round_traffic():
    """report.json's ``clip_norm`` (the DP-SGD C) is None and its per-round bytes 0, with a note, where no round ran
    (a probe: the no-dp-sgd job recorded C = 1.5 and 2 × 0.3 MB a round). The training result says so itself
    (:func:`fedhype.federated.engine.result_of`, with :func:`~fedhype.federated.result.without_rounds`), and the
    report takes its values as they are (a pipeline stage is not imported by federated; the jobs of
    tests/cli/test_pipeline_cli.py check report.json's figures, tests/federated/test_stage_rule.py the results')."""
    from fedhype.federated.result import without_rounds
    from fedhype.pipeline.report import NO_ROUND_TRAFFIC

    traffic = {"hypernetwork_parameters": 120_000, "generated_parameters_per_client": 75_000,
               "download_bytes_per_round": 300_000, "upload_bytes_per_round": 300_000}
    assert without_rounds(traffic) == {"hypernetwork_parameters": 120_000, "generated_parameters_per_client": 75_000,
                                       "download_bytes_per_round": 0, "upload_bytes_per_round": 0,
                                       "note": NO_ROUND_TRAFFIC}
    assert traffic["upload_bytes_per_round"] == 300_000  # a new dict: the model's own sizes are not edited
    assert NO_ROUND_TRAFFIC.startswith("no DP-SGD round ran") and without_rounds(None) is None


def test_report_downstream_section(skewed_federation):
    """report.json's downstream summary and report.md's per-client table, from the real protocol's output."""
    from fedhype.eval.client_downstream import client_downstream
    from fedhype.pipeline.report import DOWNSTREAM_ROWS, _downstream_lines, downstream_summary, glance

    _, clients, syn = skewed_federation
    d = client_downstream(clients, syn, seed=0)
    d.pop("interpolation")  # as the job stores it
    s = downstream_summary(d)
    assert downstream_summary(None) is None and s["private"] is False
    assert set(s["per_client"]) == set(clients) and s["gain_union_accuracy"] == d["gain_union_accuracy"]
    gains = [c["union"]["local_synthetic"] - c["union"]["local_only"] for c in s["per_client"].values()]
    assert s["clients_gaining_union"] == sum(g > 0 for g in gains)
    md = "\n".join(_downstream_lines(s))
    name, c = next(iter(s["per_client"].items()))
    row = next(line for line in md.splitlines() if line.startswith(f"| {name} |"))
    assert f"{c['own']['local_only']:.3f} / {c['union']['local_only']:.3f}" in row
    assert ", ".join(c["missing_classes"]) in row
    assert md.count("\n| ") == 2 + len(clients) and all(v in md for v in DOWNSTREAM_ROWS.values())
    assert f"{d['gain_union_accuracy']:+.3f} accuracy on the union test set" in md
    assert "not covered by DP" in md and "benchmarks/downstream.py" in md
    line = next(x for x in glance({"private": False, "n_classes": 10, "downstream": s}) if "For each client" in x)
    assert f"by {d['gain_union_accuracy']:+.3f} on average ({s['clients_gaining_union']} of {len(clients)}" in line


def test_held_out_figures_that_rise_over_the_rounds_are_said_in_the_report():
    """A new user's probe saw held-out −ELBO 84274 → 86659 and MMD² 0.0618 → 0.0633 over 8 rounds, with no word."""
    from fedhype.pipeline.report import _trend_sentence, held_out_trend

    def row(r, e, m):
        return {"round": r, "epsilon": 0.9, "diagnostics_not_dp": {"val_neg_elbo": e, "val_mmd2": m}}

    worse = held_out_trend([row(0, 84274.0, 0.0618), row(1, 85000.0, 0.0620), row(7, 86659.0, 0.0633)])
    assert worse == {"rounds": [1, 8], "val_neg_elbo": [84274.0, 86659.0], "val_mmd2": [0.0618, 0.0633], "worse": True}
    s = _trend_sentence(worse)
    assert "round 1 to round 8" in s and "84274 → 86659" in s and "made the held-out fit worse" in s
    better = held_out_trend([row(0, 90.0, 0.05), row(3, 80.0, 0.04)])
    assert better["worse"] is False and "worse" not in _trend_sentence(better)
    assert held_out_trend([row(0, 1.0, 0.1)]) is None and _trend_sentence(None) == ""
    assert held_out_trend([{"round": 0}, {"round": 1}]) is None  # runs without diagnostics


def test_the_report_says_which_located_share_the_release_used(real_store, tmp_path):
    """``model.located_share = "auto"`` resolves from the release (docs/method.md, decision 16): the run records the share,
    F and r in release.json, and the report's Synthetic line says them; a run without them says nothing."""
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.pipeline.report import _release_choices, _share_clause

    part = make_partition(real_store, scheme="domain", seed=0)
    train(real_store, part, TrainConfig(method="dp-gaussian", epsilon=8.0, seed=0), tmp_path / "run", diagnostics=False)
    notes = json.loads((tmp_path / "run" / "release.json").read_text())
    got = _release_choices(tmp_path / "run")
    assert got == {k: notes[k] for k in ("located_share", "class_mean_snr", "located_directions")}
    assert got["located_share"] in (0.0, 0.8) and 0 < got["located_directions"] <= 64
    assert got["located_share"] == (0.8 if got["class_mean_snr"] >= 0.94 and got["located_directions"] <= 20 else 0.0)
    clause = _share_clause(got)
    assert clause.startswith(f"; located share s = {got['located_share']:g} of the unlocated variance")
    assert f"F = {got['class_mean_snr']:.3f}, {got['located_directions']} located directions" in clause
    (tmp_path / "bare").mkdir()
    assert _release_choices(tmp_path / "bare") is None and _share_clause(None) == ""
    assert _share_clause({"located_share": [0.8, 0.0]}) == ""  # local-cvae: one per client, not one line


def test_the_report_states_the_resolved_model_sizes_and_which_a_rule_set(real_store, tmp_path):
    """The job's config.toml says ``code_dim = "auto"`` (or nothing); the report says what it resolved to (a probe:
    only run/config.json and release/config.json did), marking the sizes set by ``"auto"``."""
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.pipeline.report import _model_line, _model_sizes

    part = make_partition(real_store, scheme="domain", seed=0)
    train(real_store, part, TrainConfig(method="dp-gaussian", epsilon=8.0, seed=0, model={"hidden": 48}),
          tmp_path / "run", diagnostics=False)
    m = _model_sizes(tmp_path / "run")
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    assert m == {"latent": resolved["latent"], "hidden": 48, "code_dim": 32, "decoder": resolved["decoder"],
                 "latent_asked": "auto", "code_dim_asked": "auto"}
    line = _model_line(m, {"hypernetwork_parameters": 2_345_678})[0]
    assert line == (f"Model: latent size {resolved['latent']} (`auto`), code dimension 32 (`auto`), hidden width 48, "
                    f"decoder `{resolved['decoder']}`; 2.3 M hypernetwork parameters.")
    assert "(`auto`)" not in _model_line({**m, "code_dim_asked": 32, "latent_asked": 64}, None)[0]
    (tmp_path / "bare").mkdir()
    assert _model_sizes(tmp_path / "bare") is None and _model_line(None, None) == []
