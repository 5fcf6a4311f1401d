"""FedHPro over in-process clients: FedAvg of the adapter + head, server-side prototype matching.

One round (FedHPro official ``FedHPro()`` loop, reordered so that the prototypes are matched at
the same model the class gradients were computed at):

1. every client computes class-wise head gradients on its records under the global model —
   noise-free (``matching="synthetic"``: NOT private) or clipped and noised
   (``matching="dp"``: one ledger event per client, :mod:`fedhype.prototypes.dp_gradients`);
2. the server averages them over clients (per class, over the clients that sent one) and runs
   ``match_steps`` matching steps on the prototypes P;
3. every client trains a copy of the global model for ``local_epochs`` epochs of the client
   objective with the new P and its own margin m_i (:mod:`fedhype.prototypes.training`);
4. the server averages the clients' adapter + head weights, weighted by their public sizes n_i
   (McMahan et al. 2017, FedAvg, Alg. 1).

Privacy: the averaged model weights come from non-private local training on the clients' real
records, so the resulting classifier is **not** differentially private, whatever ``matching`` is
(``privacy_["model_private"] = False``). It is the FedHPro reference (trained on real data, like
TRTR); the private workflow trains on a synthetic store (:meth:`HyperPrototypeClassifier.fit`,
optionally with ``matching="dp"``).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import numpy as np
import torch

from fedhype.errors import ValidationError
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.prototypes.classifier import HyperPrototypeClassifier
from fedhype.prototypes.inputs import as_features, as_labels
from fedhype.prototypes.matching import class_gradients, match_prototypes
from fedhype.prototypes.training import features_of, torch_threads, train_epochs


def fedavg(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """``Σ_i w_i θ_i / Σ_i w_i`` per tensor (FedAvg with public weights, e.g. client sizes)."""
    total = float(sum(weights))
    if not states or total <= 0:
        raise ValidationError("fedavg needs at least one client with positive weight")
    return {k: sum(s[k] * (w / total) for s, w in zip(states, weights)) for k in states[0]}


def fit_federated(clf: HyperPrototypeClassifier, clients: Mapping[str, tuple[Any, Any]], *, classes: Any,
                  local_epochs: int = 1, ledger: PrivacyLedger | None = None) -> HyperPrototypeClassifier:
    """Train ``clf`` by FedHPro rounds over ``clients`` (``clf.epochs`` rounds); returns ``clf`` fitted.

    Args:
        clf: an unfitted estimator (its parameters set the objective, matching and DP settings).
        clients: client id → ``(X_i [n_i, D], y_i [n_i])`` (real records; never pooled).
        classes: all class labels (public: the store's classes).
        local_epochs: client epochs per round.
        ledger: for ``matching="dp"`` (default: a new ledger at ``clf.delta``).

    Raises:
        ValidationError: no clients, mismatched dimensions, ``init="class_means"`` (it would pool
            the clients' records), or the checks of :meth:`HyperPrototypeClassifier.fit`.
        BudgetExceededError: planned DP events over ``clf.max_epsilon``.
    """
    clf._check_params()
    with torch_threads(clf.n_threads):
        return _fit_federated(clf, clients, classes, local_epochs, ledger)


def _fit_federated(clf, clients, classes, local_epochs, ledger) -> HyperPrototypeClassifier:
    if not clients:
        raise ValidationError("fit_federated needs at least one client")
    if clf.init == "class_means":
        raise ValidationError("init='class_means' needs all training data in one place; use init='orthogonal' "
                              "with federated training")
    if isinstance(local_epochs, bool) or not isinstance(local_epochs, int) or local_epochs < 1:
        raise ValidationError(f"local_epochs must be a positive integer, got {local_epochs!r}")
    clf.classes_ = np.unique(np.asarray(classes, dtype=np.int64))
    data: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    dim = None
    for cid, (x, y) in clients.items():
        xt = as_features(x, f"clients[{cid!r}] X")
        if dim is not None and xt.shape[1] != dim:
            raise ValidationError(f"clients[{cid!r}] X has {xt.shape[1]} features, other clients have {dim}")
        dim = xt.shape[1]
        data[str(cid)] = (xt.to(clf.device), clf._encode(as_labels(y, xt.shape[0], f"clients[{cid!r}] y"),
                                                         f"clients[{cid!r}] y"))
    dp = clf._dp_clients({c: (x.cpu(), clf.classes_[y.cpu().numpy()]) for c, (x, y) in data.items()}
                         if clf.matching == "dp" else None, dim)
    ledger = clf._dp_ledger(dp, ledger)
    net, p, opt_p, gen = clf._start(dim, clf.classes_, None, None)
    sizes = [float(len(x)) for x, _ in data.values()]
    client_gens = {c: torch.Generator().manual_seed(int(torch.randint(1 << 62, (1,), generator=gen)))
                   for c in data}
    for rnd in range(int(clf.epochs)):
        rec: dict[str, Any] = {"round": rnd}
        if clf.matching != "none" and clf.match_steps > 0:
            w, b = net.head.weight.detach(), net.head.bias.detach()
            if clf.matching == "dp":
                targets = clf._dp_targets(net, dp, w, b, ledger, rnd)
            else:
                targets = _mean_targets([class_gradients(features_of(net, x), y, w, b, 256, gen)
                                         for x, y in data.values()])
            rec["match_before"], rec["match_after"] = match_prototypes(p, opt_p, w, b, targets, int(clf.match_steps))
        states, stats = [], []
        for cid, (x, y) in data.items():
            local = copy.deepcopy(net)
            opt = torch.optim.Adam(local.parameters(), lr=float(clf.lr))
            stats.append(train_epochs(local, p, x, y, clf.objective(), opt, epochs=local_epochs,
                                      batch_size=int(clf.batch_size), generator=client_gens[cid]))
            states.append({k: v.detach() for k, v in local.state_dict().items()})
        net.load_state_dict(fedavg(states, sizes))
        rec["loss"] = float(np.average([s["loss"] for s in stats], weights=sizes))
        rec["margins"] = {cid: s["margin"] for cid, s in zip(data, stats)}
        clf.history_.append(rec)
    clf._finish(net, p, ledger)
    clf.privacy_.update(model_private=False, federated=True, clients=list(data), client_sizes=sizes,
                        model_note="adapter/head averaged from non-private local training on real records: "
                               "the classifier is NOT differentially private")
    return clf


def _mean_targets(per_client: list[dict[int, tuple[torch.Tensor, torch.Tensor]]]) -> dict[int, tuple]:
    """Per class, the mean of the clients' target gradients over the clients that hold the class."""
    out = {}
    for c in sorted({c for t in per_client for c in t}):
        have = [t[c] for t in per_client if c in t]
        out[c] = (torch.stack([h[0] for h in have]).mean(0), torch.stack([h[1] for h in have]).mean(0))
    return out
