"""The server: holds the hypernetwork Φ and the client codes, accepts only privatized updates.

Aggregation (pFedHN-style, Shamsian et al. 2021, eq. 3, with a FedAvg base decoder): for the
participating clients S with public training-set sizes n_i (public metadata, as the dataset
size is in DP-SGD) and weights w_i = n_i / Σ_S n_j, the pseudo-gradient of the generated
parameters is −Δθ_i. By the chain rule

    ∇_Φ = − Σ_i w_i (∂θ_i/∂Φ)ᵀ Δθ_i + λ_Lip ∇_Φ R_Lip,    ∇_{c_i} = − w_i (∂θ_i/∂c_i)ᵀ Δθ_i + λ_Lip ∇_{c_i} R_Lip

computed as one vector–Jacobian product of ⟨θ(c_i; Φ), −Δθ_i⟩. The base decoder and the head
biases are identity parts of h, so with ``lr_server = 1`` (SGD) their update is exactly FedAvg of
the clients' Δθ; the trunk, head weights and codes take Adam steps on the same pseudo-gradient
(plain SGD at lr 1 there overshoots by a factor ‖trunk features‖² and diverged in our runs).
Every Δθ_i is a PrivatizedUpdate, so Φ and the codes are post-processing of DP outputs.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from fedhype.models.config import ModelConfig
from fedhype.models.hypernet import HyperNetwork, fill_missing_anchors
from fedhype.models.losses import lipschitz_penalty_backward
from fedhype.privacy.dp_step import PrivatizedUpdate


class ServerStrategy(Protocol):
    """What the engine (:mod:`fedhype.federated.engine`) asks of a server, whatever the method.

    :class:`Server` (one hypernetwork for the federation) and
    :class:`~fedhype.federated.baselines.LocalServers` (``local-cvae``: one per client) implement it;
    :func:`fedhype.federated.baselines.make_server` picks one by the method's federation.

    Attributes:
        cfg: the model configuration.
        hnet: the model saved as the run's model file: h_Φ (a module whose ``traffic()`` gives the
            parameter and message sizes).
        codes: float32 ``[n_clients, code_dim]``, client i's code at row i.
    """

    cfg: ModelConfig
    hnet: nn.Module

    @property
    def codes(self) -> torch.Tensor: ...

    def theta_for(self, index: int) -> dict[str, torch.Tensor]:
        """θ_i = h(c_i), detached: what client ``index`` downloads (name → float32 tensor)."""

    def space_for(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The public model space ``(m [D], s [])`` client ``index`` trains in."""

    def accept(self, index: int, weight: float, update: PrivatizedUpdate) -> None:
        """Fold client ``index``'s update into the round (anything but a PrivatizedUpdate raises TypeError)."""

    def aggregate(self) -> dict[str, Any]:
        """Apply the round's updates; ``{"participants", "lipschitz"}``."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Everything needed to resume (parameters, codes, optimiser and generator states)."""

    def load_state_tensors(self, t: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_tensors`."""


class Server:
    """Φ, the codes ``[n_clients, code_dim]`` and the update rule (a :class:`ServerStrategy`).

    Args:
        cfg: model configuration.
        n_clients: number of clients (one code each).
        generator: public randomness (init, client sampling, Lipschitz directions).
        lr_server: SGD learning rate of the identity parts (base decoder, head biases); 1 = FedAvg.
        lr_hyper, lr_code: Adam learning rates of the trunk/head weights and of the codes.
    """

    def __init__(self, cfg: ModelConfig, n_clients: int, generator: torch.Generator, *,
                 lr_server: float = 1.0, lr_hyper: float = 1.0, lr_code: float = 1.0, lambda_lip: float | None = None):
        self.cfg = cfg
        self.generator = generator
        self.hnet = HyperNetwork(cfg, generator)
        self.codes = torch.nn.Parameter(torch.randn(n_clients, cfg.code_dim, generator=generator) * 0.1)
        self.lambda_lip = cfg.lambda_lip if lambda_lip is None else lambda_lip
        head_bias = [p for n, p in self.hnet.heads.items() if n.endswith("_b")]
        head_weight = [p for n, p in self.hnet.heads.items() if not n.endswith("_b")]
        # identity parts (base decoder, head biases): SGD — with lr_server = 1 exactly FedAvg of Δθ;
        # trunk, head weights and codes: Adam, whose per-coordinate scaling keeps the pseudo-gradient
        # VJP (whose size grows with ‖trunk features‖²) from overshooting.
        self.opt = torch.optim.SGD([{"params": list(self.hnet.base.parameters()) + head_bias, "lr": lr_server}])
        self.opt_adam = torch.optim.Adam([
            {"params": list(self.hnet.trunk.parameters()) + head_weight, "lr": lr_hyper},
            {"params": [self.codes], "lr": lr_code},
        ])
        self._inbox: list[tuple[int, float]] = []  # (client index, weight) of the updates folded in this round

    def theta_for(self, index: int) -> dict[str, torch.Tensor]:
        """θ_i = h_Φ(c_i), detached (what client ``index`` downloads)."""
        with torch.no_grad():
            return {k: v.detach().clone() for k, v in self.hnet(self.codes[index]).items()}

    def space_for(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The model space ``(m [D], s [])`` every client trains in (one per federation, set by the release)."""
        return self.hnet.space()

    def accept(self, index: int, weight: float, update: PrivatizedUpdate) -> None:
        """Fold a client's update into the round's pseudo-gradient now (streamed aggregation).

        The vector–Jacobian product of ``−w_i ⟨θ(c_i; Φ), Δθ_i⟩`` is accumulated into the ``.grad`` of
        Φ and the codes at once, so neither the update nor its autograd graph is kept: the server's
        memory does not grow with the number of clients in a round. :meth:`aggregate` divides by
        Σ w_i (the weights are renormalised over the participants, which are known only then); by
        linearity the result is the module docstring's ∇_Φ.

        Raises:
            TypeError: ``update`` is not a PrivatizedUpdate (the privacy boundary is a type).
        """
        if type(update) is not PrivatizedUpdate:
            raise TypeError(f"the server accepts only PrivatizedUpdate, got {type(update).__name__}")
        if not self._inbox:
            self.opt.zero_grad(set_to_none=True)
            self.opt_adam.zero_grad(set_to_none=True)
        theta = self.hnet(self.codes[index])
        surrogate = self.codes.new_zeros(())
        for k, d in update.tensors.items():
            surrogate = surrogate - float(weight) * (theta[k] * d).sum()
        surrogate.backward()
        self._inbox.append((index, float(weight)))

    def aggregate(self) -> dict[str, float]:
        """Apply the round's folded updates (weights renormalised over participants) and start a new round."""
        if not self._inbox:
            return {"participants": 0}
        total_w = sum(w for _, w in self._inbox)
        with torch.no_grad():  # Σ w_i g_i → Σ (w_i / Σ w) g_i
            for p in [*self.hnet.parameters(), self.codes]:
                if p.grad is not None:
                    p.grad /= total_w
        lip = torch.zeros(())
        if self.lambda_lip > 0:
            lip = lipschitz_penalty_backward(self.hnet, self.codes, [i for i, _ in self._inbox], self.generator,
                                             self.lambda_lip)
        with torch.no_grad():  # each code gets its own client's full pseudo-gradient (not w_i-scaled)
            for index, w in (self._inbox if self.codes.grad is not None else []):
                self.codes.grad[index] /= (w / total_w)
        self.opt.step()
        self.opt_adam.step()
        n = len(self._inbox)
        self._inbox.clear()
        return {"participants": n, "lipschitz": float(lip.detach())}

    # ------------------------------------------------------------------ persistence
    def state_tensors(self) -> dict[str, torch.Tensor]:
        t = {f"hnet.{k}": v.detach() for k, v in self.hnet.state_dict().items()}
        t["codes"] = self.codes.detach()
        t["gen.server"] = self.generator.get_state()
        for i, st in self.opt_adam.state_dict()["state"].items():
            for k, v in st.items():
                t[f"adam.{i}.{k}"] = torch.as_tensor(v)
        return t

    def load_state_tensors(self, t: dict[str, torch.Tensor]) -> None:
        self.hnet.load_state_dict(fill_missing_anchors(self.hnet, {k[5:]: v for k, v in t.items() if k.startswith("hnet.")}))
        with torch.no_grad():
            self.codes.copy_(t["codes"])
        self.generator.set_state(t["gen.server"])
        sd = self.opt_adam.state_dict()
        state: dict[int, dict] = {}
        for key, v in t.items():
            if key.startswith("adam."):
                _, i, name = key.split(".", 2)
                state.setdefault(int(i), {})[name] = v
        sd["state"] = state
        self.opt_adam.load_state_dict(sd)
