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
import math
import os
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedhype.data.partition import Partition, make_partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, FedhypeWarning, ValidationError, counted
from fedhype.eval.result import Evaluation
from fedhype.pipeline.config import _TRAIN_KEYS, DEFAULTS, resolve, train_config
from fedhype.pipeline.arguments import (MAX_SEED, check_store, check_whole, evaluate_store, in_api_words, is_number,
                                        is_whole, parse_fractions, same_value, shown)

#: the encoder's refusals name ``fedhype embed``'s flags; :func:`embed` says its own arguments
_EMBED_FLAGS = {"--image-size ": "image_size=", "--pooling ": "pooling ", "--dtype ": "dtype ", "--device ": "device "}


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
        limit: a stratified subset of this many images, a whole number ≥ 1 (None: all; as ``fedhype embed
            --limit``, which refuses 0 too). pooling: ``cls`` or ``mean``.
        device, dtype: ``auto`` picks CUDA / bfloat16 autocast where the machine has them.
        seed: seed of the ``limit`` subset (a whole number ≥ 0).

    Returns:
        An :class:`~fedhype.data.store.EmbeddingStore` (float32 ``[N, D]`` embeddings, labels, domains).

    Warns:
        FedhypeWarning: what ``fedhype embed`` prints as ``warning:`` lines — byte-identical image files (each
            copy is a record: an image stored k times is protected only as a group of k), copies under two
            classes, unreadable files (skipped), classes without a record, images far below the encoder's input.

    Raises:
        ValidationError: unknown dataset or encoder, a file or missing folder as ``source``, an unreadable
            folder, an ambiguous layout, a ``limit`` or ``image_size`` that is not a whole number ≥ 1.
    """
    from fedhype.data.datasets import BUILTIN_DATASETS
    from fedhype.data.layout import check_layout
    from fedhype.pipeline.job import embed_store

    names = ", ".join(BUILTIN_DATASETS)
    takes = (f"embed takes a folder of images (<folder>/<class>/..., or <folder>/<domain>/<class>/... with "
             f"layout='domain/class') or a bundled dataset name ({names})")
    if not isinstance(source, (str, os.PathLike)):
        raise ValidationError(f"embed: source must be a bundled dataset name or an image folder (a str or "
                              f"os.PathLike), got {shown(source)}; {takes}")
    if limit is not None:
        limit = check_whole("embed", "limit", limit, 1, what=" (a stratified subset of that many images) or None "
                             "for every image")
    if image_size is not None:
        image_size = check_whole("embed", "image_size", image_size, 1, what=" (the input side in pixels) or None "
                                  "for the encoder's own default")
    seed = check_whole("embed", "seed", seed, 0, what=" (the seed of the limit= subset)")
    check_layout(layout, "layout=")
    d = {**DEFAULTS["data"], "encoder": encoder, "image_size": image_size or 0, "limit": limit or 0,
         "pooling": pooling, "device": device, "dtype": dtype, "seed": seed, "cache_dir": str(cache_dir or ""),
         "layout": layout}
    folder = Path(source)
    if folder.is_dir():
        d.update(images=str(folder), dataset="")
    elif folder.exists():
        raise ValidationError(f"embed: {str(folder)!r} is a file, not a folder; {takes}")
    elif str(source) not in BUILTIN_DATASETS and (isinstance(source, os.PathLike) or "/" in str(source)
                                                  or os.sep in str(source)):
        raise ValidationError(f"embed: {str(folder)!r}: no such folder; {takes}")
    else:
        d.update(dataset=str(source), images="")
    said: list[str] = []
    try:
        store = embed_store(d, progress=progress, limit_name="limit=", warn=said.append)
    except ValidationError as exc:  # the encoder's checks speak of `fedhype embed`'s flags (a probe read --image-size)
        text = str(exc)
        for flag, word in _EMBED_FLAGS.items():
            if text.startswith(flag):
                raise ValidationError(f"embed: {word}{text[len(flag):]}") from None
        raise
    for text in said:
        warnings.warn(f"embed: {text}", FedhypeWarning, stacklevel=2)
    return store


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

    ``fractions`` is a sequence of three numbers, e.g. ``(0.6, 0.2, 0.2)``; the CLI's spelling ``"0.6,0.2,0.2"``
    (three comma-separated numbers) is read too. ``clients``: a whole number ≥ 1, or None (``domain``: one client
    per domain). ``seed``: a whole number ≥ 0.

    ``split`` is the old name of ``fractions`` (deprecated: a ``FutureWarning``; removed in the next release).

    Raises:
        ValidationError: ``store`` not an EmbeddingStore, unknown scheme, bad fractions, a count or seed that is not
            a whole number, a client below ``min_records``.
    """
    name = "fractions"
    if split is not None:
        import warnings

        warnings.warn("fedhype.partition(split=) is deprecated and will be removed in the next release; use fractions=",
                      FutureWarning, stacklevel=2)
        fractions, name = split, "split"
    store = check_store("partition", "store", store, "what fedhype.embed(...) returns")
    if not isinstance(scheme, str):
        raise ValidationError(f"partition: scheme must be one of 'domain', 'dirichlet', 'iid', got {shown(scheme)}")
    if clients is not None:
        clients = check_whole("partition", "clients", clients, 1, what=" or None (scheme 'domain': one client per "
                               "domain)")
    if not is_number(alpha):
        raise ValidationError(f"partition: alpha must be a positive number (the Dirichlet concentration), "
                              f"got {shown(alpha)}")
    fractions = parse_fractions(fractions, name)
    min_records = check_whole("partition", "min_records", min_records, 0, what=" (the smallest client training set)")
    seed = check_whole("partition", "seed", seed, 0)
    return make_partition(store, scheme=scheme, n_clients=clients, alpha=alpha, splits=fractions,
                          min_train_per_client=min_records, seed=seed)


