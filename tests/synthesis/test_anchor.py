"""Class-mean anchoring (fedhype.synthesis.anchor): each code's class means back on the statistics release's.

On real DP runs of the shared digits store: the release's class means are recorded before round 0 and kept while
DP-SGD moves the model; the anchored decoder's class means equal them (Monte Carlo, model space); the release
itself (``dp-gaussian``, whose MLP output is zero) is unchanged by anchoring; a model written without them loads,
is drawn unanchored and says so; a run written without them gets them from its own release checkpoint.
"""

from __future__ import annotations

import pytest
import torch

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


@pytest.fixture(scope="module")
def ours_run(real_store, tmp_path_factory):
    """A DP run of ours (4 domain clients, client statistics, 3 rounds at ε = 8) and its partition."""
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train

    part = make_partition(real_store, scheme="domain", seed=0)
    run = tmp_path_factory.mktemp("anchor") / "run"
    train(real_store, part, TrainConfig(epsilon=8.0, rounds=3, local_steps=4, batch_size=32, seed=0, model=SMALL),
          run, diagnostics=False)
    return run, part


def _class_means(theta, cfg, n: int = 20_000) -> torch.Tensor:
    """Class means [K, D] of the decoder output in model space (before the likelihood noise): E_z[MLP(z, y)] by
    Monte Carlo (plain draws from a generator other than anchoring's) plus μ_y·W_lin + cb[y] exactly (the linear
    path's spread, ‖std‖ ≈ 15 here, would swamp a Monte Carlo mean of the whole output)."""
    from fedhype.models.cvae import decode, prior

    g = torch.Generator().manual_seed(123)
    eye = torch.eye(cfg.n_classes)
    mu, lv = prior(theta, eye, cfg.latent)
    z = mu[:, None] + torch.exp(0.5 * lv)[:, None] * torch.randn(cfg.n_classes, n, cfg.latent, generator=g)
    mlp = {k: v for k, v in theta.items() if k not in ("dec.cb", "dec.wl")}
    with torch.no_grad():
        return decode(mlp, z, eye[:, None].expand(cfg.n_classes, n, cfg.n_classes)).mean(1) + mu @ theta["dec.wl"] \
            + theta["dec.cb"]


def test_the_release_means_are_kept_while_dp_sgd_moves_the_class_means(ours_run):
    from fedhype.federated.rundir import load_model
    from fedhype.io import load_tensors
    from fedhype.synthesis.anchor import anchored

    run, _ = ours_run
    hnet, codes, _ = load_model(run)
    released = load_tensors(run / "ckpt" / "release-state.safetensors", what="release")
    # recorded before round 0: the class output bias and client-statistics heads as the release set them
    assert torch.equal(hnet.anchor_cb, released["hnet.base.cb"])
    assert torch.equal(hnet.anchor_cs_cb_w, released["hnet.heads.cs_cb_w"])
    cfg = hnet.cfg
    for code, stats in ((codes[0], True), (codes[2], True), (codes.mean(0), False)):
        target = hnet.release_class_means(code, client_stats=stats)
        theta = hnet(code, client_stats=stats)
        drift = (_class_means(theta, cfg) - target).norm(dim=1)
        after = (_class_means(anchored(theta, target, cfg.n_classes, cfg.latent), cfg) - target).norm(dim=1)
        # DP-SGD moved them (3 noisy rounds); anchoring puts them back up to the Monte Carlo error of the MLP term
        assert drift.min() > 0.05, drift
        assert (after < 0.05 * drift).all(), (after, drift)


