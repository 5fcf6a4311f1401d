"""Downstream value per client: does the shared synthetic store improve each client's own classifier?

For every client i four linear probes (:class:`fedhype.eval.utility.Probe`, the project's standard
classifier: StandardScaler + multinomial logistic regression on L2-normalised rows) are compared:

* ``local_only`` — trained on client i's real training split alone;
* ``synthetic_only`` — trained on the shared DP synthetic store alone (one probe for all clients);
* ``local_synthetic`` — augmentation: trained on the union of client i's real training records
  and the whole synthetic store, with sample weights (below);
* ``interpolation`` — the predecessor's λ-interpolation λ·p_local + (1 − λ)·p_synthetic, λ chosen
  on client i's validation split (:func:`fedhype.eval.interpolation.interpolation_protocol`,
  called here, not re-implemented).

Each is scored (accuracy, balanced accuracy, macro-F1: :func:`~fedhype.eval.utility.classification_metrics`)
on client i's own test split (``"own"``) and on the union of all clients' test splits (``"union"``,
where a client meets the classes and domains it does not hold). Every probe outputs all K
class columns, also for the classes a client lacks (:class:`~fedhype.eval.utility.Probe`).

Sources. The λ protocol, the per-client local/synthetic comparison and the metrics are the
predecessor's (Di Salvo, Nguyen & Ledig, DP-CVAE, MICCAI 2025, arXiv 2507.02671). Ours: the
augmentation row and its weighting, and the union test set.

Weighting of ``local_synthetic`` (ours). Pooled unweighted, a client's few hundred real records are
drowned by the 300 synthetic records per class. Within each class k the client holds, its real
records receive the share r of the class's total weight T_k = n_real,k + n_syn,k and the
synthetic records 1 − r (each real record r·T_k/n_real,k, each synthetic one (1 − r)·T_k/n_syn,k);
a class only one source has keeps weight 1 per record, so the classes the client lacks are not
down-weighted (the synthetic records are all it knows of them). The class totals, hence the
class balance of the union, stay those of the unweighted union, and the mean weight stays 1 (the
logistic regression's L2 strength means the same). r is chosen per client from ``real_shares``
(``None`` = unweighted, r = the natural share) on the client's **validation** split by
``select_by``, ties towards the larger real share; the test splits are never used for a choice.

Privacy: client i's real records are used only by client i, for its own classifiers; the figures
are computed on held-out real records for the data holder's eyes and are **not** differentially
private. The synthetic store (and every probe trained on it alone) is post-processing of DP output.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.eval.inputs import as_matrix, check_compatible, check_space, labels_of
from fedhype.eval.interpolation import LAMBDA_GRID, ClientSplits, interpolation_protocol
from fedhype.eval.utility import METRICS, Probe, classification_metrics

#: the rows of the table, in order
ROWS = ("local_only", "synthetic_only", "local_synthetic", "interpolation")
#: real shares r tried for ``local_synthetic`` (None: unweighted union)
REAL_SHARES: tuple[float | None, ...] = (None, 0.5, 0.75, 0.9)


def client_items(clients: Mapping[str, ClientSplits] | Sequence[ClientSplits]) -> list[tuple[str, ClientSplits]]:
    """``[(name, splits)]`` of a mapping, or of a sequence named ``client_0``, ``client_1``, …"""
    if isinstance(clients, Mapping):
        return [(str(k), v) for k, v in clients.items()]
    return [(f"client_{i}", c) for i, c in enumerate(clients)]


def union_store(stores: Mapping[str, EmbeddingStore]) -> EmbeddingStore:
    """The rows of ``stores``, one client after the other; domain = the client (named as in ``stores``).

    Sample ids are prefixed with the client name (``"name/id"``) so that they stay unique.

    Raises:
        ValidationError: no stores, or stores of different dimension or class names.
    """
    items = list(stores.items())
    if not items:
        raise ValidationError("the union of the clients' test splits needs at least one client")
    first = items[0][1]
    for name, s in items[1:]:
        check_compatible(s, first, f"client {name} store", f"client {items[0][0]} store")
    return EmbeddingStore(torch.cat([s.embeddings for _, s in items]), torch.cat([s.labels for _, s in items]),
                          torch.cat([torch.full((len(s),), i, dtype=torch.int64) for i, (_, s) in enumerate(items)]),
                          [f"{n}/{sid}" for n, s in items for sid in s.sample_ids], list(first.class_names),
                          [n for n, _ in items], {"kind": "real", "what": "union of the clients' test splits"})


def augmentation_weights(y_real: np.ndarray, y_syn: np.ndarray, real_share: float | None) -> np.ndarray:
    """Sample weights float64 ``[n_real + n_syn]`` (real rows first) of the weighted union (module docstring).

    Args:
        y_real: int labels ``[n_real]`` of the client's real training records.
        y_syn: int labels ``[n_syn]`` of the synthetic records.
        real_share: r in (0, 1): the real records' share of each shared class's weight; ``None``
            gives every record weight 1.

    Raises:
        ValidationError: ``real_share`` outside (0, 1).
    """
    y_real, y_syn = np.asarray(y_real, dtype=np.int64), np.asarray(y_syn, dtype=np.int64)
    w = np.ones(len(y_real) + len(y_syn))
    if real_share is None:
        return w
    r = float(real_share)
    if not 0.0 < r < 1.0:
        raise ValidationError(f"real shares must lie in (0, 1) (or be None: unweighted), got {real_share!r}")
    w_real, w_syn = w[: len(y_real)], w[len(y_real):]
    for k in np.intersect1d(np.unique(y_real), np.unique(y_syn)):
        in_real, in_syn = y_real == k, y_syn == k
        total = in_real.sum() + in_syn.sum()
        w_real[in_real] = r * total / in_real.sum()
        w_syn[in_syn] = (1.0 - r) * total / in_syn.sum()
    return w


def _natural_share(y_real: np.ndarray, y_syn: np.ndarray) -> float:
    shared = np.isin(y_real, y_syn)
    n = shared.sum() + np.isin(y_syn, y_real).sum()
    return float(shared.sum() / n) if n else 1.0


def _mean_table(per: dict[str, dict], where: str) -> dict[str, dict[str, float]]:
    return {row: {m: float(np.mean([c[where][row][m] for c in per.values()])) for m in METRICS} for row in ROWS}


def client_downstream(
    clients: Mapping[str, ClientSplits] | Sequence[ClientSplits],
    synthetic: EmbeddingStore,
    *,
    space: str = "l2",
    real_shares: Sequence[float | None] = REAL_SHARES,
    grid: Sequence[float] = LAMBDA_GRID,
    select_by: str = "accuracy",
    seed: int = 0,
) -> dict:
    """The per-client downstream table (module docstring): four probes, own and union test splits.

    Args:
        clients: per-client real ``ClientSplits`` (train / val / test stores; a mapping name →
            splits, or a sequence named ``client_0``, …); each split needs ≥ 1 record. Embeddings
            float32 ``[n, D]``, labels int64 ``[n]`` in ``[0, K)``, the synthetic store's D and classes.
        synthetic: the shared synthetic store (float32 ``[N_syn, D]``, labels int64 ``[N_syn]``).
        space: evaluation space (``"l2"`` or ``"raw"``, :func:`fedhype.eval.inputs.as_matrix`).
        real_shares: the real shares r tried for ``local_synthetic`` (``None`` = unweighted).
        grid: the λ grid of the interpolation row.
        select_by: validation metric choosing r and λ (``accuracy``, ``balanced_accuracy``, ``macro_f1``).
        seed: ``random_state`` of every probe.

    Returns:
        ``{"rows": ROWS, "clients": {name: {"n_train", "n_val", "n_test", "missing_classes"
        (class names without a real training record at the client), "real_share" (the chosen r;
        None = unweighted), "real_share_natural", "real_share_val_scores" (one per
        ``real_shares``), "lambda", "own": {row: {metric: float}}, "union": {row: {...}}}},
        "mean": {"own": {row: {metric}}, "union": {row: {metric}}}, "gain_union_accuracy" (mean
        over clients of local_synthetic − local_only on the union), "gain_own_accuracy",
        "n_union_test", "n_synthetic", "real_shares", "select_by", "interpolation" (the full
        :func:`~fedhype.eval.interpolation.interpolation_protocol` result), "private": False,
        "note"}``. Metrics are floats in [0, 1].

    Raises:
        ValidationError: no clients, an empty split, stores whose D or classes differ from the
            synthetic store's, a real share outside (0, 1), an empty ``real_shares``, an unknown
            ``select_by`` or ``space``, a λ outside [0, 1].
    """
    check_space(space)
    items = client_items(clients)
    if not items:
        raise ValidationError("the per-client downstream protocol needs at least one client")
    if select_by not in METRICS:
        raise ValidationError(f"select_by must be one of {list(METRICS)}, got {select_by!r}")
    shares = list(real_shares)
    if not shares:
        raise ValidationError("real_shares is empty: give at least one real share (None = unweighted)")
    for r in shares:
        augmentation_weights(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), r)  # refuses r outside (0, 1)
    if len(synthetic) == 0:
        raise ValidationError("the synthetic store is empty")
    for name, c in items:
        for split in ("train", "val", "test"):
            store = getattr(c, split)
            check_compatible(store, synthetic, f"client {name} {split} store", "synthetic store")
            if len(store) == 0:
                raise ValidationError(f"client {name}: the {split} split is empty")
    union = union_store({name: c.test for name, c in items})
    lam = interpolation_protocol(dict(items), synthetic, space=space, grid=grid, select_by=select_by, seed=seed,
                                 union_test=union)
    k = synthetic.n_classes
    x_syn, y_syn = as_matrix(synthetic, space).numpy(), labels_of(synthetic)
    x_union, y_union = as_matrix(union, space).numpy(), labels_of(union)
    syn_probe = Probe(k, seed=seed).fit(x_syn, y_syn)
    syn_union = classification_metrics(y_union, syn_probe.predict(x_union))
    per: dict[str, dict] = {}
    for name, c in items:
        x_tr, y_tr = as_matrix(c.train, space).numpy(), labels_of(c.train)
        x_val, y_val = as_matrix(c.val, space).numpy(), labels_of(c.val)
        x_te, y_te = as_matrix(c.test, space).numpy(), labels_of(c.test)
        x_aug, y_aug = np.concatenate([x_tr, x_syn]), np.concatenate([y_tr, y_syn])
        fits = [Probe(k, seed=seed).fit(x_aug, y_aug, augmentation_weights(y_tr, y_syn, r)) for r in shares]
        val_scores = [classification_metrics(y_val, p.predict(x_val))[select_by] for p in fits]
        natural = _natural_share(y_tr, y_syn)
        effective = [natural if r is None else float(r) for r in shares]
        best = max(val_scores)
        pick = max((i for i, v in enumerate(val_scores) if v == best), key=lambda i: effective[i])
        local = Probe(k, seed=seed).fit(x_tr, y_tr)
        aug = fits[pick]
        li = lam["clients"][name]
        own = {"local_only": classification_metrics(y_te, local.predict(x_te)),
               "synthetic_only": classification_metrics(y_te, syn_probe.predict(x_te)),
               "local_synthetic": classification_metrics(y_te, aug.predict(x_te)),
               "interpolation": {m: li[m] for m in METRICS}}
        uni = {"local_only": classification_metrics(y_union, local.predict(x_union)),
               "synthetic_only": syn_union,
               "local_synthetic": classification_metrics(y_union, aug.predict(x_union)),
               "interpolation": {m: li["union"][m] for m in METRICS}}
        held = set(np.unique(y_tr).tolist())
        per[name] = {"n_train": len(c.train), "n_val": len(c.val), "n_test": len(c.test),
                     "missing_classes": [n for i, n in enumerate(synthetic.class_names) if i not in held],
                     "real_share": shares[pick], "real_share_natural": natural,
                     "real_share_val_scores": val_scores, "lambda": li["lambda"], "own": own, "union": uni}
    mean = {"own": _mean_table(per, "own"), "union": _mean_table(per, "union")}
    gain = {w: float(np.mean([c[w]["local_synthetic"]["accuracy"] - c[w]["local_only"]["accuracy"]
                              for c in per.values()])) for w in ("own", "union")}
    return {"rows": list(ROWS), "clients": per, "mean": mean, "gain_own_accuracy": gain["own"],
            "gain_union_accuracy": gain["union"], "n_union_test": len(union), "n_synthetic": len(synthetic),
            "real_shares": shares, "select_by": select_by, "interpolation": lam, "private": False,
            "note": "evaluation on held-out real records, for the data holder's eyes: not covered by DP"}


__all__ = ["REAL_SHARES", "ROWS", "augmentation_weights", "client_downstream", "client_items", "union_store"]
