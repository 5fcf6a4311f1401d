"""FedHypeVAE training on real embeddings: privacy boundary, accounting, resume, learning."""

import json

import pytest
import torch

from fedhype.data.partition import make_partition
from fedhype.errors import ArtifactError, BudgetExceededError, ValidationError
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.federated.rundir import load_model
from fedhype.federated.server import Server
from fedhype.privacy.dp_step import PrivatizedUpdate

SMALL = {"hidden": 64, "latent": 16, "hyper_hidden": 32, "code_dim": 8}


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="domain", seed=0)


def _cfg(**kw):
    base = dict(rounds=2, local_steps=3, batch_size=32, epsilon=4.0, delta=1e-4, seed=0, model=SMALL)
    base.update(kw)
    return TrainConfig(**base)


def test_only_privatized_updates_cross_the_boundary(real_store, part, tmp_path, monkeypatch):
    seen = []
    orig = Server.accept

    def spy(self, index, weight, update):
        seen.append(update)
        return orig(self, index, weight, update)

    monkeypatch.setattr(Server, "accept", spy)
    res = train(real_store, part, _cfg(), tmp_path / "run", diagnostics=False)
    sizes = {str(c.id): len(c.train) for c in part.clients}
    assert len(seen) == 2 * len(part.clients)
    theta_keys = set(load_model(tmp_path / "run")[0](torch.zeros(SMALL["code_dim"])).keys())
    for u in seen:
        assert type(u) is PrivatizedUpdate and u.private
        assert u.noise_multiplier == pytest.approx(res["noise_multiplier"]) and u.noise_multiplier > 0
        assert u.sample_rate == pytest.approx(32 / sizes[u.client]) and u.steps == 3 and u.clip_norm == 1.5
        assert set(u.tensors) == theta_keys  # generated parameters only: nothing of the local encoder
    # the server refuses anything else
    srv = Server(load_model(tmp_path / "run")[0].cfg, 1, torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="only PrivatizedUpdate"):
        srv.accept(0, 1.0, {k: v for k, v in seen[0].tensors.items()})


def test_epsilon_is_the_accountants_for_the_steps_run(real_store, part, tmp_path):
    from opacus.accountants import PRVAccountant

    from fedhype.privacy.ledger import PrivacyLedger

    res = train(real_store, part, _cfg(), tmp_path / "run", diagnostics=False)
    sigma = res["noise_multiplier"]
    # the DP statistics released before round 0 (fedhype.federated.class_stats): the centre and the
    # class statistics, two un-subsampled Gaussian steps per client, composed with the DP-SGD steps
    s0: dict[str, list] = {}
    for e in PrivacyLedger.load(tmp_path / "run" / "ledger.json").events:
        if e.round == -1:
            s0.setdefault(e.client, []).append((e.noise_multiplier, 1.0, 1))
    assert sorted(s0) == sorted(str(c.id) for c in part.clients) and all(len(v) == 2 for v in s0.values())
    worst = 0.0
    for c in part.clients:
        acc = PRVAccountant()
        acc.history = s0[str(c.id)] + [(sigma, 32 / len(c.train), 2 * 3)]
        eps = acc.get_epsilon(delta=1e-4)
        assert res["epsilon_per_client"][str(c.id)] == pytest.approx(eps, rel=1e-9)
        worst = max(worst, eps)
    assert res["epsilon"] == pytest.approx(worst) and res["epsilon"] <= 4.0
    # calibrated for the plan actually run: the worst client is close to the target, not far below
    assert res["epsilon"] > 0.97 * 4.0
    # and within 1 % of dp-accounting's PLD
    from fedhype.privacy.accountant import epsilon
    smallest = min(len(c.train) for c in part.clients)
    pld = epsilon(next(iter(s0.values())) + [(sigma, 32 / smallest, 6)], 1e-4, accountant="pld")
    assert res["epsilon"] == pytest.approx(pld, rel=0.01)
    meta = load_model(tmp_path / "run")[2]
    assert meta["epsilon"] == pytest.approx(res["epsilon"]) and meta["private"] is True


