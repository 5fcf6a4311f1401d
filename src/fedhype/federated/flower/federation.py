"""What the Flower server is told about a federation, and the Flower App folder that runs it.

The server of a deployment never holds the embeddings. It reads one public file,
``federation.json`` (format :data:`FORMAT`), written by :func:`write_federation` on a machine that
has the store (e.g. where the partition was made)::

    {"format": "fedhype-flower-federation/1",
     "train": {...TrainConfig...},
     "store": {"digest", "n", "dim", "encoder"},   # fedhype.federated.engine.describe_store
     "n_classes": K,
     "partition": "partition.json"}                 # the public partition, next to this file

Everything in it is public structure (sizes, sample ids, settings, a digest); no embedding.
:func:`write_app` writes the Flower App folder (a ``pyproject.toml`` naming
:mod:`fedhype.federated.flower.apps` and the server's run config) that ``flwr run`` submits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhype import __version__
from fedhype.data.partition import Partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, ValidationError
from fedhype.federated.baselines import federation as federation_kind
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import check_client_sizes, describe_store
from fedhype.io import atomic_write_json, atomic_write_text, read_json

FORMAT = "fedhype-flower-federation/1"


@dataclass
class Federation:
    """The public description of a federation (see the module docstring)."""

    train: TrainConfig
    store: dict[str, Any]
    n_classes: int
    partition: Partition

    @classmethod
    def load(cls, path: str | Path) -> "Federation":
        """Read ``federation.json`` and its partition.

        Raises:
            ArtifactError: missing file, wrong format or fields, or a partition of another store.
            ValidationError: a bad training setting.
        """
        path = Path(path)
        raw = read_json(path, "federation file")
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ArtifactError(f"{path}: not a fedhype federation file (format {FORMAT!r}); write it with "
                                "fedhype.federated.flower.federation.write_federation")
        try:
            train = TrainConfig(**raw["train"])
            store, n_classes = dict(raw["store"]), int(raw["n_classes"])
            part_path = path.parent / str(raw["partition"])
            dim = int(store["dim"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{path}: missing or bad field ({exc!r}); write it again") from None
        part = Partition.load(part_path)
        if part.store_digest != store.get("digest") or part.store_n != store.get("n") or dim < 1:
            raise ArtifactError(f"{path}: the partition {part_path} was made from another store; write both again")
        return cls(train, store, n_classes, part)


def check_secure_aggregation(cfg, n_clients: int):
    """The (m, t) of a Flower run with ``train.secure_aggregation`` (None without), as strict as in process
    (m ≥ 2, 0 ≤ t < m, a model that releases statistics) and stricter: 2t < m (SecAgg+'s threshold m − t must
    exceed the t clients that may collude with the server: :func:`fedhype.privacy.skellam.check_deployment`).

    Raises:
        ValidationError: naming the flag.
    """
    distributed = cfg.distributed_noise(n_clients)
    if distributed is None:
        return None
    from fedhype.privacy.skellam import check_deployment

    check_deployment(distributed)
    if not cfg.model_config(1, 1).class_bias:
        raise ValidationError("--secure-aggregation aggregates the statistics release; this model releases none "
                              "(model.class_bias = false)")
    return distributed


def write_federation(folder: str | Path, store: EmbeddingStore, partition: Partition, cfg: TrainConfig) -> Path:
    """Write ``federation.json`` and ``partition.json`` into ``folder`` (public files for the server).

    Raises:
        ValidationError: a method that is not federated (``central-cvae`` pools every client's
            records on one machine: use ``fedhype train``), secure aggregation with t ≥ m/2, fewer than
            2 clients or a model without the statistics release (:func:`check_secure_aggregation`),
            or a too-small client.
        ArtifactError: the partition was made from another store.
    """
    if federation_kind(cfg.method) == "pooled":
        raise ValidationError(f"method {cfg.method!r} pools every client's records on one machine: it cannot run on a "
                              "Flower deployment; use `fedhype train`")
    check_secure_aggregation(cfg, len(partition.clients))
    partition.check_store(store)
    check_client_sizes(partition, cfg)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    partition.save(folder / "partition.json")
    return atomic_write_json(folder / "federation.json", {
        "format": FORMAT, "train": cfg.to_dict(), "store": describe_store(store), "n_classes": store.n_classes,
        "partition": "partition.json"})


def write_app(folder: str | Path, *, federation: str | Path, run_dir: str | Path, resume: bool = False,
              connect_timeout: float = 300.0, round_timeout: float = 3600.0, straggler_timeout: float = 600.0,
              wire_log: str | Path | None = None, wire_dump: str | Path | None = None) -> Path:
    """Write the Flower App folder (``pyproject.toml``) whose ServerApp trains into ``run_dir``.

    Paths are those of the SuperLink's machine (where the ServerApp runs); every value can be
    overridden at launch, e.g. ``flwr run <folder> <superlink> --run-config 'resume=true'``.

    Args:
        folder: the app folder (created).
        federation: ``federation.json`` on the server machine.
        run_dir: the run directory the server writes (config, ledger, checkpoints, metrics, model).
        resume: continue the run in ``run_dir`` from its last committed round.
        connect_timeout, round_timeout, straggler_timeout: seconds
            (:mod:`fedhype.federated.flower.grid_transport`).
        wire_log: optional JSON-lines log of the structure of every message (audit).
        wire_dump: optional folder: the arrays of every message the server receives, as ``.npy`` (audit: what
            the server sees anyway — masked vectors under secure aggregation, PrivatizedUpdates otherwise).

    Returns:
        the path of ``pyproject.toml``.
    """
    import tomli_w

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "project": {"name": "fedhype-flower", "version": __version__, "license": "Apache-2.0",
                    "description": "fedhype FedHypeVAE training on a Flower deployment (needs fedhype[flower] "
                                   "installed on every machine)",
                    "dependencies": ["flwr>=1.42,<2"]},
        "tool": {"flwr": {"app": {
            "publisher": "fedhype",
            "components": {"serverapp": "fedhype.federated.flower.apps:server_app",
                           "clientapp": "fedhype.federated.flower.apps:client_app"},
            "config": {"federation": str(Path(federation).resolve()), "run-dir": str(Path(run_dir).resolve()),
                       "resume": bool(resume), "connect-timeout": float(connect_timeout),
                       "round-timeout": float(round_timeout), "straggler-timeout": float(straggler_timeout),
                       "wire-log": str(Path(wire_log).resolve()) if wire_log else "",
                       "wire-dump": str(Path(wire_dump).resolve()) if wire_dump else ""}}}},
    }
    header = ("# Flower App of fedhype (written by fedhype.federated.flower.federation.write_app).\n"
              "# fedhype[flower] must be installed on the SuperLink's and every SuperNode's machine; start the\n"
              "# SuperLink with --disable-runtime-dependency-installation. Telemetry: FLWR_TELEMETRY_ENABLED=0.\n")
    return atomic_write_text(folder / "pyproject.toml", header + tomli_w.dumps(doc))
