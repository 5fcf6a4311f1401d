"""Baselines without federation in the same engine: local-cvae and central-cvae on real embeddings."""

import dataclasses
import json

import pytest
import torch

from fedhype.data.partition import make_partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.federated.baselines import LocalModels, pooled_partition
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.federated.rundir import load_model

TINY = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="domain", seed=0)


def _cfg(**kw):
    base = dict(rounds=2, local_steps=2, batch_size=32, epsilon=4.0, delta=1e-4, seed=0, model=TINY)
    base.update(kw)
    return TrainConfig(**base)


def _prv(history):
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = list(history)
    return acc.get_epsilon(delta=1e-4)


def _ledger_history(run_dir, client: str) -> list[tuple[float, float, int]]:
    """Every mechanism run on ``client``'s records, as Opacus history (the DP-SGD steps and any DP statistics)."""
    events = json.loads((run_dir / "ledger.json").read_text())["events"]
    return [(e["noise_multiplier"], e["sample_rate"], e["steps"]) for e in events if e["client"] == client]


@pytest.fixture(scope="module")
def local_run(real_store, part, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "run"
    return train(real_store, part, _cfg(method="local-cvae"), out, diagnostics=False), out


def test_local_cvae_accounts_per_client_and_keeps_one_model_per_client(part, local_run):
    res, out = local_run
    sigma = res["noise_multiplier"]
    events = [e for e in json.loads((out / "ledger.json").read_text())["events"] if e["mechanism"] == "dp-sgd"]
    # each client's own 2 rounds × 2 DP-SGD steps at q_i = B / n_i, nothing of anyone else
    assert sorted((e["client"], e["round"]) for e in events) == sorted((str(c.id), r) for c in part.clients for r in (0, 1))
    for c in part.clients:
        mine = [e for e in events if e["client"] == str(c.id)]
        assert all(e["steps"] == 2 and e["noise_multiplier"] == sigma and e["sample_rate"] == pytest.approx(32 / len(c.train))
                   for e in mine)
        # ε_i is the accountant's (Opacus PRV) for every mechanism run on client i's records
        assert res["epsilon_per_client"][str(c.id)] == pytest.approx(_prv(_ledger_history(out, str(c.id))), rel=1e-9)
    assert res["epsilon"] == pytest.approx(max(res["epsilon_per_client"].values())) and 3.9 < res["epsilon"] <= 4.0
    hnet, codes, meta = load_model(out)
    assert isinstance(hnet, LocalModels) and len(hnet.models) == len(part.clients) == codes.shape[0]
    assert meta["method"] == "local-cvae" and meta["epsilon"] == pytest.approx(res["epsilon"])
    thetas = [hnet(codes[i]) for i in range(len(part.clients))]
    assert set(thetas[0]) == {k for k in thetas[0] if k.startswith("dec.")}  # the CVAE preset: a plain decoder
    assert not torch.equal(thetas[0]["dec.wo"], thetas[1]["dec.wo"])  # separate models
    assert res["traffic"]["upload_bytes_per_round"] == 0


def _changed_client(store: EmbeddingStore, part, client: int) -> tuple[EmbeddingStore, object]:
    """The same store with client ``client``'s training records changed (its embeddings re-paired with other labels)."""
    pos = torch.as_tensor(store.positions(part.clients[client].train))
    emb = store.embeddings.clone()
    emb[pos] = emb[pos.flip(0)]
    changed = dataclasses.replace(store, embeddings=emb)
    return changed, dataclasses.replace(part, store_digest=changed.digest())


@pytest.mark.parametrize("method, independent", [("local-cvae", True), ("dp-cvae", False)])
def test_a_local_model_ignores_other_clients_records(real_store, part, tmp_path, method, independent):
    changed, part2 = _changed_client(real_store, part, client=1)
    cfg = _cfg(method=method, rounds=1, local_steps=2, noise_multiplier=1.0, epsilon=None)  # σ set: no calibration
    train(real_store, part, cfg, tmp_path / "a", diagnostics=False)
    train(changed, part2, cfg, tmp_path / "b", diagnostics=False)
    (ha, ca, _), (hb, cb, _) = load_model(tmp_path / "a"), load_model(tmp_path / "b")
    theta_a0, theta_b0 = ha(ca[0]), hb(cb[0])
    same = all(torch.equal(theta_a0[k], theta_b0[k]) for k in theta_a0)
    assert same is independent  # federated: client 1's records reach client 0's model through Φ
    if independent:
        assert not torch.equal(ha(ca[1])["dec.wo"], hb(cb[1])["dec.wo"])  # client 1's own model did change


def test_local_cvae_synthesis_specs(part, local_run):
    from fedhype.models.cvae import sample
    from fedhype.synthesis import synthesize
    from fedhype.synthesis.sample import class_labels

    _, out = local_run
    hnet, codes, meta = load_model(out)
    one = synthesize(out, "client:optdigits", per_class=5, seed=3)
    gen = torch.Generator().manual_seed(3)
    labels = class_labels(hnet.cfg.n_classes, per_class=5, generator=gen)
    with torch.no_grad():
        expected = sample(hnet(codes[1]), labels, hnet.cfg, gen, 1.0, hnet.space_for(codes[1]))
    assert torch.equal(one.labels, labels) and torch.allclose(one.embeddings, expected)
    mix = synthesize(out, "mixture:0=1,3=1", per_class=20, seed=0)
    assert mix.domain_names == ["mnist", "rotated-mnist"] and set(mix.domains.tolist()) == {0, 1}
    sizes = torch.tensor(meta["client_sizes"], dtype=torch.float64)
    every = synthesize(out, "mixture", n=4000, seed=0)
    share = torch.bincount(every.domains, minlength=4).double() / 4000
    assert torch.allclose(share, sizes / sizes.sum(), atol=0.03)
    for spec in ("neutral", "mix:0=1,1=1"):
        with pytest.raises(ValidationError, match="mixture"):
            synthesize(out, spec, per_class=2, seed=0)


def test_central_cvae_pools_every_client_into_one(real_store, part, tmp_path):
    res = train(real_store, part, _cfg(method="central-cvae", rounds=1, local_steps=3), tmp_path / "c",
                diagnostics=False)
    n = sum(len(c.train) for c in part.clients)
    assert res["clients"] == ["0"] and list(res["epsilon_per_client"]) == ["0"]
    # record-level DP over the pooled set: q = B / Σ n_i, 1 round × 3 steps
    (event,) = [e for e in json.loads((tmp_path / "c" / "ledger.json").read_text())["events"] if e["mechanism"] == "dp-sgd"]
    assert event["client"] == "0" and event["sample_rate"] == pytest.approx(32 / n) and event["steps"] == 3
    assert res["epsilon"] == pytest.approx(_prv(_ledger_history(tmp_path / "c", "0")), rel=1e-9)
    assert 3.9 < res["epsilon"] <= 4.0
    _, codes, meta = load_model(tmp_path / "c")
    assert meta["client_names"] == ["pooled"] and meta["client_sizes"] == [n] and codes.shape[0] == 1
    pooled = pooled_partition(part)
    assert sorted(pooled.clients[0].train) == sorted(s for c in part.clients for s in c.train)
    from fedhype.synthesis import synthesize

    assert len(synthesize(tmp_path / "c", "neutral", per_class=3, seed=0)) == 3 * real_store.n_classes


def test_pooled_training_beats_training_alone_without_dp(real_store, part, tmp_path):
    cfg = dict(rounds=2, local_steps=None, local_epochs=1.0, lr_local=3e-3, no_dp=True, epsilon=None)
    central = train(real_store, part, _cfg(method="central-cvae", **cfg), tmp_path / "c")
    local = train(real_store, part, _cfg(method="local-cvae", **cfg), tmp_path / "l")
    assert central["private"] is False and central["epsilon"] is None
    mc = json.loads((tmp_path / "c" / "metrics.json").read_text())
    ml = json.loads((tmp_path / "l" / "metrics.json").read_text())
    # held-out (validation) −ELBO: pooled records beat each client alone (measured 152 vs 254)
    assert mc[-1]["diagnostics_not_dp"]["val_neg_elbo"] < mc[0]["diagnostics_not_dp"]["val_neg_elbo"]
    assert mc[-1]["diagnostics_not_dp"]["val_neg_elbo"] < 0.8 * ml[-1]["diagnostics_not_dp"]["val_neg_elbo"]


def test_job_refuses_a_neutral_code_for_local_cvae_before_writing(tmp_path):
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import run_job

    conf = resolve(None, ['train.method="local-cvae"', 'synthesis.code="neutral"'])
    with pytest.raises(ValidationError, match='synthesis.code = "mixture"'):
        run_job(conf, tmp_path / "job", log=lambda s: None)
    assert not (tmp_path / "job").exists()


def test_local_cvae_resume_is_identical(real_store, part, tmp_path):
    cfg = _cfg(method="local-cvae", rounds=2, local_steps=1, noise_multiplier=1.0, epsilon=None)
    train(real_store, part, cfg, tmp_path / "a", diagnostics=False)
    train(real_store, part, cfg, tmp_path / "b", diagnostics=False, stop_after=1)
    train(real_store, part, cfg, tmp_path / "b", resume=True, diagnostics=False)
    (ha, ca, _), (hb, cb, _) = load_model(tmp_path / "a"), load_model(tmp_path / "b")
    assert torch.equal(ca, cb)
    for (k, va), (_, vb) in zip(ha.state_dict().items(), hb.state_dict().items()):
        assert torch.equal(va, vb), k
