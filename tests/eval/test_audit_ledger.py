"""Ledger consistency audit on a real short run, and membership inference with the run's splits."""

from __future__ import annotations

import json
import shutil

import pytest

from fedhype.data.partition import make_partition
from fedhype.errors import ArtifactError
from fedhype.eval.audit_ledger import audit_run
from fedhype.eval.audit_mia import run_mia
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.synthesis.sample import synthesize

from conftest import AUDIT_CFG as CFG  # noqa: E402


@pytest.fixture(scope="module")
def shared(audit_run, real_store, tmp_path_factory):
    """One real DP run (σ = 1, 2 rounds × 2 steps, 2 iid clients of 240 train records), shared by audit tests."""
    run_dir, part = audit_run
    return run_dir, part


@pytest.fixture
def run_copy(shared, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(shared[0], dst)
    return dst


def test_clean_run_recomputes_every_claim(shared):
    from opacus.accountants import PRVAccountant, RDPAccountant

    run, _ = shared
    res = audit_run(run)
    assert res["consistent"] and res["ledger_ok"] and res["private"] and res["mismatches"] == []
    # the accountant's figures for what ran: σ = 1, q = 32/240, 2 × 2 steps, δ = 1e-4
    prv, rdp = PRVAccountant(), RDPAccountant()
    prv.history = rdp.history = [(1.0, 32 / 240, 4)]
    assert res["epsilon"] == pytest.approx(prv.get_epsilon(delta=1e-4), rel=1e-9)
    assert res["epsilon_rdp"] == pytest.approx(rdp.get_epsilon(delta=1e-4), rel=1e-9)
    assert res["epsilon"] < res["epsilon_rdp"] and res["delta"] == 1e-4 and res["events"] == 4
    names = {r["name"]: r for r in res["checked"]}
    # round 0 is checked against the ledger truncated to round 0 (2 steps): a smaller ε
    r0 = names["metrics.json: round 0 epsilon"]
    prv0 = PRVAccountant()
    prv0.history = [(1.0, 32 / 240, 2)]
    assert r0["recomputed"] == pytest.approx(prv0.get_epsilon(delta=1e-4), rel=1e-9)
    assert r0["recomputed"] < res["epsilon"]
    assert names["metrics.json: round 1 epsilon_per_client[1]"]["recomputed"] == res["epsilon"]
    assert names["model.safetensors: epsilon"]["difference"] == 0.0
    # flags, model ε, model δ, config δ; per round ε + 2 clients; per client its release (none here) and its
    # DP-SGD events against config.json's privacy_plan
    assert len(res["checked"]) == 4 + 2 * 3 + 2 * 2
    plan = names["ledger.json: client 1's DP-SGD events in the committed rounds vs the plan"]
    assert plan["ok"] and plan["claimed"] == plan["recomputed"] == 4


def test_events_deleted_from_the_ledger_do_not_pass_against_the_plan(run_copy):
    """A ledger rewritten without client 1's round-1 events (hash chain rebuilt, so it loads) is caught by the
    plan check even where the ε claims were rewritten to match (a privacy auditor's tamper test)."""
    from fedhype.privacy.ledger import PrivacyLedger

    ledger = PrivacyLedger.load(run_copy / "ledger.json")
    kept = PrivacyLedger(ledger.delta, meta=ledger.meta)
    for e in ledger.events:
        if not (e.round == 1 and str(e.client) == "1"):
            kept.record(e)
    kept.save(run_copy / "ledger.json")
    metrics = json.loads((run_copy / "metrics.json").read_text())  # the claims rewritten to the smaller ledger
    for m in metrics:
        m["epsilon_per_client"] = {c: kept.epsilon(c) for c in m["epsilon_per_client"]}
        m["epsilon"] = max(m["epsilon_per_client"].values())
    (run_copy / "metrics.json").write_text(json.dumps(metrics))
    res = audit_run(run_copy)
    assert res["ledger_ok"] and not res["consistent"]
    bad = {r["name"]: r for r in res["mismatches"]}
    row = bad["ledger.json: client 1's DP-SGD events in the committed rounds vs the plan"]
    assert row["claimed"] == 2 and row["recomputed"] == 4 and "round(s) [2] (counted from 1" in row["reason"]
    assert "ledger.json: client 0's DP-SGD events in the committed rounds vs the plan" not in bad


def test_edited_sigma_in_the_ledger_is_named(run_copy):
    text = (run_copy / "ledger.json").read_text()
    lines = text.split("\n")
    i = next(i for i, ln in enumerate(lines) if '"round":1' in ln and '"client":"1"' in ln)
    lines[i] = lines[i].replace('"noise_multiplier":1.0', '"noise_multiplier":3.0')
    (run_copy / "ledger.json").write_text("\n".join(lines))
    res = audit_run(run_copy)
    assert res["ledger_ok"] is False and not res["consistent"] and res["epsilon"] is None
    (bad,) = res["mismatches"]
    assert bad["name"] == "ledger.json"
    assert "event 3 hash mismatch" in bad["reason"] and "client '1', round 1" in bad["reason"] and "σ=3.0" in bad["reason"]


def test_edited_metrics_epsilon_shows_the_difference(run_copy):
    metrics = json.loads((run_copy / "metrics.json").read_text())
    true0 = metrics[0]["epsilon"]
    metrics[0]["epsilon"] = true0 - 0.5  # under-report round 0
    metrics[1]["epsilon_per_client"]["0"] += 0.25
    (run_copy / "metrics.json").write_text(json.dumps(metrics))
    res = audit_run(run_copy)
    assert res["ledger_ok"] and not res["consistent"]
    got = {m["name"]: m for m in res["mismatches"]}
    assert set(got) == {"metrics.json: round 0 epsilon", "metrics.json: round 1 epsilon_per_client[0]"}
    assert got["metrics.json: round 0 epsilon"]["difference"] == pytest.approx(-0.5, abs=1e-12)
    assert got["metrics.json: round 0 epsilon"]["recomputed"] == true0
    assert got["metrics.json: round 1 epsilon_per_client[0]"]["difference"] == pytest.approx(0.25, abs=1e-12)


def test_synthetic_store_and_report_claims(run_copy, tmp_path):
    syn = synthesize(run_copy, "neutral", per_class=5, seed=0)
    good = tmp_path / "good.safetensors"
    syn.save(good)
    assert audit_run(run_copy, [good])["consistent"]
    # a `fedhype run` output layout: out/run, out/report.json, out/synthetic.safetensors
    eps = audit_run(run_copy)["epsilon_per_client"]
    syn.meta["epsilon"] = syn.meta["epsilon"] / 2
    syn.save(tmp_path / "synthetic.safetensors")
    (tmp_path / "report.json").write_text(json.dumps({"epsilon": 1.0, "delta": 1e-4, "epsilon_per_client": eps}))
    for target in (tmp_path, run_copy):  # the job directory, or its run/ folder
        res = audit_run(target, [good] if target == tmp_path else [good, tmp_path / "synthetic.safetensors"])
        assert res["run"] == str(run_copy) and res["report"] == str(tmp_path / "report.json")
        got = {m["name"]: m for m in res["mismatches"]}
        bad = f"synthetic {tmp_path / 'synthetic.safetensors'}: meta.epsilon"
        assert set(got) == {bad, f"{tmp_path / 'report.json'}: epsilon"}
        assert got[bad]["difference"] == pytest.approx(-res["epsilon"] / 2)
        assert got[f"{tmp_path / 'report.json'}: epsilon"]["difference"] == pytest.approx(1.0 - res["epsilon"])
        assert sum(r["name"].startswith(f"{tmp_path / 'report.json'}: epsilon_per_client") for r in res["checked"]) == 2


def test_non_private_run_claims_no_epsilon(real_store, shared, tmp_path):
    _, part = shared
    cfg = TrainConfig(**{**CFG, "rounds": 1, "local_steps": 1, "no_dp": True, "noise_multiplier": None})
    train(real_store, part, cfg, tmp_path / "nodp", diagnostics=False)
    res = audit_run(tmp_path / "nodp")
    assert res["private"] is False and res["consistent"] and res["epsilon"] is None and res["ledger_ok"] is None
    syn = synthesize(tmp_path / "nodp", "neutral", per_class=3, seed=0)
    syn.meta["epsilon"] = 1.0  # a DP claim on non-private output
    syn.save(tmp_path / "s.safetensors")
    (bad,) = audit_run(tmp_path / "nodp", [tmp_path / "s.safetensors"])["mismatches"]
    assert bad["claimed"] == 1.0 and "non-private" in bad["reason"]


def test_mia_on_the_run_uses_disjoint_splits(real_store, shared):
    run, part = shared
    r = run_mia(run, real_store, part, seed=0, n_bootstrap=100)
    assert (r["n_members"], r["n_non_members"], r["n_reference"]) == (480, 160, 160)
    assert r["n_synthetic"] == 10 * 48  # ⌈480 / 10⌉ per class
    for attack in ("domias", "dcr"):
        a = r[attack]
        assert 0.0 <= a["auroc"] <= 1.0 and a["auroc_ci"][0] <= a["auroc"] <= a["auroc_ci"][1]
        # a DP run (ε ≈ 2.1, 4 steps) does not expose its members: the interval covers chance
        assert a["auroc_ci"][0] < 0.5 < a["auroc_ci"][1]
    assert r["synthetic_epsilon"] == pytest.approx(audit_run(run)["epsilon"])
    other = make_partition(real_store, scheme="iid", n_clients=3, seed=0)
    with pytest.raises(ArtifactError, match="partition"):
        run_mia(run, real_store, other)


def test_interrupted_run_is_reported_as_interrupted_not_tampered(real_store, tmp_path, monkeypatch):
    from fedhype.federated import client as client_mod

    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    calls = {"n": 0}
    orig = client_mod.Client.run_round

    def crash(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # first client of round 2: its events were written ahead
            raise KeyboardInterrupt
        return orig(self, *a, **k)

    monkeypatch.setattr(client_mod.Client, "run_round", crash)
    with pytest.raises(KeyboardInterrupt):
        train(real_store, part, TrainConfig(**{**CFG, "seed": None}), tmp_path / "run", diagnostics=False)
    res = audit_run(tmp_path / "run")
    assert res["ledger_ok"] and res["consistent"], res["mismatches"]
    assert res["interrupted"] and any("interrupted run" in w for w in res["warnings"])
    from fedhype.federated.rundir import load_model

    # the spent ε (full ledger, 2 rounds charged) is above what the committed model claims (1 round)
    assert res["events"] == 4 and res["epsilon"] > load_model(tmp_path / "run")[2]["epsilon"] * 1.1
    assert res["recharged_events"] == 0 and res["target_epsilon"] is None and not res["above_target"]
    assert "round(s) ≥ 2 (counted from 1 as train's progress counts them; in ledger.json and metrics.json, which count from 0, round 2 is 1)" in " ".join(res["warnings"])  # as train and the report count
    from fedhype.eval.audit_ledger import STABLE_KEYS

    assert set(STABLE_KEYS) <= set(res)  # the same keys in every state (a script met a KeyError)

    # a store drawn from it carries the full ledger's ε (fedhype.synthesis.spent), and its release keeps the model's
    # committed figure: both honest, and the audit takes both (a probe saw each fail it after the store's ε check)
    from fedhype.pipeline.release import write_release
    from fedhype.synthesis import synthesize

    syn = synthesize(tmp_path / "run", per_class=5, seed=0)
    assert syn.meta["epsilon"] == pytest.approx(res["epsilon"], rel=1e-9)
    syn.save(tmp_path / "syn.safetensors")
    again = audit_run(tmp_path / "run", synthetic=[tmp_path / "syn.safetensors"])
    assert again["consistent"], again["mismatches"]
    rel = write_release(tmp_path / "run", tmp_path / "release", synthetic=tmp_path / "syn.safetensors")
    assert (rel / "model.safetensors").read_bytes() == (tmp_path / "run" / "model.safetensors").read_bytes()
    released = audit_run(rel, synthetic=[rel / "synthetic.safetensors"])
    assert released["consistent"] and released["epsilon"] == pytest.approx(res["epsilon"]), released["mismatches"]
    # a store saying less than the committed rounds cost still fails
    syn.meta["epsilon"] = 0.5 * load_model(tmp_path / "run")[2]["epsilon"]
    syn.save(tmp_path / "low.safetensors")
    assert not audit_run(tmp_path / "run", synthetic=[tmp_path / "low.safetensors"])["consistent"]


def test_a_resumed_run_names_the_events_charged_again_and_the_target_it_passed(real_store, tmp_path, monkeypatch):
    """Unseeded noise: the round interrupted after its write-ahead charge is charged again on resume,
    so ε ends above the target. `fedhype train` says so and points at the audit, which names those
    events (it had listed nothing: a new user's probe)."""
    from fedhype.federated import client as client_mod

    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    cfg = TrainConfig(**{**CFG, "seed": None, "noise_multiplier": None, "epsilon": 2.0})
    orig, calls = client_mod.Client.run_round, {"n": 0}

    def crash(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return orig(self, *a, **k)

    monkeypatch.setattr(client_mod.Client, "run_round", crash)
    with pytest.raises(KeyboardInterrupt):
        train(real_store, part, cfg, tmp_path / "run", diagnostics=False)
    monkeypatch.setattr(client_mod.Client, "run_round", orig)
    train(real_store, part, cfg, tmp_path / "run", resume=True, diagnostics=False)
    res = audit_run(tmp_path / "run")
    assert res["ledger_ok"] and res["consistent"], res["mismatches"]
    assert res["target_epsilon"] == 2.0 and res["epsilon"] > 2.0 and res["above_target"]
    assert res["recharged_events"] == 2 and res["events"] == 6  # round 2 of both clients, charged twice
    assert any("charged again" in w and "round(s) [2] counted from 1" in w and "above the target 2" in w for w in res["warnings"])
    # a statistics release charged again is named as such, not as "round 0" (a new user's probe read "[0, 1]")
    from fedhype.privacy.ledger import PrivacyLedger, as_rerun

    led = PrivacyLedger.load(tmp_path / "run" / "ledger.json")
    from fedhype.privacy.events import RELEASE, release_events

    led.record(as_rerun(release_events(["0"], [(2.0, 1.0, 1)], [RELEASE], 1.0)[0]))  # (this plan has no release)
    led.save(tmp_path / "run" / "ledger.json")
    (w,) = [w for w in audit_run(tmp_path / "run")["warnings"] if "charged again" in w]
    assert "resume: the statistics release, round(s) [2] counted from 1" in w and "[0" not in w


def test_prv_above_rdp_is_a_warning_and_rdp_is_the_recomputed_figure(shared, monkeypatch):
    """A numerical failure of PRV (here: PRV + 1 for every history) is flagged per client; ε is then RDP's."""
    from fedhype.privacy import accountant

    run, _ = shared
    real = accountant._ACCOUNTANT_FNS["prv"]
    monkeypatch.setitem(accountant._ACCOUNTANT_FNS, "prv", lambda h, d: real(h, d) + 1.0)
    accountant._epsilon_cached.cache_clear()
    try:
        res = audit_run(run)
    finally:
        accountant._epsilon_cached.cache_clear()
    assert res["ledger_ok"] and res["epsilon"] == res["epsilon_rdp"]
    prv = [w for w in res["warnings"] if not w.startswith("the noise was seeded")]  # the run is seeded: also said
    assert res["noise_seeded"] and len(res["warnings"]) == len(prv) + 1
    assert sorted(w.split(":")[0] for w in prv) == ["client 0", "client 1"]
    assert all("exceeds the RDP upper bound" in w and "the RDP figure is the reported one" in w for w in prv)
    # the run recorded PRV's (correct) figure, below RDP: the claims now disagree with the recomputation
    assert not res["consistent"] and all(m["difference"] < 0 for m in res["mismatches"] if m["difference"] is not None)


def test_a_ledger_prv_cannot_evaluate_is_audited_with_rdp(shared, monkeypatch):
    """PRV's numerics can fail outright (a run at ε ≈ 1000: a new user's probe); train then reports RDP, and
    the audit must do the same and say so, not stop with a usage error."""
    from fedhype.privacy import accountant

    run, _ = shared

    def broken(h, d):
        raise ValueError("Floating point errors will dominate")

    monkeypatch.setitem(accountant._ACCOUNTANT_FNS, "prv", broken)
    accountant._epsilon_cached.cache_clear()
    try:
        res = audit_run(run)
    finally:
        accountant._epsilon_cached.cache_clear()
    assert res["ledger_ok"] and res["epsilon"] == res["epsilon_rdp"] > 0
    assert any("could not evaluate this ledger" in w and "RDP upper bound" in w for w in res["warnings"])


def test_a_run_interrupted_before_its_first_commit_is_audited_from_its_ledger(real_store, tmp_path, monkeypatch):
    """No model yet (a crash in round 1, or a Flower site refusing the first task): the audit reports the ledger's
    spent ε and the interrupted flag instead of "model not found" with exit 4 (a new user's probe)."""
    from fedhype.federated import client as client_mod
    from fedhype.privacy.ledger import PrivacyLedger

    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)

    def crash(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(client_mod.Client, "run_round", crash)
    with pytest.raises(KeyboardInterrupt):
        train(real_store, part, TrainConfig(**{**CFG, "seed": None}), tmp_path / "run", diagnostics=False)
    assert not (tmp_path / "run" / "model.safetensors").exists()
    res = audit_run(tmp_path / "run")
    led = PrivacyLedger.load(tmp_path / "run" / "ledger.json")
    assert res["interrupted"] and res["consistent"] and res["ledger_ok"] and res["private"]
    assert res["events"] == len(led) > 0 and res["epsilon"] > 0
    assert res["epsilon"] == pytest.approx(led.worst()[1], rel=1e-12)
    assert res["client_names"] == {"0": part.clients[0].name, "1": part.clients[1].name}
    assert any("before its first round was committed" in w for w in res["warnings"])
    assert res["noise_seeded"] is False and not any("was seeded" in w for w in res["warnings"])
    # seeded, the same stop: the audit says so (an auditor's probe read noise_seeded false and no warning)
    with pytest.raises(KeyboardInterrupt):
        train(real_store, part, TrainConfig(**{**CFG, "seed": 3}), tmp_path / "seeded", diagnostics=False)
    res = audit_run(tmp_path / "seeded")
    assert res["interrupted"] and res["noise_seeded"] is True
    assert any("the noise was seeded (train.seed = 3)" in w for w in res["warnings"])
    assert res["target_epsilon"] == CFG.get("epsilon") and res["recharged_events"] == 0


def test_a_store_in_the_audited_folder_is_checked_or_named(run_copy, real_store, tmp_path):
    """A privacy auditor's probe: a model swapped into a release passed unless --synthetic was given, and a release with
    privacy.json (and its extra-file check) deleted and the real embeddings copied in passed. The audited folder's own
    stores are now looked at: in a release every synthetic store is checked (its model_digest ties the model to it);
    in a run folder — private — one drawn from this model is checked and anything else is named in a warning (a
    second probe's store drawn before a resume, and a backup of the model, had failed an honest run folder)."""
    import torch

    from fedhype.io import atomic_save_tensors, load_tensors, tensor_metadata
    from fedhype.pipeline.release import write_release

    assert audit_run(run_copy)["release"] is False  # a run folder, not a release: the JSON says so
    real_store.save(run_copy / "embeddings.safetensors")
    (run_copy / "notes.safetensors").write_bytes(b"not a safetensors file")
    synthesize(run_copy, "neutral", per_class=5, seed=0).save(run_copy / "synthetic.safetensors")
    res = audit_run(run_copy)
    assert res["consistent"], res["mismatches"]
    assert f"synthetic {run_copy / 'synthetic.safetensors'}: meta.model_digest (the model it was drawn from)" in {
        r["name"] for r in res["checked"]}  # checked without --synthetic
    said = " ".join(res["warnings"])
    assert "embeddings.safetensors in the run folder holds real embeddings" in said
    assert "notes.safetensors in the run folder is neither its model nor an embeddings store" in said
    (run_copy / "embeddings.safetensors").unlink()
    (run_copy / "notes.safetensors").unlink()
    release = write_release(run_copy, tmp_path / "release", synthetic=run_copy / "synthetic.safetensors")

    def swap_model(folder):  # another model: its tensors changed, its metadata (ε included) kept
        tensors = load_tensors(folder / "model.safetensors", what="model")
        name = next(k for k, t in tensors.items() if t.is_floating_point())
        tensors[name] = tensors[name] + torch.ones_like(tensors[name])
        raw = tensor_metadata(folder / "model.safetensors")
        atomic_save_tensors(folder / "model.safetensors", tensors, {k: v for k, v in raw.items() if k == "fedhype"})

    swap_model(run_copy)  # in the run folder the earlier store is now another model's: named, not failed
    res = audit_run(run_copy)
    assert res["consistent"] and any("synthetic.safetensors in the run folder was drawn from another model" in w
                                     for w in res["warnings"])
    swap_model(release)  # in a release it fails, with --synthetic or without
    res = audit_run(release)
    bad = f"synthetic {release / 'synthetic.safetensors'}: meta.model_digest (the model it was drawn from)"
    assert [m["name"] for m in res["mismatches"]] == [bad]
    assert "draw it again" in res["mismatches"][0]["reason"]
    # a release folder without its privacy.json (its config.json is a release's) fails instead of passing as a run
    stripped = tmp_path / "stripped"
    write_release(run_copy, stripped)
    (stripped / "privacy.json").unlink()
    (stripped / "README.md").unlink()
    real_store.save(stripped / "embeddings.safetensors")
    res = audit_run(stripped)
    assert not res["consistent"] and "privacy.json" in {m["name"] for m in res["mismatches"]}
    assert "ask for the folder as it was released" in res["mismatches"][0]["reason"]


def test_a_plan_whose_sigma_was_edited_no_longer_composes_to_its_target():
    """A privacy auditor's probe multiplied the release's σ by 1.5 in the ledger and in config.json's plan prefix
    (re-chained): the audit reported ε = 0.696 for a run calibrated for ε = 1, and passed. config.json's plan is now
    checked against its own settings: the prefix is the split of its σ₀ by train.centre_share, and a calibrated plan
    composes to train.epsilon (the worst client within 5 % below it) — the bundled job's plan, computed as train does."""
    import dataclasses

    from fedhype.eval.audit_ledger import _calibration_rows
    from fedhype.federated.run_plan import plan_privacy
    from fedhype.pipeline.config import resolve, train_config

    cfg = train_config(resolve())  # the bundled job's defaults: ε = 1, 8 rounds, the centred release
    plan = plan_privacy(cfg, [1500, 1078, 750, 750])
    config = {"train": dataclasses.asdict(cfg), "privacy_plan": {k: plan[k] for k in plan}}
    config["train"].pop("model", None)
    rows = {r["name"]: r for r in _calibration_rows(config)}
    composes = "config.json: privacy_plan composes to train.epsilon (calibrated)"
    split = "config.json: privacy_plan.prefix vs its σ₀ and train.centre_share"
    assert rows[composes]["ok"] and rows[split]["ok"]
    assert 0.95 <= rows[composes]["recomputed"] <= 1.0
    forged = json.loads(json.dumps(config))
    forged["privacy_plan"]["prefix"][1][0] *= 1.5  # the class statistics' σ (the centre's first)
    rows = {r["name"]: r for r in _calibration_rows(forged)}
    assert not rows[split]["ok"] and not rows[composes]["ok"]
    assert rows[composes]["recomputed"] < 0.95 and "edited" in rows[composes]["reason"]
    # the target rewritten to the forged plan's ε still fails on the split; σ₀ rewritten too is a consistent forgery
    forged["train"]["epsilon"] = rows[composes]["recomputed"]
    assert [r["ok"] for r in _calibration_rows(forged)] == [False, True]