def test_resume_is_identical_and_counts_each_step_once(real_store, part, tmp_path):
    full = train(real_store, part, _cfg(rounds=3), tmp_path / "a", diagnostics=False)
    first = train(real_store, part, _cfg(rounds=3), tmp_path / "b", diagnostics=False, stop_after=1)
    assert first["rounds"] == 1 and not first["complete"]
    with pytest.raises(ValidationError, match="--resume"):
        train(real_store, part, _cfg(rounds=3), tmp_path / "b", diagnostics=False)
    done = train(real_store, part, _cfg(rounds=3), tmp_path / "b", resume=True, diagnostics=False)
    ha, ca, _ = load_model(tmp_path / "a")
    hb, cb, _ = load_model(tmp_path / "b")
    assert torch.equal(ca, cb)
    for (k, va), (_, vb) in zip(ha.state_dict().items(), hb.state_dict().items()):
        assert torch.equal(va, vb), k
    la = json.loads((tmp_path / "a" / "ledger.json").read_text())
    lb = json.loads((tmp_path / "b" / "ledger.json").read_text())
    assert len(la["events"]) == len(lb["events"]) == (3 + 2) * len(part.clients)  # + the centre and the class statistics
    assert done["epsilon"] == pytest.approx(full["epsilon"])


def test_a_run_resumes_at_the_latent_size_it_started_with_when_the_auto_rule_changed(real_store, part, tmp_path,
                                                                                       monkeypatch):
    """A run started with ``model.latent = "auto"`` under one rule must resume under a release of fedhype whose
    rule resolves ``"auto"`` otherwise (here: the scale threshold lowered so that 48 records per class would get
    L = 128): it keeps its L, charges nothing twice, and finishes; a new run gets the new rule's L."""
    import fedhype.models.config as mc

    small = {k: v for k, v in SMALL.items() if k != "latent"}  # latent left at "auto"
    cfg = _cfg(rounds=2, model=small)
    first = train(real_store, part, cfg, tmp_path / "b", diagnostics=False, stop_after=1)
    assert load_model(tmp_path / "b")[0].cfg.latent == mc.DP_LATENT == 64 and first["rounds"] == 1
    events = len(json.loads((tmp_path / "b" / "ledger.json").read_text())["events"])
    monkeypatch.setattr(mc, "SCALE_RECORDS_PER_CLASS", 10)
    done = train(real_store, part, cfg, tmp_path / "b", resume=True, diagnostics=False)
    assert done["complete"] and load_model(tmp_path / "b")[0].cfg.latent == 64
    assert len(json.loads((tmp_path / "b" / "ledger.json").read_text())["events"]) == events + len(part.clients)
    train(real_store, part, cfg, tmp_path / "c", diagnostics=False, stop_after=1)
    assert load_model(tmp_path / "c")[0].cfg.latent == mc.SCALE_LATENT == 128  # a new run: the rule of now
    # a size the user gives on resume is still compared with the run's own settings
    with pytest.raises(ValidationError, match="--resume: the configuration differs"):
        train(real_store, part, _cfg(rounds=2, model={**small, "latent": 128}), tmp_path / "c", resume=True,
              diagnostics=False)


def test_a_run_resumes_at_the_code_dimension_it_started_with_when_the_auto_rule_changed(real_store, part, tmp_path,
                                                                                          monkeypatch):
    """As the latent size: a run begun with ``model.code_dim = "auto"`` (4 clients: 32) resumes with 32 under a rule
    that resolves otherwise (here: steps of 2, so 4 clients would get 4), charging nothing twice; a new run gets 4."""
    import fedhype.models.config as mc

    small = {k: v for k, v in SMALL.items() if k != "code_dim"}  # code_dim left at "auto"
    cfg = _cfg(rounds=2, model=small)
    train(real_store, part, cfg, tmp_path / "b", diagnostics=False, stop_after=1)
    assert load_model(tmp_path / "b")[0].cfg.code_dim == 32
    events = len(json.loads((tmp_path / "b" / "ledger.json").read_text())["events"])
    monkeypatch.setattr(mc, "DEFAULT_CODE_DIM", 2)
    done = train(real_store, part, cfg, tmp_path / "b", resume=True, diagnostics=False)
    model, codes, _ = load_model(tmp_path / "b")
    assert done["complete"] and model.cfg.code_dim == 32 and tuple(codes.shape) == (len(part.clients), 32)
    assert len(json.loads((tmp_path / "b" / "ledger.json").read_text())["events"]) == events + len(part.clients)
    train(real_store, part, cfg, tmp_path / "c", diagnostics=False, stop_after=1)
    assert load_model(tmp_path / "c")[0].cfg.code_dim == len(part.clients) == 4  # a new run: the rule of now
    # the default written out asks the same as leaving it out (a probe: 'auto' → None was refused on resume)
    done = train(real_store, part, _cfg(rounds=2, model={**small, "code_dim": "auto"}), tmp_path / "c", resume=True,
                 diagnostics=False)
    assert done["complete"] and load_model(tmp_path / "c")[0].cfg.code_dim == 4
    # another code dimension is refused, saying what the run was started with (it read "None → 8")
    with pytest.raises(ValidationError) as err:
        train(real_store, part, _cfg(rounds=3, model={**small, "code_dim": 8}), tmp_path / "c", resume=True,
              diagnostics=False)
    assert "train.model.code_dim: not given (the default, 'auto') → 8" in str(err.value)
    assert "None" not in str(err.value)


