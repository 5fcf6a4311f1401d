"""The shared hypernetwork h_Φ: client code c_i → the parameters generated for client i.

Design (ours; FedHypeVAE's abstract leaves the parametrisation open). The hypernetwork output
θ_i = h_Φ(c_i) has three parts:

* **Base decoder** — the weights of a 3-hidden-layer MLP decoder (z ⊕ onehot(y) → hidden ×3 → D).
  They are part of Φ and pass through h unchanged, so their update is FedAvg of the clients'
  privatized Δθ (as the predecessor DP-CVAE averages its decoder).
* **FiLM modulation** (Perez et al. 2018, "FiLM") — per hidden layer ℓ a scale γ_ℓ and shift β_ℓ
  (3 × 2 × hidden numbers) generated from the code: the decoder of client i computes
  h_ℓ ← γ_{i,ℓ} ⊙ h_ℓ + β_{i,ℓ}. This gives client-aware decoders at a fraction of the cost of
  generating every weight (pFedHN-style chunked heads would need ~D·hidden outputs per chunk).
* **Class-conditional prior** — μ_{i,y}, log σ²_{i,y} for every class y (2 × K × L numbers).
* **Client statistics** (``cfg.client_heads``) — offsets of the class output bias, the linear path and
  the residual log σ_x, linear in the code itself (``W_cs · c_i``, no bias: the base parameters are
  the pooled values; linear in c rather than in the trunk features because the trunk features of
  the clients share a large common part, which made the interpolation below ill-conditioned), set
  before round 0 so that each client's code reproduces the DP Gaussian of its own release
  (:func:`fedhype.federated.class_stats.apply_client_stats`); the neutral meta-code c̄ = Σ w_i c_i
  then gets the size-weighted mean of the clients' offsets.

Parameter count and traffic for D = 384, K = 10, L = 64, hidden = 128, code 32, trunk 128
(the bundled default): see :meth:`HyperNetwork.traffic` (printed by ``fedhype train``). A client
downloads θ_i and uploads a Δθ_i of the same size (float32).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedhype.models.config import ModelConfig


#: Buffers a model written before they were kept lacks (:meth:`HyperNetwork.release_class_means`): loading
#: leaves them NaN (no release means).
ANCHOR_BUFFERS = ("anchor_cb", "anchor_cs_cb_w")


def fill_missing_anchors(module: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` plus ``module``'s own (NaN) values of every :data:`ANCHOR_BUFFERS` entry it lacks.

    So a model or checkpoint written before the release means were kept loads with ``load_state_dict``
    (strict) and synthesis draws it unanchored. Returns a new dict; ``state`` is not changed.
    """
    out = dict(state)
    for k, v in module.state_dict().items():
        if k.rsplit(".", 1)[-1] in ANCHOR_BUFFERS and k not in out:
            out[k] = v
    return out


