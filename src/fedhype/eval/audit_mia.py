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
from fedhype.errors import ArtifactError, ValidationError
from fedhype.eval.attacks import mia_report
from fedhype.eval.audit_ledger import run_directory
from fedhype.eval.inputs import check_compatible
from fedhype.federated.rundir import RunDir
from fedhype.io import read_json


def run_sites(run_dir: str | Path) -> list[str] | None:
    """The sites of a run trained with ``fedhype train --site`` (its ``config.json`` names them under ``store``),
    or None for a run on a pooled store and its partition (or a folder without a readable config)."""
    path = RunDir(run_directory(run_dir)).config
    if not path.is_file():
        return None
    try:
        sites = read_json(path, "run config").get("store", {}).get("sites")
    except (ArtifactError, AttributeError):
        return None
    return [str(x) for x in sites] if isinstance(sites, list) and sites else None


def site_run_refusal(run_dir: str | Path, sites: list[str], what: str = "--mia",
                     drop: str = "--mia") -> ValidationError:
    """Why ``what`` (membership inference, or a check against ``--store``/``--partition``: ``drop`` the flags to
    leave out) cannot be run on a site run."""
    return ValidationError(
        f"{what} is not available for run {run_dir}: it was trained with `train --site` on the sites "
        f"{', '.join(sites)}, and a site run has no pooled store. Membership inference needs the run's real records "
        "in one store and its partition (--store, --partition: members = the training split, non-members = the test "
        "split); a site's records stay at the site. Instead, each site can evaluate the synthetic data on its own test "
        "split (`fedhype evaluate --site <site folder> --synthetic <store>`), and `fedhype audit --run "
        f"{run_dir}` without {drop} checks the run's ledger")


def check_run_data(run_dir: str | Path, store: EmbeddingStore, partition: Partition) -> None:
    """Raise :class:`ArtifactError` unless ``store`` and ``partition`` are the ones the run trained on.

    ``run_dir``: a run directory or a ``fedhype run`` output folder (its ``run/`` is checked).

    Raises:
        ValidationError: a run trained with ``train --site`` (no pooled store: :func:`site_run_refusal`).
        ArtifactError: another store or partition than the run's.
    """
    sites = run_sites(run_dir)
    if sites:  # its config's digest is the sites' keys': "not the store it trained on" misled a probe
        raise site_run_refusal(run_dir, sites, "a check of --store/--partition against the run", "--store/--partition")
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
        ArtifactError: data that is not the run's; ValidationError: incompatible stores, or a site run
            (:func:`site_run_refusal`).
    """
    sites = run_sites(run_dir)
    if sites:
        raise site_run_refusal(run_dir, sites)
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
