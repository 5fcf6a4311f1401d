"""The predecessor's per-client λ-interpolation protocol.

Source: Di Salvo, Nguyen & Ledig, DP-CVAE (MICCAI 2025, arXiv 2507.02671), evaluation protocol:
per client, a linear classifier trained on the client's real local training data and one trained
on the synthetic data are combined as

    p_λ(y | x) = λ · p_local(y | x) + (1 − λ) · p_synthetic(y | x),

with λ on the grid {0, 0.1, …, 1} chosen on the client's validation set; the chosen λ is then
scored on the client's test set (accuracy, balanced accuracy, macro-F1).

Our choices where the paper is silent: both classifiers are :class:`fedhype.eval.utility.Probe`
(standardised multinomial logistic regression); one synthetic classifier is trained on the whole
synthetic store and shared by all clients; λ maximises validation ``select_by`` (accuracy by
default), ties broken towards the *larger* λ (rely on the local model unless synthetic data helps
strictly). λ = 1 is the local-only baseline, λ = 0 is synthetic-only (TSTR per client).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError
from fedhype.eval.inputs import as_matrix, check_compatible, check_space, labels_of
from fedhype.eval.utility import METRICS, classification_metrics, fit_probe

#: λ grid of the protocol: 0, 0.1, …, 1.
LAMBDA_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))


@dataclass
class ClientSplits:
    """One client's real train / validation / test stores (same classes and D as the synthetic set)."""

    train: EmbeddingStore
    val: EmbeddingStore
    test: EmbeddingStore


def _mix_scores(p_local: np.ndarray, p_syn: np.ndarray, y: np.ndarray, grid: Sequence[float]) -> list[dict]:
    return [classification_metrics(y, (lam * p_local + (1.0 - lam) * p_syn).argmax(1)) for lam in grid]


def select_lambda(
    p_local: np.ndarray,
    p_syn: np.ndarray,
    y_val: np.ndarray,
    grid: Sequence[float] = LAMBDA_GRID,
    select_by: str = "accuracy",
) -> tuple[float, list[float]]:
    """λ in ``grid`` maximising validation ``select_by`` (ties → the largest λ).

    Args:
        p_local, p_syn: class probabilities float ``[N_val, C]``.
        y_val: int labels ``[N_val]``.

    Returns:
        ``(λ, validation scores per grid point)``.
    """
    if select_by not in METRICS:
        raise ValidationError(f"select_by must be one of {list(METRICS)}, got {select_by!r}")
    scores = [s[select_by] for s in _mix_scores(p_local, p_syn, y_val, grid)]
    best = max(scores)
    lam = max(g for g, s in zip(grid, scores) if s == best)
    return float(lam), scores


def interpolation_protocol(
    clients: Mapping[str, ClientSplits] | Sequence[ClientSplits],
    synthetic: EmbeddingStore,
    *,
    space: str = "l2",
    grid: Sequence[float] = LAMBDA_GRID,
    select_by: str = "accuracy",
    seed: int = 0,
    union_test: EmbeddingStore | None = None,
) -> dict:
    """Run the λ-interpolation protocol for every client.

    Args:
        clients: per-client ``ClientSplits`` (a mapping name → splits, or a sequence named
            ``client_0``, ``client_1``, …). Each split needs ≥ 1 record.
        synthetic: the synthetic store (one classifier trained on all of it).
        space: evaluation space (``"l2"`` or ``"raw"``).
        grid: λ values (each in [0, 1]).
        select_by: validation metric that picks λ (``accuracy``, ``balanced_accuracy``, ``macro_f1``).
        seed: ``random_state`` of the classifiers.
        union_test: a second test set scored with each client's chosen λ (ours, not the
            predecessor's: the union of all clients' test splits, where a client's classifier meets
            the classes and domains it does not hold); ``None`` skips it.

    Returns:
        ``{"clients": {name: {"lambda", "val_scores", "n_train", "n_val", "n_test", "accuracy",
        "balanced_accuracy", "macro_f1", "local_only": {...}, "synthetic_only": {...}}},
        "mean_lambda", "mean_accuracy", "mean_balanced_accuracy", "mean_macro_f1", "grid",
        "select_by"}`` (test metrics; ``local_only`` is λ = 1, ``synthetic_only`` λ = 0). With
        ``union_test`` every client also has ``"union": {metrics of its chosen λ, "local_only",
        "synthetic_only"}`` and the result ``"mean_union_accuracy"`` etc.

    Raises:
        ValidationError: no clients, an empty split, a λ outside [0, 1], or stores whose D or
            classes differ from the synthetic store's.
    """
    check_space(space)
    if isinstance(clients, Mapping):
        items = list(clients.items())
    else:
        items = [(f"client_{i}", c) for i, c in enumerate(clients)]
    if not items:
        raise ValidationError("the λ protocol needs at least one client")
    grid = [float(g) for g in grid]
    if not grid or any(not 0.0 <= g <= 1.0 for g in grid):
        raise ValidationError(f"λ grid values must lie in [0, 1], got {grid}")
    if union_test is not None:
        check_compatible(union_test, synthetic, "union test store", "synthetic store")
        if len(union_test) == 0:
            raise ValidationError("the union test store is empty")
        x_union, y_union = as_matrix(union_test, space).numpy(), labels_of(union_test)
    syn_probe = fit_probe(synthetic, space, seed)
    p_union_syn = syn_probe.predict_proba(x_union) if union_test is not None else None
    per: dict[str, dict] = {}
    for name, c in items:
        for split in ("train", "val", "test"):
            store = getattr(c, split)
            check_compatible(store, synthetic, f"client {name} {split} store", "synthetic store")
            if len(store) == 0:
                raise ValidationError(f"client {name}: the {split} split is empty")
        local = fit_probe(c.train, space, seed)
        x_val, y_val = as_matrix(c.val, space).numpy(), labels_of(c.val)
        p_val_local, p_val_syn = local.predict_proba(x_val), syn_probe.predict_proba(x_val)
        lam, val_scores = select_lambda(p_val_local, p_val_syn, y_val, grid, select_by)
        x_te, y_te = as_matrix(c.test, space).numpy(), labels_of(c.test)
        p_loc, p_syn = local.predict_proba(x_te), syn_probe.predict_proba(x_te)
        chosen, local_only, syn_only = _mix_scores(p_loc, p_syn, y_te, [lam, 1.0, 0.0])
        per[name] = {
            "lambda": lam,
            "val_scores": val_scores,
            "n_train": len(c.train),
            "n_val": len(c.val),
            "n_test": len(c.test),
            **chosen,
            "local_only": local_only,
            "synthetic_only": syn_only,
        }
        if union_test is not None:
            u_chosen, u_local, u_syn = _mix_scores(local.predict_proba(x_union), p_union_syn, y_union, [lam, 1.0, 0.0])
            per[name]["union"] = {**u_chosen, "local_only": u_local, "synthetic_only": u_syn}
    out = {"clients": per, "grid": grid, "select_by": select_by}
    out["mean_lambda"] = float(np.mean([r["lambda"] for r in per.values()]))
    for m in METRICS:
        out[f"mean_{m}"] = float(np.mean([r[m] for r in per.values()]))
        if union_test is not None:
            out[f"mean_union_{m}"] = float(np.mean([r["union"][m] for r in per.values()]))
    return out


__all__ = ["ClientSplits", "LAMBDA_GRID", "interpolation_protocol", "select_lambda"]
