"""``PrivatizedUpdate.from_wire``: the server-side re-typing of a received update refuses anything
not shaped exactly like the θ_i that was sent (real client, real embeddings, one DP round)."""

import math

import pytest
import torch

from fedhype.data.partition import make_partition
from fedhype.errors import ArtifactError
from fedhype.federated.engine import build_client
from fedhype.federated.server import Server
from fedhype.models.config import ModelConfig
from fedhype.privacy.dp_step import DPConfig, PrivatizedUpdate

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


@pytest.fixture(scope="module")
def real_update(real_store, tmp_path_factory):
    """(θ_0 sent to client 0, its PrivatizedUpdate after one local DP-SGD step on real records, model config)."""
    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    cfg = ModelConfig(dim=real_store.dim, n_classes=real_store.n_classes, **SMALL)
    server = Server(cfg, 2, torch.Generator().manual_seed(0))
    client = build_client(real_store, part, 0, tmp_path_factory.mktemp("state"), seed=0)
    theta = server.theta_for(0)
    upd = client.run_round(0, theta, cfg, DPConfig(1.0, 1.5), batch_size=32, steps=1, lr=1e-3)
    return theta, upd, cfg


def _rebuild(upd, like, **over):
    kw = dict(client=upd.client, tensors=dict(upd.tensors), like=like, steps=upd.steps,
              noise_multiplier=upd.noise_multiplier, clip_norm=upd.clip_norm, sample_rate=upd.sample_rate,
              private=upd.private)
    kw.update(over)
    return PrivatizedUpdate.from_wire(**kw)


def test_from_wire_rebuilds_a_real_update_exactly(real_update):
    theta, upd, cfg = real_update
    got = _rebuild(upd, theta)
    assert type(got) is PrivatizedUpdate and got.client == "0" and got.private and got.steps == 1
    assert got.noise_multiplier == 1.0 and got.clip_norm == 1.5 and math.isclose(got.sample_rate, upd.sample_rate)
    assert set(got.tensors) == set(theta)
    for k, v in upd.tensors.items():
        assert torch.equal(got.tensors[k], v) and v.abs().sum() > 0  # a real, non-zero Δθ
    Server(cfg, 2, torch.Generator().manual_seed(0)).accept(0, 1.0, got)  # the server's type check holds


def test_from_wire_refuses_anything_not_shaped_like_theta(real_update):
    theta, upd, _ = real_update
    name = sorted(theta)[0]
    psi_like = {**dict(upd.tensors), "local.enc.w0": torch.zeros(3, 3)}  # e.g. a local-encoder tensor
    with pytest.raises(ArtifactError, match=r"unexpected \['local.enc.w0'\]"):
        _rebuild(upd, theta, tensors=psi_like)
    with pytest.raises(ArtifactError, match="missing"):
        _rebuild(upd, theta, tensors={k: v for k, v in upd.tensors.items() if k != name})
    wrong_shape = {**dict(upd.tensors), name: torch.zeros(*theta[name].shape, 2)}
    with pytest.raises(ArtifactError, match=f"'{name}' must be float32"):
        _rebuild(upd, theta, tensors=wrong_shape)
    with pytest.raises(ArtifactError, match="must be float32"):
        _rebuild(upd, theta, tensors={**dict(upd.tensors), name: upd.tensors[name].double()})
    nan = upd.tensors[name].clone()
    nan.view(-1)[0] = float("nan")
    with pytest.raises(ArtifactError, match="non-finite"):
        _rebuild(upd, theta, tensors={**dict(upd.tensors), name: nan})


@pytest.mark.parametrize("over", [dict(noise_multiplier=None), dict(private=False), dict(steps=-1),
                                  dict(sample_rate=1.5), dict(clip_norm=0.0), dict(noise_multiplier=float("inf"))])
def test_from_wire_refuses_bad_metadata(real_update, over):
    theta, upd, _ = real_update
    with pytest.raises(ArtifactError, match="bad metadata"):
        _rebuild(upd, theta, **over)


def test_constructor_still_refuses_other_callers(real_update):
    theta, upd, _ = real_update
    with pytest.raises(TypeError, match="can only be built"):
        PrivatizedUpdate(_token=object(), client="0", tensors=dict(upd.tensors), steps=1, noise_multiplier=1.0,
                         clip_norm=1.5, sample_rate=0.1, private=True)
