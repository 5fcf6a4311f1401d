"""A client's private state across an interrupted round: what a rerun replays and what it draws afresh."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits

from fedhype.federated.client import Client
from fedhype.models.config import ModelConfig


def _client(tmp_path, seed):
    d = load_digits()
    x = torch.nn.functional.normalize(torch.tensor(d.data[:60], dtype=torch.float32), dim=1)
    return Client("0", 0, x, torch.tensor(d.target[:60]), tmp_path / "state", seed)


def _saved_and_reloaded(tmp_path, seed):
    c = _client(tmp_path, seed)
    cfg = ModelConfig(dim=64, n_classes=10)
    state = c.load_state(0, cfg)
    for g in (state["sample_gen"], state["noise_gen"]):  # the round's draws
        torch.rand(100, generator=g)
    opt = torch.optim.SGD(list(state["psi"].values()), lr=0.1)
    c.save_state(1, state, opt)
    return state, c.load_state(1, cfg)


def test_a_seeded_rerun_replays_batches_and_noise(tmp_path):
    saved, again = _saved_and_reloaded(tmp_path, seed=3)
    for k in ("sample_gen", "noise_gen"):
        assert torch.equal(again[k].get_state(), saved[k].get_state())


def test_an_unseeded_rerun_draws_new_batches_as_well_as_new_noise(tmp_path):
    """The ledger charges an unseeded rerun as an independent mechanism (PrivacyLedger.as_rerun); with the
    same Poisson batches and fresh noise it would not be one (each step: one batch under noise σ/√2)."""
    saved, again = _saved_and_reloaded(tmp_path, seed=None)
    from fedhype.io import load_tensors

    kept = load_tensors(tmp_path / "state" / "state-r1.safetensors")
    assert not [k for k in kept if k.startswith("gen.")]  # never read back, so never written (a rewindable state)
    for k in ("sample_gen", "noise_gen"):
        assert not torch.equal(again[k].get_state(), saved[k].get_state())
    q = 0.3  # and the batches differ: the Poisson masks of the two attempts are not the same draws
    a = torch.rand(60, generator=again["sample_gen"]) < q
    b = torch.rand(60, generator=saved["sample_gen"]) < q
    assert not torch.equal(a, b)
    assert again["psi"].keys() == saved["psi"].keys()
    for k in saved["psi"]:
        assert torch.equal(again["psi"][k], saved["psi"][k])  # the model state itself is restored



def test_a_client_keeps_one_copy_of_its_records_and_maps_each_batch_as_drawn(tmp_path):
    """Memory: a client holds its records once (float32 [n_i, D]), not also a model-space copy (that halved the
    per-client data in the clients-scaling benchmark); a batch mapped to model space when drawn has the values
    that mapping every record first gives (the map is row-wise), so a seeded round is unchanged."""
    from fedhype.models.cvae import to_model_space

    c = _client(tmp_path, seed=5)
    c.set_space((torch.full((64,), 0.01), torch.tensor(0.2)))
    assert [k for k, v in vars(c).items() if torch.is_tensor(v) and v.dim() == 2] == ["_raw"]
    assert c.n == 60
    full = to_model_space(c._raw, c.space)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        idx = torch.randint(0, 60, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g)
        assert torch.equal(to_model_space(c._raw[idx], c.space), full[idx])