def evaluate(real_test: EmbeddingStore | str | os.PathLike, synthetic: EmbeddingStore | str | os.PathLike, *,
             real_train: EmbeddingStore | str | os.PathLike | None = None,
             seed: int = DEFAULTS["evaluate"]["seed"], permutations: int = DEFAULTS["evaluate"]["permutations"],
             max_samples: int = DEFAULTS["evaluate"]["max_samples"], k: int = DEFAULTS["evaluate"]["k"]) -> Evaluation:
    """Fidelity (MMD², FD, PRDC) and utility (TSTR; TRTR with ``real_train``) of ``synthetic``.

    The held-out ``real_test`` must not have been used in training. Returns an
    :class:`~fedhype.eval.result.Evaluation` (``.tstr_accuracy``, ``.mmd2``, …, ``.to_dict()``);
    the metrics and their sources are those of :func:`fedhype.eval.evaluate`.

    Each store argument is an :class:`~fedhype.data.store.EmbeddingStore` or the path of a store file saved with
    ``.save(path)`` (read with :meth:`EmbeddingStore.load <fedhype.data.store.EmbeddingStore.load>`). ``real_test``
    and ``real_train`` must be real stores: one whose ``kind`` is ``"synthetic"`` is refused (the arguments swapped,
    a probe's ``evaluate(syn, test)`` was scored without a word); ``synthetic`` may be a real store (a
    real-vs-real reference).

    Warns:
        FedhypeWarning: ``real_test`` holds every record of the store as embedded (if the model trained on some,
            the figures overstate), or fewer than two classes (accuracy then says nothing of how classes are told
            apart); ``synthetic`` is not marked synthetic (a real-vs-real reference, as ``fedhype evaluate`` warns).

    Raises:
        ValidationError: an argument that is neither a store nor a store file's path, a synthetic store given as
            ``real_test`` or ``real_train``, stores of different dimension or class names, sets too small for a
            metric. ArtifactError: an unreadable store file; real data embedded with another encoder, pooling or
            preprocessing than the synthetic store's run (not comparable), or a partition's split that is not the
            run's.
    """
    from fedhype.eval.evaluate import evaluate as _evaluate

    real_test = evaluate_store("real_test", real_test, "the held-out real embeddings, e.g. "
                                "clients.split_store(store, 'test')")
    synthetic = evaluate_store("synthetic", synthetic, "the synthetic embeddings, e.g. gen.sample(...)")
    if real_train is not None:
        real_train = evaluate_store("real_train", real_train, "the real training embeddings, e.g. "
                                     "clients.split_store(store, 'train'), or None")
    if real_test.kind == "synthetic":
        if synthetic.kind == "real":
            raise ValidationError("evaluate: the arguments are swapped: real_test= is a synthetic store (kind "
                                  "'synthetic') and synthetic= a real one (kind 'real'); call evaluate(real_test, "
                                  "synthetic) with the held-out real embeddings first")
        raise ValidationError("evaluate: real_test= is a synthetic store (kind 'synthetic'); give the held-out real "
                              "embeddings first (e.g. clients.split_store(store, 'test')), then the synthetic ones")
    if real_train is not None and real_train.kind == "synthetic":
        raise ValidationError("evaluate: real_train= is a synthetic store (kind 'synthetic'); TRTR trains on real "
                              "embeddings: give the real training split (e.g. clients.split_store(store, 'train')) or "
                              "leave real_train out")
    seed = check_whole("evaluate", "seed", seed, 0)
    permutations = check_whole("evaluate", "permutations", permutations, 0, what=" (0: no MMD² permutation test)")
    max_samples = check_whole("evaluate", "max_samples", max_samples, 2)
    k = check_whole("evaluate", "k", k, 1, what=" (the neighbours of PRDC)")
    from fedhype.eval.inputs import (check_not_test_records, check_provenance, one_class_warning,
                                     shared_records_warning, whole_store_warning)

    # as `fedhype evaluate`: real data embedded otherwise than the run's is refused (a probe scored mean-pooled
    # records against a CLS run without a word), and what makes the figures say little is warned about
    check_provenance(real_test, synthetic, "evaluate: real_test=", "synthetic=")
    check_not_test_records(real_test, synthetic, "real_test=", "evaluate: synthetic=")
    if real_train is not None:
        check_provenance(real_train, synthetic, "evaluate: real_train=", "synthetic=")
    # as `fedhype evaluate` warns (a probe's evaluate(test, store) printed TSTR 0.996, above TRTR, without a word)
    real_as_synthetic = (f"synthetic= is marked kind={synthetic.kind!r}, not 'synthetic': its figures score real records "
                         "as if they were synthetic (a real-vs-real reference, not a synthetic store's quality)"
                         if synthetic.kind != "synthetic" else None)
    for note in (whole_store_warning(real_test, "real_test="), one_class_warning(real_test), real_as_synthetic,
                 shared_records_warning(real_test, real_train)):
        if note:
            warnings.warn(f"evaluate: {note}", FedhypeWarning, stacklevel=2)
    metrics = _evaluate(real_test, synthetic, real_train=real_train, n_permutations=permutations,
                        max_samples=max_samples, k=k, seed=seed)
    # the best constant guess, as the job's report gives it (a helper read chance 0.200 here and 0.264 there)
    import torch

    majority = float(torch.bincount(real_test.labels.long()).max()) / len(real_test) if len(real_test) else None
    return Evaluation.from_metrics(metrics, real_test.n_classes, chance=majority)


