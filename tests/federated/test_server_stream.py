"""Streamed aggregation: folding each update into the pseudo-gradient as it arrives gives the same
step as the batch formula of fedhype.federated.server (module docstring), and keeps nothing per client."""

import copy

import torch

from fedhype.federated.server import Server
from fedhype.models.config import ModelConfig
from fedhype.models.losses import lipschitz_penalty
from fedhype.privacy.dp_step import PrivatizedUpdate


def _updates(server: Server, n: int) -> list[PrivatizedUpdate]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        theta = server.theta_for(i)
        out.append(PrivatizedUpdate.from_wire(  # shaped like θ_i, as a remote client's update arrives
            client=str(i), tensors={k: 0.01 * torch.randn(v.shape, generator=g) for k, v in theta.items()}, like=theta,
            steps=1, sample_rate=0.1, noise_multiplier=1.0, clip_norm=1.0, private=True))
    return out


def _batch_step(server: Server, items: list[tuple[int, float, PrivatizedUpdate]]) -> None:
    """The batch formula: one VJP of −Σ (w_i/Σw) ⟨θ_i, Δθ_i⟩ + λ R_Lip, codes rescaled by Σw / w_i."""
    total = sum(w for _, w, _ in items)
    server.opt.zero_grad(set_to_none=True)
    server.opt_adam.zero_grad(set_to_none=True)
    surrogate = torch.zeros(())
    for i, w, u in items:
        theta = server.hnet(server.codes[i])
        for k, d in u.tensors.items():
            surrogate = surrogate - (w / total) * (theta[k] * d).sum()
    lip = lipschitz_penalty(server.hnet, server.codes[torch.tensor([i for i, _, _ in items])], server.generator)
    (surrogate + server.lambda_lip * lip).backward()
    with torch.no_grad():
        for i, w, _ in items:
            server.codes.grad[i] /= (w / total)
    server.opt.step()
    server.opt_adam.step()


def test_streamed_aggregation_equals_the_batch_formula():
    cfg = ModelConfig(dim=16, n_classes=3, latent=4, hidden=8, code_dim=5, hyper_hidden=8, lambda_lip=0.1)
    server = Server(cfg, 4, torch.Generator().manual_seed(0), lr_server=1.0, lr_hyper=1e-2, lr_code=1e-2)
    ref, before = copy.deepcopy(server), copy.deepcopy(server)
    ups = _updates(server, 4)
    items = [(0, 10.0, ups[0]), (2, 30.0, ups[2]), (3, 5.0, ups[3])]  # client 1 not sampled
    for i, w, u in items:
        server.accept(i, w, u)
    assert server._inbox == [(0, 10.0), (2, 30.0), (3, 5.0)]  # no tensors are kept per client
    server.aggregate()
    _batch_step(ref, items)
    for (name, a), (_, b) in zip(server.hnet.named_parameters(), ref.hnet.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), name
    moved = [n for (n, a), (_, b) in zip(server.hnet.named_parameters(), before.hnet.named_parameters()) if not torch.equal(a, b)]
    assert moved  # the step did something (the comparison above is not between two untouched models)
    assert torch.allclose(server.codes, ref.codes, atol=1e-6)
    assert torch.equal(server.codes[1], before.codes[1])  # the unsampled client's code did not move
    # a second round starts from zeroed gradients
    for i, w, u in items[:1]:
        server.accept(i, w, u)
    assert server.aggregate()["participants"] == 1
