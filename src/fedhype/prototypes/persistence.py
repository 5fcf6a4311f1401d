"""Saving and loading a fitted :class:`HyperPrototypeClassifier` (safetensors + JSON, never pickle).

A model directory holds

* ``model.safetensors`` — ``net.<name>`` (adapter and head weights) and ``prototypes`` ``[K, L, d]``,
  all float32;
* ``config.json`` — format tag ``"fedhype-hyperprototypes/1"``, the constructor parameters, the
  classes, D, the privacy summary, the training history, free-form ``meta`` (e.g. store names and
  provenance), the SHA-256 digest of the tensors and ``config_sha256``, that of the rest of the file
  (canonical JSON); written last, so its presence marks a complete model;
* ``ledger.json`` — the privacy ledger of ``matching="dp"`` (:class:`~fedhype.privacy.ledger.PrivacyLedger`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhype.errors import ArtifactError
from fedhype.io import (CONFIG_DIGEST, atomic_save_tensors, atomic_write_json, load_tensors, read_json, sealed,
                        tensor_digest)
from fedhype.privacy.ledger import PrivacyLedger

FORMAT = "fedhype-hyperprototypes/1"
WEIGHTS, CONFIG, LEDGER = "model.safetensors", "config.json", "ledger.json"


def save_classifier(clf: Any, path: str | os.PathLike, meta: dict | None = None) -> Path:
    """Write a fitted classifier to the directory ``path`` (created if needed); returns ``path``.

    Raises:
        sklearn NotFittedError: ``clf`` is not fitted.
    """
    from sklearn.utils.validation import check_is_fitted

    check_is_fitted(clf, "net_")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    tensors = {f"net.{k}": v.detach().cpu() for k, v in clf.net_.state_dict().items()}
    tensors["prototypes"] = clf.prototypes_.detach().cpu()
    atomic_save_tensors(root / WEIGHTS, tensors, {"format": FORMAT})
    if clf.ledger_ is not None:
        clf.ledger_.save(root / LEDGER)
    elif (root / LEDGER).exists():
        (root / LEDGER).unlink()
    config = {"format": FORMAT, "params": clf.get_params(), "classes": clf.classes_.tolist(),
              "n_features_in": int(clf.n_features_in_), "privacy": clf.privacy_, "history": clf.history_,
              "meta": dict(meta or getattr(clf, "meta_", {}) or {}), "digest": tensor_digest(tensors)}
    config[CONFIG_DIGEST] = _config_digest(config)
    atomic_write_json(root / CONFIG, config)
    return root


def _config_digest(config: dict) -> str:
    """SHA-256 of ``config`` without :data:`CONFIG_DIGEST`, as canonical JSON (:func:`fedhype.io.sealed`)."""
    return sealed(config)[CONFIG_DIGEST]


def load_classifier(path: str | os.PathLike) -> Any:
    """Read a classifier directory written by :func:`save_classifier`.

    Raises:
        ArtifactError: missing directory or file, wrong format tag, digest mismatch (modified or
            truncated weights, or a config.json edited after it was written: its ``config_sha256``), or tensors
            whose shapes disagree with the config (exit code 4).
    """
    from fedhype.prototypes.classifier import HyperPrototypeClassifier
    from fedhype.prototypes.network import AdapterNet

    root = Path(path)
    if not root.is_dir():
        raise ArtifactError(f"hyper-prototype model directory not found: {root} (train one with "
                            "`fedhype prototypes train`)")
    cfg = read_json(root / CONFIG, "hyper-prototype model config")
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        got = cfg.get("format") if isinstance(cfg, dict) else type(cfg).__name__
        what = (" — a generator's run or release folder (`fedhype train` / `fedhype run`), not a hyper-prototype model"
                if (root / "model.safetensors").is_file() and isinstance(cfg, dict) and "train" in cfg else "")
        raise ArtifactError(f"{root / CONFIG}: format {got!r}, expected {FORMAT!r}{what}; give the --out of "
                            "`fedhype prototypes train`")
    if CONFIG_DIGEST in cfg and cfg[CONFIG_DIGEST] != _config_digest(cfg):
        # a helper set meta.private / data_kind / class names in config.json by hand: evaluate trusted them (a model
        # trained on real records then scored without its "not held-out" warning). Models saved before the digest
        # existed have none and load as before.
        raise ArtifactError(f"{root / CONFIG}: edited after it was written (its {CONFIG_DIGEST} does not match its "
                            "content: the classes, the privacy summary or the provenance a report relies on may have "
                            "changed); retrain or restore the directory")
    tensors = load_tensors(root / WEIGHTS, "hyper-prototype model weights")
    if tensor_digest(tensors) != cfg.get("digest"):
        raise ArtifactError(f"{root / WEIGHTS}: tensor digest differs from {CONFIG} (file modified or from "
                            "another model); retrain or restore the directory")
    try:
        clf = HyperPrototypeClassifier(**cfg["params"])
        clf._check_params()
        classes = np.asarray(cfg["classes"], dtype=np.int64)
        dim = int(cfg["n_features_in"])
        net = AdapterNet(dim, len(classes), int(clf.hidden_dim), int(clf.feature_dim))
        net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")}, strict=True)
        protos = tensors["prototypes"]
        want = (len(classes), int(clf.n_prototypes), int(clf.feature_dim))
        if tuple(protos.shape) != want:
            raise ValueError(f"prototypes have shape {tuple(protos.shape)}, config implies {want}")
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ArtifactError(f"hyper-prototype model {root}: config and weights disagree ({exc})") from None
    ledger = PrivacyLedger.load(root / LEDGER) if (root / LEDGER).exists() else None
    clf.device = "cpu"
    clf.classes_, clf.n_features_in_ = classes, dim
    clf.net_, clf.prototypes_ = net.eval(), protos.to(torch.float32)
    clf.ledger_, clf.privacy_, clf.history_ = ledger, cfg.get("privacy", {}), cfg.get("history", [])
    clf.meta_ = cfg.get("meta", {})
    return clf
