"""A federated client: its private records, local encoder ψ_i and private state.

What a client holds never leaves it: its records, ψ_i and ψ_i's optimiser state, and its
noise / sampling generator states (they are stored in ``<run>/clients/<id>/`` — in a real
deployment that folder lives on the institution's machine). What it returns is a
:class:`~fedhype.privacy.dp_step.PrivatizedUpdate` from :meth:`Client.run_round`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn import functional as F

from fedhype.io import atomic_save_tensors, load_tensors
from fedhype.models.config import ModelConfig
from fedhype.models.cvae import init_encoder_from_decoder, init_local_encoder, to_model_space
from fedhype.models.losses import batch_elbo, make_batch_loss, make_per_example_loss, make_public_grad
from fedhype.privacy.dp_step import (DPConfig, LocalDPSession, PrivatizedUpdate, ReleaseWeights, poisson_batch,
                                    privatize_class_sums)
from fedhype.privacy.randomness import noise_generator


class Client:
    """One institution in the in-process simulation.

    Args:
        client_id: public id (str).
        index: position of the client (its code row on the server).
        x: float32 ``[n_i, D]`` training embeddings (raw, kept once; each batch is mapped to model space as it is drawn).
        labels: int64 ``[n_i]``.
        state_dir: private folder for ψ_i, optimiser and generator states.
        seed: run seed, or None (noise seeded from OS entropy: not reproducible).
    """

    def __init__(self, client_id: str, index: int, x: torch.Tensor, labels: torch.Tensor, state_dir: Path,
                 seed: int | None):
        self.id = str(client_id)
        self.index = index
        self._raw = x.to(torch.float32)  # the one copy of the records: a batch is mapped to model space when drawn
        self.space = None  # (m, s) of the model space, set by set_space once the DP statistics are in
        self.labels = labels.to(torch.int64)
        self.state_dir = Path(state_dir)
        self.seed = seed

    def set_space(self, space) -> None:
        """Use the model space ``(m [D], s [])`` (public DP outputs) for this client's records."""
        self.space = (space[0].detach().clone(), space[1].detach().clone())

    def release_centre(self, noise_multiplier: float | None, *, distributed=None) -> PrivatizedUpdate:
        """The client's DP sum and count of its unit records (the centred release's first step,
        :func:`~fedhype.privacy.centring.privatize_centre`), from a generator of its own."""
        from fedhype.privacy.centring import privatize_centre

        gen = noise_generator(self.seed, 7_777_793, self.index + 29)
        return privatize_centre(self.id, self._raw, noise_multiplier, gen, distributed=distributed)

    def release_class_stats(self, n_classes: int, dp: DPConfig, weights: ReleaseWeights | None = None, *,
                            distributed=None, centring=None) -> PrivatizedUpdate:
        """The client's per-class sums, counts and (with ``weights.second_moment > 0``) second moments
        through one Gaussian mechanism (:func:`~fedhype.privacy.dp_step.privatize_class_sums`).

        The noise generator is seeded from the run seed (reproducible, not secure) or from OS
        entropy, separately from the DP-SGD noise. ``centring``: the public centre and radius of a
        centred release (:mod:`fedhype.privacy.centring`). ``distributed``: the run's
        :class:`~fedhype.privacy.secure_agg.DistributedNoise` under secure aggregation (the result is
        then this client's :class:`~fedhype.privacy.secure_agg.SecureShare`).
        """
        gen = noise_generator(self.seed, 5_555_557, self.index + 17)
        return privatize_class_sums(self.id, self._raw, self.labels, n_classes, dp, gen, weights, distributed=distributed,
                                    centring=centring)

    def release_integer(self, kind: str, plan, *, n_classes: int = 0, weights: ReleaseWeights | None = None,
                        centring=None):
        """The client's integer-domain release under SecAgg+ (:mod:`fedhype.privacy.skellam`): ``kind``
        ``"centre"`` (the centred release's first step) or ``"statistics"`` (the class statistics, around the
        public ``centring``), with Skellam noise of the :class:`~fedhype.privacy.skellam.SkellamPlan` ``plan``.
        Returns an :class:`~fedhype.privacy.skellam.IntegerShare` (readable only masked or summed); its
        dither and noise come from generators of their own (seeded like the Gaussian release's)."""
        from fedhype.privacy import skellam

        if kind == "centre":
            gen = noise_generator(self.seed, 3_333_331, self.index + 41)
            return skellam.privatize_centre_integer(self.id, self._raw, plan, gen)
        gen = noise_generator(self.seed, 4_444_447, self.index + 43)
        return skellam.privatize_class_stats_integer(self.id, self._raw, self.labels, n_classes, weights, plan, gen,
                                                     centring=centring)

    @property
    def n(self) -> int:
        return int(self._raw.shape[0])

    # ------------------------------------------------------------------ private state
    def _state_path(self, round_idx: int) -> Path:
        return self.state_dir / f"state-r{round_idx}.safetensors"

    def _fresh_state(self, cfg: ModelConfig) -> dict:
        # ψ_i's initialisation is public (seed 0 without a run seed); sampling and noise follow the one
        # generator rule (fedhype.privacy.randomness.noise_generator), each client its own salted stream
        init_gen = noise_generator(0 if self.seed is None else self.seed, 1_000_003, 7919 * (self.index + 1))
        psi = dict(sorted(init_local_encoder(cfg, init_gen).items()))  # canonical order = optimiser index order
        sample_gen = noise_generator(self.seed, 7_777_777, self.index + 11)
        noise_gen = noise_generator(self.seed, 9_999_991, self.index + 13)
        return {"psi": psi, "opt": None, "sample_gen": sample_gen, "noise_gen": noise_gen}

    def load_state(self, round_idx: int, cfg: ModelConfig) -> dict:
        """State at the start of ``round_idx`` (fresh at round 0).

        A seeded run restores both generators (the rerun replays the interrupted round exactly and is
        charged once). An unseeded run draws *both* the Poisson sampling and the noise afresh from OS
        entropy: the rerun of an interrupted round is then an independent invocation of the mechanism,
        which is what the ledger charges it as (``PrivacyLedger.as_rerun``). Restoring the sampling state
        alone would rerun the same batches with new noise: to a server that received both attempts (a
        Flower deployment), each step would be one batch under noise σ/√2, which costs more than two
        independent subsampled steps (σ = 1, q = 0.05, 8 rounds of 100 steps with one rerun: ε 10.22
        against the 9.05 charged).
        """
        path = self._state_path(round_idx)
        if round_idx == 0 or not path.exists():
            return self._fresh_state(cfg)
        t = load_tensors(path, what=f"client {self.id} state")
        psi = dict(sorted((k[4:], v) for k, v in t.items() if k.startswith("psi.")))
        opt = {k[4:]: v for k, v in t.items() if k.startswith("opt.")}
        # unseeded: fresh batches and fresh noise after a restart, never replayed
        sample_gen, noise_gen = noise_generator(None), noise_generator(None)
        if self.seed is not None:
            sample_gen.set_state(t["gen.sample"])
            noise_gen.set_state(t["gen.noise"])
        return {"psi": psi, "opt": opt or None, "sample_gen": sample_gen, "noise_gen": noise_gen}

    def save_state(self, round_idx: int, state: dict, optimizer: torch.optim.Optimizer) -> None:
        t = {f"psi.{k}": v.detach() for k, v in state["psi"].items()}
        for i, st in optimizer.state_dict()["state"].items():
            for k, v in st.items():
                t[f"opt.{i}.{k}"] = torch.as_tensor(v)
        if self.seed is not None:  # only a seeded run replays them; an unseeded one never reads them back, and a
            # saved Mersenne-Twister state could be rewound to the noise of the round just run
            t["gen.sample"] = state["sample_gen"].get_state()
            t["gen.noise"] = state["noise_gen"].get_state()
        atomic_save_tensors(self._state_path(round_idx), t)

    def drop_state_before(self, round_idx: int) -> None:
        for p in self.state_dir.glob("state-r*.safetensors"):
            if int(p.stem.split("-r")[1]) < round_idx:
                p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ training
    def run_round(self, round_idx: int, theta0: dict[str, torch.Tensor], cfg: ModelConfig, dp: DPConfig,
                  *, batch_size: int, steps: int, lr: float) -> PrivatizedUpdate:
        """K local DP-SGD steps from θ_i^0; returns Δθ_i as a PrivatizedUpdate.

        Saves the client's private state for round ``round_idx + 1``.
        """
        state = self.load_state(round_idx, cfg)
        if round_idx == 0 and "wx" in state["psi"] and "dec.wl" in theta0:
            init_encoder_from_decoder(state["psi"], theta0)  # the PPCA posterior of the DP Gaussian
        q = min(1.0, batch_size / self.n)
        session = LocalDPSession(
            self.id, theta0, state["psi"], dp, sample_rate=q, expected_batch_size=q * self.n,
            generator=state["noise_gen"], make_optimizer=lambda ps: torch.optim.Adam(ps, lr=lr))
        if state["opt"]:
            _restore_adam(session.local_optimizer, state["opt"])
        loss_fn, batch_loss = make_per_example_loss(cfg), make_batch_loss(cfg)
        public = make_public_grad(cfg, state["sample_gen"])
        g = state["sample_gen"]
        for _ in range(steps):
            idx = poisson_batch(self.n, q, g)
            b = int(idx.numel())
            x = to_model_space(self._raw[idx], self.space)  # row-wise: the same values as mapping every record first
            y1h = F.one_hot(self.labels[idx], cfg.n_classes).to(torch.float32)
            eps_q = torch.randn(b, cfg.latent, generator=g)
            eps_s = torch.randn(b, cfg.mmd_samples, cfg.latent, generator=g)
            session.step(loss_fn, (x, y1h, eps_q, eps_s), public_grad=public, batch_loss=batch_loss)
        update = session.finish()
        self.save_state(round_idx + 1, state, session.local_optimizer)
        return update

    def diagnostics(self, theta: dict[str, torch.Tensor], round_idx: int, cfg: ModelConfig, x_val: torch.Tensor,
                    y_val: torch.Tensor) -> dict[str, float]:
        """Held-out (validation) ELBO terms of this client's model — NOT covered by DP."""
        state = self.load_state(round_idx, cfg)
        gen = torch.Generator().manual_seed(1234)
        return batch_elbo(theta, state["psi"], to_model_space(x_val, self.space), y_val, cfg, gen)


def _restore_adam(opt: torch.optim.Optimizer, flat: dict[str, torch.Tensor]) -> None:
    sd = opt.state_dict()
    state: dict[int, dict] = {}
    for key, v in flat.items():
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = v
    sd["state"] = state
    opt.load_state_dict(sd)