def test_an_interrupted_non_private_run_resumes_identically(real_store, part, tmp_path):
    cfg = dict(rounds=2, no_dp=True, epsilon=None)
    train(real_store, part, _cfg(**cfg), tmp_path / "a", diagnostics=False)
    train(real_store, part, _cfg(**cfg), tmp_path / "b", diagnostics=False, stop_after=1)
    done = train(real_store, part, _cfg(**cfg), tmp_path / "b", resume=True, diagnostics=False)
    assert done["complete"] and done["private"] is False and done["epsilon"] is None
    assert not (tmp_path / "b" / "ledger.json").exists()  # no releases to record
    ha, hb = load_model(tmp_path / "a")[0], load_model(tmp_path / "b")[0]
    for (k, va), (_, vb) in zip(ha.state_dict().items(), hb.state_dict().items()):
        assert torch.equal(va, vb), k
    # a private run whose ledger went missing is still refused
    train(real_store, part, _cfg(rounds=2), tmp_path / "p", diagnostics=False, stop_after=1)
    (tmp_path / "p" / "ledger.json").unlink()
    with pytest.raises(ArtifactError, match="ledger"):
        train(real_store, part, _cfg(rounds=2), tmp_path / "p", resume=True, diagnostics=False)


def test_interrupted_round_without_seed_is_charged_again(real_store, part, tmp_path, monkeypatch):
    from fedhype.federated import client as client_mod

    calls = {"n": 0}
    orig = client_mod.Client.run_round

    def crash(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == len(part.clients) + 1:  # first client of round 2
            raise KeyboardInterrupt
        return orig(self, *a, **k)

    monkeypatch.setattr(client_mod.Client, "run_round", crash)
    with pytest.raises(KeyboardInterrupt):
        train(real_store, part, _cfg(seed=None), tmp_path / "r", diagnostics=False)
    monkeypatch.setattr(client_mod.Client, "run_round", orig)
    res = train(real_store, part, _cfg(seed=None), tmp_path / "r", resume=True, diagnostics=False)
    events = json.loads((tmp_path / "r" / "ledger.json").read_text())["events"]
    # round 2 was announced (write-ahead) before the crash and is charged again on the rerun
    assert len(events) == (3 + 2) * len(part.clients)  # + the centre and class statistics, released once before round 0
    assert sum("rerun" in (e.get("note") or "") for e in events) == len(part.clients)
    steps = {c: sum(e["steps"] for e in events if e["client"] == c and e["mechanism"] == "dp-sgd")
             for c in res["epsilon_per_client"]}
    assert all(s == 9 for s in steps.values())


def test_budget_refusals(real_store, part, tmp_path):
    with pytest.raises(BudgetExceededError) as up_front:
        train(real_store, part, _cfg(noise_multiplier=0.6, epsilon=None, max_epsilon=1.0), tmp_path / "x")
    assert up_front.value.epsilon > 1.0 and not (tmp_path / "x" / "ledger.json").exists()
    # it says what this call did, which is also true of a resume (a probe read "nothing was trained" after spending)
    assert str(up_front.value).endswith("stopped before spending (nothing was charged by this call)")
    smallest = min(len(c.train) for c in part.clients)
    with pytest.raises(ValidationError, match="δ|delta"):
        train(real_store, part, _cfg(delta=1.0 / smallest), tmp_path / "y")


def test_no_dp_is_explicit_and_marked(real_store, part, tmp_path):
    res = train(real_store, part, _cfg(no_dp=True, epsilon=None), tmp_path / "n", diagnostics=False)
    assert res["private"] is False and res["epsilon"] is None
    # nothing was clipped: no C is claimed (the configured 1.5 was, in the result and report.json)
    assert res["clip_norm"] is None and res["rounds"] >= 1
    assert load_model(tmp_path / "n")[2]["private"] is False


@pytest.mark.parametrize("dp", [{"epsilon": 4.0}, {"no_dp": True, "epsilon": None}])
def test_training_lowers_elbo_and_mmd_on_real_embeddings(real_store, part, tmp_path, dp):
    """From a random decoder (the no-second-moment design) training lowers both; from the DP
    Gaussian (the default) it lowers the −ELBO and keeps the MMD² where the statistics put it."""
    # class_stats_share 0.8 (TrainConfig's default when this was written): 0.95 leaves the DP-SGD steps too
    # little ε at this size to lower the −ELBO in 6 rounds
    cfg = _cfg(rounds=6, local_steps=None, local_epochs=1.0, batch_size=32, lr_local=3e-3, class_stats_share=0.8, **dp,
               model={**SMALL, "second_moment": False})
    train(real_store, part, cfg, tmp_path / "t")
    metrics = json.loads((tmp_path / "t" / "metrics.json").read_text())
    first, last = metrics[0]["diagnostics_not_dp"], metrics[-1]["diagnostics_not_dp"]
    assert last["val_neg_elbo"] < first["val_neg_elbo"]
    assert last["val_mmd2"] < first["val_mmd2"]
    cfg = _cfg(rounds=6, local_steps=None, local_epochs=1.0, batch_size=32, class_stats_share=0.8, **dp)
    train(real_store, part, cfg, tmp_path / "g")
    metrics = json.loads((tmp_path / "g" / "metrics.json").read_text())
    first, last = metrics[0]["diagnostics_not_dp"], metrics[-1]["diagnostics_not_dp"]
    assert last["val_neg_elbo"] < first["val_neg_elbo"]
    assert last["val_mmd2"] < 1.05 * first["val_mmd2"]


@pytest.mark.parametrize("method", ["dp-cvae", "no-class-stats", "no-mmd", "fixed-prior", "shared-decoder", "no-lipschitz"])
def test_baselines_and_ablations_train_with_exact_accounting(real_store, part, tmp_path, method):
    from opacus.accountants import PRVAccountant

    res = train(real_store, part, _cfg(method=method, rounds=1, local_steps=2), tmp_path / method, diagnostics=False)
    hnet, codes, meta = load_model(tmp_path / method)
    theta = hnet(codes[0])
    if method in ("dp-cvae", "shared-decoder"):
        assert "film.gamma" not in theta
    if method in ("dp-cvae", "fixed-prior"):
        assert "prior.mu" not in theta
    smallest = min(len(c.train) for c in part.clients)
    acc = PRVAccountant()
    acc.history = [(res["noise_multiplier"], 32 / smallest, 2)]
    if meta["model"]["class_bias"]:  # the DP release is composed in (centre and statistics: σ₀ split in two, q = 1)
        from fedhype.privacy.centring import release_steps

        assert method != "dp-cvae" and res["class_stats_noise_multiplier"] > 0
        acc.history = release_steps(res["class_stats_noise_multiplier"], TrainConfig().centre_share) + acc.history
    else:
        assert method in ("dp-cvae", "no-class-stats") and "dec.cb" not in theta
    assert res["epsilon"] == pytest.approx(acc.get_epsilon(delta=1e-4), rel=1e-9)
    assert meta["method"] == method
    # each preset switches off exactly its own term
    assert (meta["model"]["lambda_mmd"] == 0) == (method in ("dp-cvae", "no-mmd"))
    assert (meta["model"]["lambda_lip"] == 0) == (method in ("dp-cvae", "no-lipschitz"))
