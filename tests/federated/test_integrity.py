"""Content digests of models, checkpoints and client state, and the numerical check after each round
(issue #17): a flipped byte is refused before anything is touched or charged; a diverged round stops the
run before it is committed and before the next round is charged."""

import pytest
import torch

from fedhype.data.partition import make_partition
from fedhype.errors import ArtifactError, FedhypeError
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.federated.rundir import RunDir, load_model
from fedhype.federated.server import Server
from fedhype.io import DIGEST_KEY, atomic_save_tensors, load_tensors
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.synthesis import synthesize

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}
CFG = dict(rounds=3, local_steps=1, batch_size=32, noise_multiplier=1.0, epsilon=None, seed=0, model=SMALL)


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="domain", seed=0)


def _flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_any_tensor_file_is_refused(tmp_path):
    p = tmp_path / "t.safetensors"
    atomic_save_tensors(p, {"a": torch.arange(6, dtype=torch.float32)}, {"x": "y"})
    assert torch.equal(load_tensors(p)["a"], torch.arange(6, dtype=torch.float32))
    from safetensors import safe_open

    with safe_open(str(p), framework="pt") as fh:
        assert set(fh.metadata()) == {"x", DIGEST_KEY}
    _flip_last_byte(p)
    with pytest.raises(ArtifactError, match="modified or corrupted after it was written"):
        load_tensors(p, "test file")


def test_corrupt_model_is_refused_by_synthesize_and_a_corrupt_checkpoint_before_resume_charges(real_store, part, tmp_path):
    run = tmp_path / "run"
    train(real_store, part, TrainConfig(**CFG), run, diagnostics=False, stop_after=2)
    load_model(run)  # intact
    _flip_last_byte(run / "model.safetensors")
    with pytest.raises(ArtifactError, match="model .* modified or corrupted"):
        synthesize(run, "neutral", per_class=5, seed=0)
    ckpt = RunDir(run).server_ckpt(2)
    _flip_last_byte(ckpt)
    before = len(PrivacyLedger.load(run / "ledger.json").events)
    with pytest.raises(ArtifactError, match="server checkpoint .* modified or corrupted"):
        train(real_store, part, TrainConfig(**CFG), run, resume=True, diagnostics=False)
    assert len(PrivacyLedger.load(run / "ledger.json").events) == before  # nothing charged


def test_a_client_state_flipped_on_disk_is_refused_before_the_round_is_charged(real_store, part, tmp_path):
    run = tmp_path / "run"
    train(real_store, part, TrainConfig(**CFG), run, diagnostics=False, stop_after=1)
    states = sorted((run / "clients").rglob("state-r1.safetensors"))
    assert states
    _flip_last_byte(states[0])
    before = len(PrivacyLedger.load(run / "ledger.json").events)
    with pytest.raises(ArtifactError, match="state .* modified or corrupted"):
        train(real_store, part, TrainConfig(**CFG), run, resume=True, diagnostics=False)
    assert len(PrivacyLedger.load(run / "ledger.json").events) == before


def test_a_round_that_diverges_is_not_committed_and_the_next_is_not_charged(real_store, part, tmp_path, monkeypatch):
    real = Server.aggregate
    calls = {"n": 0}

    def poisoned(self):
        out = real(self)
        calls["n"] += 1
        if calls["n"] == 2:  # round 2 goes non-finite
            with torch.no_grad():
                self.hnet.base["bo"][0] = float("nan")
        return out

    monkeypatch.setattr(Server, "aggregate", poisoned)
    run = tmp_path / "run"
    with pytest.raises(FedhypeError, match="round 2 produced non-finite values in \\['hnet.base.bo'\\]"):
        train(real_store, part, TrainConfig(**CFG), run, diagnostics=False)
    assert RunDir(run).committed_round() == 1
    rounds = {e.round for e in PrivacyLedger.load(run / "ledger.json").events}
    assert max(rounds) == 1  # round index 1 (the second) was charged and ran; round 3 was never charged


def test_an_unseeded_run_interrupted_after_the_release_is_not_charged_for_it_again(real_store, part, tmp_path):
    """Fresh noise on a rerun is charged again — but a release that completed is reused from its saved
    public outputs (ckpt/release-state.safetensors), so resuming does not pay for the statistics twice."""
    from fedhype.federated.class_stats import MECHANISM

    cfg = TrainConfig(**{**CFG, "seed": None})
    run = tmp_path / "run"
    train(real_store, part, cfg, run, diagnostics=False, stop_after=0)  # the release ran, no round
    first = PrivacyLedger.load(run / "ledger.json")
    assert sum(e.mechanism == MECHANISM for e in first.events) == len(part.clients)
    theta0 = load_tensors(run / "ckpt" / "release-state.safetensors")
    res = train(real_store, part, cfg, run, resume=True, diagnostics=False)
    ledger = PrivacyLedger.load(run / "ledger.json")
    assert sum(e.mechanism == MECHANISM for e in ledger.events) == len(part.clients)  # charged once
    assert res["complete"]
    _, _, meta = load_model(run)
    assert meta["client_class_counts"] is not None
    assert torch.equal(theta0["hnet.space_mean"], load_model(run)[0].space_mean)  # the same release was used


