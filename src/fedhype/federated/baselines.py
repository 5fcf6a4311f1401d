"""Baselines without federation, run by the same engine (issue #7): ``local-cvae`` and ``central-cvae``.

Both use the predecessor's CVAE (Di Salvo et al. 2025: one decoder, fixed N(0, I) prior, no MMD,
no Lipschitz term; :data:`~fedhype.federated.config.METHOD_PRESETS`) with the engine's DP class
statistics as for ``fedhypevae`` (model space and class output bias,
:mod:`fedhype.federated.class_stats`: each local-cvae client from its own release, central-cvae
from the pooled set; ``model.class_bias = false`` gives dp-cvae's un-centred space), and the
unchanged engine loop (:func:`fedhype.federated.engine.train`): the same clients, local DP-SGD
sessions, write-ahead ledger, checkpoints and model file. Only two things differ, each behind a
narrow hook:

* ``local-cvae`` — **each client trains alone.** :func:`make_server` returns a
  :class:`LocalServers`: one independent :class:`~fedhype.federated.server.Server` per client
  (its own hypernetwork Φ_i, code c_i, optimiser and generator). Round r of client i starts from
  θ_i = h_{Φ_i}(c_i), runs its K_i local DP-SGD steps and returns its
  :class:`~fedhype.privacy.dp_step.PrivatizedUpdate`, which is applied to Φ_i alone
  (with ``lr_server = 1``: θ_i ← θ_i + Δθ_i). Nothing is aggregated across clients, so client i's
  model is a function of its own records, its own noise and public settings only (no other
  client's records, sizes enter only the common σ calibration). Privacy accounting is unchanged
  and per client: the engine records one ``dp-sgd`` ledger event per client and round with that
  client's (σ, q_i = B/n_i, K_i) (plus its class-statistics release), and ε_i is Opacus PRV over
  client i's events. (Adam's moments for θ restart every round, as in the federated methods: a
  "round" is a checkpoint here.)

  The model file keeps the per-client models server-side as separate entries:
  ``hnet.models.<i>.<name>`` is Φ_i (under the CVAE preset just the decoder θ_i), ``codes[i]`` is
  c_i, and the metadata ``method = "local-cvae"`` tells :func:`~fedhype.federated.rundir.load_model`
  to rebuild a :class:`LocalModels` table. ``LocalModels(c_i)`` returns client i's θ_i (and
  ``space_for(c_i)`` its model space), so the code specs ``client:<id>``, ``mixture:...`` and
  ``mixture`` (all clients ∝ public sizes) work unchanged; ``neutral`` and ``mix:`` (a code that is
  no client's own) have no meaning without a shared code space and raise a ValidationError that
  points to ``mixture`` (``fedhype run`` refuses them before training).

* ``central-cvae`` — **pooled data, no federation.** :func:`training_partition` replaces the
  partition by a one-client partition (:func:`pooled_partition`) whose train/val/test ids are the
  union of every client's: one client (id 0, name ``"pooled"``) holds all training records. With
  ``--no-dp`` this is the non-private upper bound; with DP it is record-level DP over the pooled
  set (a trusted curator holds all the data: not a federated threat model), q = B / Σ_i n_i.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedhype.data.partition import ClientSplit, Partition
from fedhype.errors import ValidationError
from fedhype.federated.config import METHOD_REGISTRY
from fedhype.models.config import ModelConfig
from fedhype.models.hypernet import HyperNetwork
from fedhype.privacy.dp_step import PrivatizedUpdate

if TYPE_CHECKING:
    from fedhype.federated.server import ServerStrategy

#: The methods that do not train ``"federated"``, by name (:attr:`fedhype.federated.config.Method.federation`).
FEDERATION: dict[str, str] = {name: m.federation for name, m in METHOD_REGISTRY.items() if m.federation != "federated"}
POOLED_NAME = "pooled"


def federation(method: str) -> str:
    """``"federated"``, ``"local"`` (each client alone) or ``"pooled"`` (one client with all records):
    the registered method's :attr:`~fedhype.federated.config.Method.federation` (``"federated"`` for a
    name that is not registered, e.g. the metadata of a model that names none)."""
    entry = METHOD_REGISTRY.get(method) if isinstance(method, str) else None
    return entry.federation if entry is not None else "federated"


def is_local(meta_or_method: dict | str) -> bool:
    """Whether a method name (or a model file's metadata) is the local-only baseline."""
    method = meta_or_method.get("method") if isinstance(meta_or_method, dict) else meta_or_method
    return federation(str(method)) == "local"


# --------------------------------------------------------------------------- central-cvae
def pooled_partition(partition: Partition) -> Partition:
    """One client (id 0, name ``"pooled"``) holding every client's train, val and test ids.

    Ids keep the original client order. The result refers to the same store (same digest).
    """
    ids = {split: [s for c in partition.clients for s in c.ids(split)] for split in ("train", "val", "test")}
    return dataclasses.replace(
        partition, params={**partition.params, "pooled_from": [c.name for c in partition.clients]},
        clients=[ClientSplit(0, POOLED_NAME, ids["train"], ids["val"], ids["test"])])


def training_partition(partition: Partition, method: str) -> Partition:
    """The partition the engine trains on: pooled for ``central-cvae``, else ``partition`` itself."""
    return pooled_partition(partition) if federation(method) == "pooled" else partition


# --------------------------------------------------------------------------- local-cvae
class LocalModels(nn.Module):
    """A table of per-client hypernetworks keyed by the clients' own codes (local-cvae's model).

    Args:
        models: client i's hypernetwork Φ_i at position i.
        codes: float32 ``[n_clients, code_dim]``; row i is client i's code c_i.

    Calling it with c_i returns θ_i = h_{Φ_i}(c_i) (the dict of :class:`HyperNetwork`).

    Raises (on call):
        ValidationError: the code is not exactly one client's code (e.g. ``neutral`` or ``mix:``).
    """

    def __init__(self, models: list[HyperNetwork], codes: torch.Tensor):
        super().__init__()
        self.models = nn.ModuleList(models)
        self.cfg: ModelConfig = models[0].cfg
        self._codes = codes  # not a buffer: the model file stores the codes once, as "codes"

    def set_codes(self, codes: torch.Tensor) -> None:
        self._codes = codes

    def index_of(self, code: torch.Tensor) -> int:
        code = code.to(self._codes.device)
        for i, row in enumerate(self._codes):
            if torch.equal(row, code):
                return i
        raise ValidationError("this is a local-cvae model: every client trained its own decoder and there is no "
                              "shared code space, so 'neutral' and 'mix:' codes are not meaningful; use "
                              "--code client:<id>, or mixture (all clients in proportion to their public sizes) "
                              "or mixture:<id>=<w>,...")

    def forward(self, code: torch.Tensor, *, client_stats: bool = True) -> dict[str, torch.Tensor]:
        return self.models[self.index_of(code)](code, client_stats=client_stats)

    def release_class_means(self, code: torch.Tensor, *, client_stats: bool = True) -> "torch.Tensor | None":
        """The release's class means of the client whose code is ``code`` (its own model's)."""
        return self.models[self.index_of(code)].release_class_means(code, client_stats=client_stats)

    def space_for(self, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model space (m, s) of the client whose code is ``code`` (each client has its own)."""
        return self.models[self.index_of(code)].space()

    def traffic(self) -> dict[str, int | str]:
        """Parameter counts; nothing is communicated (each client keeps its own model)."""
        one = self.models[0].traffic()
        return {"hypernetwork_parameters": sum(p.numel() for p in self.parameters()),
                "generated_parameters_per_client": one["generated_parameters_per_client"],
                "download_bytes_per_round": 0, "upload_bytes_per_round": 0,
                "note": "local-cvae: no federation, each client keeps its own model"}


def load_local_models(cfg: ModelConfig, n_clients: int, codes: torch.Tensor) -> LocalModels:
    """An empty :class:`LocalModels` of ``n_clients`` models shaped by ``cfg`` (to load weights into)."""
    return LocalModels([HyperNetwork(cfg, torch.Generator().manual_seed(i)) for i in range(n_clients)], codes)


class LocalServers:
    """The engine's server for ``local-cvae``: one independent :class:`Server` per client.

    A :class:`~fedhype.federated.server.ServerStrategy` like :class:`~fedhype.federated.server.Server`;
    each update goes to its own client's server only. ``servers`` (client i's :class:`Server` at
    position i) is read by :mod:`fedhype.federated.class_stats` to set each client's model from its
    own statistics release.

    Args:
        cfg: model configuration (shared by all clients).
        n_clients: number of clients.
        generator: the engine's public generator (client sampling); each client's server gets
            its own generator seeded from it, so client i's initial model does not depend on
            anything but the run seed and i.
        lr_server, lr_hyper, lr_code: as for :class:`Server`.
    """

    def __init__(self, cfg: ModelConfig, n_clients: int, generator: torch.Generator, *, lr_server: float = 1.0,
                 lr_hyper: float = 1.0, lr_code: float = 1.0):
        from fedhype.federated.server import Server

        self.cfg = cfg
        self.generator = generator
        seeds = torch.randint(0, 1 << 62, (n_clients,), generator=generator).tolist()
        self.servers = [Server(cfg, 1, torch.Generator().manual_seed(int(s)), lr_server=lr_server, lr_hyper=lr_hyper,
                               lr_code=lr_code) for s in seeds]
        self.hnet = LocalModels([s.hnet for s in self.servers], self.codes)

    @property
    def codes(self) -> torch.Tensor:
        """``[n_clients, code_dim]``: client i's own code (detached copy)."""
        return torch.cat([s.codes.detach() for s in self.servers])

    def theta_for(self, index: int) -> dict[str, torch.Tensor]:
        return self.servers[index].theta_for(0)

    def space_for(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The model space (m [D], s []) of client ``index``'s own model."""
        return self.servers[index].space_for(0)

    def accept(self, index: int, weight: float, update: PrivatizedUpdate) -> None:
        """Queue client ``index``'s update at its own server (anything but a PrivatizedUpdate raises TypeError)."""
        self.servers[index].accept(0, weight, update)

    def aggregate(self) -> dict[str, float]:
        """Apply every client's own update to its own model."""
        results = [s.aggregate() for s in self.servers]
        self.hnet.set_codes(self.codes)
        lips = [r["lipschitz"] for r in results if "lipschitz" in r]
        return {"participants": sum(r["participants"] for r in results),
                "lipschitz": sum(lips) / len(lips) if lips else None}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        t = {"gen.server": self.generator.get_state()}
        for i, s in enumerate(self.servers):
            t.update({f"local.{i}.{k}": v for k, v in s.state_tensors().items()})
        return t

    def load_state_tensors(self, t: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(t["gen.server"])
        for i, s in enumerate(self.servers):
            p = f"local.{i}."
            s.load_state_tensors({k[len(p):]: v for k, v in t.items() if k.startswith(p)})
        self.hnet.set_codes(self.codes)


def make_server(cfg: ModelConfig, n_clients: int, generator: torch.Generator, method: str, *, lr_server: float,
                lr_hyper: float, lr_code: float) -> "ServerStrategy":
    """The engine's server for ``method``, by its federation: :class:`LocalServers` for ``"local"``
    (``local-cvae``: one server per client), else one :class:`~fedhype.federated.server.Server`.

    ``generator`` is the engine's public generator: the server initialises from it and keeps it
    (client sampling, Lipschitz directions; saved in its checkpoint).
    """
    from fedhype.federated.server import Server

    cls = LocalServers if federation(method) == "local" else Server
    return cls(cfg, n_clients, generator, lr_server=lr_server, lr_hyper=lr_hyper, lr_code=lr_code)