def _above_target_note(result: Any, cfg: Any) -> str | None:
    """The warning for a run whose accountant ε ended above its target (a release or round charged again after an
    interruption, fresh noise), as ``fedhype train`` says it; None otherwise."""
    from fedhype.privacy.plan import above_target

    eps = getattr(result, "epsilon", None) if not isinstance(result, dict) else result.get("epsilon")
    target = None if cfg.no_dp or cfg.noise_multiplier is not None else cfg.epsilon
    if eps is None or target is None or not above_target(eps, target):
        return None
    return (f"ε = {eps:.4g} is above the target {target:g}: a release or round that was interrupted was charged again "
            "on resume (its noise is fresh); ledger.json says which, and train.max_epsilon (max_epsilon=) refuses "
            "before spending instead")


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
        return (f"(ε = {self.epsilon:.3f}, δ = {self.delta:g})-DP per record, worst of {counted(len(self.per_client), 'client')} "
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
            (:data:`fedhype.federated.config.METHODS`); ``fedhypevae`` runs no round where the median client has
            fewer than ``train={"dp_sgd_min_records": ...}`` training records (the ``no-dp-sgd`` model; 0 always
            runs them: :meth:`fedhype.federated.config.TrainConfig.for_clients`, docs/method.md decision 22).
        secure_aggregation: pool the clients' releases by secure aggregation (the server sees only sums).
        seed: seed of the initialisation, sampling and noise (reproducible, not secure; None: OS entropy).
        out: the run directory ``fit`` writes. It holds private client state (to resume); share only
            what :meth:`save` writes. Default: a new temporary folder from which ``fit`` removes the
            client states, checkpoints and held-out diagnostics once training ends (the model, ledger,
            configuration and commit point stay, for sampling and audit); the folder itself is removed
            when this object is garbage-collected, when Python exits, or when a later ``fit`` succeeds (a
            failed or interrupted ``fit`` leaves the model it had): :meth:`save` what is to be kept, and
            ``FedHypeVAE.load`` a saved folder, not ``run_dir_``.
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
        for what, given in (("train", train), ("model", model)):
            if given is not None and not isinstance(given, Mapping):
                example = "{'local_epochs': 3}" if what == "train" else "{'latent': 32}"
                raise ValidationError(f"FedHypeVAE: {what}= must be a dict of [{what}] keys, got {shown(given)} "
                                      f"(e.g. {what}={example})")
        if out is not None and not isinstance(out, (str, os.PathLike)):
            raise ValidationError(f"FedHypeVAE: out= must be a folder path (a str or os.PathLike) or None (a temporary "
                                  f"folder), got {shown(out)}")
        if out is not None and not os.fspath(out).strip():  # Path("") is the working directory: not what was meant
            raise ValidationError("FedHypeVAE: out= is empty; give a folder for the run (e.g. out='run') or leave it "
                                  "out for a temporary folder")
        # a probe's FedHypeVAE(epsilon=1, train={"epsilon": 2}) trained at ε = 1 without a word
        for k, v in named.items():
            if v is not None and train is not None and k in train and not same_value(train[k], v):
                raise ValidationError(f"FedHypeVAE: {k}={v!r} and train={{{k!r}: {train[k]!r}}} both set train.{k}, "
                                      f"to different values; give it once")
        values = {f"train.{k}": v for k, v in (train or {}).items()}
        values.update({f"train.{k}": v for k, v in named.items() if v is not None})
        values.update({f"model.{k}": v for k, v in (model or {}).items()})
        self.config = resolve(values=values, where="FedHypeVAE:")
        self.train_config = train_config(self.config)  # validated now, not at fit time
        self.out = None if out is None else Path(out)
        self.run_dir_: Path | None = None
        self.result_: dict[str, Any] | None = None
        #: every finished private fit of this object: (partition key, δ, ε, {client: its ledger events}, run folder), kept in
        #: memory because a later fit removes a temporary run folder with its ledger (:meth:`_earlier_fits_note`)
        self._fits: list[tuple[str, float, float, dict[str, list], str]] = []

    def __repr__(self) -> str:
        t = self.config["train"]
        what = "no_dp" if t["no_dp"] else (f"epsilon={t['epsilon']}" if t["epsilon"] is not None
                                            else f"noise_multiplier={t['noise_multiplier']}")
        state = f", run_dir={str(self.run_dir_)!r}" if self.run_dir_ is not None else ""
        ran = (self.result_ or {}).get("method")
        if ran and ran != t["method"]:  # the stage rule (docs/method.md, decision 22)
            state += f", trained as {ran!r}: no DP-SGD round"
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
            ValidationError: ``store`` not an EmbeddingStore or ``partition`` not a Partition (or the two swapped),
                a client too small, δ ≥ 1/n, an existing run in ``out`` without ``resume``, ``resume`` without one.
            BudgetExceededError: the plan would exceed ``max_epsilon``.
        """
        from fedhype.federated.engine import train

        if isinstance(store, Partition) and isinstance(partition, EmbeddingStore):
            raise ValidationError("fit: the arguments are swapped: fit(store, partition) takes the EmbeddingStore "
                                  "first (what fedhype.embed(...) returns), then its Partition (what "
                                  "fedhype.partition(store) returns): fit(store, clients)")
        store = check_store("fit", "store", store, "what fedhype.embed(...) returns; the partition goes second: "
                             "fit(store, partition)")
        if not isinstance(partition, Partition):
            raise ValidationError(f"fit: partition must be a Partition (what fedhype.partition(store) returns, or "
                                  f"fedhype.data.partition.Partition.load(path) of a saved one), "
                                  f"got {shown(partition)}")
        if not isinstance(resume, bool):
            raise ValidationError(f"fit: resume must be True or False, got {shown(resume)}")
        self._check_out(resume)
        cfg = self.train_config if self.train_config is not None else train_config(self.config)
        # what `fedhype train` prints as warnings (a notebook user saw none: a probe)
        sizes = {c.name: len(c.train) for c in partition.clients}
        for advice in cfg.plan_warnings(sizes):
            warnings.warn(advice.replace("--batch-size ", "batch_size=").replace("--delta ", "delta="),
                          FedhypeWarning, stacklevel=2)
        off = cfg.stage_off_reason(sizes)
        if off:
            # what `fedhype train` prints (a probe: the API trained no-dp-sgd without a word)
            warnings.warn(f"fit: {off}", FedhypeWarning, stacklevel=2)
        if self._fits and not resume:
            # a helper's second fit() on the same records released them again; privacy_spent() then showed that fit's ε
            # alone, and nothing said the first one's still counts; its third fit was still told of one fit at 3.998
            warnings.warn(self._earlier_fits_note(partition), FedhypeWarning, stacklevel=2)
        temporary = None if self.out is not None else Path(tempfile.mkdtemp(prefix="fedhype-run-"))
        out = self.out if temporary is None else temporary / "run"
        try:
            result = train(store, partition, cfg, out, resume=resume, progress=progress, diagnostics=diagnostics)
        except BaseException as exc:
            if temporary is not None:  # a failed or interrupted fit leaves the model this object had (a probe's
                shutil.rmtree(temporary, ignore_errors=True)  # Ctrl-C in a second fit deleted the first's)
            text = str(exc)
            if type(exc) is not ValidationError or not text.startswith("--resume: "):
                raise  # the engine's words are the CLI's (--resume)
            raise ValidationError("fit(resume=True): " + text[len("--resume: "):]) from None
        self.result_, self.run_dir_ = result, Path(out)
        self._remember_fit(partition, Path(out))
        above = _above_target_note(result, cfg)
        if above:
            warnings.warn(above, FedhypeWarning, stacklevel=2)
        if temporary is not None:  # a temporary run cannot be resumed: drop what is private, keep the DP outputs
            for name in ("clients", "ckpt"):
                shutil.rmtree(out / name, ignore_errors=True)
            (out / "metrics.json").unlink(missing_ok=True)
            self._own_temporary(temporary)
        return self

    def _remember_fit(self, partition: Partition, run: Path) -> None:
        """Keep a finished private fit's ledger events per client (a resumed fit replaces the fit it continued)."""
        from fedhype.privacy.ledger import PrivacyLedger

        if not (self.result_ or {}).get("private") or not (run / "ledger.json").is_file():
            return
        ledger = PrivacyLedger.load(run / "ledger.json")
        by_client = {c: [e for e in ledger.events if e.client == c] for c in ledger.clients()}
        eps = max(ledger.epsilons().values(), default=0.0)
        entry = (partition.key or "", float(ledger.delta), float(eps), by_client, str(run))
        if self._fits and self._fits[-1][4] == str(run):  # fit(resume=True) of the same run folder
            self._fits[-1] = entry
        else:
            self._fits.append(entry)

    def _earlier_fits_note(self, partition: Partition) -> str:
        """What the earlier fits of this object spent, composed as they would be on the same records.

        Fits on the same partition (its key): per client, every fit's ledger events composed by the accountant
        (:func:`fedhype.privacy.site_ledger.composed`, PRV and RDP, at the largest δ of the fits), the worst client
        named. Fits on different partitions: a record's client in each is not known here, so the bound is basic
        composition (Dwork & Roth 2014, Theorem 3.16): the sum of the fits' ε at the sum of their δ.
        """
        from fedhype.privacy.site_ledger import composed

        fits = self._fits
        listed = ", ".join(f"{eps:.4g}" for _, _, eps, _, _ in fits)
        head = (f"fit: this object was already fitted {'once' if len(fits) == 1 else f'{len(fits)} times'} "
                f"(ε = {listed}; δ = {fits[-1][1]:g}); fitting again trains and releases anew, and on the same records "
                "the fits compose (sequential composition): ")
        keys = {key for key, *_ in fits}
        if len(fits) == 1:
            total = ""
        elif len(keys) == 1 and "" not in keys:
            delta = max(d for _, d, *_ in fits)
            clients = set().union(*(set(c) for *_, c, _ in fits))
            worst = max(composed([e for *_, c, _ in fits for e in c.get(k, [])], delta, seeded_infinite=False)
                        for k in clients)
            total = f"the records of these {len(fits)} fits (one partition) have spent ε = {worst:.4g} at δ = {delta:g} " \
                    "(their ledgers composed per client, worst client); "
        else:
            total = (f"on records shared by these {len(fits)} fits (different partitions) at most ε = "
                     f"{sum(e for _, _, e, _, _ in fits):.4g} at δ = {sum(d for _, d, *_ in fits):g} (basic composition); ")
        return (head + total + "this fit adds its own — privacy_spent() reports this fit alone (a site folder's ledger, "
                "`fedhype site` and `fedhype train --site`, composes every run on its records)")

    def _own_temporary(self, root: Path) -> None:
        """Make ``root`` (the temporary folder of a ``fit`` without ``out=`` that succeeded) this object's: removed when
        it is garbage-collected, at interpreter exit, or when a later ``fit`` succeeds (what :meth:`save` wrote
        elsewhere stays); the folder of the ``fit`` it replaces goes now."""
        if getattr(self, "_cleanup", None) is not None:
            self._cleanup()
        self._cleanup = weakref.finalize(self, shutil.rmtree, root, ignore_errors=True)

    def _check_out(self, resume: bool) -> None:
        """Refuse, in the API's words, an ``out`` folder that ``fit`` cannot use (the engine refuses the same, in the
        CLI's: ``--resume``, ``--out``; :func:`fedhype.federated.run_plan.committed_rounds`)."""
        if self.out is None:
            if resume:
                raise ValidationError("fit(resume=True): this FedHypeVAE has no out= folder, so there is no run to "
                                      "resume (a temporary run cannot be resumed); give the folder of the run to "
                                      "continue: FedHypeVAE(..., out='run').fit(store, partition, resume=True)")
            return
        root = self.out
        if root.exists() and not root.is_dir():
            raise ValidationError(f"fit: out= {str(root)!r} is a file; give FedHypeVAE a folder for the run (out=)")
        if (root / "privacy.json").is_file():  # FedHypeVAE.load(release).fit(...): the release is never trained into
            raise ValidationError(f"fit: out= {str(root)!r} is a release folder (it holds privacy.json): a release is "
                                  "shared as written and never trained into, so nothing was written to it; give "
                                  "FedHypeVAE a new out= folder, or resume the run folder it was released from")
        from fedhype.io import refuse_inside_release

        refuse_inside_release(root, "fit: out=")  # a helper's run folder (client state) was written into a release
        has_run = (root / "config.json").exists()
        if has_run and not resume:
            raise ValidationError(f"fit: the out= folder {str(root)!r} already holds a run; continue it with "
                                  "fit(store, partition, resume=True) (the same settings and partition), or give "
                                  "FedHypeVAE another out= folder")
        if resume and not has_run:
            raise ValidationError(f"fit(resume=True): the out= folder {str(root)!r} holds no run to resume (check "
                                  "out=); call fit without resume=True to start a new run")

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
            n: this many in all, split evenly between the classes (a remainder r adds one to r of them;
                ``fedhype synthesize --n N --label-weights …`` sets other shares).
            code: ``mixture`` (default: every client's model in proportion to its size), ``neutral``
                (the domain-neutral meta-code), ``client:<id>``, ``mix:<id>=<w>,…``
                (:mod:`fedhype.synthesis.codes`).
            seed: sampling seed, a whole number in [0, 2^63) (None: the configuration's ``[synthesis] seed``).
            temperature: scale of the prior's standard deviation (1: the model's distribution; > 0 and at most
                :data:`fedhype.synthesis.defaults.MAX_TEMPERATURE`, as ``fedhype synthesize --temperature``).
            anchor: put each code's class means back on the statistics release's (None: the configuration's
                ``[synthesis] anchor``; :mod:`fedhype.synthesis.anchor`).

        Returns:
            An EmbeddingStore of unit-norm float32 ``[N, D]`` embeddings with labels; its ``meta``
            carries ε, δ and the code.

        Raises:
            ValidationError: no model yet, a bad code, counts, seed, temperature or anchor. ArtifactError: an
                unreadable model.
        """
        from fedhype.synthesis import synthesize
        from fedhype.synthesis.defaults import MAX_TEMPERATURE

        if per_class is not None and n is not None:
            raise ValidationError(f"sample: give per_class= (samples of every class) or n= (a total, split between the "
                                  f"classes), not both; got per_class={shown(per_class)}, n={shown(n)}")
        if per_class is not None and per_class != "auto":
            per_class = check_whole("sample", "per_class", per_class, 1, what=" or \"auto\" (samples of every class)")
        if n is not None:
            n = check_whole("sample", "n", n, 1, what=" (the total number of synthetic embeddings)")
        if code is not None and not isinstance(code, str):
            raise ValidationError(f"sample: code must be a string (mixture, neutral, client:<id> or mix:<id>=<w>,...), "
                                  f"got {shown(code)}")
        if seed is not None and not (is_whole(seed) and 0 <= seed < MAX_SEED):
            raise ValidationError(f"sample: seed must be a whole number or None (the configuration's [synthesis] "
                                  f"seed), got {shown(seed)}; a seed is in [0, 2^63)")
        if temperature is not None and not (is_number(temperature) and math.isfinite(temperature)
                                            and 0 < temperature <= MAX_TEMPERATURE):
            raise ValidationError(f"sample: temperature must be a number > 0 and ≤ {MAX_TEMPERATURE:g}, got "
                                  f"{shown(temperature)}: it scales the prior's standard deviation (1 = the model's "
                                  "distribution, below 1 closer to the class means, above 1 more spread out); use e.g. "
                                  "temperature=1")
        if anchor is not None and not isinstance(anchor, bool):
            raise ValidationError(f"sample: anchor must be True or False (or None: the configuration's [synthesis] "
                                  f"anchor), got {shown(anchor)}")
        s = self.config["synthesis"]
        if per_class is None and n is None:
            per_class = s["per_class"]
        try:
            syn = synthesize(self._model_dir(), s["code"] if code is None else code, per_class=per_class, n=n,
                             seed=s["seed"] if seed is None else int(seed),
                             temperature=s["temperature"] if temperature is None else float(temperature),
                             anchor=s.get("anchor", DEFAULTS["synthesis"]["anchor"]) if anchor is None else anchor)
        except ValidationError as exc:  # synthesis words its refusals for `fedhype synthesize` (--n, --code)
            better = in_api_words(str(exc), n) if type(exc) is ValidationError else None
            if better is None:
                raise
            raise better from None
        for note in syn.meta.get("notes") or []:  # what `fedhype synthesize` prints (classes not told from absent, …)
            if note.get("kind") in ("absent", "empty", "few", "epsilon"):
                warnings.warn(note["text"], FedhypeWarning, stacklevel=2)
        return syn

    # ------------------------------------------------------------------ privacy
    def privacy_spent(self) -> PrivacySpent:
        """ε per client and worst, recomputed from the ledger's events (never read from a claim).

        Where the model's metadata says more was spent than the ledger beside it records (another run's ledger
        copied into the folder, or an older or edited one), the worst ε is the model's figure and a
        :class:`FedhypeWarning` says so — as ``fedhype synthesize`` stamps a store
        (:func:`fedhype.synthesis.spent.checked_epsilon`); ``fedhype audit --run`` tells which.

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
        worst = max(eps.values()) if eps else 0.0
        claimed = meta.get("epsilon")
        if claimed is not None and float(claimed) > worst * (1 + 1e-6) + 1e-12:
            # a helper copied another run's ledger.json into a release: ε ≈ 2 reported for an ε ≈ 8 model, silently
            from fedhype.synthesis.spent import checked_epsilon

            worst, _, note = checked_epsilon(root, meta)
            warnings.warn(f"privacy_spent: {note}", FedhypeWarning, stacklevel=2)
        return PrivacySpent(worst, ledger.delta, eps, REPORTED, mechanisms, True, seeded)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write the shareable part of the trained model to the new folder ``path`` (a release folder).

        Writes the DP model, its ledger, the run's public settings, ``privacy.json`` (ε recomputed
        from the ledger) and a README (:func:`fedhype.pipeline.release.write_release`) — never the
        client state, checkpoints or held-out diagnostics of the run directory. The folder appears
        complete or not at all (written beside it, then renamed).

        Raises:
            ValidationError: no model yet, ``path`` exists, or it is inside a release folder.
        """
        from fedhype.io import refuse_inside_release
        from fedhype.pipeline.release import write_release

        refuse_inside_release(path, "save:")
        return write_release(self._model_dir(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "FedHypeVAE":
        """A model saved by :meth:`save` (or a run directory), ready to :meth:`sample`.

        Its configuration is the one it was trained with (``config.json``: the ``train`` and ``model`` settings).
        ``fit(store, partition, resume=True)`` on a run directory continues the run there (an interrupted one);
        a plain ``fit`` is refused there (the folder holds a run), and on a release folder, which has no client state.

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
        # every train key a job lists, and the [model] settings (a helper's load of an interrupted run lost
        # model.latent = 32 and train.local_steps, and the resume that the refusal of a plain fit advised was then
        # refused as "a different configuration")
        self.config["train"].update({k: v for k, v in saved.items() if k in _TRAIN_KEYS})
        self.config["model"].update(saved.get("model") or {})
        self.train_config = None  # what it was trained with is in config.json; fit() validates anew
        self.out, self.run_dir_, self.result_ = root, root, None
        self._fits = []  # a loaded model's own run is not composed with this object's later fits (its partition is unknown)
        return self