def test_max_epsilon_refuses_a_resume_that_would_release_again_before_charging_it(real_store, part, tmp_path):
    """A run interrupted during its release (charged, its outputs never saved) is released again on an unseeded
    resume, with fresh noise, and charged again. A new user's probe saw `--resume --max-epsilon 2.1` spend that
    second release and only then stop at round 1, saying "stopped before spending". It is now refused before."""
    from fedhype.errors import BudgetExceededError

    cfg = TrainConfig(**{**CFG, "seed": None, "epsilon": 2.0, "noise_multiplier": None})
    run = tmp_path / "run"
    train(real_store, part, cfg, run, diagnostics=False, stop_after=0)
    for f in ("release-state", "release-outputs"):  # as if interrupted after the charge, before any output was saved
        (run / "ckpt" / f"{f}.safetensors").unlink()
    before = (run / "ledger.json").read_bytes()
    spent = max(PrivacyLedger.load(run / "ledger.json").epsilons().values())
    with pytest.raises(BudgetExceededError, match=r"the statistics release \(interrupted before, charged again"):
        train(real_store, part, TrainConfig(**{**cfg.__dict__, "max_epsilon": 2.1}), run, resume=True, diagnostics=False)
    assert (run / "ledger.json").read_bytes() == before  # nothing charged by the refused resume
    assert spent < 2.1  # what was spent before fits the limit: only the re-release would break it


def test_a_resume_says_where_the_release_stands(real_store, part, tmp_path):
    """A probe interrupted a job during its release: the resume said "the release did not complete" while its charge
    stood in the ledger, and then spent it again without saying the run would end above its target."""
    from fedhype.federated.rundir import RunDir
    from fedhype.pipeline.job import release_resume_note

    run = RunDir(tmp_path / "run")
    assert run.release_stage() == "not started"
    cfg = TrainConfig(**{**CFG, "seed": None})
    train(real_store, part, cfg, run.root, diagnostics=False, stop_after=0)
    assert run.release_stage() == "saved"
    (run.root / "ckpt" / "release-state.safetensors").unlink()  # interrupted in the server's post-processing:
    assert run.release_stage() == "saved"  # the clients' updates were saved, a resume reuses them
    (run.root / "ckpt" / "release-outputs.safetensors").unlink()  # interrupted after the charge, before any save
    assert run.release_stage() == "interrupted"
    note = release_resume_note("interrupted", seeded=False)
    assert "interrupted after it was charged (write-ahead) and before its outputs were saved" in note
    assert "charged again" in note and "above its target ε" in note and "--max-epsilon" in note
    assert "nothing is charged twice" in release_resume_note("interrupted", seeded=True)
    train(real_store, part, cfg, run.root, resume=True, diagnostics=False)
    assert run.release_stage() == "committed"
    assert "not charged again" in release_resume_note("committed", seeded=False)


def test_a_release_interrupted_in_the_servers_post_processing_is_reused_not_charged_again(real_store, part, tmp_path):
    """A probe's Ctrl-C landed after the release was charged and before the model it sets was saved: the resume
    released (and charged) it again. The clients' updates are now saved the moment they arrive; a resume that finds
    them redoes only the server's post-processing: nothing charged again, and the same model as without the stop."""
    from fedhype.federated.class_stats import MECHANISM

    cfg = TrainConfig(**{**CFG, "seed": None})  # unseeded: a re-release would be charged again
    run = tmp_path / "run"
    train(real_store, part, cfg, run, diagnostics=False, stop_after=0)
    whole = load_tensors(run / "ckpt" / "release-state.safetensors")
    (run / "ckpt" / "release-state.safetensors").unlink()  # stopped after the updates were saved
    before = (run / "ledger.json").read_bytes()
    train(real_store, part, cfg, run, resume=True, diagnostics=False, stop_after=0)
    assert (run / "ledger.json").read_bytes() == before  # nothing charged again
    again = load_tensors(run / "ckpt" / "release-state.safetensors")
    for k in ("hnet.space_mean", "hnet.base.cb", "hnet.base.wl", "hnet.heads.cs_cb_w"):
        assert torch.equal(again[k], whole[k]), k  # the same release, post-processed again
    # a file of other clients' updates is not reused: the release runs (and is charged) again
    from fedhype.federated.release_outputs import load_release_outputs

    class Other:
        id = "nobody"

    assert load_release_outputs(run / "ckpt" / "release-outputs.safetensors", [Other()] * len(part.clients)) is None
    assert sum(e.mechanism == MECHANISM for e in PrivacyLedger.load(run / "ledger.json").events) == len(part.clients)


