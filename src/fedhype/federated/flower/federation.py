"""What the Flower server is told about a federation, and the Flower App folder that runs it.

The server of a deployment never holds the embeddings, a record id or a label. It reads one public
file, ``federation.json`` (format :data:`FORMAT`)::

    {"format": "fedhype-flower-federation/2",
     "federation_id": "<32 hex>",                   # random, new in every file written: one file per run
     "train": {...TrainConfig...},
     "store": {"digest", "n", "dim", "encoder"},   # fedhype.federated.engine.describe_store / describe_roster
     "n_classes": K,
     "roster": {...}}                               # fedhype.data.roster.Roster: names, n_train, data keys, classes

written either from the sites' public cards (:func:`write_site_federation`: a real consortium, every
site with its own store and split, :mod:`fedhype.data.sites`) or, for a simulation on one data
holder's pooled store, from its partition (:func:`write_federation`: the partition itself stays with
the data holder and its nodes). Everything in it is public: settings, sizes, names, random site keys
or the pooled store's digest.
:func:`write_app` writes the Flower App folder (a ``pyproject.toml`` naming
:mod:`fedhype.federated.flower.apps` and the server's run config) that ``flwr run`` submits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhype import __version__
from fedhype.data.partition import Partition
from fedhype.data.roster import Roster
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, ValidationError
from fedhype.federated.baselines import federation as federation_kind
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import check_client_sizes, describe_store
from fedhype.io import atomic_write_json, atomic_write_text, read_json

FORMAT = "fedhype-flower-federation/2"


@dataclass
class Federation:
    """The public description of a federation (see the module docstring)."""

    train: TrainConfig
    store: dict[str, Any]
    n_classes: int
    roster: Roster
    digest: str = ""  # fedhype.federated.flower.handshake.federation_digest of the file read

    @classmethod
    def load(cls, path: str | Path) -> "Federation":
        """Read ``federation.json``.

        Raises:
            ArtifactError: missing file, wrong format or fields.
            ValidationError: a bad training setting.
        """
        path = Path(path)
        raw = read_json(path, "federation file")
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ArtifactError(f"{path}: not a fedhype federation file (format {FORMAT!r}); write it with "
                                "fedhype.federated.flower.federation.write_site_federation (or write_federation)")
        try:
            train = TrainConfig(**raw["train"])
            store, n_classes = dict(raw["store"]), int(raw["n_classes"])
            dim = int(store["dim"])
            roster = Roster.from_dict(raw["roster"], where=f"{path} (roster)")
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{path}: missing or bad field ({exc!r}); write it again") from None
        if dim < 1 or n_classes != len(roster.class_names):
            raise ArtifactError(f"{path}: D or K disagrees with its roster; write it again")
        # the server and every node resolve the DP-SGD stage rule from the same public roster (decision 22)
        train = train.for_clients([c.n_train for c in roster.clients])
        from fedhype.federated.flower.handshake import federation_digest

        return cls(train, store, n_classes, roster, federation_digest(raw))


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


def _check_federated(cfg: TrainConfig, roster: Roster) -> None:
    if federation_kind(cfg.method) == "pooled":
        raise ValidationError(f"method {cfg.method!r} pools every client's records on one machine: it cannot run on a "
                              "Flower deployment; use `fedhype train`")
    check_secure_aggregation(cfg, len(roster.clients))
    check_client_sizes(roster, cfg)


def _write(folder: str | Path, cfg: TrainConfig, store: dict[str, Any], roster: Roster) -> Path:
    import secrets

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # a fresh random id in every file written: the SuperNodes bind a federation file (by its digest) to the one run
    # it served, so a second run needs a new file — and a probe found that writing one with the same settings gave
    # the same bytes, which the nodes refused as already used
    return atomic_write_json(folder / "federation.json", {
        "format": FORMAT, "federation_id": secrets.token_hex(16), "train": cfg.to_dict(), "store": store,
        "n_classes": len(roster.class_names), "roster": roster.to_dict()})


def write_federation(folder: str | Path, store: EmbeddingStore, partition: Partition, cfg: TrainConfig) -> Path:
    """Write ``federation.json`` into ``folder`` for a simulation on one pooled store (the server's public file).

    Only the partition's roster goes in (client names, training-set sizes, the store digest as data
    key, class names); the partition itself (record ids) stays with the data holder's SuperNodes.

    Raises:
        ValidationError: a method that is not federated (``central-cvae`` pools every client's
            records on one machine: use ``fedhype train``), secure aggregation with t ≥ m/2, fewer than
            2 clients or a model without the statistics release (:func:`check_secure_aggregation`),
            or a too-small client.
        ArtifactError: the partition was made from another store.
    """
    partition.check_store(store)
    roster = partition.roster(store.dim)
    _check_federated(cfg, roster)
    return _write(folder, cfg, describe_store(store), roster)


def write_site_federation(folder: str | Path, cards: list, cfg: TrainConfig, classes: list[str] | None = None) -> Path:
    """Write ``federation.json`` into ``folder`` from the sites' public cards (a consortium without a pooled store).

    Args:
        folder: where to write (created).
        cards: one :class:`~fedhype.data.sites.SiteCard` (or path of a ``card.json``) per site; client i is card i.
        cfg: the training configuration.
        classes: the federation's class names (default: the sorted union of the cards').

    Raises:
        ValidationError: as :func:`write_federation`, and as :meth:`~fedhype.data.roster.Roster.from_cards`
            (two sites with one name, a class outside ``classes``).
        ArtifactError: an unreadable card, or cards of different encoders or dimensions.
    """
    from fedhype.data.sites import SiteCard
    from fedhype.federated.engine import describe_roster

    cards = [c if isinstance(c, SiteCard) else SiteCard.load(c) for c in cards]
    roster = Roster.from_cards(cards, classes, classes_flag="write_site_federation(classes=[...])")
    _check_federated(cfg, roster)
    return _write(folder, cfg, describe_roster(roster), roster)


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
