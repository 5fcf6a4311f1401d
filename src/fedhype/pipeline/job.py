"""``fedhype run``: every stage in order, each skipped when its artifact is already there.

Output directory::

    out/
      config.toml / config.json    the resolved job configuration
      embeddings.safetensors       real embeddings (a copy of the cached store)
      partition.json               clients → sample ids
      run/                         the training run (model, ledger, metrics, checkpoints)
      synthetic.safetensors        synthetic embeddings (DP by post-processing)
      evaluation.json              fidelity and utility against held-out real test embeddings
      dp_linear/                   [evaluate] dp_linear: the DP-SGD FedAvg linear classifier trained on
                                   the clients' real embeddings (model + its own ledger: a separate release)
      report.json, report.md       the summary; plots/*.png (for the data holder: computed on real records)
      release/                     what may be shared: model, ledger, config, synthetic store, privacy.json
                                   (:mod:`fedhype.pipeline.release`); everything else here stays private.
                                   A train.no_dp job's release is NOT private: nothing of it may leave the
                                   site as private data (its README, the report and the log say so)
      timings.json                 every run's stage seconds, an interrupted run's included (:class:`StageTimings`)
      .lock                        one `fedhype run` at a time in the folder (a second is refused, naming the pid)

Rerunning the same command after an interruption continues where it stopped: embeddings come
from the cache, the partition is reused, training resumes from its last committed round
(with a seed each step is charged once; without one the interrupted round is charged again, see
:mod:`fedhype.federated.engine`), later stages rerun.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

from fedhype.data.partition import Partition, make_partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, ValidationError, counted
from fedhype.io import atomic_write_json, atomic_write_text, read_json
from fedhype.pipeline.config import to_toml, train_config

Log = Callable[[str], None]
#: what the stages before training write (removed when a never-trained job's configuration is replaced)
_STAGE_FILES = ("embeddings.safetensors", "partition.json", "synthetic.safetensors", "evaluation.json", "report.json",
                "report.md")
#: the job sections read only after training: post-processing of the trained DP model (synthesis) and evaluation
#: against the site's own records; a job that trained may rerun with other values of them (nothing is charged)
LATER_SECTIONS = ("synthesis", "evaluate")
#: what those stages write: removed when their settings change (with the folder ``release/``), so no output of the
#: old settings is left beside the new configuration if the rerun stops before them
LATER_STAGE_FILES = ("synthetic.safetensors", "evaluation.json", "report.json", "report.md")


#: settings any rerun may change, however far the job got: a spending cap changes nothing trained or drawn (the
#: engine checks it against the ledger before each release and round), so a resume may add, raise or lower it; and
#: whether an unreadable image stops the embedding (data.strict: a store it made is the same either way, and a rerun
#: reuses the job's store without reading an image again)
FREE_SETTINGS = (("train", "max_epsilon"), ("data", "strict"))


def without_free_settings(conf: dict) -> dict:
    """``conf`` without :data:`FREE_SETTINGS` (a copy; the sections are copied where one is removed)."""
    out = dict(conf)
    for section, key in FREE_SETTINGS:
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def split_changes(old: dict, new: dict) -> tuple[list[str], list[str]]:
    """The differences (``"train.epsilon: 1.0 → 4"``) between two job configurations (both with their defaults
    spelled out: :func:`fedhype.pipeline.config.with_defaults_spelled_out`), split into those of the sections that
    made the trained model and its ε and those of :data:`LATER_SECTIONS`."""
    from fedhype.federated.engine import _differences

    trained = _differences(*({k: c.get(k) for k in set(old) | set(new) if k not in LATER_SECTIONS} for c in (old, new)))
    return trained, _differences(*({k: c.get(k) for k in LATER_SECTIONS} for c in (old, new)))


def later_changes(old: dict, new: dict) -> list[str]:
    """The settings (``"synthesis.per_class: 'auto' → 50"``) that differ between two job configurations when only
    :data:`LATER_SECTIONS` differ (:func:`split_changes`); ``[]`` when any other section differs too (or none
    does): those settings made the trained model and its ε, so a job that trained resumes only with them unchanged."""
    trained, later = split_changes(old, new)
    return [] if trained else later


def _embed(conf: dict, out: Path, log: Log, reuse: bool) -> EmbeddingStore:
    """The job's real store: the folder's copy when ``reuse``, else embedded (or read from the cache); not written here."""
    path = out / "embeddings.safetensors"
    d = conf["data"]
    if reuse and path.exists():
        store = EmbeddingStore.load(path)
        if d["images"]:
            _check_same_images(d, store, path, started=(out / "run" / "config.json").exists())
        elif d.get("store"):
            _check_same_store(d, store, path)
        log(f"embed: reusing {path} ({len(store)} × {store.dim})")
        return store
    store, note = _embed_store(d, progress=True, warn=lambda text: log(f"embed: warning: {text}"))
    pre = store.meta.get("preprocess") or {}
    log(f"embed: {len(store)} images → {store.dim}-d ({store.meta.get('encoder')}, {pre.get('crop', '?')} px){note}")
    src = store.meta.get("source") or {}
    if d["images"]:
        log(f"embed: {d['images']} read as layout {src.get('layout')!r}" + (" (detected)" if src.get("layout_asked") == "auto"
                                                                            else "")
            + (f"; its split folders give {src.get('split_counts')}" if src.get("splits") else ""))
    return store


def _check_same_store(d: dict, store: EmbeddingStore, path: Path) -> None:
    """Refuse to go on with a job whose ``data.store`` file now holds other records than the copy the job made of it
    (a helper replaced the store and reran: the job used its old copy without a word, while a changed image folder
    is refused). A store that is gone is not an error: the job's copy is what it trained on.

    Raises:
        ValidationError: naming both files — the job's training and ε belong to the old records: use another --out.
    """
    given = Path(d["store"])
    if not given.is_file():
        return
    if EmbeddingStore.load(given).digest() != store.digest():
        raise ValidationError(f"data.store = {str(given)!r} now holds other records than the job embedded from it "
                              f"({path}, its copy): the job's partition, training and ε belong to those; use another "
                              "--out for the new store, or put the old one back to go on")


def _check_same_images(d: dict, store: EmbeddingStore, path: Path, *, started: bool) -> None:
    """Refuse to resume a job whose image folder no longer holds the files it embedded.

    The folder is scanned and hashed again (:func:`fedhype.encoders.cache.image_files_key`) and compared
    with the key recorded in the job's ``embeddings.safetensors``.

    Raises:
        ValidationError: the files (or their bytes, classes, splits) differ — the job's training and
            ε belong to the old files, so it cannot go on with new ones: use another ``--out``.
    """
    from fedhype.data.images import scan_image_folder
    from fedhype.encoders.cache import image_files_key

    old = store.meta.get("cache_key")
    if not isinstance(old, dict) or old.get("kind") != "image-folder":
        return  # embedded with --no-cache: no content key to compare
    source = scan_image_folder(d["images"], layout=d.get("layout", "auto"), limit=d["limit"] or None, seed=d["seed"])
    now = image_files_key(source)
    if now["files"] != old.get("files") or now["skipped"] != old.get("skipped"):
        what = f"{old.get('n_files')} → {now['n_files']} images" if now["n_files"] != old.get("n_files") else \
            "the same number of images, other content"
        raise ValidationError(
            f"data.images = {d['images']!r} changed since this job embedded it into {path} ({what})"
            + ("; its training and ε belong to the old files: use another --out for the new ones" if started else
               "; use another --out (or delete the folder: nothing was trained in it yet)"))


def embed_store(d: dict, *, progress: bool = True, warn: Log | None = None,
                limit_name: str = "data.limit") -> EmbeddingStore:
    """The real store of a ``[data]`` section ``d``: an existing store (``store``, from ``fedhype embed``),
    an image folder (``images``, read as ``layout``) or a bundled ``dataset``, both read from (or added to)
    the embedding cache (:mod:`fedhype.encoders.cache`; an image folder by the content of its files).

    ``image_size`` 0 means the encoder's own default input size — the size ``fedhype embed`` uses
    without ``--image-size`` — so one encoder name gives the same embeddings in both commands; the
    size used is in the store's ``meta["preprocess"]``.

    ``warn`` is called with each warning about the embedded images or the store (byte-identical copies, copies
    under two classes, unreadable files, classes without a record, tiny images: :mod:`fedhype.encoders.checks`),
    whose texts name the subset size as ``limit_name``; an existing ``store`` gets none.

    Raises:
        ValidationError: ``store`` is missing or not a real embeddings store; an ambiguous image
            folder layout. ArtifactError: a corrupt store.
    """
    return _embed_store(d, progress=progress, warn=warn, limit_name=limit_name)[0]


def _embed_store(d: dict, *, progress: bool, warn=None, limit_name: str = "data.limit") -> tuple[EmbeddingStore, str]:
    """:func:`embed_store` and a note for the log (``" (from the embedding cache)"`` or ``""``)."""
    from fedhype.encoders.cache import cached_embed, cached_embed_images
    from fedhype.encoders.checks import store_warnings

    if d.get("store"):
        path = Path(d["store"])
        if path.is_dir():  # `fedhype site --store` said so, the job said "no such file" (a probe)
            raise ValidationError(f"data.store = {str(path)!r} is a folder, not a file: give the store file "
                                  "(`fedhype embed --out FILE.safetensors` writes one)")
        if not path.is_file():
            raise ValidationError(f"data.store = {str(path)!r}: no such file (make one with `fedhype embed --out ...`)")
        store = EmbeddingStore.load(path)
        if store.kind != "real":
            raise ArtifactError(f"data.store = {str(path)!r} is a {store.kind!r} store; the job trains on real "
                                "embeddings (from `fedhype embed`)")
        _check_store_settings(d, store, path)
        return store, ""
    if d["images"]:
        store, hit = cached_embed_images(d["images"], d["encoder"], layout=d.get("layout", "auto"),
                                         limit=d["limit"] or None, seed=d["seed"], image_size=d["image_size"] or None,
                                         cache_dir=d["cache_dir"] or None, pooling=d["pooling"], device=d["device"],
                                         dtype=d.get("dtype", "auto"), progress=progress, warn=warn,
                                         strict=bool(d.get("strict", False)))
        note = " (the same files' embeddings, from the embedding cache)" if hit else ""
    else:
        store, note = cached_embed(d["dataset"], d["encoder"], limit=d["limit"] or None, seed=d["seed"],
                                   image_size=d["image_size"] or None, cache_dir=d["cache_dir"] or None,
                                   pooling=d["pooling"], device=d["device"], dtype=d.get("dtype", "auto"),
                                   progress=progress), ""
    if warn is not None:
        for text in store_warnings(store, where="the store", limit=d["limit"] or None, limit_name=limit_name,
                                   images=bool(d["images"]), skipped=True):
            warn(text)
    return store, note


def _check_store_settings(d: dict, store: EmbeddingStore, path: Path) -> None:
    """Refuse ``[data]`` embedding settings that a given store (``data.store``) contradicts.

    A store is used as it was embedded: ``data.limit`` would subset images that are not read, and an
    encoder, input size or pooling other than the store's would be recorded in config.toml as if it had
    been used. Defaults (``limit = 0``, ``image_size = 0``, the default encoder and pooling) mean "the store's".

    Raises:
        ValidationError: naming each contradicting ``data.*`` key, its value and the store's.
    """
    from fedhype.pipeline.config import DEFAULTS

    meta, base = store.meta, DEFAULTS["data"]
    crop = (meta.get("preprocess") or {}).get("crop")
    bad = []
    if d["limit"]:
        bad.append(f"data.limit = {d['limit']} (the store is used whole: {len(store)} records; subset images before "
                   "`fedhype embed`)")
    if d["image_size"] and crop is not None and int(d["image_size"]) != int(crop):
        bad.append(f"data.image_size = {d['image_size']} (the store was embedded at {crop} px)")
    for key, have in (("encoder", meta.get("encoder")), ("pooling", meta.get("pooling"))):
        if d[key] != base[key] and have is not None and d[key] != have:
            bad.append(f"data.{key} = {d[key]!r} (the store's is {have!r})")
    if d.get("layout", base.get("layout")) != base.get("layout"):  # how an image folder is read: none is (a probe)
        bad.append(f"data.layout = {d['layout']!r} (it says how data.images is read; a store has its domains)")
    if bad:
        raise ValidationError(f"data.store = {str(path)!r} is used as it was embedded, but " + "; ".join(bad)
                              + ": drop these keys, or embed again with `fedhype embed` and these settings")


#: fewer training records of a class than this over all clients gets a warning before training (:func:`thin_classes`)
THIN_CLASS = 10


def thin_classes(part: Partition, store: EmbeddingStore, minimum: int = THIN_CLASS) -> str | None:
    """A warning naming the classes with fewer than ``minimum`` training records over all clients, or None.

    A class of one image trained without a word and scored TSTR 0.250 against chance 0.200 (a new user's probe):
    its DP class mean and covariance are then mostly noise (the count floor of
    :func:`fedhype.federated.class_stats.aggregate_class_stats` shrinks the mean toward the global one). Computed on
    the private partition, for the data holder's log only (nothing here is released)."""
    import torch

    counts = torch.bincount(part.split_store(store, "train").labels.long(), minlength=store.n_classes).tolist()
    thin = [f"{store.class_names[k]!r} ({n})" for k, n in enumerate(counts) if n < minimum]
    if not thin:
        return None
    return (f"class(es) {', '.join(thin[:8])}{' …' if len(thin) > 8 else ''} have fewer than {minimum} training records "
            "over all clients: their DP statistics are mostly noise and their synthetic embeddings will be poor; add "
            "images of them or leave them out")


def _check_evaluation(conf: dict, part: Partition, store: EmbeddingStore, *, started: bool = False) -> None:
    """Refuse, before training, a job whose data its evaluation cannot score.

    The classifiers of the evaluation (TSTR, TRTR, the hyper-prototypes) need training records of at
    least two classes; PRDC's k-nearest-neighbour radii need more than ``evaluate.k`` real test records
    and MMD² at least 2 (:func:`fedhype.eval.evaluate`). The job would otherwise spend its ε and fail
    afterwards, on every rerun.

    Raises:
        ValidationError: naming the classes, or ``evaluate.k`` and the test split's size, an ``evaluate.*`` or
            ``synthesis.*`` value out of range, or a ``synthesis.code`` that names no client of the partition, and
            what to change.
    """
    import math

    from fedhype.synthesis.codes import parse_code_spec

    e, syn = conf["evaluate"], conf["synthesis"]
    # a resumed job's earlier rounds were trained and charged: "nothing was trained" was wrong there (a probe)
    done = "this run trained nothing" if started else "nothing was trained"
    for key, low in (("k", 1), ("max_samples", 2), ("permutations", 0)):
        v = e[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValidationError(f"evaluate.{key} must be an integer ≥ {low}, got {v!r}; {done}")
    from fedhype.models.config import whole_setting

    for section, values in (("synthesis", syn), ("evaluate", e)):  # synthesis.seed = 1e30 crashed after the release
        try:
            whole_setting(f"{section}.seed", values["seed"], 0, below=2 ** 63, example=0, what=" and below 2^63")
        except ValidationError as exc:
            raise ValidationError(f"{exc}; {done}") from None
    n_syn = None if syn["per_class"] == "auto" else syn["per_class"] * store.n_classes
    if n_syn is not None and n_syn > MAX_JOB_SYNTHETIC:  # 1e9 per class filled the memory after the release
        raise ValidationError(f"synthesis.per_class = {syn['per_class']:,} asks for {n_syn:,} synthetic embeddings over "
                              f"{store.n_classes} classes ({n_syn * store.dim * 4 / 2 ** 30:,.1f} GiB as float32); a job "
                              f"draws and evaluates at most {MAX_JOB_SYNTHETIC:,}: give a smaller synthesis.per_class "
                              f"(`fedhype synthesize --per-class` draws more from the trained model); {done}")
    temp = syn["temperature"]
    from fedhype.synthesis.defaults import MAX_TEMPERATURE

    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not math.isfinite(temp) or not 0 < temp <= MAX_TEMPERATURE:
        raise ValidationError(f"synthesis.temperature must be a finite number > 0 and ≤ {MAX_TEMPERATURE:g} (1 = the "
                              f"model's distribution), got {temp!r}; {done}")
    code = str(syn["code"])
    if code.strip() not in ("neutral", "mixture"):  # a client or a weighted mix: its clients must exist
        try:
            parse_code_spec(code, [str(c.id) for c in part.clients], [str(c.name) for c in part.clients])
        except ValidationError as exc:
            raise ValidationError(f"synthesis.code: {exc}; {done}") from None
    missing = set(_classes_without_training_records(store, part))
    present = [name for name in store.class_names if name not in missing]
    if len(present) < 2:
        held = ", ".join(repr(name) for name in present) or "none"
        raise ValidationError(
            f"the job's training records hold {len(present)} class(es) ({held}); its evaluation trains classifiers "
            "(TSTR, hyper-prototypes), which need at least two: give images of two or more classes (one folder per "
            f"class), or train a one-class generator with `fedhype train` alone; {done}")
    n_test = sum(len(c.test) for c in part.clients)
    k = int(conf["evaluate"]["k"])
    if n_test <= max(k, 1):
        raise ValidationError(
            f"the partition leaves {n_test} real test record(s) over {len(part.clients)} client(s); the evaluation needs "
            f"more than evaluate.k = {k} (PRDC's nearest neighbours) and at least 2 (MMD²): give more images, a larger "
            f"test share (partition.fractions) or a smaller evaluate.k; {done}")


def _partition(conf: dict, store: EmbeddingStore, out: Path, log: Log, reuse: bool) -> Partition:
    """The job's partition: the folder's when ``reuse`` (checked against ``store``), else made; not written here."""
    path = out / "partition.json"
    if reuse and path.exists():
        part = Partition.load(path)
        part.check_store(store)
        return part
    p = conf["partition"]
    part = make_partition(store, scheme=p["scheme"], n_clients=p["clients"] or None, alpha=p["alpha"],
                          splits=tuple(p["fractions"]), min_train_per_client=p["min_records"], seed=p["seed"])
    if part.params.get("given_splits"):
        from fedhype.data.partition import given_splits_line

        log(given_splits_line(part.params["given_splits"], "partition.fractions applies only to the splits drawn"))
    log(f"partition: {counted(len(part.clients), 'client')} ({p['scheme']}): " +
        ", ".join(f"{c.name}={len(c.train)}" for c in part.clients))
    missing = _classes_without_training_records(store, part)
    if missing:
        log(f"partition: warning: no client has a training record of class(es) {missing}; their synthetic "
            "embeddings come from the DP noise alone (add training images of them, or drop them)")
    return part


def _classes_without_training_records(store: EmbeddingStore, part: Partition) -> list[str]:
    """Names of the classes that no client's training split holds (e.g. a class only under test/)."""
    train = part.split_store(store, "train")
    present = set(int(v) for v in train.labels.tolist())
    return [name for k, name in enumerate(store.class_names) if k not in present]


#: the most synthetic embeddings (synthesis.per_class × classes) a ``fedhype run`` job draws and evaluates
MAX_JOB_SYNTHETIC = 1_000_000


def _check_release_epsilon(tcfg) -> None:
    """Refuse a target ε whose statistics release no noise multiplier can meet, before any work: the release is one
    un-subsampled Gaussian step, so its σ₀ needs no record count (:func:`fedhype.privacy.plan.release_noise_multiplier`,
    with the smallest share of ε the plan may give it; the rest of the plan is checked once the sizes are known).

    Raises:
        ValidationError: naming train.epsilon and train.delta (nothing was done).
    """
    if tcfg.no_dp or tcfg.epsilon is None or tcfg.noise_multiplier is not None \
            or tcfg.class_stats_noise_multiplier is not None or not tcfg.model_config(1, 2).class_bias:
        return  # (model.class_bias = false releases no statistics: the plan's own check speaks for it)
    from fedhype.privacy.plan import release_noise_multiplier

    try:
        release_noise_multiplier(min(1.0, float(tcfg.class_stats_share)), tcfg.delta, [], target_epsilon=tcfg.epsilon)
    except ValidationError as exc:
        text = str(exc)
        for flag, key in (("--epsilon", "train.epsilon"), ("--delta", "train.delta")):
            text = text.replace(flag, key)
        raise ValidationError(text + " (nothing was done)") from None


def _check_synthesis_code(conf: dict) -> None:
    from fedhype.federated.baselines import is_local

    code = str(conf["synthesis"]["code"]).strip()
    if is_local(conf["train"]["method"]) and (code == "neutral" or code.startswith("mix:")):
        raise ValidationError(f"synthesis.code = {code!r} is not meaningful for train.method = \"local-cvae\" (each "
                              "client trains its own model: there is no shared code space); set synthesis.code = "
                              "\"mixture\" (all clients in proportion to their public sizes) or "
                              "\"mixture:<client>=<w>,...\"")


def dp_linear_config(conf: dict, generator_epsilon: float | None = None, folder: Path | None = None):
    """The DP linear reference's settings: the job's ``[train]`` privacy settings and seed, module defaults otherwise.

    The reference is compared with the generator at the same ε. A job that targets ``train.epsilon`` gives it that
    target. A job that sets ``train.noise_multiplier`` instead has no target: its generator's ε is what the accountant
    composes for the steps it ran, and the same σ over the reference's own plan gave a quite different ε (a helper's
    σ = 1: 3.8 for the generator, 11.5 for the reference). There the reference is calibrated to
    ``generator_epsilon`` (the generator's ledger ε, 4 significant digits) when it is given and finite. A reference
    an older version already trained in ``folder`` at the job's σ keeps that setting (it is reused, not trained and
    charged again).
    """
    from fedhype.prototypes.dp_linear import DPLinearConfig

    t = conf["train"]
    cfg = DPLinearConfig(epsilon=t["epsilon"], delta=t["delta"], noise_multiplier=t["noise_multiplier"],
                         no_dp=bool(t["no_dp"]), max_epsilon=t["max_epsilon"], seed=t["seed"])
    if cfg.no_dp or cfg.noise_multiplier is None or generator_epsilon is None \
            or not math.isfinite(generator_epsilon) or generator_epsilon <= 0:
        return cfg
    if folder is not None and (Path(folder) / "model.safetensors").exists():
        from fedhype.prototypes.dp_linear_model import DPLinearModel

        kept = {k: v for k, v in DPLinearModel.load(folder).config.items() if k != "max_epsilon"}
        if kept.get("noise_multiplier") == cfg.noise_multiplier and kept.get("epsilon") is None:
            return cfg  # trained at the job's σ by an older version: reused as it is
    return dataclasses.replace(cfg, epsilon=float(f"{generator_epsilon:.4g}"), noise_multiplier=None)


def release_resume_note(stage: str, seeded: bool) -> str:
    """What a resume does about the statistics release (:meth:`fedhype.federated.rundir.RunDir.release_stage`)."""
    if stage in ("committed", "saved"):
        note = "the class statistics were released before; their saved outputs are reused and not charged again"
    elif stage == "centre saved":  # a Flower node killed during the statistics step
        note = ("the statistics release was interrupted between its centre and its statistics step: the released "
                "centre is reused (not charged again) and the statistics step runs again")
    elif stage == "centre partly saved":  # a Flower node killed during the centre step, the others answered
        note = ("the statistics release was interrupted during its centre step after some clients' centres arrived: "
                "those are reused (not charged again), the centre step runs again for the missing clients only, then "
                "the statistics step")
    elif stage == "statistics partly saved":  # a Flower node killed during the statistics step, the others answered
        note = ("the statistics release was interrupted during its statistics step after some clients' updates "
                "arrived: those (and a centred release's centre) are reused (not charged again) and the statistics step "
                "runs again for the missing clients only")
    elif stage == "interrupted":  # a probe read "did not complete" while the charge stood in the ledger
        note = "the statistics release was interrupted after it was charged (write-ahead) and before its outputs were saved: it runs again"
    else:
        note = "the statistics release has not started"
    return note + ("; with train.seed the same noise is replayed and nothing is charged twice" if seeded else
                   "; a release or round that was interrupted is charged again (its noise is fresh), so the run can end "
                   "above its target ε: train.max_epsilon (--max-epsilon) refuses before spending instead")


def run_job(conf: dict, out: str | Path, *, log: Log = print, on_round: Callable[[dict], None] | None = None,
            quiet: float = 3.0) -> dict[str, Any]:
    """Run (or resume) the whole job into ``out``; returns the report dict.

    A job that trained reruns with other ``[synthesis]`` / ``[evaluate]`` values (:func:`later_changes`): the
    trained model is kept and charged nothing again, the stages after training run with the new values.

    Every stage announces itself through ``log``, and while one runs a line comes at least every
    ``quiet`` seconds (:class:`~fedhype.pipeline.progress.Heartbeat`): a piped log never stays silent.

    Raises:
        ValidationError: a different ``[data]``, ``[partition]``, ``[train]`` or ``[model]`` configuration already
            in ``out`` once training started; bad settings.
        BudgetExceededError: the training plan would exceed ``train.max_epsilon``.
    """
    from fedhype.pipeline.progress import Heartbeat

    with Heartbeat(log, quiet) as beat:
        def rounds(m: dict) -> None:
            beat.touch()
            if on_round is not None:
                on_round(m)
            beat.touch()

        return _run_job(conf, out, beat, rounds)


#: every run of ``fedhype run`` into a job folder, its stages' seconds (private: it stays in the job folder)
TIMINGS_FILE = "timings.json"


#: why an earlier run stopped when it left no record of it: it was still running a stage when the next run started
KILLED = "killed (SIGKILL, out of memory or power loss: no time recorded for that stage)"


class StageTimings(dict):
    """This run's stage timings (``{"embed_s": seconds, …}``), kept with those of the earlier runs into the folder.

    Each stage's time is written to ``path`` (atomic JSON: ``{"runs": [{"started", "stages"[, "interrupted",
    "stopped_by"]}, …]}``) when it ends, so a job that was interrupted and resumed reports the earlier runs' stages
    beside this one's (:attr:`earlier`, :attr:`earlier_runs`) instead of replacing them (a probe: a resumed job's
    report showed only the resume's seconds). A run that stops (Ctrl-C, SIGTERM, an error) records the stage it
    was in, with its seconds up to then, as ``"interrupted"`` (:meth:`stopped`) before the exception goes on.

    Nothing is written until the folder holds the job (``attached``: a rerun into the job's own folder, or
    :meth:`attach` once the job wrote its configuration): a job refused before it wrote anything leaves its
    folder, an older job's timings included, as it was. ``fresh``: a folder whose job never trained and whose
    settings changed starts a new history.
    """

    def __init__(self, path: Path, fresh: bool = False, attached: bool = True):
        super().__init__()
        self.path = Path(path)
        runs: list = []
        if not fresh and self.path.exists():
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
                runs = [r for r in raw.get("runs", []) if isinstance(r, dict) and isinstance(r.get("stages"), dict)]
            except (OSError, ValueError, AttributeError):
                runs = []  # a damaged history is only a loss of earlier timings
        for r in runs:  # a run still "running" a stage when the next one starts was killed (a probe's kill -9 run
            # was listed as an ordinary run): no handler ran, so the stage it was in has no time
            stage = r.pop("running", None)
            if stage and not r.get("stopped_by"):
                r["interrupted"], r["stopped_by"] = stage, KILLED
        self.earlier = [dict(r["stages"]) for r in runs]
        #: the earlier runs' records: ``{"started", "stages"[, "interrupted": stage key, "stopped_by"]}``
        self.earlier_runs = [dict(r) for r in runs]
        self._runs = runs + [{"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "stages": {}}]
        self._attached = attached
        self._stage: tuple[str, float] | None = None

    def __setitem__(self, key: str, seconds: float) -> None:
        super().__setitem__(key, seconds)
        self._runs[-1]["stages"][key] = float(seconds)
        self._flush()

    def begin(self, key: str) -> None:
        """Stage ``key`` (``"train_s"``) starts now: :meth:`end` records its seconds, :meth:`stopped` those so far.
        The file records the stage as running, so a run killed in it (SIGKILL: no handler runs) is listed as such."""
        self._stage = (key, time.perf_counter())
        self._runs[-1]["running"] = key
        self._flush()

    def end(self) -> float:
        """Record the seconds of the stage :meth:`begin` started; returns them."""
        key, t0 = self._stage  # type: ignore[misc]
        self._stage = None
        self._runs[-1].pop("running", None)
        self[key] = seconds = time.perf_counter() - t0
        return seconds

    def finish(self) -> None:
        """The run completed: no stage is running (the report and release stages are timed only if stopped)."""
        self._stage = None
        self._runs[-1].pop("running", None)
        self._flush()

    def attach(self) -> None:
        """The folder now holds this job: write what was timed so far, and every stage from here on."""
        self._attached = True
        self._flush()

    def stopped(self, exc: BaseException) -> None:
        """The run stops with ``exc`` (KeyboardInterrupt: Ctrl-C or SIGTERM): record the stage it was in, its
        seconds up to now and why (``"interrupted"``, ``"stopped_by"``). Never raises: the caller re-raises ``exc``."""
        try:
            run = self._runs[-1]
            run.pop("running", None)
            if self._stage is not None:
                key, t0 = self._stage
                self._stage = None
                seconds = time.perf_counter() - t0
                super().__setitem__(key, seconds)
                run["stages"][key] = float(seconds)
                run["interrupted"] = key
            from fedhype.errors import ValidationError

            run["stopped_by"] = ("Ctrl-C or SIGTERM" if isinstance(exc, KeyboardInterrupt)
                                 else f"refused ({type(exc).__name__})" if isinstance(exc, ValidationError)
                                 else f"error {type(exc).__name__}")
            self._flush()
        except Exception:  # noqa: BLE001 - a lost timing must not hide why the run stopped
            pass

    def _flush(self) -> None:
        if self._attached and self.path.parent.is_dir():  # a job refused before it wrote anything leaves no folder
            atomic_write_json(self.path, {"runs": self._runs})


def check_out_writable(out: Path) -> None:
    """Refuse a job folder ``out`` that cannot be written, before any work (:func:`fedhype.io.check_writable_folder`:
    the words of the other commands' ``--out`` check); an ``--out`` that is a file is left to the CLI's check.

    Raises:
        ValidationError: naming ``out`` and the folder that cannot be written (nothing was done).
    """
    from fedhype.io import check_writable_folder

    check_writable_folder(out)


#: the [data] keys that name a file or folder: a job records them as absolute paths
PATH_KEYS = ("images", "store")


def absolute_paths(conf: dict) -> dict:
    """``conf``'s ``data.images`` and ``data.store`` made absolute (``~`` expanded, symlinks resolved), in place: a
    helper's rerun of a job from another folder, or with ``../data`` for ``data``, was refused as "a different
    configuration (data.images: 'data' → '/tmp/…/data')" — the same folder. Returns ``conf``."""
    d = conf.get("data")
    if isinstance(d, dict):
        for key in PATH_KEYS:
            if isinstance(d.get(key), str) and d[key].strip():
                d[key] = str(Path(d[key]).expanduser().resolve())
    return conf


def _run_job(conf: dict, out: str | Path, log, on_round: Callable[[dict], None]) -> dict[str, Any]:
    from fedhype.pipeline.config import check_data, check_partition, upgrade_keys, with_defaults_spelled_out

    tcfg = train_config(conf)  # validate every training setting before anything is written
    _check_release_epsilon(tcfg)  # an ε no σ can calibrate, before the embedding (a probe waited 10 min for it)
    check_data(conf)  # and the [data] section: encoder name, folder, pooling, device, dtype
    check_partition(conf)  # and [partition], which was refused only after the embedding (a new user's probe)
    _check_synthesis_code(conf)
    absolute_paths(conf)
    out = Path(out)
    check_out_writable(out)  # a read-only --out failed at train, after the embedding and the partition (a probe)
    with _job_lock(out):  # a second `fedhype run` into a live job's folder marked the first one killed (a review)
        return _locked_job(conf, out, log, on_round, tcfg)


@contextlib.contextmanager
def _job_lock(out: Path):
    """One ``fedhype run`` at a time in a job folder: ``<out>/.lock`` (:func:`fedhype.io.exclusive_lock`). A job
    that wrote no configuration leaves no lock file behind, and the folders made for it (``out`` and missing parents)
    are removed again where it wrote nothing into them.

    Raises:
        ValidationError: another process runs a job there (its pid named).
    """
    from fedhype.io import exclusive_lock

    made = []  # out and its missing parents, innermost first: removed again where left empty
    for p in (out, *out.parents):
        if p.exists():
            break
        made.append(p)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ".lock"
    new_lock = not path.exists()
    with exclusive_lock(path, f"job folder {out} is being run by another process (pid {{pid}}); wait for it to "
                              "finish, or stop it, and run the command again (nothing was done)"):
        try:
            yield
        finally:  # while the lock is held; a failed cleanup must not hide why the job stopped
            with contextlib.suppress(OSError):
                if new_lock and not (out / "config.json").exists():
                    path.unlink(missing_ok=True)  # a refused job leaves the folder as it found it
                for p in made:
                    if any(p.iterdir()):
                        break
                    p.rmdir()


def _keep_edited_toml(out: Path, old_conf: dict, log) -> None:
    """A job folder's ``config.toml`` edited by hand is kept as ``config.edited.toml`` (and said so) before the run
    writes its settings there again: a job's settings come from ``--config`` and ``--set`` (its ``config.json`` holds
    them), and a helper's edit of train.epsilon there was ignored and then overwritten without a word."""
    import tomllib

    from fedhype.pipeline.config import to_toml, upgrade_keys, with_defaults_spelled_out

    path = out / "config.toml"
    if not path.is_file():
        return
    try:
        text = path.read_text(encoding="utf-8")
        edited = with_defaults_spelled_out(absolute_paths(upgrade_keys(tomllib.loads(text))))
        # the file as this version writes it (:func:`to_toml`: no null, no data.dataset beside data.images/store — a
        # helper's every rerun of a job on its own images was told the file was edited), or as an older one did
        # (every key but the nulls)
        written = {k: ({kk: vv for kk, vv in v.items() if vv is not None} if isinstance(v, dict) else v)
                   for k, v in old_conf.items() if v is not None}
        same = any(edited == with_defaults_spelled_out(absolute_paths(upgrade_keys(c)))
                   for c in (tomllib.loads(to_toml(old_conf)), written))
    except (OSError, ValueError, TypeError, AttributeError, KeyError):  # unreadable, or not a job's settings
        same, text = False, path.read_bytes().decode("utf-8", errors="replace")
    if same:
        return
    kept = out / "config.edited.toml"
    atomic_write_text(kept, text)
    log(f"run: warning: {path} was edited by hand; a job's settings come from --config and --set (its config.json "
        f"holds them), so the edit is not used here and the file is written again; the edited copy is kept as {kept} "
        "(run it as a new job: `fedhype run --config "
        f"{kept} --out NEW`)")


def _locked_job(conf: dict, out: Path, log, on_round: Callable[[dict], None], tcfg) -> dict[str, Any]:
    from fedhype.pipeline.config import upgrade_keys, with_defaults_spelled_out

    cfg_path = out / "config.json"
    old_conf = read_json(cfg_path, "job config") if cfg_path.exists() else None
    if isinstance(old_conf, dict) and isinstance(old_conf.get("data"), dict):
        old_conf["data"].setdefault("layout", "auto")  # jobs written before data.layout existed read folders as auto
    if isinstance(old_conf, dict):
        upgrade_keys(old_conf)  # a job folder written before partition.split / min_train were renamed resumes
        absolute_paths(old_conf)  # a job written with a relative path: as seen from here
        _keep_edited_toml(out, old_conf, log)
    # a key left out and the same key given at its default are the same setting (a job begun without
    # --set train.min_records=… resumes with it given at its default, and the other way round)
    # train.max_epsilon aside (FREE_SETTINGS: a probe's resume with the cap the README suggests was refused)
    spelled = without_free_settings(with_defaults_spelled_out(conf))
    old_spelled = without_free_settings(with_defaults_spelled_out(old_conf)) if isinstance(old_conf, dict) else None
    stale = old_conf is not None and (old_spelled is None or old_spelled != spelled)
    if old_spelled is not None and (cap := (old_conf.get("train") or {}).get("max_epsilon")) \
            != conf["train"].get("max_epsilon"):
        log(f"run: train.max_epsilon: {cap} → {conf['train'].get('max_epsilon')} (a cap on what the job may still "
            "spend, checked against its ledger before each release and round: nothing trained changes)")
    later: list[str] = []
    if stale and (out / "run" / "config.json").exists() and old_spelled is not None:
        later = later_changes(old_spelled, spelled)
        stale = not later  # only [synthesis] / [evaluate] changed: said once they are checked (_stages)
    if stale:
        if (out / "run" / "config.json").exists():  # training started: only the same settings may resume it
            from fedhype.federated.engine import _differences

            if old_spelled is not None:  # the settings that refuse it first, the later stages' apart (a probe's
                # refusal listed five allowed [evaluate]/[synthesis] changes and cut the refused train.epsilon)
                diff, free = split_changes(old_spelled, spelled)
            else:
                diff, free = _differences(old_conf, with_defaults_spelled_out(conf)), []
            raise ValidationError(
                f"{out} holds a job with a different configuration ({cfg_path}: "
                f"{'; '.join(diff[:5]) or 'details differ'}{' …' if len(diff) > 5 else ''}); use another --out or "
                "the same settings to resume"
                # "given with it" counted a difference an earlier rerun had stored as one given now (a probe)
                + (f" (the {len(free)} [synthesis]/[evaluate] difference{'s' if len(free) != 1 else ''} from the "
                   f"job's settings beside {'them' if len(diff) != 1 else 'it'} would be allowed alone: they rerun "
                   "only the stages after training)" if free else ""))
        # a job refused before training spent nothing: its folder is reused, and what its stages wrote
        # under the old settings is not (removed below, once the new settings are known to be valid)
        log(f"run: {out} held a job that never started training (nothing was spent); replacing its configuration")
    # a rerun into the job's own folder records its timings from the start; a new (or replaced) job's once its
    # configuration is written, so a job refused before that leaves its folder as it was
    timings = StageTimings(out / TIMINGS_FILE, fresh=stale, attached=old_conf is not None and not stale)
    try:
        return _stages(conf, out, log, on_round, tcfg, timings, stale=stale, later=later)
    except BaseException as exc:  # Ctrl-C, SIGTERM (raised as KeyboardInterrupt by the CLI), an error
        timings.stopped(exc)  # the run's stage timings so far, the interrupted one marked (atomic)
        raise


def _stages(conf: dict, out: Path, log, on_round: Callable[[dict], None], tcfg, timings: StageTimings, *,
            stale: bool, later: "list[str] | None" = None) -> dict[str, Any]:
    """The stages of :func:`_run_job`, once every setting was checked; each timed in ``timings``. ``stale``: the
    folder's stage outputs belong to other settings (all are removed); ``later``: the changed settings of the
    stages after training (:func:`later_changes`; :data:`LATER_STAGE_FILES` are removed once every setting is
    checked, the store, partition and run are kept)."""
    cfg_path = out / "config.json"
    private = not tcfg.no_dp
    timings.begin("embed_s")
    log.stage("embed")
    store = _embed(conf, out, log, reuse=not stale)
    timings.end()

    timings.begin("partition_s")
    log.stage("partition")
    part = _partition(conf, store, out, log, reuse=not stale)
    timings.end()

    from fedhype.federated.baselines import training_partition
    from fedhype.federated.config import STATISTICS_ONLY
    from fedhype.federated.engine import check_plan
    from fedhype.federated.run_plan import check_run_disk, recorded_config, resolve_stage
    from fedhype.federated.rundir import RunDir

    # every refusal that needs the data's public sizes (δ ≥ 1/n, min_records, secure aggregation's t < m,
    # max_epsilon) happens here, before the job writes anything: a refused job leaves its folder as it was
    # what evaluation needs of the data, before any ε is spent
    _check_evaluation(conf, part, store, started=(out / "run" / "config.json").exists())
    thin = thin_classes(part, store)
    if thin:
        log(f"train: warning: {thin}")
    # δ ≪ 1/n, q = 1 and unused round settings, as `fedhype train` warns (probes: `fedhype run` said nothing)
    sizes = {c.name: len(c.train) for c in part.clients}
    for advice in tcfg.plan_warnings(sizes, "train.batch_size"):
        log(f"train: warning: {advice}")
    # fedhypevae without its DP-SGD stage for small clients (public sizes; docs/method.md, decision 22), as the
    # engine resolves it (a run begun before the rule resumes as it began)
    given, tcfg = tcfg, resolve_stage(tcfg, sizes, recorded_config(RunDir(out / "run"), True))
    if tcfg is not given:
        log(f"train: {given.stage_off_reason(sizes)}")
    timings.begin("train_s")
    log.stage("train", "train: checking the privacy plan (" + (
        "σ calibrated for the target ε" if tcfg.noise_multiplier is None else "σ = train.noise_multiplier")
        + ")" if private else "train: checking the training plan (NON-PRIVATE: no clipping, no noise)")
    # a finished run spends nothing more: train.max_epsilon has nothing to stop (a helper's rerun of a finished job
    # with a cap below its ε was refused quoting the plan's ε, not the ledger's; `train --resume` says so and goes on)
    from fedhype.federated.run_plan import finished_run

    ended = finished_run(out / "run", tcfg) if tcfg.max_epsilon is not None else None
    if ended is not None:
        eps = ended["epsilon"]
        log(f"train: the job's run is finished ({'ε = ' + format(eps, '.4g') if eps is not None else 'not private'}): "
            f"nothing more is spent, so train.max_epsilon = {tcfg.max_epsilon:g} has nothing to stop"
            + (" (the run's ε is above it already: spent before, when it was not capped)"
               if eps is not None and eps > tcfg.max_epsilon else ""))
        tcfg = dataclasses.replace(tcfg, max_epsilon=None)
    # a resumed run keeps the "auto" sizes it was built with (checked for memory as such)
    mcfg = check_plan(training_partition(part, tcfg.method), tcfg, store.dim, store.n_classes,
                      recorded_config(RunDir(out / "run"), True))[0]
    # the disk, before the job writes its configuration, store and partition and before a word of what it trains (a
    # helper's full disk was refused only after "train: 3 clients release their DP class statistics")
    check_run_disk(out / "run", mcfg, tcfg.method, len(training_partition(part, tcfg.method).clients),
                   mcfg.linear_path)
    out.mkdir(parents=True, exist_ok=True)
    if later:  # said once every setting was checked (a probe was told "run again" before a refusal)
        # the DP linear reference switched on: its own DP model, trained now at its own ε (a separate release)
        linear = (any(c.startswith("evaluate.dp_linear:") for c in later) and bool(conf["evaluate"].get("dp_linear"))
                  and not (out / "dp_linear" / "model.safetensors").exists() and private)
        log(f"run: {out} holds this job with other settings for the stages after training only "
            f"({'; '.join(later[:5])}{' …' if len(later) > 5 else ''}): the training keeps its settings (its model, "
            "or where it stopped); synthesis and evaluation run with the new ones, and release/ is written again "
            "after them" + ("; evaluate.dp_linear trains the DP linear reference now, a separate release at its own ε"
               if linear else ""))
    if stale or later:
        for name in _STAGE_FILES if stale else LATER_STAGE_FILES:
            (out / name).unlink(missing_ok=True)
    if later:  # the old release holds the old settings' synthetic store: a rerun that stops before the release
        # stage must not leave it beside the new configuration (it is written again, whole, after evaluation)
        import shutil

        shutil.rmtree(out / "release", ignore_errors=True)
    atomic_write_json(cfg_path, conf)
    atomic_write_text(out / "config.toml", to_toml(conf))
    timings.attach()  # the folder holds this job: its timings so far are written, and each stage's from here
    if not (out / "embeddings.safetensors").exists():
        store.save(out / "embeddings.safetensors")
    if not (out / "partition.json").exists():
        part.save(out / "partition.json")

    from fedhype.federated.engine import train

    run_dir = out / "run"
    resume = (run_dir / "config.json").exists()
    released, done, finished = False, 0, False
    if resume:
        rd = RunDir(run_dir)
        done = rd.committed_round()
        stage = rd.release_stage()
        released = stage in ("committed", "saved")
        finished = stage == "committed" and (tcfg.statistics_only or tcfg.method in STATISTICS_ONLY
                                             or done >= tcfg.rounds)
        if finished:  # a probe's rerun of a finished job read "resuming … a release that was interrupted is charged"
            log("train: the job finished training before" + (f" ({done} round{'s' if done != 1 else ''})" if done else "")
                + ": nothing is released, trained or charged again; the trained model is reused")
    if resume and not finished:
        log("train: resuming " + ("the statistics release" if tcfg.statistics_only else
                                  f"after round {done} of {tcfg.rounds}") + " ("
            + (release_resume_note(stage, tcfg.seed is not None) if private else
               "NON-PRIVATE: nothing is charged; "
               + ("the class statistics were computed before and are reused" if released else
                  "the class statistics are computed again")) + ")")
    # what is still to run (a resumed job said "4 clients release their DP class statistics" although it did not)
    left = [] if released else [f"{counted(len(part.clients), 'client')} release{'s' if len(part.clients) == 1 else ''} their "
                                + ("DP class statistics" if private else "class statistics (NON-PRIVATE: no noise)")]
    if tcfg.method not in STATISTICS_ONLY and tcfg.rounds > done:
        left.append(f"{tcfg.rounds - done} {'DP-SGD' if private else 'training'} round{'s' if tcfg.rounds - done != 1 else ''}"
                    + (" left" if done else "") + ("" if private else " (no clipping, no noise)"))
    if not finished:
        log("train: " + (", then ".join(left) or "nothing left to train") + f" (latent size L = {mcfg.latent})")
    trained = train(store, part, tcfg, run_dir, resume=resume, progress=on_round)
    timings.end()
    from fedhype.privacy.plan import MEANINGLESS_EPSILON

    if private and (trained.get("epsilon") or 0.0) > MEANINGLESS_EPSILON:  # a helper's train.epsilon = 1e6: no word
        log(f"train: warning: ε = {trained['epsilon']:.4g}: a guarantee this weak protects no record in practice (ε "
            "above 10 is rarely defended); its release is still marked private, as the accountant's figure says")

    from fedhype.synthesis import synthesize

    timings.begin("synthesize_s")
    s = conf["synthesis"]
    log.stage("synthesize")
    syn = synthesize(run_dir, s["code"], per_class=s["per_class"], seed=s["seed"], temperature=s["temperature"],
                     anchor=s["anchor"])
    syn.save(out / "synthetic.safetensors")
    timings.end()
    log(f"synthesize: {len(syn)} embeddings from code {s['code']!r}")
    from fedhype.synthesis.defaults import WARNING_NOTES

    for nt in syn.meta.get("notes") or []:  # a class no site holds was said only in report.md
        log(f"synthesize: {'warning' if nt['kind'] in WARNING_NOTES else 'note'}: {nt['text']}")

    from fedhype.eval import ClientSplits, evaluate, interpolation_protocol

    timings.begin("evaluate_s")
    e = conf["evaluate"]
    test, train_split = part.split_store(store, "test"), part.split_store(store, "train")
    log.stage("evaluate", f"evaluate: MMD², FD, PRDC and TSTR against {len(test)} held-out real test embeddings")
    ev = evaluate(test, syn, real_train=train_split, n_permutations=e["permutations"], max_samples=e["max_samples"],
                  k=e["k"], seed=e["seed"])
    clients = {c.name: ClientSplits(*(part.client_store(store, c.id, sp) for sp in ("train", "val", "test")))
               for c in part.clients}
    empty = [f"{n} ({sp})" for n, c in clients.items() for sp in ("train", "val", "test") if len(getattr(c, sp)) == 0]
    if empty and (e.get("downstream") or e["interpolation"]):
        # the model is trained and its ε spent: report what can be reported instead of failing here
        log(f"evaluate: warning: the per-client tables (downstream, λ protocol) are skipped: empty split(s) "
            f"{', '.join(empty[:5])}{' …' if len(empty) > 5 else ''} (each client needs train, val and test records)")
    elif e.get("downstream"):
        from fedhype.eval.client_downstream import client_downstream

        log("evaluate: the per-client downstream table (local-only, synthetic-only, local + synthetic, λ-interpolation; "
            "each client's test split and their union)")
        ev["downstream"] = client_downstream(clients, syn, seed=e["seed"])
        lam = ev["downstream"].pop("interpolation")  # the λ protocol ran inside it (with the union test set too)
        if e["interpolation"]:
            ev["interpolation"] = lam
    elif e["interpolation"]:
        log("evaluate: the λ-interpolation protocol (each client's real data mixed with synthetic)")
        ev["interpolation"] = interpolation_protocol(clients, syn, seed=e["seed"])
    if e.get("code_domain") and len(part.clients) >= 2:
        from fedhype.eval.domains import code_domain_matrix

        log("evaluate: the code × domain matrix (every client code against every client's test split)")
        ev["code_domain"] = code_domain_matrix(run_dir, {c.name: part.client_store(store, c.id, "test")
                                                         for c in part.clients}, seed=e["seed"])
    if e.get("prototypes"):
        from fedhype.prototypes import prototypes_downstream

        log("evaluate: hyper-prototype classifier trained on the synthetic embeddings")
        ev["prototypes"] = prototypes_downstream(syn, test, real_train=train_split, seed=e["seed"])
    timings.end()
    if e.get("dp_linear"):
        from fedhype.prototypes.dp_linear import dp_linear_downstream

        timings.begin("dp_linear_s")
        log.stage("dp linear", "dp linear: DP-SGD FedAvg linear classifier on the clients' real embeddings (the reference, "
                  "its own ε)" if private else "dp linear: FedAvg linear classifier on the clients' real embeddings (the "
                  "reference; NON-PRIVATE, as the job: no clipping, no noise)")
        ev["dp_linear"] = dp_linear_downstream(store, part, dp_linear_config(conf, trained.get("epsilon"), out / "dp_linear"),
                                               out=out / "dp_linear")
        timings.end()
        log(f"dp linear: accuracy {ev['dp_linear']['accuracy']:.3f} on real test embeddings "
            + (f"(its own ε = {ev['dp_linear']['epsilon']:.4g})" if ev['dp_linear']['epsilon'] is not None
               else "(NON-PRIVATE)"))
    atomic_write_json(out / "evaluation.json", ev)

    from fedhype.pipeline.report import write_report

    timings.begin("report_s")  # timed only if the run stops in it (the report lists the stages before it)
    log.stage("report", "report: report.md, report.json and plots")
    report = write_report(out, conf, store, part, trained, syn, ev, timings)
    from fedhype.pipeline.release import write_release

    timings.begin("release_s")  # (as the report: a stop here is recorded)
    log.stage("release")
    write_release(run_dir, out / "release", synthetic=out / "synthetic.safetensors", overwrite=True)
    timings.finish()
    seeded = bool(read_json(out / "release" / "privacy.json", "release privacy file").get("noise_seeded"))
    log(release_line(out / "release", private, seeded))
    return report


def release_line(release: Path, private: bool, seeded: bool = False) -> str:
    """The job's last line: what its release folder holds and whether it may leave the site (not as private data
    where the run is not private, or its noise was seeded: whoever holds the seed can remove it)."""
    if private and seeded:
        return (f"release: {release} holds the DP model, ledger, synthetic embeddings and privacy.json, but the noise "
                "was seeded (train.seed): whoever holds the seed can remove it, so none of it may leave the site as "
                "private data; train again without a seed for a release")
    if private:
        return (f"release: {release} holds what may be shared (model, ledger, synthetic embeddings, privacy.json); "
                "everything else in the folder stays private")
    return (f"release: {release} holds the NON-PRIVATE generator, its synthetic embeddings and privacy.json (private = "
            "false): none of it is private, so it must not leave the site as private data; like everything else in "
            "the folder it stays with the data holder")
