"""``HyperPrototypeClassifier``: a scikit-learn classifier with FedHPro hyper-prototypes on embeddings.

Training alternates, once per epoch (dataset condensation, Zhao et al. ICLR 2021, Alg. 1):

1. *matching*: ``match_steps`` Adam steps on the prototypes P ``[K, L, d]`` minimising the
   whole-vector cosine gradient distance to class-wise head gradients
   (:mod:`fedhype.prototypes.matching`), whose targets come from

   * ``matching="synthetic"``: the training data given to :meth:`fit`, noise-free — free when that
     data is a synthetic store (post-processing of DP outputs); NOT private on real records;
   * ``matching="dp"``: the clients' real records passed as ``dp_clients``, through clipped and
     noised class-wise gradients (:mod:`fedhype.prototypes.dp_gradients`), one ledger event per
     client per epoch; the model itself still trains only on ``X``;
   * ``matching="none"`` (the default, measured below): no matching phase; P stays at its
     initialisation (random orthonormal anchors);

2. *model*: one epoch of the client objective CE + λ_con·contrastive + λ_cons·consistency on
   ``(X, y)`` with P fixed (:mod:`fedhype.prototypes.training`).

Prediction (``head``): ``"linear"`` softmax of the linear head; ``"prototype"`` softmax of the
prototype logits (smooth max over each class's L prototypes, :func:`~fedhype.prototypes.network.prototype_logits`);
``"both"`` the mean of the two probability vectors.

Defaults, justified by a measurement (``benchmarks/prototypes.py``; table in
``benchmarks/results/prototypes.md``): bundled digits domains, 6797 images → DINOv2 ViT-S/14 at
112 px, 4-client domain partition, 3 classifier seeds; trained on the real train split (4078), on
the synthetic store of a run at ε = 0.997 (3000) and of a ``--no-dp`` run (3000); tested on the
real test split (1359); accuracy mean ± std, head ``"both"``, 30 epochs, other parameters default:

==========================================  =============  ===============  ===============
configuration                               real           synthetic ε = 1  synthetic no DP
==========================================  =============  ===============  ===============
defaults (``"none"``, λ_cons = 0)           0.881 ± 0.011  0.254 ± 0.009    0.609 ± 0.004
λ_cons = 0.3                                0.887 ± 0.015  0.237 ± 0.012    0.592 ± 0.010
``matching="synthetic"``                    0.884 ± 0.002  0.247 ± 0.020    0.570 ± 0.013
``"synthetic"``, λ_cons = 0.3 (previous)    0.884 ± 0.002  0.201 ± 0.077    0.546 ± 0.015
no margin                                   0.885 ± 0.011  0.253 ± 0.008    0.609 ± 0.006
λ_con = 0                                   0.870 ± 0.011  0.228 ± 0.040    0.565 ± 0.010
linear probe (reference)                    0.884          0.257            0.609
==========================================  =============  ===============  ===============

* ``matching="none"``: gradient matching never helped. On the synthetic no-DP store it costs
  0.039 (0.029–0.047 on every seed; 0.046 with λ_cons = 0.3); on the real and ε = 1 sets it is
  within noise (+0.003, −0.007), and with λ_cons = 0.3 it made the ε = 1 fit unstable (one seed
  0.113) and lowered the prototype head on real data (0.839 ± 0.026 vs 0.883 ± 0.017). Cause,
  measured: the matched prototypes reproduce the head gradients of the class's adapter features,
  which share a large class-independent component, so the prototypes collapse onto it (mean
  inter-class cosine of the prototype class means 0.72 with λ_cons = 0.3, 0.25 with λ_cons = 0,
  vs 0 for the orthonormal anchors) and the consistency term pulls the features along (inter-class
  cosine of the real test features' class means 0.59 with matching vs 0.10 without; seed 0,
  λ_cons = 0.3). ``match_lr`` 1e-4 keeps the prototypes apart (cosine −0.04) but is no better
  than no matching (0.884 / 0.254 / 0.602); ``match_lr`` 1e-3, one step per epoch, unit-norm or
  centred prototypes and the per-row distance were tried on seed 0 (λ_cons = 0.3) and none beat
  ``"none"``. ``"synthetic"`` and ``"dp"`` (docs/method.md decision 7) stay available, opt-in.
* λ_cons = 0: with fixed anchors the consistency term still costs 0.012–0.025 on both synthetic
  stores on every seed (−0.017 mean); on real data it is within noise (+0.006 ± 0.017).
* λ_con = 0.3 and the margin are kept: without the contrastive term the synthetic no-DP accuracy
  drops by 0.044 and the prototype head is at chance (the prototypes then shape nothing); the
  margin makes no measurable difference here (within ±0.012 paired), kept as in FedHPro.
* head ``"both"``: the three heads are within noise of one another at the defaults (linear
  0.880 / 0.255 / 0.606, prototype 0.880 / 0.254 / 0.604).
* τ = 0.05, L = 5 and the LSE pool follow FedHPro (LSE 0.684 vs max 0.639 for the prototype head on
  an earlier 2400-image store).

At these defaults the classifier matches, but does not beat, the linear probe on every training set.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from fedhype.errors import BudgetExceededError, ValidationError
from fedhype.privacy.accountant import check_delta
from fedhype.privacy.events import dp_sgd_events
from fedhype.privacy.ledger import PrivacyLedger
from fedhype.privacy.randomness import noise_generator
from fedhype.prototypes.dp_gradients import MECHANISM, dp_class_gradients, privacy_summary
from fedhype.prototypes.inputs import as_features, as_labels
from fedhype.prototypes.matching import class_gradients, match_prototypes
from fedhype.prototypes.network import AdapterNet, init_parameters, orthogonal_anchors, prototype_logits
from fedhype.prototypes.training import Objective, features_of, torch_threads, train_epochs

HEADS = ("prototype", "linear", "both")
MATCHING = ("synthetic", "dp", "none")
INITS = ("orthogonal", "class_means")
POOLS = ("lse", "max")


class HyperPrototypeClassifier(ClassifierMixin, BaseEstimator):
    """Adapter + linear head + hyper-prototypes, trained FedHPro-style on frozen embeddings.

    Args:
        n_prototypes: L, prototypes per class (FedHPro: 5).
        hidden_dim, feature_dim: adapter ``Linear(D, hidden) − GELU − Linear(hidden, feature_dim)``.
        temperature: τ of the contrastive loss and of the prototype head (FedHPro: 0.05).
        lambda_contrastive, lambda_consistency: λ_con, λ_cons of the client objective.
        margin: use the client-specific margin in the contrastive loss.
        head: ``"prototype"``, ``"linear"`` or ``"both"`` (prediction only; training is the same).
        pool: ``"lse"`` or ``"max"`` over a class's L prototypes in the prototype head.
        epochs: alternation epochs (one matching phase + one model epoch each).
        lr: Adam learning rate of the adapter and head.
        batch_size: mini-batch size of the model steps.
        matching: ``"none"`` (default), ``"synthetic"`` or ``"dp"`` (module docstring).
        match_steps, match_lr: Adam steps and learning rate on P per matching phase.
        init: ``"orthogonal"`` (random orthonormal anchors) or ``"class_means"`` (normalised class
            means of ``X``'s adapter features at initialisation plus 0.1 × the anchors).
        noise_multiplier, clip_norm, delta, dp_batch_size, max_epsilon: the DP mechanism of
            ``matching="dp"`` (σ, C, δ, expected Poisson batch B: q_i = min(1, B/n_i), refuse to
            start if any client's ε would exceed ``max_epsilon``).
        seed: seeds initialisation, shuffling and (reproducibly, hence "not secure") the DP noise;
            ``None`` draws all of them from OS entropy.
        device: torch device string.
        n_threads: torch intra-op threads during fit/predict (restored afterwards); ``None`` leaves
            torch's setting. 1 is fastest for this tiny network on CPU (see
            :func:`~fedhype.prototypes.training.torch_threads`).

    Attributes (after fit):
        classes_: the class labels (int64 ``[K]``); n_features_in_: D; net_: the AdapterNet;
        prototypes_: float32 ``[K, L, d]``; history_: per-epoch matching distances and losses;
        ledger_: the PrivacyLedger (``matching="dp"``) or None; privacy_: the privacy summary.
    """

    def __init__(self, n_prototypes: int = 5, hidden_dim: int = 256, feature_dim: int = 128,
                 temperature: float = 0.05, lambda_contrastive: float = 0.3, lambda_consistency: float = 0.0,
                 margin: bool = True, head: str = "both", pool: str = "lse", epochs: int = 30, lr: float = 1e-3,
                 batch_size: int = 64, matching: str = "none", match_steps: int = 10, match_lr: float = 0.01,
                 init: str = "orthogonal", noise_multiplier: float = 1.0, clip_norm: float = 1.0,
                 delta: float = 1e-4, dp_batch_size: int = 64, max_epsilon: float | None = None,
                 seed: int | None = 0, device: str = "cpu", n_threads: int | None = 1):
        self.n_prototypes = n_prototypes
        self.hidden_dim = hidden_dim
        self.feature_dim = feature_dim
        self.temperature = temperature
        self.lambda_contrastive = lambda_contrastive
        self.lambda_consistency = lambda_consistency
        self.margin = margin
        self.head = head
        self.pool = pool
        self.epochs = epochs
        self.lr = lr
        self.batch_size = batch_size
        self.matching = matching
        self.match_steps = match_steps
        self.match_lr = match_lr
        self.init = init
        self.noise_multiplier = noise_multiplier
        self.clip_norm = clip_norm
        self.delta = delta
        self.dp_batch_size = dp_batch_size
        self.max_epsilon = max_epsilon
        self.seed = seed
        self.device = device
        self.n_threads = n_threads

    # ------------------------------------------------------------------ checks
    def _check_params(self) -> None:
        for name, choices in (("head", HEADS), ("matching", MATCHING), ("init", INITS), ("pool", POOLS)):
            if getattr(self, name) not in choices:
                raise ValidationError(f"{name} must be one of {list(choices)}, got {getattr(self, name)!r}")
        for name in ("n_prototypes", "hidden_dim", "feature_dim", "epochs", "batch_size", "dp_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValidationError(f"{name} must be a positive integer, got {v!r}")
        for name in ("temperature", "lr", "match_lr", "clip_norm"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not (v > 0) or not math.isfinite(v):
                raise ValidationError(f"{name} must be a finite number > 0, got {v!r}")
        for name in ("lambda_contrastive", "lambda_consistency", "noise_multiplier"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not (v >= 0) or not math.isfinite(v):
                raise ValidationError(f"{name} must be a finite number ≥ 0, got {v!r}")
        if self.n_threads is not None and (isinstance(self.n_threads, bool) or not isinstance(self.n_threads, int)
                                           or self.n_threads < 1):
            raise ValidationError(f"n_threads must be a positive integer or None, got {self.n_threads!r}")
        if isinstance(self.match_steps, bool) or not isinstance(self.match_steps, (int, np.integer)) or self.match_steps < 0:
            raise ValidationError(f"match_steps must be an integer ≥ 0, got {self.match_steps!r}")

    def objective(self) -> Objective:
        """The client objective weights of this estimator."""
        return Objective(float(self.lambda_contrastive), float(self.lambda_consistency), float(self.temperature),
                         bool(self.margin))

    # ------------------------------------------------------------------ set-up shared with fit_federated
    def _start(self, dim: int, classes: np.ndarray, x_init: torch.Tensor | None, y_init: torch.Tensor | None):
        """Create net, prototypes and generators; returns ``(net, P, optimizer_P, generator)``."""
        self._check_params()
        seed = None if self.seed is None else int(self.seed)
        gen = noise_generator(seed)  # initialisation and shuffling
        self.classes_ = np.asarray(classes, dtype=np.int64)
        self.n_features_in_ = int(dim)
        k = len(self.classes_)
        if k < 2:
            raise ValidationError(f"y must hold at least two classes, got {k}")
        net = init_parameters(AdapterNet(dim, k, int(self.hidden_dim), int(self.feature_dim)), gen)
        p = orthogonal_anchors(k, int(self.n_prototypes), int(self.feature_dim), gen)
        if self.init == "class_means" and x_init is not None:
            f = torch.nn.functional.normalize(features_of(net, x_init), dim=1)
            for c in torch.unique(y_init).tolist():
                p[c] = torch.nn.functional.normalize(f[y_init == c].mean(0), dim=0) + 0.1 * p[c]
        net = net.to(self.device)
        p = p.to(self.device).requires_grad_(True)
        opt_p = torch.optim.Adam([p], lr=float(self.match_lr))
        # the DP matching's sampling and noise: seed + 1 (a stream of its own)
        self.dp_generator_ = noise_generator(None if seed is None else seed + 1)
        self.noise_seed_note_ = "not secure: reproducible noise (seed given)" if self.seed is not None else \
            "noise seeded from OS entropy"
        self.history_ = []
        return net, p, opt_p, gen

    def _encode(self, y: np.ndarray, name: str = "y") -> torch.Tensor:
        pos = np.searchsorted(self.classes_, y)
        bad = (pos >= len(self.classes_)) | (self.classes_[np.minimum(pos, len(self.classes_) - 1)] != y)
        if bad.any():
            raise ValidationError(f"{name} holds labels not in classes: {sorted(set(y[bad].tolist()))[:5]}")
        return torch.as_tensor(pos, dtype=torch.int64, device=self.device)

    def _finish(self, net: AdapterNet, p: torch.Tensor, ledger: PrivacyLedger | None) -> None:
        self.net_ = net.eval()
        self.prototypes_ = p.detach().clone()
        self.ledger_ = ledger
        self.privacy_ = privacy_summary(self.matching, ledger, self.noise_seed_note_)

    # ------------------------------------------------------------------ fit
    def fit(self, X: Any, y: Any, *, classes: Any = None,
            dp_clients: Mapping[str, tuple[Any, Any]] | None = None,
            ledger: PrivacyLedger | None = None) -> "HyperPrototypeClassifier":
        """Fit on embeddings ``X`` float ``[N, D]`` with integer labels ``y`` ``[N]``.

        Args:
            X, y: the training set of the model steps (a synthetic store in the private workflow).
            classes: all class labels (default: those in ``y``); classes absent from ``y`` still get
                prototypes and head rows.
            dp_clients: ``matching="dp"`` only: client id → ``(X_i, y_i)`` real records, used only
                through DP class-wise gradients.
            ledger: ledger to record the DP events in (default: a new one at ``delta``); its δ must
                equal ``delta``.

        Raises:
            ValidationError: bad X / y / parameters, ``dp_clients`` missing or given without
                ``matching="dp"``, δ ≥ 1/n_i for a client.
            BudgetExceededError: the planned DP events would take a client over ``max_epsilon``.
        """
        self._check_params()
        with torch_threads(self.n_threads):
            return self._fit(X, y, classes, dp_clients, ledger)

    def _fit(self, X, y, classes, dp_clients, ledger) -> "HyperPrototypeClassifier":
        x = as_features(X, "X")
        y_raw = as_labels(y, x.shape[0], "y")
        classes = np.unique(y_raw) if classes is None else np.unique(np.asarray(classes, dtype=np.int64))
        self.classes_ = classes
        yt = self._encode(y_raw)
        x = x.to(self.device)
        clients = self._dp_clients(dp_clients, x.shape[1])
        ledger = self._dp_ledger(clients, ledger)
        net, p, opt_p, gen = self._start(x.shape[1], classes, x, yt)
        opt = torch.optim.Adam(net.parameters(), lr=float(self.lr))
        for epoch in range(int(self.epochs)):
            rec: dict[str, Any] = {"epoch": epoch}
            if self.matching != "none" and self.match_steps > 0:
                w, b = net.head.weight.detach(), net.head.bias.detach()
                if self.matching == "synthetic":
                    targets = class_gradients(features_of(net, x), yt, w, b, 256, gen)
                else:
                    targets = self._dp_targets(net, clients, w, b, ledger, epoch)
                rec["match_before"], rec["match_after"] = match_prototypes(p, opt_p, w, b, targets, int(self.match_steps))
            rec.update(train_epochs(net, p, x, yt, self.objective(), opt, epochs=1, batch_size=int(self.batch_size),
                                    generator=gen))
            self.history_.append(rec)
        self._finish(net, p, ledger)
        return self

    def _dp_clients(self, dp_clients, dim: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        if self.matching != "dp":
            if dp_clients is not None:
                raise ValidationError("dp_clients is only used with matching='dp'")
            return {}
        if not dp_clients:
            raise ValidationError("matching='dp' needs dp_clients: client id → (X_i, y_i) real records")
        out = {}
        for cid, (xc, yc) in dp_clients.items():
            xt = as_features(xc, f"dp_clients[{cid!r}] X")
            if xt.shape[1] != dim:
                raise ValidationError(f"dp_clients[{cid!r}] X has {xt.shape[1]} features, X has {dim}")
            check_delta(float(self.delta), xt.shape[0], where=f"client {cid!r}")
            out[str(cid)] = (xt.to(self.device), self._encode(as_labels(yc, xt.shape[0], f"dp_clients[{cid!r}] y"),
                                                               f"dp_clients[{cid!r}] y"))
        return out

    def _dp_ledger(self, clients: dict, ledger: PrivacyLedger | None) -> PrivacyLedger | None:
        if self.matching != "dp":
            return None
        ledger = ledger if ledger is not None else PrivacyLedger(float(self.delta), {"what": "hyper-prototype matching"})
        if ledger.delta != float(self.delta):
            raise ValidationError(f"ledger has delta={ledger.delta:g}, this classifier uses delta={self.delta:g}")
        if self.max_epsilon is not None and self.match_steps > 0:
            planned = [ev for cid, (xc, _) in clients.items() for e in range(int(self.epochs))
                       for ev in dp_sgd_events(e, [(cid, self.sample_rate(len(xc)), 1)], float(self.noise_multiplier),
                                               float(self.clip_norm), mechanism=MECHANISM)]
            over = ledger.would_exceed(planned, float(self.max_epsilon))
            if over:
                worst = max(over, key=over.get)
                raise BudgetExceededError(f"hyper-prototype DP matching would take client {worst!r} to ε = "
                                          f"{over[worst]:.3g} > max_epsilon {self.max_epsilon:g}; raise "
                                          "noise_multiplier or lower epochs", epsilon=over[worst], limit=self.max_epsilon)
        return ledger

    def sample_rate(self, n: int) -> float:
        """q_i = min(1, dp_batch_size / n_i) of the DP class-gradient release of a client of n_i records."""
        return min(1.0, float(self.dp_batch_size) / n)

    def _dp_targets(self, net, clients, w, b, ledger, rnd) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Mean over clients of their DP class-wise gradients (one ledger event per client)."""
        released = [dp_class_gradients(features_of(net, xc), yc, w, b, noise_multiplier=float(self.noise_multiplier),
                                       clip_norm=float(self.clip_norm), sample_rate=self.sample_rate(len(xc)),
                                       generator=self.dp_generator_, ledger=ledger, client=cid, round=rnd)
                    for cid, (xc, yc) in clients.items()]
        return {c: tuple(torch.stack([r[c][i] for r in released]).mean(0) for i in range(2)) for c in released[0]}

    # ------------------------------------------------------------------ predict
    def transform(self, X: Any) -> np.ndarray:
        """Adapter features float32 ``[N, feature_dim]``."""
        return self._features(X).cpu().numpy()

    def _features(self, X: Any) -> torch.Tensor:
        check_is_fitted(self, "net_")
        x = as_features(X, "X")
        if x.shape[1] != self.n_features_in_:
            raise ValidationError(f"X has {x.shape[1]} features, the classifier was fit on {self.n_features_in_}")
        return features_of(self.net_, x.to(self.device))

    def predict_proba(self, X: Any, head: str | None = None) -> np.ndarray:
        """Class probabilities float64 ``[N, K]`` (columns in ``classes_`` order) of ``head`` (default: ``self.head``)."""
        head = head or self.head
        if head not in HEADS:
            raise ValidationError(f"head must be one of {list(HEADS)}, got {head!r}")
        with torch_threads(self.n_threads), torch.no_grad():
            f = self._features(X)
            lin = torch.softmax(self.net_.head(f), dim=1)
            pro = torch.softmax(prototype_logits(f, self.prototypes_, float(self.temperature), self.pool), dim=1)
        out = {"linear": lin, "prototype": pro, "both": (lin + pro) / 2}[head]
        return out.double().cpu().numpy()

    def predict(self, X: Any, head: str | None = None) -> np.ndarray:
        """Predicted labels int64 ``[N]`` (values from ``classes_``)."""
        return self.classes_[self.predict_proba(X, head).argmax(1)]

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, meta: dict | None = None):
        """Write ``path/model.safetensors`` + ``path/config.json`` (+ ``ledger.json``); see :mod:`.persistence`."""
        from fedhype.prototypes.persistence import save_classifier

        return save_classifier(self, path, meta)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HyperPrototypeClassifier":
        """Read a classifier written by :meth:`save` (ArtifactError if missing, corrupt or mismatched)."""
        from fedhype.prototypes.persistence import load_classifier

        return load_classifier(path)
