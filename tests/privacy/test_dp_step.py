"""The DP step: per-example gradients, clipping, noise scale, and the privacy-boundary type."""

import math

import pytest
import torch
from torch.nn import functional as F

from fedhype.models.config import ModelConfig
from fedhype.models.cvae import init_local_encoder
from fedhype.models.hypernet import HyperNetwork
from fedhype.models.losses import make_per_example_loss
from fedhype.privacy.dp_step import (DPConfig, LocalDPSession, PrivatizedUpdate, clip_and_sum, per_example_grads,
                                     poisson_batch)


def _setup(dtype=torch.float64, B=6, D=12, K=3):
    cfg = ModelConfig(dim=D, n_classes=K, latent=5, hidden=16, code_dim=4, hyper_hidden=8, mmd_samples=3)
    g = torch.Generator().manual_seed(0)
    hnet = HyperNetwork(cfg, g)
    with torch.no_grad():
        for p in hnet.heads.values():  # non-trivial generated FiLM/prior
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    theta = {k: v.detach().to(dtype) for k, v in hnet(torch.randn(4, generator=g)).items()}
    psi = {k: v.to(dtype) for k, v in init_local_encoder(cfg, g).items()}
    params = {**{f"shared.{k}": v for k, v in theta.items()}, **{f"local.{k}": v for k, v in psi.items()}}
    x = torch.randn(B, D, generator=g, dtype=dtype) * 3
    y = torch.randint(0, K, (B,), generator=g)
    batch = (x, F.one_hot(y, K).to(dtype), torch.randn(B, cfg.latent, generator=g, dtype=dtype),
             torch.randn(B, cfg.mmd_samples, cfg.latent, generator=g, dtype=dtype))
    return cfg, params, batch


def test_per_example_grads_equal_single_example_autograd():
    cfg, params, batch = _setup()
    loss = make_per_example_loss(cfg)
    pe = per_example_grads(loss, params, batch)
    for i in range(batch[0].shape[0]):
        p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        li = loss(p, *(t[i] for t in batch))
        grads = torch.autograd.grad(li, list(p.values()))
        for (k, _), gk in zip(p.items(), grads):
            assert torch.allclose(pe[k][i], gk, atol=1e-6, rtol=0), k
    # every parameter that touches the data gets a non-zero per-example gradient
    assert all(pe[k].abs().sum() > 0 for k in pe)


def test_clipping_bounds_every_example_norm():
    cfg, params, batch = _setup(torch.float32, B=16)
    pe = per_example_grads(make_per_example_loss(cfg), params, batch)
    C = 0.5
    _, norms = clip_and_sum(pe, C)
    assert (norms > C).any(), "test needs examples above the clipping norm"
    factor = (C / (norms + 1e-6)).clamp(max=1.0)
    clipped_norms = torch.sqrt(sum((pe[k].reshape(16, -1) * factor[:, None]).pow(2).sum(1) for k in pe))
    assert float(clipped_norms.max()) <= C * (1 + 1e-5)


def _session(params, dp, B, n, seed=0, lr=1.0):
    shared = {k[7:]: v.float() for k, v in params.items() if k.startswith("shared.")}
    local = {k[6:]: v.float().clone() for k, v in params.items() if k.startswith("local.")}
    return LocalDPSession("c0", shared, local, dp, sample_rate=B / n, expected_batch_size=float(B),
                          generator=torch.Generator().manual_seed(seed),
                          make_optimizer=lambda ps: torch.optim.SGD(ps, lr=lr))


def test_no_noise_no_clipping_equals_plain_gradient():
    cfg, params, batch = _setup(torch.float32, B=8)
    loss = make_per_example_loss(cfg)
    s = _session(params, DPConfig(None, 1.0, enabled=False), B=8, n=100)
    s.step(loss, tuple(t.float() for t in batch))
    upd = s.finish()
    p = {k: v.float().clone().requires_grad_(True) for k, v in params.items()}
    mean_loss = torch.stack([loss(p, *(t[i].float() for t in batch)) for i in range(8)]).mean()
    grads = dict(zip(p, torch.autograd.grad(mean_loss, list(p.values()))))
    for k, d in upd.tensors.items():  # SGD lr=1: Δθ = −mean gradient
        assert torch.allclose(d, -grads[f"shared.{k}"], atol=1e-5), k
    assert upd.private is False and upd.noise_multiplier is None


def test_noise_that_leaves_client_has_right_scale():
    cfg, params, batch = _setup(torch.float32, B=4)
    sigma, C, B = 2.0, 1.5, 4.0
    # zero-gradient loss: what leaves the client is pure noise, std = σC/B per coordinate
    zero_loss = lambda p, *ex: 0.0 * sum(v.sum() for v in p.values())  # noqa: E731
    s = _session(params, DPConfig(sigma, C), B=4, n=100)
    s.step(zero_loss, tuple(t.float() for t in batch))
    upd = s.finish()
    flat = torch.cat([t.flatten() for t in upd.tensors.values()])
    expected = sigma * C / B
    n = flat.numel()
    assert n > 1000
    # sample std within 5 standard errors; mean ≈ 0; Gaussian kurtosis ≈ 3
    se = expected / math.sqrt(2 * n)
    assert abs(float(flat.std()) - expected) < 5 * se
    assert abs(float(flat.mean())) < 5 * expected / math.sqrt(n)
    from scipy import stats
    assert stats.kstest(flat.double().numpy(), "norm", args=(0.0, expected)).pvalue > 1e-3
    # and a wrong scale is rejected by the same test (the test can fail)
    assert stats.kstest(flat.double().numpy(), "norm", args=(0.0, 1.5 * expected)).pvalue < 1e-3
    assert upd.private and upd.noise_multiplier == sigma and upd.clip_norm == C


