"""Membership inference against a trained run, with the splits of its own partition.

Members are the clients' training records (``train`` split: the only records the DP steps
touched), non-members the held-out ``test`` records, and the DOMIAS reference set the
``val`` records — three disjoint sets of the same distribution, so an AUROC near 0.5 means the
synthetic data does not reveal who was trained on. The attacks and metrics are
:func:`fedhype.eval.attacks.mia_report` (DOMIAS, van Breugel et al. 2023; DCR).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedhype.data.partition import Partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError
from fedhype.eval.attacks import mia_report
from fedhype.eval.audit_ledger import run_directory
from fedhype.eval.inputs import check_compatible
from fedhype.federated.rundir import RunDir
from fedhype.io import read_json


def check_run_data(run_dir: str | Path, store: EmbeddingStore, partition: Partition) -> None:
    """Raise :class:`ArtifactError` unless ``store`` and ``partition`` are the ones the run trained on.

    ``run_dir``: a run directory or a ``fedhype run`` output folder (its ``run/`` is checked).
    """
    run_dir = run_directory(run_dir)
    config = read_json(RunDir(run_dir).config, "run config")
    partition.check_store(store)
    digest = config.get("store", {}).get("digest")
    if digest != store.digest():
        raise ArtifactError(f"the store (digest {store.digest()[:12]}…) is not the one run {run_dir} trained on "
                            f"(digest {str(digest)[:12]}…); pass the run's --store")
    keys = config.get("partition", {}).get("keys")
    why = partition.key_mismatch(keys)
    if why:
        raise ArtifactError(f"{why}: it is not the partition run {run_dir} trained on; pass the run's --partition")
    names = config.get("partition", {}).get("clients")
    if names != [c.name for c in partition.clients]:
        raise ArtifactError(f"the partition's clients {[c.name for c in partition.clients]} differ from the run's "
                            f"{names}; pass the run's --partition")


def run_mia(run_dir: str | Path, store: EmbeddingStore, partition: Partition, synthetic: EmbeddingStore | None = None,
            *, per_class: int | None = None, seed: int = 0, n_bootstrap: int = 200, space: str = "l2") -> dict[str, Any]:
    """DOMIAS and DCR membership inference on a run's synthetic data.

    Args:
        run_dir: the trained run (a ``fedhype train`` run directory or a ``fedhype run`` output folder).
        store / partition: the run's real data (checked against the run's config).
        synthetic: the synthetic store to attack; ``None`` draws one from the run with the
            neutral meta-code (``per_class`` each, default ⌈n_members / K⌉; sampling ``seed``).
        seed: seed of the draw, the PCA and the bootstrap.

    Returns:
        :func:`~fedhype.eval.attacks.mia_report` plus ``"synthetic"`` (how it was obtained) and
        ``"synthetic_epsilon"`` (the ε its metadata claims).

    Raises:
        ArtifactError: data that is not the run's; ValidationError: incompatible stores.
    """
    run_dir = run_directory(run_dir)
    check_run_data(run_dir, store, partition)
    members = partition.split_store(store, "train")
    non_members = partition.split_store(store, "test")
    reference = partition.split_store(store, "val")
    if synthetic is None:
        from fedhype.synthesis.sample import synthesize

        per_class = per_class or max(1, math.ceil(len(members) / store.n_classes))
        synthetic = synthesize(run_dir, "neutral", per_class=per_class, seed=seed)
        source = f"drawn from the run: code neutral, per_class {per_class}, seed {seed}"
    else:
        source = "given"
    check_compatible(store, synthetic, "real store", "synthetic store")
    out = mia_report(synthetic, members, non_members, reference if len(reference) >= 3 else None,
                     space=space, n_bootstrap=n_bootstrap, seed=seed)
    out.update(synthetic=source, synthetic_epsilon=synthetic.meta.get("epsilon"))
    return out