@pytest.mark.parametrize("centre_share", [0.0, 0.06])
def test_a_secure_aggregation_release_interrupted_in_post_processing_is_reused_not_charged_again(real_store, part,
                                                                                              tmp_path, centre_share):
    """Under secure aggregation the server keeps only the sums it received; they are now saved the moment they
    arrive, as the clients' updates are per client: a resume after the charge and before the model was saved redoes
    only the post-processing of the same sums (nothing charged again, the same model), and a file that is not this
    run's sums (other clients, another noise plan, damaged) is not reused."""
    from fedhype.errors import ValidationError
    from fedhype.federated.class_stats import MECHANISM
    from fedhype.federated.release_outputs import load_secure_outputs
    from fedhype.privacy.secure_agg import DistributedNoise

    cfg = TrainConfig(**{**CFG, "seed": None, "secure_aggregation": True, "centre_share": centre_share})
    run = tmp_path / "run"
    train(real_store, part, cfg, run, diagnostics=False, stop_after=0)
    outputs = run / "ckpt" / "release-outputs.safetensors"
    assert outputs.exists()
    whole = load_tensors(run / "ckpt" / "release-state.safetensors")
    (run / "ckpt" / "release-state.safetensors").unlink()  # stopped after the sums arrived, before the model was saved
    assert RunDir(run).release_stage() == "saved"
    before = (run / "ledger.json").read_bytes()
    charged = sum(e.mechanism == MECHANISM for e in PrivacyLedger.load(run / "ledger.json").events)
    assert charged >= len(part.clients)
    train(real_store, part, cfg, run, resume=True, diagnostics=False, stop_after=0)
    assert (run / "ledger.json").read_bytes() == before  # nothing charged again
    again = load_tensors(run / "ckpt" / "release-state.safetensors")
    for k in ("hnet.space_mean", "hnet.base.cb", "hnet.base.wl"):
        assert torch.equal(again[k], whole[k]), k  # the same sums, post-processed again

    class C:
        def __init__(self, i):
            self.id = i

    ids = [C(str(c.id)) for c in part.clients]
    m = len(ids)
    kept = load_secure_outputs(outputs, ids, DistributedNoise(m))
    assert kept is not None and (kept[0] is None) == (centre_share == 0)
    assert set(kept[1].contributors) == {str(c.id) for c in part.clients} and kept[1].noise_variance_factor >= 1
    assert load_secure_outputs(outputs, [C("nobody")] * m, DistributedNoise(m)) is None  # other clients' sums
    assert load_secure_outputs(outputs, ids, DistributedNoise(m, 1)) is None  # another noise plan
    # a damaged sum (re-signed, so the digest passes) is refused by name, not used
    t = load_tensors(outputs)
    from safetensors import safe_open

    with safe_open(str(outputs), framework="pt") as f:
        meta = dict(f.metadata())
    meta.pop(DIGEST_KEY, None)
    name = next(k for k in t if k.startswith("stats.sum."))
    t[name] = torch.full_like(t[name], float("nan"))
    atomic_save_tensors(outputs, t, meta)
    with pytest.raises(ValidationError, match="non-finite entries"):
        load_secure_outputs(outputs, ids, DistributedNoise(m))


def test_a_partition_whose_class_names_were_edited_is_refused(real_store, part, tmp_path):
    import dataclasses

    edited = dataclasses.replace(part, class_names=part.class_names[:2])
    with pytest.raises(ArtifactError, match="class names"):
        edited.check_store(real_store)


def test_a_run_config_edited_by_hand_is_refused_by_the_resume_synthesis_and_the_audit(real_store, part, tmp_path):
    """A helper raised train.rounds 30 → 40 in a run's config.json and resumed with --rounds 40: the resume ran 10
    more rounds and blamed the ε above target on "round 11 charged again" (only the audit caught it). config.json is
    sealed now (its config_sha256): an edit is refused (exit 4) before anything is charged; an older file without
    the seal reads as before."""
    import json

    from fedhype.eval.audit_ledger import audit_run
    from fedhype.io import CONFIG_DIGEST, read_json

    cfg = TrainConfig(**{**CFG, "rounds": 2})
    train(real_store, part, cfg, tmp_path / "run", stop_after=1)
    path = RunDir(tmp_path / "run").config
    raw = json.loads(path.read_text())
    assert len(raw[CONFIG_DIGEST]) == 64 and CONFIG_DIGEST not in read_json(path, "run config")
    edited = {**raw, "train": {**raw["train"], "rounds": 3}}
    path.write_text(json.dumps(edited))
    charged = len(PrivacyLedger.load(tmp_path / "run" / "ledger.json"))
    for attempt in (lambda: train(real_store, part, TrainConfig(**{**CFG, "rounds": 3}), tmp_path / "run", resume=True),
                    lambda: audit_run(tmp_path / "run")):
        with pytest.raises(ArtifactError, match="config.json: edited after it was written"):
            attempt()
    assert len(PrivacyLedger.load(tmp_path / "run" / "ledger.json")) == charged  # nothing charged
    # a config.json from before the seal reads as before, and the resume finishes the run
    path.write_text(json.dumps({k: v for k, v in raw.items() if k != CONFIG_DIGEST}))
    train(real_store, part, cfg, tmp_path / "run", resume=True)
    assert load_model(tmp_path / "run")[2] is not None