def test_noise_changes_with_generator_and_is_independent_of_data():
    cfg, params, batch = _setup(torch.float32, B=4)
    loss = make_per_example_loss(cfg)
    a = _session(params, DPConfig(1.0, 1.0), 4, 100, seed=1)
    b = _session(params, DPConfig(1.0, 1.0), 4, 100, seed=2)
    a.step(loss, tuple(t.float() for t in batch))
    b.step(loss, tuple(t.float() for t in batch))
    da, db = a.finish().tensors, b.finish().tensors
    assert any(not torch.allclose(da[k], db[k]) for k in da)


def test_privatized_update_cannot_be_forged():
    with pytest.raises(TypeError, match="only be built"):
        PrivatizedUpdate(_token=object(), client="x", tensors={}, steps=1, noise_multiplier=1.0, clip_norm=1.0,
                         sample_rate=0.1, private=True)


def test_poisson_batch_rate():
    g = torch.Generator().manual_seed(0)
    sizes = [poisson_batch(1000, 0.05, g).numel() for _ in range(200)]
    assert abs(sum(sizes) / 200 - 50) < 2.5
    assert len(set(sizes)) > 5  # variable batch size, as Poisson sampling requires


def test_dpconfig_validation():
    from fedhype.errors import ValidationError
    with pytest.raises(ValidationError):
        DPConfig(-1.0, 1.0)
    with pytest.raises(ValidationError):
        DPConfig(1.0, 0.0)


@pytest.mark.parametrize("variant", [{}, {"decoder": "shared"}, {"prior": "standard", "lambda_mmd": 0.0}])
def test_bookkeeping_equals_torch_func_reference(variant):
    """The fast path clips exactly the per-example gradients that vmap(grad) computes."""
    from fedhype.models.losses import make_batch_loss
    from fedhype.privacy.bookkeeping import clipped_sum_bookkeeping

    cfg, params, batch = _setup(torch.float64, B=7)
    cfg = ModelConfig(**{**cfg.to_dict(), **variant})
    g = torch.Generator().manual_seed(1)
    hnet = HyperNetwork(cfg, g)
    theta = {k: v.detach().double() + 0.01 * torch.randn(v.shape, generator=g, dtype=torch.float64)
             for k, v in hnet(torch.randn(4, generator=g)).items()}
    params = {**{f"shared.{k}": v for k, v in theta.items()},
              **{k: v for k, v in params.items() if k.startswith("local.")}}
    pe = per_example_grads(make_per_example_loss(cfg), params, batch)
    for C in (0.05, 1e6):  # clipping active / inactive
        ref, ref_norms = clip_and_sum(pe, C)
        fast, norms = clipped_sum_bookkeeping(make_batch_loss(cfg), params, batch, C)
        assert torch.allclose(norms, ref_norms, rtol=1e-6, atol=1e-8)
        assert set(fast) == set(ref)
        for k in ref:
            assert torch.allclose(fast[k], ref[k], rtol=1e-6, atol=1e-8), k


def test_dp_step_and_model_helpers_create_no_tensor_off_the_parameters_device():
    """Every tensor these paths create lives on the parameters' device (a CPU-made ``torch.zeros``
    broke the book-keeping step on CUDA, found by benchmarks/gpu.py). The ``meta`` device raises on
    any mix with a CPU tensor, so this checks the placement without a GPU."""
    from fedhype.models.cvae import init_encoder_from_decoder, init_local_encoder
    from fedhype.models.losses import make_batch_loss
    from fedhype.privacy.bookkeeping import clipped_sum_bookkeeping

    cfg = ModelConfig(dim=32, n_classes=4)
    g = torch.Generator().manual_seed(0)
    hnet = HyperNetwork(cfg, g)
    theta = {k: v.detach().to("meta") for k, v in hnet(torch.randn(cfg.code_dim, generator=g)).items()}
    psi = {k: v.to("meta") for k, v in init_local_encoder(cfg, g).items()}
    params = {**{f"shared.{k}": v for k, v in theta.items()}, **{f"local.{k}": v for k, v in psi.items()}}
    B = 5
    batch = (torch.empty(B, 32, device="meta"), torch.empty(B, 4, device="meta"),
             torch.empty(B, cfg.latent, device="meta"), torch.empty(B, cfg.mmd_samples, cfg.latent, device="meta"))
    out, norms = clipped_sum_bookkeeping(make_batch_loss(cfg), params, batch, 1.0)
    assert norms.device.type == "meta" and norms.shape == (B,)
    assert set(out) == set(params) and all(v.device.type == "meta" for v in out.values())
    init_encoder_from_decoder(psi, theta)
    assert hnet.to("meta").traffic()["generated_parameters_per_client"] == sum(v.numel() for v in theta.values())
