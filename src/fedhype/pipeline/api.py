"""The high-level Python API: ``fedhype.embed``, ``fedhype.partition``, :class:`FedHypeVAE`, ``fedhype.evaluate``.

A notebook version of ``fedhype run`` (same defaults: :data:`fedhype.pipeline.config.DEFAULTS`)::

    import fedhype
    store = fedhype.embed("digits-domains")                  # real images → DINOv2 embeddings (cached)
    clients = fedhype.partition(store)                         # one client per domain, 60/20/20 splits
    gen = fedhype.FedHypeVAE(epsilon=4.0, seed=0).fit(store, clients)
    syn = gen.sample(per_class=300)                            # DP synthetic embeddings (an EmbeddingStore)
    print(gen.privacy_spent(), fedhype.evaluate(clients.split_store(store, "test"), syn))

Everything here is a thin layer over the stage functions (:func:`fedhype.federated.engine.train`,
:func:`fedhype.synthesis.synthesize`, :func:`fedhype.eval.evaluate`); the privacy mechanisms and
the accountant are theirs.
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedhype.data.partition import Partition, make_partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, ValidationError
from fedhype.eval.result import Evaluation
from fedhype.pipeline.config import DEFAULTS, resolve, train_config

def embed(source: str | os.PathLike = DEFAULTS["data"]["dataset"], *, encoder: str = DEFAULTS["data"]["encoder"],
          image_size: int | None = None, layout: str = DEFAULTS["data"]["layout"], limit: int | None = None,
          pooling: str = DEFAULTS["data"]["pooling"], device: str = DEFAULTS["data"]["device"],
          dtype: str = DEFAULTS["data"]["dtype"], seed: int = DEFAULTS["data"]["seed"],
          cache_dir: str | os.PathLike | None = None, progress: bool = True) -> EmbeddingStore:
    """Real embeddings of a bundled dataset or of an image folder, with a frozen encoder.

    Args:
        source: a bundled dataset name (``digits-domains``, ``fashion-mnist``, …) or an image
            folder. Both are cached under ``~/.cache/fedhype/embeddings`` (``cache_dir``), a folder
            by the content of its files (:func:`fedhype.encoders.cache.image_cache_key`).
        encoder: encoder name (``fedhype embed --help`` lists them).
        image_size: input side in px; None: the encoder's own default (as ``fedhype embed`` and
            ``fedhype run``; 112 px for ``dinov2-vits14``). The size used is in ``meta["preprocess"]``.
        layout: how a folder is read (:mod:`fedhype.data.layout`): ``class`` (``<folder>/<class>/...``,
            nested folders stay in their class, as torchvision's ImageFolder), ``domain/class``
            (``<folder>/<domain>/<class>/...``) or ``auto`` (detected where unambiguous, else refused).
            Split folders (``train/``, ``val/``, ``test/``) give the records' splits.
        limit: a stratified subset of this many images (None: all). pooling: ``cls`` or ``mean``.
        device, dtype: ``auto`` picks CUDA / bfloat16 autocast where the machine has them.

    Returns:
        An :class:`~fedhype.data.store.EmbeddingStore` (float32 ``[N, D]`` embeddings, labels, domains).

    Raises:
        ValidationError: unknown dataset or encoder, an unreadable folder, an ambiguous layout, bad sizes.
    """
    from fedhype.data.layout import check_layout
    from fedhype.pipeline.job import embed_store

    check_layout(layout, "layout=")
    d = {**DEFAULTS["data"], "encoder": encoder, "image_size": image_size or 0, "limit": limit or 0,
         "pooling": pooling, "device": device, "dtype": dtype, "seed": seed, "cache_dir": str(cache_dir or ""),
         "layout": layout}
    folder = Path(source)
    if folder.is_dir():
        d.update(images=str(folder), dataset="")
    else:
        d.update(dataset=str(source), images="")
    return embed_store(d, progress=progress)


def partition(store: EmbeddingStore, *, scheme: str = DEFAULTS["partition"]["scheme"], clients: int | None = None,
              alpha: float = DEFAULTS["partition"]["alpha"],
              fractions: tuple[float, float, float] = tuple(DEFAULTS["partition"]["fractions"]),
              min_records: int = DEFAULTS["partition"]["min_records"], seed: int = DEFAULTS["partition"]["seed"],
              split: tuple[float, float, float] | None = None) -> Partition:
    """Clients and their train/val/test splits (:func:`fedhype.data.partition.make_partition`).

    ``scheme``: ``domain`` (one client per domain of the store), ``dirichlet`` (``clients`` clients
    with Dirichlet(``alpha``) label skew) or ``iid``. ``fractions``: train/val/test fractions of each client
    (``--fractions`` of the CLI).
    ``min_records``: the smallest training set a client may have (records; ``--min-records`` of the CLI).

    ``split`` is the old name of ``fractions`` (deprecated: a ``FutureWarning``; removed in the next release).

    Raises:
        ValidationError: unknown scheme, bad fractions, a client below ``min_records``.
    """
    if split is not None:
        import warnings

        warnings.warn("fedhype.partition(split=) is deprecated and will be removed in the next release; use fractions=",
                      FutureWarning, stacklevel=2)
        fractions = split
    return make_partition(store, scheme=scheme, n_clients=clients, alpha=alpha, splits=tuple(fractions),
                          min_train_per_client=min_records, seed=seed)


def evaluate(real_test: EmbeddingStore, synthetic: EmbeddingStore, *, real_train: EmbeddingStore | None = None,
             seed: int = DEFAULTS["evaluate"]["seed"], permutations: int = DEFAULTS["evaluate"]["permutations"],
             max_samples: int = DEFAULTS["evaluate"]["max_samples"], k: int = DEFAULTS["evaluate"]["k"]) -> Evaluation:
    """Fidelity (MMD², FD, PRDC) and utility (TSTR; TRTR with ``real_train``) of ``synthetic``.

    The held-out ``real_test`` must not have been used in training. Returns an
    :class:`~fedhype.eval.result.Evaluation` (``.tstr_accuracy``, ``.mmd2``, …, ``.to_dict()``);
    the metrics and their sources are those of :func:`fedhype.eval.evaluate`.

    Raises:
        ValidationError: stores of different dimension or class names, sets too small for a metric.
    """
    from fedhype.eval.evaluate import evaluate as _evaluate

    metrics = _evaluate(real_test, synthetic, real_train=real_train, n_permutations=permutations,
                        max_samples=max_samples, k=k, seed=seed)
    return Evaluation.from_metrics(metrics, real_test.n_classes)


@dataclass(frozen=True)
class PrivacySpent:
    """What a trained model cost, recomputed by the accountant from the run's ledger.

    Attributes:
        epsilon: the largest ε over the clients (record-level, at ``delta``); None for a
            non-private (``no_dp``) run.
        delta: δ.
        per_client: ε of each client (the ledger's client ids).
        accountant: the accountant that produced the figures (``"best"``: the smaller of Opacus's PRV
            and RDP bounds, :mod:`fedhype.privacy.accountant`).
        mechanisms: the mechanisms in the ledger (``dp-release-centre`` and ``dp-class-stats``: the
            centred statistics release before round 0, :mod:`fedhype.privacy.centring`; ``dp-sgd``:
            the local DP-SGD steps).
        private: False for a run trained with ``no_dp``.
        noise_seeded: the noise was drawn from a seed (``seed=`` / ``train.seed``, or a Flower node's ``seed=``):
            reproducible, so whoever knows the seed can remove it — the run must not be shared as private (the
            release's ``privacy.json`` and README and ``fedhype audit`` say the same).
    """

    epsilon: float | None
    delta: float
    per_client: dict[str, float]
    accountant: str
    mechanisms: tuple[str, ...]
    private: bool
    noise_seeded: bool = False

    def __str__(self) -> str:
        if not self.private:
            return "NON-PRIVATE (trained with no_dp): no ε guarantee"
        how = "min of PRV and RDP" if self.accountant == "best" else self.accountant
        seeded = ("; SEEDED noise: reproducible, not to be shared as private — train without a seed for a release"
                  if self.noise_seeded else "")
        return (f"(ε = {self.epsilon:.3f}, δ = {self.delta:g})-DP per record, worst of {len(self.per_client)} clients "
                f"(accountant: {how}; mechanisms: {', '.join(self.mechanisms)}){seeded}")


class FedHypeVAE:
    """A federated hypernetwork CVAE trained under record-level DP, with a ``fit`` / ``sample`` interface.

    Every keyword left at None takes ``fedhype run``'s default (:data:`fedhype.pipeline.config.DEFAULTS`,
    the one source of defaults; ``fedhype run --help`` and ``docs/method.md`` explain them).

    Args:
        epsilon: target ε; the noise multipliers are calibrated so the accountant's ε for the
            plan actually run meets it (default 1.0).
        delta: δ (must be < 1/n for every client's n; default 1e-4).
        noise_multiplier: σ of DP-SGD set directly instead of ``epsilon`` (ε is then reported).
        max_epsilon: refuse any plan or round that would pass this ε.
        no_dp: train without privacy (a reference, never to be shared as private).
        rounds: federated rounds. method: ``fedhypevae`` or a baseline/ablation
            (:data:`fedhype.federated.config.METHODS`).
        secure_aggregation: pool the clients' releases by secure aggregation (the server sees only sums).
        seed: seed of the initialisation, sampling and noise (reproducible, not secure; None: OS entropy).
        out: the run directory ``fit`` writes. It holds private client state (to resume); share only
            what :meth:`save` writes. Default: a new temporary folder from which ``fit`` removes the
            client states, checkpoints and held-out diagnostics once training ends (the model, ledger,
            configuration and commit point stay, for sampling and audit).
        train, model: any other ``[train]`` / ``[model]`` key of the job configuration (e.g.
            ``train={"local_epochs": 3}``, ``model={"latent": 32}``).

    Raises:
        ValidationError: an unknown key, a value of the wrong type, ``no_dp`` with a privacy target.

    Attributes (after :meth:`fit` or :meth:`load`):
        run_dir_: the run directory (or saved model folder). result_: what training returned
            (``epsilon``, ``noise_multiplier``, ``rounds``, …; only after ``fit``).
    """

    def __init__(self, *, epsilon: float | None = None, delta: float | None = None,
                 noise_multiplier: float | None = None, max_epsilon: float | None = None, no_dp: bool | None = None,
                 rounds: int | None = None, method: str | None = None, secure_aggregation: bool | None = None,
                 seed: int | None = None, out: str | os.PathLike | None = None,
                 train: dict[str, Any] | None = None, model: dict[str, Any] | None = None):
        named = {"epsilon": epsilon, "delta": delta, "noise_multiplier": noise_multiplier,
                 "max_epsilon": max_epsilon, "no_dp": no_dp, "rounds": rounds, "method": method,
                 "secure_aggregation": secure_aggregation, "seed": seed}
        values = {f"train.{k}": v for k, v in (train or {}).items()}
        values.update({f"train.{k}": v for k, v in named.items() if v is not None})
        values.update({f"model.{k}": v for k, v in (model or {}).items()})
        self.config = resolve(values=values, where="FedHypeVAE:")
        self.train_config = train_config(self.config)  # validated now, not at fit time
        self.out = None if out is None else Path(out)
        self.run_dir_: Path | None = None
        self.result_: dict[str, Any] | None = None

    def __repr__(self) -> str:
        t = self.config["train"]
        what = "no_dp" if t["no_dp"] else (f"epsilon={t['epsilon']}" if t["epsilon"] is not None
                                            else f"noise_multiplier={t['noise_multiplier']}")
        state = f", run_dir={str(self.run_dir_)!r}" if self.run_dir_ is not None else ""
        return f"FedHypeVAE(method={t['method']!r}, {what}, delta={t['delta']}, rounds={t['rounds']}{state})"

    # ------------------------------------------------------------------ training
    def fit(self, store: EmbeddingStore, partition: Partition, *, resume: bool = False,
            progress: Callable[[dict], None] | None = None, diagnostics: bool = True) -> "FedHypeVAE":
        """Train on the clients of ``partition`` (each sees only its own training rows of ``store``).

        Args:
            store: the real embeddings. partition: clients → sample ids (from :func:`partition`).
            resume: continue the run in ``out`` from its last committed round (same settings).
            progress: called after each round with that round's metrics.
            diagnostics: per-round validation diagnostics (not DP; kept at the site, in ``metrics.json``).

        Returns:
            self.

        Raises:
            ValidationError: a client too small, δ ≥ 1/n, an existing run in ``out`` without ``resume``.
            BudgetExceededError: the plan would exceed ``max_epsilon``.
        """
        from fedhype.federated.engine import train

        out = self.out if self.out is not None else Path(tempfile.mkdtemp(prefix="fedhype-run-")) / "run"
        cfg = self.train_config if self.train_config is not None else train_config(self.config)
        self.result_ = train(store, partition, cfg, out, resume=resume, progress=progress,
                             diagnostics=diagnostics)
        self.run_dir_ = Path(out)
        if self.out is None:  # a temporary run cannot be resumed: drop what is private, keep the DP outputs
            import shutil

            for name in ("clients", "ckpt"):
                shutil.rmtree(out / name, ignore_errors=True)
            (out / "metrics.json").unlink(missing_ok=True)
        return self

    def _model_dir(self) -> Path:
        if self.run_dir_ is None:
            raise ValidationError("this FedHypeVAE has no model yet: call fit(store, partition) or FedHypeVAE.load(path)")
        return self.run_dir_

    # ------------------------------------------------------------------ synthesis
    def sample(self, per_class: int | str | None = None, *, n: int | None = None, code: str | None = None,
               seed: int | None = None, temperature: float | None = None, anchor: bool | None = None) -> EmbeddingStore:
        """Synthetic embeddings (post-processing of the DP model: no further privacy cost).

        Args:
            per_class: this many of each class, or ``"auto"`` (when ``n`` is not given either: the
                configuration's ``[synthesis] per_class``, ``"auto"`` by default = 300 from a DP model of
                latent 64, 3,000 from a larger one; :func:`fedhype.synthesis.auto_per_class`).
            n: this many in all, classes in proportion to the DP class counts.
            code: ``mixture`` (default: every client's model in proportion to its size), ``neutral``
                (the domain-neutral meta-code), ``client:<id>``, ``mix:<id>=<w>,…``
                (:mod:`fedhype.synthesis.codes`).
            seed: sampling seed (None: the configuration's ``[synthesis] seed``).
            temperature: scale of the prior's standard deviation (1: the model's distribution).
            anchor: put each code's class means back on the statistics release's (None: the configuration's
                ``[synthesis] anchor``; :mod:`fedhype.synthesis.anchor`).

        Returns:
            An EmbeddingStore of unit-norm float32 ``[N, D]`` embeddings with labels; its ``meta``
            carries ε, δ and the code.

        Raises:
            ValidationError: no model yet, a bad code or counts. ArtifactError: an unreadable model.
        """
        from fedhype.synthesis import synthesize

        s = self.config["synthesis"]
        if per_class is None and n is None:
            per_class = s["per_class"]
        return synthesize(self._model_dir(), s["code"] if code is None else code, per_class=per_class, n=n,
                          seed=s["seed"] if seed is None else seed,
                          temperature=s["temperature"] if temperature is None else temperature,
                          anchor=s.get("anchor", DEFAULTS["synthesis"]["anchor"]) if anchor is None else anchor)

    # ------------------------------------------------------------------ privacy
    def privacy_spent(self) -> PrivacySpent:
        """ε per client and worst, recomputed from the ledger's events (never read from a claim).

        Raises:
            ValidationError: no model yet. ArtifactError: a missing or tampered ledger.
        """
        from fedhype.federated.rundir import load_model
        from fedhype.privacy.accountant import REPORTED
        from fedhype.privacy.ledger import PrivacyLedger

        root = self._model_dir()
        _, _, meta = load_model(root)
        if not meta.get("private"):
            return PrivacySpent(None, float(meta.get("delta") or self.config["train"]["delta"]), {}, REPORTED, (), False)
        path = root / "ledger.json"
        if not path.is_file():
            raise ArtifactError(f"{path}: the run's privacy ledger is missing; ε cannot be recomputed")
        ledger = PrivacyLedger.load(path)
        eps = ledger.epsilons()
        mechanisms = tuple(dict.fromkeys(e.mechanism for e in ledger.events))
        seeded = meta.get("seed") is not None or any(e.seeded for e in ledger.events)
        return PrivacySpent(max(eps.values()) if eps else 0.0, ledger.delta, eps, REPORTED, mechanisms, True, seeded)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write the shareable part of the trained model to the new folder ``path`` (a release folder).

        Writes the DP model, its ledger, the run's public settings, ``privacy.json`` (ε recomputed
        from the ledger) and a README (:func:`fedhype.pipeline.release.write_release`) — never the
        client state, checkpoints or held-out diagnostics of the run directory. The folder appears
        complete or not at all (written beside it, then renamed).

        Raises:
            ValidationError: no model yet, or ``path`` exists.
        """
        from fedhype.pipeline.release import write_release

        return write_release(self._model_dir(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "FedHypeVAE":
        """A model saved by :meth:`save` (or a run directory), ready to :meth:`sample`.

        Its configuration is the one it was trained with (``config.json``); ``fit`` on it trains anew.

        Raises:
            ArtifactError: no fedhype model in ``path``.
        """
        from fedhype.federated.rundir import load_model
        from fedhype.io import read_json

        root = Path(path)
        load_model(root)  # validates the format
        self = cls.__new__(cls)
        conf_path = root / "config.json"
        saved = (read_json(conf_path, "run config") if conf_path.is_file() else {}).get("train") or {}
        self.config = copy.deepcopy(DEFAULTS)
        self.config["train"].update({k: v for k, v in saved.items() if k in DEFAULTS["train"]})
        self.train_config = None  # what it was trained with is in config.json; fit() validates anew
        self.out, self.run_dir_, self.result_ = root, root, None
        return self