def test_the_anchored_store_has_the_release_class_means_and_the_rest_unchanged(ours_run):
    from fedhype.federated.rundir import load_model
    from fedhype.synthesis import synthesize

    run, _ = ours_run
    hnet, codes, _ = load_model(run)
    on = synthesize(run, "neutral", per_class=2000, seed=0, anchor=True)
    off = synthesize(run, "neutral", per_class=2000, seed=0)  # the default: off
    assert on.meta["anchor"] == "release class means" and off.meta["anchor"] == "off"
    m, s = hnet.space()
    target = torch.nn.functional.normalize(m + s * hnet.release_class_means(codes.mean(0), client_stats=False), dim=1)
    gap = {}
    for name, st in (("on", on), ("off", off)):
        means = torch.stack([st.embeddings[st.labels == k].mean(0) for k in range(hnet.cfg.n_classes)])
        gap[name] = float(torch.nn.functional.cosine_similarity(means, target).min())
    assert gap["on"] > 0.99 and gap["on"] > gap["off"], gap
    # the same draws shifted per class: the labels are the same and the within-class spread barely changes
    assert torch.equal(on.labels, off.labels)
    spread = [float(st.embeddings[st.labels == 0].var(0).sum()) for st in (on, off)]
    assert abs(spread[0] - spread[1]) < 0.1 * spread[1], spread


def test_anchoring_changes_nothing_for_the_release_itself(real_store, tmp_path):
    """``dp-gaussian``'s model is the release: its MLP output is zero, so the anchored bias is the bias (no MC error)."""
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.federated.rundir import load_model
    from fedhype.synthesis import synthesize
    from fedhype.synthesis.anchor import anchored

    part = make_partition(real_store, scheme="domain", seed=0)
    train(real_store, part, TrainConfig(method="dp-gaussian", epsilon=4.0, seed=0, model=SMALL), tmp_path / "run",
          diagnostics=False)
    hnet, codes, _ = load_model(tmp_path / "run")
    theta = hnet(codes.mean(0), client_stats=False)
    target = hnet.release_class_means(codes.mean(0), client_stats=False)
    assert torch.allclose(anchored(theta, target, hnet.cfg.n_classes, hnet.cfg.latent)["dec.cb"], theta["dec.cb"],
                          atol=1e-6)
    on, off = (synthesize(tmp_path / "run", "neutral", per_class=50, seed=1, anchor=a) for a in (True, False))
    assert torch.allclose(on.embeddings, off.embeddings, atol=1e-5)


def test_a_model_without_release_means_loads_is_drawn_unanchored_and_can_be_backfilled(ours_run, tmp_path):
    from safetensors.torch import load_file, save_file

    from fedhype.federated.rundir import backfill_release_means, load_model
    from fedhype.io import DIGEST_KEY, tensor_digest
    from fedhype.synthesis import synthesize

    run, _ = ours_run
    # a model file as fedhype wrote it before the release means were kept: no anchor buffers
    from safetensors import safe_open

    with safe_open(str(run / "model.safetensors"), framework="pt") as fh:
        meta = fh.metadata()
    t = {k: v for k, v in load_file(run / "model.safetensors").items() if "anchor_" not in k}
    old = tmp_path / "model.safetensors"
    save_file(t, old, metadata={**meta, DIGEST_KEY: tensor_digest(t)})
    hnet, codes, _ = load_model(old)
    assert hnet.release_class_means(codes[0]) is None and torch.isnan(hnet.anchor_cb).all()
    syn = synthesize(old, "neutral", per_class=20, seed=0, anchor=True)
    assert syn.meta["anchor"].startswith("none: the model holds no release class means")
    assert torch.equal(syn.embeddings, synthesize(run, "neutral", per_class=20, seed=0, anchor=False).embeddings)
    # its run's release checkpoint gives them back (the model as the release set it)
    assert backfill_release_means(hnet, run / "ckpt" / "release-state.safetensors")
    new, _, _ = load_model(run)
    assert torch.equal(hnet.anchor_cb, new.anchor_cb) and torch.equal(hnet.anchor_cs_cb_w, new.anchor_cs_cb_w)
    assert not backfill_release_means(hnet, run / "ckpt" / "release-state.safetensors")  # has them: left alone


def test_a_job_config_written_before_the_anchor_key_resumes_with_the_default():
    from fedhype.pipeline.config import DEFAULTS, resolve, upgrade_keys

    conf = resolve(None, [])
    old = {**conf, "synthesis": {k: v for k, v in conf["synthesis"].items() if k != "anchor"}}
    assert upgrade_keys(old) == conf and DEFAULTS["synthesis"]["anchor"] is False
    assert resolve(None, ["synthesis.anchor=true"])["synthesis"]["anchor"] is True
    with pytest.raises(Exception, match="synthesis.anchor must be true or false"):
        resolve(None, ['synthesis.anchor="yes"'])