def _linear_init(out_f: int, in_f: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Kaiming-uniform weight [out, in] and uniform bias [out] as in ``torch.nn.Linear``."""
    bound = 1.0 / math.sqrt(in_f)
    w = (torch.rand(out_f, in_f, generator=generator) * 2 - 1) * bound
    b = (torch.rand(out_f, generator=generator) * 2 - 1) * bound
    return w, b


class HyperNetwork(nn.Module):
    """h_Φ: code ``[code_dim]`` → dict of generated parameters θ (float32).

    Keys of the output (shapes):

    * ``dec.w1`` [hidden, L+K], ``dec.b1`` [hidden], ``dec.w2``/``dec.w3`` [hidden, hidden],
      ``dec.b2``/``dec.b3`` [hidden], ``dec.wo`` [D, hidden], ``dec.bo`` [D] (base decoder),
      ``dec.logsx`` [D] (log σ_x of the Gaussian likelihood, model space), ``dec.cb`` [K, D] (class
      output bias, only when ``cfg.class_bias``), ``dec.wl`` [L, D] (linear path of the decoder, only when
      ``cfg.linear_path``: with the MLP output zeroed, ``x̃ = cb[y] + z·W_lin + σ_x·ε`` is probabilistic PCA,
      Tipping & Bishop 1999, eq. 3, initialised from the DP second moments: :mod:`fedhype.federated.class_stats`)
    * ``film.gamma``, ``film.beta`` [3, hidden] (only when ``cfg.decoder == "film"``)
    * ``prior.mu``, ``prior.logvar`` [K, L] (only when ``cfg.prior == "class"``)
    """

    def __init__(self, cfg: ModelConfig, generator: torch.Generator):
        super().__init__()
        self.cfg = cfg
        h, L, K, D = cfg.hidden, cfg.latent, cfg.n_classes, cfg.dim
        shapes = [("w1", "b1", h, L + K), ("w2", "b2", h, h), ("w3", "b3", h, h), ("wo", "bo", D, h)]
        self.base = nn.ParameterDict()
        for wn, bn, o, i in shapes:
            w, b = _linear_init(o, i, generator)
            self.base[wn], self.base[bn] = nn.Parameter(w), nn.Parameter(b)
        if cfg.class_bias:  # class-conditional output bias, set from DP class means before round 0
            self.base["cb"] = nn.Parameter(torch.zeros(K, D))
        if cfg.linear_path:  # linear-Gaussian path z ↦ z·W_lin, set from the DP second moments before round 0
            self.base["wl"] = nn.Parameter(torch.zeros(L, D))
        # model space x̃ = (x/‖x‖ − m) / s (buffers: DP outputs, saved with the model). The
        # defaults m = 0, s = 1/√D give the fixed transform √D·x/‖x‖.
        self.register_buffer("space_mean", torch.zeros(D))
        self.register_buffer("space_scale", torch.tensor(1.0 / math.sqrt(D)))
        # the release's class means (model space; buffers: DP outputs saved with the model): ``cb`` and the
        # client-statistics heads as the release set them before round 0, NaN until then (and in a model
        # whose untrained state is not the DP Gaussian). Synthesis anchors each code's class means to them.
        if cfg.class_bias:
            self.register_buffer("anchor_cb", torch.full((K, D), float("nan")))
        if cfg.client_heads:
            self.register_buffer("anchor_cs_cb_w", torch.full((K * D, cfg.code_dim), float("nan")))
        # per-dimension log std of the Gaussian likelihood p(x|z,y) = N(dec(z,y), diag σ_x²)
        if cfg.likelihood == "learned":
            self.base["logsx"] = nn.Parameter(torch.full((D,), -0.5))
        hh = cfg.hyper_hidden
        self.trunk = nn.ParameterDict()
        for name, (o, i) in {"t1": (hh, cfg.code_dim), "t2": (hh, hh)}.items():
            w, b = _linear_init(o, i, generator)
            self.trunk[name + "_w"], self.trunk[name + "_b"] = nn.Parameter(w), nn.Parameter(b)
        self.heads = nn.ParameterDict()
        if cfg.decoder == "film":
            # zero-initialised: every client starts from γ = 1, β = 0 (the shared decoder)
            self.heads["film_w"] = nn.Parameter(torch.zeros(2 * 3 * h, hh))
            self.heads["film_b"] = nn.Parameter(torch.zeros(2 * 3 * h))
        if cfg.client_heads:  # zero: every code starts at the pooled statistics until set from the releases
            self.heads["cs_cb_w"] = nn.Parameter(torch.zeros(K * D, cfg.code_dim))
            self.heads["cs_wl_w"] = nn.Parameter(torch.zeros(L * D, cfg.code_dim))
            if "logsx" in self.base:
                self.heads["cs_lsx_w"] = nn.Parameter(torch.zeros(D, cfg.code_dim))
        if cfg.prior == "class":
            w, _ = _linear_init(K * L, hh, generator)
            self.heads["mu_w"] = nn.Parameter(w * 0.1)
            # class-separated initial prior means: a fixed random direction per class
            self.heads["mu_b"] = nn.Parameter(torch.randn(K * L, generator=generator) * 0.5)
            self.heads["lv_w"] = nn.Parameter(torch.zeros(K * L, hh))
            self.heads["lv_b"] = nn.Parameter(torch.zeros(K * L))

    def release_class_means(self, code: torch.Tensor, *, client_stats: bool = True) -> "torch.Tensor | None":
        """The class means ``[K, D]`` (float32, model space) that the statistics release gave the model of ``code``.

        Before round 0 the model is the DP class-conditional Gaussian (:func:`fedhype.federated.class_stats.apply_class_stats`):
        its class-y mean is ``cb[y]`` plus, with client statistics, the code's offset ``(W_cs·c)[y]``. Those values
        are kept (buffers ``anchor_cb``, ``anchor_cs_cb_w``) while DP-SGD moves ``cb``, the heads, the prior and the
        MLP. ``client_stats=False``: the pooled means (the neutral model). ``None`` when the model holds no
        release means (a model written before they were kept, an ablation without the linear-Gaussian start).
        """
        cb = getattr(self, "anchor_cb", None)
        if cb is None or not bool(torch.isfinite(cb).all()):
            return None
        w = getattr(self, "anchor_cs_cb_w", None)
        if client_stats and w is not None and bool(torch.isfinite(w).all()):
            return cb + nn.functional.linear(code, w).reshape(cb.shape)
        return cb.clone()

    def space(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(m float32 [D], s float32 []) of the model space x̃ = (x/‖x‖ − m)/s (public DP outputs)."""
        return self.space_mean, self.space_scale

    def space_for(self, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model space of the client with ``code`` (one space for all clients of a federation)."""
        return self.space()

    def trunk_features(self, code: torch.Tensor) -> torch.Tensor:
        t = torch.relu(nn.functional.linear(code, self.trunk["t1_w"], self.trunk["t1_b"]))
        return torch.relu(nn.functional.linear(t, self.trunk["t2_w"], self.trunk["t2_b"]))

    def generated(self, code: torch.Tensor) -> dict[str, torch.Tensor]:
        """The code-dependent outputs only (FiLM, prior and the client-statistics offsets
        ``cs.cb`` [K, D], ``cs.wl`` [L, D], ``cs.logsx`` [D]), without the base decoder."""
        cfg = self.cfg
        out: dict[str, torch.Tensor] = {}
        if not self.heads:
            return out
        t = self.trunk_features(code)
        if cfg.decoder == "film":
            f = nn.functional.linear(t, self.heads["film_w"], self.heads["film_b"]).reshape(2, 3, cfg.hidden)
            out["film.gamma"] = 1.0 + f[0]
            out["film.beta"] = f[1]
        if cfg.prior == "class":
            K, L = cfg.n_classes, cfg.latent
            out["prior.mu"] = nn.functional.linear(t, self.heads["mu_w"], self.heads["mu_b"]).reshape(K, L)
            lv = nn.functional.linear(t, self.heads["lv_w"], self.heads["lv_b"]).reshape(K, L)
            out["prior.logvar"] = 4.0 * torch.tanh(lv / 4.0)  # bounded in (-4, 4) for stability
        if cfg.client_heads:
            K, L, D = cfg.n_classes, cfg.latent, cfg.dim
            out["cs.cb"] = nn.functional.linear(code, self.heads["cs_cb_w"]).reshape(K, D)
            out["cs.wl"] = nn.functional.linear(code, self.heads["cs_wl_w"]).reshape(L, D)
            if "cs_lsx_w" in self.heads:
                out["cs.logsx"] = nn.functional.linear(code, self.heads["cs_lsx_w"])
        return out

    def forward(self, code: torch.Tensor, *, client_stats: bool = True) -> dict[str, torch.Tensor]:
        """θ_i = h_Φ(c_i). ``code`` float32 ``[code_dim]``; returns the dict described above.

        ``client_stats=False`` leaves out the client-statistics offsets (the pooled statistics with the
        code's FiLM and prior): the domain-neutral model that ``--code neutral`` samples."""
        out = {f"dec.{k}": v for k, v in self.base.items()}
        gen = self.generated(code)
        for k in ("cb", "wl", "logsx"):  # client statistics: pooled base + the client's offset
            off = gen.pop(f"cs.{k}", None)
            if off is not None and client_stats:
                out[f"dec.{k}"] = out[f"dec.{k}"] + off
        out.update(gen)
        return out

    def traffic(self) -> dict[str, int]:
        """Parameter counts and per-round bytes (float32) a client downloads and uploads."""
        with torch.no_grad():
            theta = self.forward(torch.zeros(self.cfg.code_dim, device=self.space_mean.device))
        n_theta = sum(v.numel() for v in theta.values())
        return {
            "hypernetwork_parameters": sum(p.numel() for p in self.parameters()),
            "generated_parameters_per_client": n_theta,
            "download_bytes_per_round": 4 * n_theta,
            "upload_bytes_per_round": 4 * n_theta,
        }
