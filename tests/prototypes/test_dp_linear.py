"""The DP-SGD FedAvg linear classifier on real embeddings: accuracy, exact accounting, privacy boundary."""

import dataclasses
import json

import pytest
import torch

from fedhype.data.partition import make_partition
from fedhype.errors import BudgetExceededError, ValidationError
from fedhype.prototypes import dp_linear as dpl
from fedhype.prototypes.dp_linear import DPLinearConfig, DPLinearModel, dp_linear_downstream


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="domain", seed=0)


def _prv(history):
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = list(history)
    return acc.get_epsilon(delta=1e-4)


def _events(out):
    return json.loads((out / "ledger.json").read_text())["events"]


@pytest.fixture(scope="module")
def eps8(real_store, part, tmp_path_factory):
    out = tmp_path_factory.mktemp("dpl") / "model"
    return dp_linear_downstream(real_store, part, DPLinearConfig(epsilon=8.0, seed=0), out=out), out


def test_above_chance_at_eps8_with_the_accountants_epsilon(real_store, part, eps8):
    res, out = eps8
    # 10 digit classes: chance is 0.10 (measured 0.33 accuracy, 0.28 macro-F1 on the 160 held-out records)
    assert res["accuracy"] > 0.2 and res["balanced_accuracy"] > 0.2 and res["macro_f1"] > 0.15
    assert res["n_test"] == sum(len(c.test) for c in part.clients)
    assert set(res["per_client"]) == {c.name for c in part.clients} == set(res["per_domain"])
    sigma, sigma0 = res["noise_multiplier"], res["class_stats_noise_multiplier"]
    events = _events(out)
    for c in part.clients:  # one class-statistics release, then 10 rounds × ⌈n_i / 64⌉ steps at q_i = 64 / n_i
        n, mine = len(c.train), [e for e in events if e["client"] == str(c.id)]
        steps = 10 * -(-n // 64)
        assert res["steps_per_client"][str(c.id)] == steps
        assert [(e["mechanism"], e["round"]) for e in mine] == [("dp-linear-class-stats", -1)] + [
            ("dp-fedavg-linear", r) for r in range(10)]
        assert sum(e["steps"] for e in mine[1:]) == steps and mine[1]["sample_rate"] == pytest.approx(64 / n)
        expected = _prv([(sigma0, 1.0, 1), (sigma, 64 / n, steps)])  # Opacus PRV of what ran
        assert res["epsilon_per_client"][str(c.id)] == pytest.approx(expected, rel=1e-9)
    assert res["epsilon"] == pytest.approx(max(res["epsilon_per_client"].values()))
    assert 0.97 * 8.0 < res["epsilon"] <= 8.0  # calibrated for the plan run: the worst client binds
    # the saved model predicts as reported
    test = part.split_store(real_store, "test")
    acc = float((DPLinearModel.load(out).predict(test.embeddings) == test.labels.numpy()).mean())
    assert acc == pytest.approx(res["accuracy"])


def test_only_privatized_updates_are_averaged(real_store, part, monkeypatch):
    seen = []
    orig = dpl._payload

    def spy(update):
        seen.append(update)
        return orig(update)

    monkeypatch.setattr(dpl, "_payload", spy)
    clients = {str(c.id): (part.client_store(real_store, c.id, "train").embeddings,
                           part.client_store(real_store, c.id, "train").labels) for c in part.clients}
    model, ledger = dpl.fit_dp_fedavg_linear(clients, 10, DPLinearConfig(rounds=2, noise_multiplier=1.0, epsilon=None,
                                                                          seed=0))
    assert len(seen) == 2 * len(clients)  # one per client and round
    for u in seen:
        n = len(clients[u.client][1])
        assert u.private and u.noise_multiplier == 1.0 and u.clip_norm == 1.0
        assert u.sample_rate == pytest.approx(64 / n) and u.steps == -(-n // 64) and set(u.tensors) == {"weight", "bias"}
    with pytest.raises(TypeError, match="PrivatizedUpdate"):
        orig({"weight": torch.zeros(10, 384)})
    assert model.privacy["epsilon"] == pytest.approx(max(ledger.epsilons().values()))


def test_no_dp_is_marked_and_learns_more(real_store, part, eps8):
    res = dp_linear_downstream(real_store, part, DPLinearConfig(no_dp=True, epsilon=None, seed=0))
    assert res["private"] is False and res["epsilon"] is None and res["epsilon_per_client"] == {}
    assert res["accuracy"] > 0.35 and res["accuracy"] > eps8[0]["accuracy"]  # measured 0.425 vs 0.33


def test_rerun_reuses_the_saved_release(real_store, part, eps8):
    res, out = eps8
    before = (out / "ledger.json").read_bytes()
    again = dp_linear_downstream(real_store, part, DPLinearConfig(epsilon=8.0, seed=0), out=out)
    assert again["reused"] and again["accuracy"] == res["accuracy"] and (out / "ledger.json").read_bytes() == before
    with pytest.raises(ValidationError, match="other settings"):
        dp_linear_downstream(real_store, part, DPLinearConfig(epsilon=4.0, seed=0), out=out)
    # a job resumed with a spending cap (train.max_epsilon, which a rerun may change) reuses the model: the cap
    # trained nothing (a reviewer: such a rerun was refused after synthesis and evaluation)
    capped = dp_linear_downstream(real_store, part, DPLinearConfig(epsilon=8.0, seed=0, max_epsilon=9.0), out=out)
    assert capped["reused"] and (out / "ledger.json").read_bytes() == before


@pytest.mark.parametrize("seed", [None, 0])
def test_an_attempt_killed_during_training_stays_charged(real_store, part, tmp_path, monkeypatch, seed):
    """A helper killed a job during the reference: no ledger was on disk, and the rerun reported the second attempt's
    ε alone. The ledger is now written ahead of every charge; the rerun composes its charges with the interrupted
    attempt's (fresh noise: charged again, as a rerun; the same seeded noise: not twice)."""
    from fedhype.privacy.dp_step import LocalDPSession
    from fedhype.privacy.ledger import PrivacyLedger

    cfg = DPLinearConfig(epsilon=2.0, rounds=3, seed=seed)
    clean = dp_linear_downstream(real_store, part, cfg, out=tmp_path / "clean")
    out = tmp_path / "killed"
    real_step, steps = LocalDPSession.step, []

    def killed_in_round_2(self, *a, **k):
        steps.append(1)
        if len(steps) > sum(cfg.steps_per_round(len(c.train)) for c in part.clients):  # round 1 done
            raise KeyboardInterrupt
        return real_step(self, *a, **k)

    with monkeypatch.context() as mp:
        mp.setattr(LocalDPSession, "step", killed_in_round_2)
        with pytest.raises(KeyboardInterrupt):
            dp_linear_downstream(real_store, part, cfg, out=out)
    assert not (out / "model.safetensors").exists()
    spent = PrivacyLedger.load(out / "ledger.json")  # on disk: the release, round 1, round 2's first client
    m = len(part.clients)
    assert [e.round for e in spent.events] == [-1] * m + [0] * m + [1]
    # a spending cap sees the interrupted attempt's charges too: a cap the plan alone fits refuses an unseeded rerun
    import dataclasses

    capped = dataclasses.replace(cfg, max_epsilon=clean["epsilon"] * 1.05)
    if seed is None:
        with pytest.raises(BudgetExceededError, match="with the charges an interrupted attempt left in its ledger"):
            dp_linear_downstream(real_store, part, capped, out=out)
        assert PrivacyLedger.load(out / "ledger.json").events == spent.events  # refused before spending
    res = dp_linear_downstream(real_store, part, cfg if seed is None else capped, out=out)  # seeded: a free replay
    led = PrivacyLedger.load(out / "ledger.json")
    assert led.events[:len(spent.events)] == spent.events  # the interrupted attempt's charges stay
    assert res["epsilon"] == pytest.approx(max(led.epsilons().values()), rel=1e-9)
    if seed is None:  # every charge of the first attempt made again: more ε than a clean run
        assert len(led.events) == len(spent.events) + len(_events(tmp_path / "clean"))
        assert res["epsilon"] > clean["epsilon"] * 1.2
    else:  # the same noise replayed: charged once, the clean run's figure
        assert len(led.events) == len(_events(tmp_path / "clean"))
        assert res["epsilon"] == pytest.approx(clean["epsilon"], rel=1e-9)
    # a ledger at another δ is named, not appended to
    with pytest.raises(ValidationError, match="interrupted attempt at δ = 0.0001"):
        (out / "model.safetensors").unlink()
        dp_linear_downstream(real_store, part, DPLinearConfig(epsilon=2.0, rounds=3, seed=seed, delta=1e-5), out=out)


def test_refusals(real_store, part, tmp_path):
    with pytest.raises(BudgetExceededError):
        dp_linear_downstream(real_store, part, DPLinearConfig(noise_multiplier=0.5, epsilon=None, max_epsilon=1.0),
                             out=tmp_path / "m")
    assert not (tmp_path / "m").exists()
    with pytest.raises(ValidationError, match="delta"):
        dp_linear_downstream(real_store, part, DPLinearConfig(delta=0.05))
    with pytest.raises(ValidationError, match="lr"):
        DPLinearConfig(lr=0.0)


def test_cli_dp_linear(real_store, part, tmp_path):
    from typer.testing import CliRunner

    from fedhype.cli.main import app

    real_store.save(tmp_path / "real.safetensors")
    part.save(tmp_path / "part.json")
    args = ["prototypes", "dp-linear", "--store", str(tmp_path / "real.safetensors"), "--partition",
            str(tmp_path / "part.json"), "--rounds", "2", "--seed", "0", "--json"]
    res = CliRunner().invoke(app, [*args, "--epsilon", "8", "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["private"] and 0 < out["epsilon"] <= 8.0 and (tmp_path / "m" / "ledger.json").exists()
    bad = CliRunner().invoke(app, [*args, "--delta", "0.5"])
    assert bad.exit_code == 2


def test_job_settings_and_report_keys(eps8):
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import dp_linear_config
    from fedhype.pipeline.report import _dp_linear_keys

    assert resolve(None, [])["evaluate"]["dp_linear"] is True
    cfg = dp_linear_config(resolve(None, ["train.epsilon=4", "train.seed=3", "train.delta=1e-5"]))
    assert (cfg.epsilon, cfg.seed, cfg.delta, cfg.no_dp) == (4.0, 3, 1e-5, False)  # the job's [train] privacy settings
    assert dp_linear_config(resolve(None, ["train.no_dp=true"])).no_dp
    res = eps8[0]
    keys = _dp_linear_keys(res)  # a separate release: its own ε beside the generator's
    assert keys["dp_fedavg_linear_accuracy"] == res["accuracy"] and keys["dp_fedavg_linear_epsilon"] == res["epsilon"]
    assert keys["dp_fedavg_linear_per_client_accuracy"] == {n: r["accuracy"] for n, r in res["per_client"].items()}
    assert all(v is None for v in _dp_linear_keys(None).values())


def test_the_audit_recomputes_the_dp_linear_models_epsilon_and_fails_an_edited_ledger(eps8, tmp_path):
    """``fedhype audit --run RUN/dp_linear``: the model's ε claims against its own ledger (a probe found the folder
    refused as "not a fedhype model" while the job's report cited its ε)."""
    import shutil

    from fedhype.eval.audit_dp_linear import audit_dp_linear, is_dp_linear

    res, out = eps8
    assert is_dp_linear(out)
    a = audit_dp_linear(out)
    assert a["consistent"] and a["ledger_ok"] and a["dp_linear"] is True
    assert a["epsilon"] == pytest.approx(res["epsilon"], abs=1e-9) and a["epsilon"] == pytest.approx(7.98, abs=0.03)
    assert len(a["checked"]) >= 3 and "composition" in a["warnings"][0]
    assert not audit_dp_linear(out, report={"dp_fedavg_linear_epsilon": res["epsilon"] / 2})["consistent"]
    bad = tmp_path / "dp_linear"
    shutil.copytree(out, bad)
    state = json.loads((bad / "ledger.json").read_text())
    state["events"][0]["noise_multiplier"] *= 1.5  # a larger σ than was run: the chain no longer matches
    (bad / "ledger.json").write_text(json.dumps(state))
    b = audit_dp_linear(bad)
    assert b["ledger_ok"] is False and not b["consistent"]


def test_a_job_folders_audit_names_its_dp_linear_reference_and_the_composed_epsilon(eps8, audit_run, tmp_path):
    """A job folder holds two DP models of the same records (release/'s generator and dp_linear/): the audit checks
    both, and says what sharing both would cost (sequential composition)."""
    import shutil

    from fedhype.eval.audit_ledger import audit_run as audit_folder

    res, out = eps8
    job = tmp_path / "job"
    shutil.copytree(audit_run[0], job / "run")
    shutil.copytree(out, job / "dp_linear")
    gen = audit_folder(job / "run")
    report = {"epsilon": gen["epsilon"], "delta": gen["delta"], "dp_fedavg_linear_epsilon": res["epsilon"],
              "dp_fedavg_linear_delta": gen["delta"]}
    (job / "report.json").write_text(json.dumps(report))
    a = audit_folder(job)
    assert a["consistent"], a["mismatches"]
    assert a["dp_linear"]["epsilon"] == pytest.approx(res["epsilon"], abs=1e-9) and a["dp_linear"]["consistent"]
    assert any("report.json: dp_fedavg_linear_epsilon" in r["name"] for r in a["checked"])
    said = [w for w in a["warnings"] if "dp_linear/ is a separate DP model" in w]
    assert len(said) == 1 and f"ε ≤ {gen['epsilon'] + res['epsilon']:.4g}" in said[0]
    # its seeded noise is said at the job's level too (a second probe saw it only in dp_linear/'s own audit)
    from fedhype.eval.audit_dp_linear import audit_dp_linear as audit_linear

    seeded = audit_linear(out).get("noise_seeded", False)
    assert seeded  # the eps8 reference is trained with a seed
    assert any(w.startswith("the noise of dp_linear/") for w in a["warnings"]) == seeded
    (job / "report.json").write_text(json.dumps({**report, "dp_fedavg_linear_epsilon": 1.0}))
    b = audit_folder(job)
    assert not b["consistent"] and [m["name"] for m in b["mismatches"]] == [f"{job / 'report.json'}: dp_fedavg_linear_epsilon"]
    # an auditor's probe: with dp_linear/ deleted the report's reference left the audit without a word
    (job / "report.json").write_text(json.dumps(report))
    shutil.rmtree(job / "dp_linear")
    c = audit_folder(job)
    assert not c["consistent"] and [m["name"] for m in c["mismatches"]] == [
        f"{job / 'report.json'}: dp_fedavg_linear_epsilon (dp_linear/)"]
    assert "is missing" in c["mismatches"][0]["reason"]
    # the report's other privacy figures are checked too: the target ε and its report.md's digest
    (job / "report.md").write_text("ε = 0.1")
    for forged in ({"target_epsilon": 0.5}, {"report_md_sha256": "0" * 64}):
        (job / "report.json").write_text(json.dumps({k: v for k, v in {**report, **forged}.items()
                                                     if not k.startswith("dp_fedavg")}))
        d = audit_folder(job)
        assert not d["consistent"] and len(d["mismatches"]) == 1, d["mismatches"]
        assert d["mismatches"][0]["name"].startswith(f"{job / 'report'}"), d["mismatches"]


def test_a_reference_an_older_version_trained_at_the_jobs_sigma_is_reused_as_it_is(real_store, part, tmp_path):
    """Before the reference followed the generator's ε, a job with ``train.noise_multiplier`` trained it at that σ:
    a rerun of such a job (new synthesis settings) reuses it rather than refusing it or training and charging a
    second one."""
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import dp_linear_config

    conf = resolve(None, ["train.noise_multiplier=2.0", "train.seed=0"])
    old = dataclasses.replace(dp_linear_config(conf), rounds=2)
    folder = tmp_path / "dp_linear"
    first = dp_linear_downstream(real_store, part, old, out=folder)
    kept = dp_linear_config(conf, 3.0, folder)
    assert (kept.noise_multiplier, kept.epsilon) == (2.0, None)
    again = dp_linear_downstream(real_store, part, dataclasses.replace(kept, rounds=2), out=folder)
    assert again["reused"] and again["epsilon"] == first["epsilon"]
    fresh = dp_linear_config(conf, 3.0, tmp_path / "none")  # a new job: calibrated to the generator's ε
    assert (fresh.noise_multiplier, fresh.epsilon) == (None, 3.0)