def test_a_finished_run_written_without_release_means_gets_them_on_resume(ours_run, real_store, tmp_path):
    """A run trained before the means were kept (no anchor buffers in any file) is resumed with nothing left to
    train: its model file is rewritten with the means of its own release checkpoint, and nothing is charged."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.federated.rundir import load_model
    from fedhype.io import DIGEST_KEY, tensor_digest
    from fedhype.privacy.ledger import PrivacyLedger

    run, part = ours_run
    old = tmp_path / "run"
    shutil.copytree(run, old)
    for f in [old / "model.safetensors", *sorted((old / "ckpt").glob("*.safetensors"))]:
        with safe_open(str(f), framework="pt") as fh:
            meta = fh.metadata() or {}
        t = {k: v for k, v in load_file(f).items() if "anchor_" not in k}
        save_file(t, f, metadata={**meta, **({DIGEST_KEY: tensor_digest(t)} if DIGEST_KEY in meta else {})})
    assert load_model(old)[0].release_class_means(torch.zeros(SMALL["code_dim"])) is None
    events = len(PrivacyLedger.load(old / "ledger.json").events)
    train(real_store, part, TrainConfig(epsilon=8.0, rounds=3, local_steps=4, batch_size=32, seed=0, model=SMALL),
          old, resume=True, diagnostics=False)
    hnet, new = load_model(old)[0], load_model(run)[0]
    assert torch.equal(hnet.anchor_cb, new.anchor_cb) and torch.equal(hnet.anchor_cs_cb_w, new.anchor_cs_cb_w)
    assert len(PrivacyLedger.load(old / "ledger.json").events) == events


def test_local_cvae_anchors_each_client_to_its_own_release(real_store, tmp_path):
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.federated.rundir import backfill_release_means, load_model
    from fedhype.synthesis import synthesize

    part = make_partition(real_store, scheme="domain", seed=0)
    run = tmp_path / "run"
    train(real_store, part, TrainConfig(method="local-cvae", epsilon=8.0, rounds=2, local_steps=2, batch_size=32, seed=0,
                                        model=SMALL), run, diagnostics=False)
    hnet, codes, _ = load_model(run)
    means = [hnet.release_class_means(c) for c in codes]
    assert all(m is not None for m in means) and not torch.allclose(means[0], means[1])  # each client's own
    assert synthesize(run, "mixture", per_class=5, seed=0, anchor=True).meta["anchor"] == "release class means"
    for m in hnet.models:  # a local-cvae model written without them gets each client's from the checkpoint
        m.anchor_cb.fill_(float("nan"))
    assert backfill_release_means(hnet, run / "ckpt" / "release-state.safetensors")
    assert all(torch.equal(hnet.release_class_means(c), m) for c, m in zip(codes, means))


def test_the_cli_reports_the_anchor_and_says_when_a_model_has_no_release_means(ours_run, tmp_path):
    """A probe: `--anchor` on a model without release means did nothing, silently, and `--json` did not say."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from typer.testing import CliRunner

    from fedhype.cli.main import app
    from fedhype.io import DIGEST_KEY, tensor_digest

    run, _ = ours_run
    runner = CliRunner()
    r = runner.invoke(app, ["synthesize", "--run", str(run), "--anchor", "--per-class", "5", "--seed", "0",
                            "--out", str(tmp_path / "a.safetensors"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["anchor"] == "release class means"
    with safe_open(str(run / "model.safetensors"), framework="pt") as fh:
        meta = fh.metadata()
    t = {k: v for k, v in load_file(run / "model.safetensors").items() if "anchor_" not in k}
    save_file(t, tmp_path / "old.safetensors", metadata={**meta, DIGEST_KEY: tensor_digest(t)})
    r = runner.invoke(app, ["synthesize", "--run", str(tmp_path / "old.safetensors"), "--anchor", "--per-class", "5",
                            "--out", str(tmp_path / "b.safetensors"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["anchor"].startswith("none")
    assert "--anchor: none: the model holds no release class means" in r.stderr
