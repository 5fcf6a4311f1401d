"""The job configuration: one TOML file plus ``--set section.key=value`` overrides.

Sections: ``[data]``, ``[partition]``, ``[train]`` (:class:`~fedhype.federated.config.TrainConfig`
fields), ``[model]`` (:class:`~fedhype.models.config.ModelConfig` overrides), ``[synthesis]``,
``[evaluate]``. Unknown sections or keys are errors (a typo must not silently use a default).
The resolved configuration is written into the output directory.
"""

from __future__ import annotations

import copy
import tomllib
import warnings
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from fedhype.errors import ArtifactError, ValidationError
from fedhype.federated.config import TRAIN_FLAGS, TrainConfig
from fedhype.models.config import ModelConfig, field_defaults
from fedhype.synthesis.defaults import DEFAULT_ANCHOR

#: the ``[train]`` keys a job configuration lists (and writes into config.toml); the other
#: :class:`TrainConfig` fields (local_steps, lr_server, lr_hyper, lr_code, class_stats_noise_multiplier,
#: min_records) may be set too and otherwise keep their defaults
JOB_TRAIN_KEYS = ("rounds", "local_epochs", "batch_size", "participation", "lr_local", "epsilon", "delta",
                  "noise_multiplier", "clip_norm", "class_stats_share", "second_moment_share", "centre_share",
                  "release_radius", "release_centre", "secure_aggregation", "dropout_tolerance", "no_dp", "max_epsilon",
                  "seed", "method")
#: the ``[model]`` keys a job configuration lists (any other :class:`ModelConfig` field may be set too)
JOB_MODEL_KEYS = ("hidden", "latent")
#: keys that take ``"auto"`` or an integer ≥ 1
AUTO_OR_COUNT = {("model", "latent"), ("model", "code_dim"), ("synthesis", "per_class")}


_TRAIN_DEFAULTS = field_defaults(TrainConfig)
_MODEL_DEFAULTS = field_defaults(ModelConfig)

DEFAULTS: dict[str, dict[str, Any]] = {
    # data: a bundled dataset, an image folder (images, read as layout) or an existing real store from
    # `fedhype embed` (store). image_size 0 = the encoder's own default input size, as `fedhype embed` and
    # fedhype.embed use (112 px for dinov2-vits14; configs/*.toml set 112 explicitly, the size the committed
    # benchmark figures were measured at); cache_dir "" = ~/.cache/fedhype/embeddings ($FEDHYPE_CACHE)
    "data": {"dataset": "digits-domains", "images": "", "layout": "auto", "store": "", "encoder": "dinov2-vits14",
             "image_size": 0, "pooling": "cls", "limit": 0, "seed": 0, "device": "auto", "dtype": "auto", "cache_dir": "",
             "strict": False},
    # fractions: train/val/test shares of each client's records (`fedhype partition --fractions`); min_records:
    # the smallest client training set (`--min-records`), the same minimum as train.min_records
    "partition": {"scheme": "domain", "clients": 0, "alpha": 0.3, "fractions": [0.6, 0.2, 0.2],
                  "min_records": _TRAIN_DEFAULTS["min_records"], "seed": 0},
    # train and model: the dataclasses' own defaults (TrainConfig and ModelConfig say why each was chosen)
    "train": {k: _TRAIN_DEFAULTS[k] for k in JOB_TRAIN_KEYS},
    "model": {k: _MODEL_DEFAULTS[k] for k in JOB_MODEL_KEYS},
    # per_class "auto": 300 from a DP model of latent 64, 3,000 from a larger one (trained without DP, or with
    # DP on ≥ 500 records per class: fedhype.synthesis.auto_per_class, fedhype.models.config.resolve_latent)
    # anchor: each code's class means put back on the statistics release's (fedhype.synthesis.anchor; no ε)
    "synthesis": {"code": "mixture", "per_class": "auto", "seed": 0, "temperature": 1.0, "anchor": DEFAULT_ANCHOR},
    # downstream: the per-client table of fedhype.eval.client_downstream (local-only, synthetic-only, local +
    # synthetic, λ-interpolation on each client's test split and their union); the prototype-anchor rows of
    # fedhype.prototypes.anchored train a network per client and are left to benchmarks/downstream.py
    "evaluate": {"permutations": 200, "max_samples": 2000, "k": 5, "seed": 0, "interpolation": True,
                 "downstream": True, "prototypes": True, "dp_linear": True, "code_domain": True},
}

#: job keys renamed to the CLI's option names (``--fractions``, ``--min-records``): the old name is still
#: read, with a warning, for one release (a config file or a job folder written before the rename)
RENAMED_KEYS = {("partition", "split"): "fractions", ("partition", "min_train"): "min_records"}

_TRAIN_KEYS = {f.name for f in fields(TrainConfig)} - {"model"}
_MODEL_KEYS = {f.name for f in fields(ModelConfig)} - {"dim", "n_classes"}


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def resolve(config_file: str | Path | None = None, overrides: list[str] | None = None, *,
            values: dict[str, Any] | None = None, where: str = "argument",
            warn: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Defaults ← TOML file ← ``--set`` overrides ← ``values``, validated.

    Args:
        config_file: a job TOML file (sections as :data:`DEFAULTS`).
        overrides: ``section.key=value`` strings (``--set``; values parsed as TOML).
        values: ``{"section.key": value}`` with Python values (the Python API's keyword arguments;
            errors name them as ``{where} key``).
        warn: called with each deprecation message (an old key of :data:`RENAMED_KEYS`, which is read
            under its new name); default: :func:`warnings.warn` with a ``FutureWarning``.

    Raises:
        ValidationError: unreadable TOML, unknown section/key, malformed ``--set``, a value of the
            wrong type, or ``train.no_dp = true`` together with a ``train.epsilon``, ``train.noise_multiplier``
            or ``train.max_epsilon`` that a config file, ``--set`` or ``values`` gives, in any layer and any
            order (a probe's ``--set train.no_dp=true`` over a config file's ``epsilon = 2.0`` ran without
            privacy and without a word); the bundled defaults' ε (:data:`DEFAULTS`) is no request. A later
            layer may unset an earlier one's ε: ``--set train.epsilon=none``.
    """
    conf = copy.deepcopy(DEFAULTS)
    given: dict[str, str] = {}  # "section.key" → where it was set (file or --set)
    say = warn or (lambda m: warnings.warn(m, FutureWarning, stacklevel=3))

    spelled: dict[tuple[str, str], tuple[str, str]] = {}  # (section, current name) → (name as given, where)

    def _set(conf: dict, section: str, key: str, value: Any, where: str) -> str:  # → the key's current name
        name = key
        if (section, key) in RENAMED_KEYS:
            key = RENAMED_KEYS[section, key]
            say(f"{where}: {section}.{name} is deprecated and will be removed in the next release; use {section}.{key}")
        before = spelled.get((section, key))
        if before is not None and before[0] != name and _layer(before[1]) == _layer(where):
            raise ValidationError(f"{where}: {section}.{name} and {section}.{before[0]} ({before[1]}) are the old and new "
                                  f"names of one setting; give only {section}.{key}")
        spelled[section, key] = (name, where)
        _set_key(conf, section, key, value, where)
        return key

    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ValidationError(f"--config {path}: file not found")
        data = _read_toml(path)
        for section, entries in data.items():
            if not isinstance(entries, dict):
                raise ValidationError(f"--config {path}: top-level key {section!r} must be a section (a TOML table "
                                      f"of settings, e.g. train with rounds = 8 under it), not a single value")
            for key, value in entries.items():
                key = _set(conf, section, key, value, where=f"--config {path}")
                given[f"{section}.{key}"] = f"--config {path}"
    for item in overrides or []:
        key, eq, value = item.partition("=")
        if not eq or "." not in key:
            raise ValidationError(f"--set {item!r}: expected section.key=value (e.g. train.rounds=20)")
        section, _, name = key.strip().partition(".")
        name = _set(conf, section, name, _parse_value(value.strip()), where=f"--set {item}")
        given[f"{section}.{name}"] = f"--set {item}"
    for key, value in (values or {}).items():
        section, _, name = key.partition(".")
        label = f"{where} {name}"
        name = _set(conf, section, name, list(value) if isinstance(value, tuple) else value, where=label)
        given[f"{section}.{name}"] = label
    # normalise "none" markers
    for k in ("noise_multiplier", "max_epsilon", "seed", "epsilon"):
        if isinstance(conf["train"].get(k), str) and conf["train"][k].lower() in ("none", "null", ""):
            conf["train"][k] = None
    if conf["train"]["no_dp"]:
        _refuse_no_dp_with_privacy(conf, given)
    if conf["train"]["noise_multiplier"] is not None and conf["train"]["epsilon"] is not None \
            and "train.epsilon" in given and "train.noise_multiplier" in given:
        raise ValidationError(f"train.epsilon ({given['train.epsilon']}) asks σ to be calibrated for a target ε and "
                              f"train.noise_multiplier ({given['train.noise_multiplier']}) sets σ directly; give one of the two")
    if conf["train"]["no_dp"] or conf["train"]["noise_multiplier"] is not None:
        conf["train"]["epsilon"] = None
    # (a written config.toml lists every key, so only a dataset other than the default is a contradiction)
    if "data.dataset" in given and conf["data"]["dataset"] != DEFAULTS["data"]["dataset"] and (
            conf["data"]["images"] or conf["data"]["store"]):
        raise ValidationError(f"data.dataset ({given['data.dataset']}) and data.{'images' if conf['data']['images'] else 'store'} "
                              "both name the real data; give one")
    # a probe's alpha with scheme "domain" was ignored silently; a config file may list the default (a written
    # config.toml lists every key), the command line means it
    if "partition.alpha" in given and conf["partition"]["scheme"] != "dirichlet" and (
            not given["partition.alpha"].startswith("--config") or conf["partition"]["alpha"] != DEFAULTS["partition"]["alpha"]):
        raise ValidationError(f"{given['partition.alpha']}: partition.alpha applies to partition.scheme = \"dirichlet\" "
                              f"only (the label skew of a Dirichlet partition); the scheme is "
                              f"{conf['partition']['scheme']!r}: drop partition.alpha or set partition.scheme = \"dirichlet\"")
    from fedhype.data.layout import check_layout

    check_layout(conf["data"]["layout"], f"{given.get('data.layout', 'data.layout')}: data.layout")
    for k in ("image_size", "limit"):
        if conf["data"][k] < 0:
            raise ValidationError(f"{given.get(f'data.{k}', f'data.{k}')}: data.{k} must be ≥ 0 (0: "
                                  f"{'the encoder’s default size' if k == 'image_size' else 'every image'}), got {conf['data'][k]}")
    for k in ("store", "images"):  # an empty value given on the command line meant no data at all, not the bundled set
        label = given.get(f"data.{k}", "")
        if not label.startswith("--config") and label and not str(conf["data"][k]).strip():
            raise ValidationError(f"{label}: data.{k} is empty; give the {'store file' if k == 'store' else 'image folder'}"
                                  f" (an empty value trained on the bundled dataset instead, a probe), or leave the "
                                  f"setting out for the bundled data.dataset")
    if conf["data"]["images"] and conf["data"]["store"]:
        raise ValidationError(f"data.images ({given.get('data.images', 'set')}) and data.store ({given.get('data.store', 'set')}) "
                              "both name the real data; give one (an image folder to embed, or a store made by `fedhype embed`)")
    return conf


def check_data(conf: dict) -> None:
    """Check the ``[data]`` section of a resolved configuration beyond types, loading nothing.

    The encoder name must be a known family (:func:`fedhype.encoders.registry.check_encoder_spec`),
    ``pooling``, ``device`` and ``dtype`` valid, ``images`` an existing folder, ``dataset`` a
    bundled one. ``fedhype run`` calls this before it writes anything into its ``--out``.

    Raises:
        ValidationError: naming the ``data.*`` key at fault and what to do.
    """
    from fedhype.encoders.base import resolve_device, resolve_dtype
    from fedhype.encoders.registry import POOLINGS, check_encoder_spec

    d = conf["data"]
    for key, check in (("encoder", lambda: d["store"] or check_encoder_spec(d["encoder"])),
                       ("device", lambda: resolve_device(d["device"])),
                       ("dtype", lambda: resolve_dtype(d["dtype"], resolve_device(d["device"])))):
        try:
            check()
        except ValidationError as exc:
            raise ValidationError(f"data.{key} = {d[key]!r}: {exc}") from None
    if d["pooling"] not in POOLINGS:
        raise ValidationError(f"data.pooling must be one of {list(POOLINGS)}, got {d['pooling']!r}")
    _check_seed("data", d["seed"])
    if d["images"]:
        path = Path(d["images"])
        if not path.is_dir():
            raise ValidationError(f"data.images = {str(path)!r}: " + ("a file, not a folder" if path.exists() else "no such folder")
                                  + " (give the folder that holds the class or domain folders)")
    elif not d["store"]:
        from fedhype.data.datasets import BUILTIN_DATASETS

        if d["dataset"] not in BUILTIN_DATASETS:
            raise ValidationError(f"data.dataset = {d['dataset']!r} is not a bundled dataset; available: "
                                  f"{', '.join(BUILTIN_DATASETS)} (or set data.images to a folder, data.store to a store)")


def _check_seed(section: str, value: Any, end: str = "") -> None:
    """``<section>.seed`` is a whole number in [0, 2^63) (a probe's ``partition.seed = -1`` ended in an internal
    error from NumPy)."""
    from fedhype.models.config import whole_setting
    from fedhype.pipeline.arguments import MAX_SEED

    try:
        whole_setting(f"{section}.seed", value, 0, below=MAX_SEED, example=0, what=" and below 2^63")
    except ValidationError as exc:
        raise ValidationError(f"{exc}{end}") from None


def check_partition(conf: dict) -> None:
    """Check the ``[partition]`` section of a resolved configuration, loading nothing
    (:func:`fedhype.data.partition.check_partition_args`); ``fedhype run`` calls it before it embeds.

    Each setting is checked on its own, so the refusal names the one at fault (a probe's
    ``partition.fractions=[0.5,0.5]`` was reported under an empty label with "clients = 0").

    Raises:
        ValidationError: ``partition.<key> = <value>: <what is wrong>; <what it needs>; nothing was embedded``.
    """
    from fedhype.data.partition import SCHEMES, check_partition_args

    p = conf["partition"]
    scheme, clients, fractions = p["scheme"], p["clients"], p["fractions"]
    end = "; nothing was embedded"
    _check_seed("partition", p["seed"], end)
    if scheme not in SCHEMES:
        raise ValidationError(f"partition.scheme = {scheme!r}: unknown scheme; expected one of {', '.join(SCHEMES)}{end}")
    if not (isinstance(fractions, list) and len(fractions) == 3
            and all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in fractions)):
        raise ValidationError(f"partition.fractions = {fractions!r}: give three fractions, train, val and test, "
                              f"each ≥ 0 with train > 0, summing to 1 (e.g. [0.6, 0.2, 0.2]){end}")
    checks = (  # (the setting, the arguments with every other setting valid)
        ("scheme/clients" if scheme != "domain" else "clients", (scheme, clients or None, 1.0, None, [1, 0, 0], 0)),
        ("alpha", (scheme, 1, p["alpha"], None, [1, 0, 0], 0)),
        ("fractions", ("domain", None, 1.0, None, fractions, 0)),
        ("min_records", ("domain", None, 1.0, None, [1, 0, 0], p["min_records"])),
    )
    for key, args in checks:
        try:
            check_partition_args(*args)
        except ValidationError:
            if key == "fractions":
                raise ValidationError(f"partition.fractions = {fractions!r}: give three fractions, train, val and test, "
                                      f"each ≥ 0 with train > 0, summing to 1 (e.g. [0.6, 0.2, 0.2])"
                                      + (f"; these sum to {sum(fractions):g}" if abs(sum(fractions) - 1) > 1e-6 else "")
                                      + end) from None
            if key == "scheme/clients":
                raise ValidationError(f"partition.clients = {clients!r}: partition.scheme = {scheme!r} needs the number "
                                      f"of clients, an integer ≥ 1 (0, one client per domain, is for the 'domain' "
                                      f"scheme only){end}") from None
            need = {"clients": "give the number of clients, an integer ≥ 1, or 0 for one client per domain",
                    "alpha": "the Dirichlet concentration must be a number > 0 (smaller = more label skew)",
                    "min_records": "the smallest client training set must be an integer ≥ 0 (0: no minimum)"}[key]
            raise ValidationError(f"partition.{key} = {p[key]!r}: {need}{end}") from None
    try:  # every setting together (none of the checks above depends on another today)
        check_partition_args(scheme, clients or None, p["alpha"], None, fractions, p["min_records"])
    except ValidationError as exc:
        raise ValidationError(f"partition settings (partition.scheme = {scheme!r}): {exc}{end}") from None


def _layer(label: str) -> int:
    """The layer a setting came from: 0 a config file, 1 ``--set``, 2 the Python API's values."""
    return 0 if label.startswith("--config") else 1 if label.startswith("--set") else 2


#: the ``[train]`` keys that ask for privacy (refused beside ``train.no_dp = true``)
_PRIVACY_KEYS = ("epsilon", "noise_multiplier", "max_epsilon")


def _says(label: str, key: str, value: Any, verb: str) -> str:
    """A setting and where it came from, as a refusal names it: ``job.toml sets train.epsilon = 2.0``,
    ``--set train.no_dp=true <verb>``, ``FedHypeVAE: epsilon = 4.0 <verb>``."""
    if label.startswith("--config "):
        return f"{label[len('--config '):]} sets {key} = {_toml_value(value)}"
    return f"{label} {verb}" if label.startswith("--set") else f"{label} = {value!r} {verb}"


def _toml_value(value: Any) -> str:
    return "true" if value is True else "false" if value is False else repr(value)


def _refuse_no_dp_with_privacy(conf: dict, given: dict[str, str]) -> None:
    """Refuse ``train.no_dp = true`` beside a privacy setting that a user layer gave, naming both sources.

    The bundled defaults' ε (:data:`DEFAULTS`: TrainConfig's ``epsilon = 1.0``) is not in ``given`` and is no
    request; a later layer's ``train.epsilon = none`` unsets an earlier one's ε (its value is then None).

    Raises:
        ValidationError: e.g. ``"job.toml sets train.epsilon = 2.0 and --set train.no_dp=true turns DP off: …"``,
            and how to ask for either run.
    """
    off = given.get("train.no_dp")
    if off is None:  # the default (false) cannot be true
        return
    for k in _PRIVACY_KEYS:
        on = given.get(f"train.{k}")
        if on is None or conf["train"][k] is None:
            continue
        if _layer(on) == _layer(off):  # one layer asks both
            if on.startswith("--config"):
                say = f"{on[len('--config '):]} sets both train.{k} = {_toml_value(conf['train'][k])} and train.no_dp = true"
            else:  # (the words the CLI and the Python API have said since the refusal exists)
                say = f"{on}: train.{k} asks for privacy but train.no_dp = true ({off}) turns it off"
            raise ValidationError(f"{say}; a job is private or not (nothing was done): drop one of the two — "
                                  f"train.{k} for a non-private run, train.no_dp for a private one")
        both = (f"{_says(on, f'train.{k}', conf['train'][k], 'asks for privacy')} and "
                f"{_says(off, 'train.no_dp', True, 'turns DP off')}")
        if on.startswith("--config"):  # a file's ε and a later (or other) layer's no_dp: the probe's case
            fix = (f"for a non-private run use a config without train.{k} (drop it from {on[len('--config '):]} and set "
                   f"train.no_dp = true there, or unset it here with --set train.{k}=none); for a private run drop "
                   + (off if off.startswith("--set") else "train.no_dp"))
        elif off.startswith("--config"):  # a file's no_dp and a later layer's ε
            fix = (f"for a private run drop train.no_dp from {off[len('--config '):]} (or add --set train.no_dp=false); "
                   f"for a non-private run drop {on}")
        else:
            fix = f"for a non-private run drop {on}; for a private run drop {off}"
        raise ValidationError(f"{both}: a job is never silently run without the privacy it asks for (nothing was "
                              f"done); {fix}")


def upgrade_keys(conf: dict) -> dict:
    """A stored job configuration (a job folder's config.json) with the keys of :data:`RENAMED_KEYS` under
    their new names, in place; returns ``conf``. A folder written before the rename resumes unchanged."""
    for (section, old), new in RENAMED_KEYS.items():
        part = conf.get(section)
        if isinstance(part, dict) and old in part and new not in part:
            part[new] = part.pop(old)
    if isinstance(conf.get("synthesis"), dict):  # written before synthesis.anchor: it synthesizes with the default
        conf["synthesis"].setdefault("anchor", DEFAULT_ANCHOR)
    return conf


def _is_number(text: str) -> bool:
    try:
        float(text.strip())
    except ValueError:
        return False
    return True


def _set_key(conf: dict, section: str, key: str, value: Any, where: str) -> None:
    import difflib

    if section not in conf:
        near = difflib.get_close_matches(section, list(conf), n=1)
        raise ValidationError(f"{where}: unknown section {section!r}"
                              + (f" (did you mean {near[0]!r}?)" if near else "") + f"; sections: {sorted(conf)}")
    allowed = _MODEL_KEYS if section == "model" else (_TRAIN_KEYS if section == "train" else set(conf[section]))
    if key not in allowed:
        near = difflib.get_close_matches(key, sorted(allowed), n=1)
        raise ValidationError(f"{where}: unknown key {section}.{key}"
                              + (f" (did you mean {section}.{near[0]}?)" if near else "") + f"; known: {sorted(allowed)}")
    default = DEFAULTS.get(section, {}).get(key)
    if key not in DEFAULTS.get(section, {}) and section in ("train", "model"):
        # a key the job does not list (train.min_records, train.dp_sgd_min_records, …): a whole number written 20.0
        # is 20, as for the keys it lists (a probe: rounds = 8.0 was taken, min_records = 20.0 refused); anything
        # else is the dataclass's to check (its refusals name the key and what to give)
        field_default = (_TRAIN_FIELD_DEFAULTS if section == "train" else _MODEL_FIELD_DEFAULTS).get(key)
        whole = (isinstance(field_default, int) and not isinstance(field_default, bool)) \
            or (section == "train" and key in TRAIN_FLAGS)  # train.local_steps: unset by default, a whole number when set
        if whole and isinstance(value, float) and value.is_integer():
            value = int(value)
    if (section, key) in AUTO_OR_COUNT:
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1
                                or (isinstance(value, float) and not value.is_integer())):
            raise ValidationError(f"{where}: {section}.{key} must be \"auto\" or an integer ≥ 1, got {value!r}")
        conf[section][key] = value if value == "auto" else int(value)
        return
    if (section, key) == ("train", "epsilon") and isinstance(value, str) and value.strip().lower() in ("none", "null"):
        conf[section][key] = None  # unset a config file's target ε (with train.no_dp or train.noise_multiplier)
        return
    # a number or switch must stay one (a typo like rounds=abc would otherwise fail much later)
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ValidationError(f"{where}: {section}.{key} must be true or false, got {value!r}")
    if isinstance(default, (int, float)) and not isinstance(default, bool) and (
            isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValidationError(f"{where}: {section}.{key} must be a number, got {value!r}"
                              + (f"; write it unquoted, e.g. {section}.{key} = {value.strip()}"
                                 if isinstance(value, str) and _is_number(value) else ""))  # a probe: "unquote" unsaid
    if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) and not value.is_integer():
        raise ValidationError(f"{where}: {section}.{key} must be an integer, got {value!r}")
    if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float):
        value = int(value)
    if isinstance(default, str) and not isinstance(value, str):  # e.g. data.images=2024 (a folder named 2024)
        raise ValidationError(f"{where}: {section}.{key} must be a string, got {value!r}; quote it "
                              f"(--set '{section}.{key}=\"{value}\"')")
    conf[section][key] = value


#: every [train] / [model] field's default (a default factory called once), for the keys a job does not list
_TRAIN_FIELD_DEFAULTS = field_defaults(TrainConfig, factories=True, skip=("model",))
_MODEL_FIELD_DEFAULTS = field_defaults(ModelConfig, factories=True, skip=("dim", "n_classes"))


def with_defaults_spelled_out(conf: dict) -> dict:
    """A JSON copy of a job configuration whose ``[train]`` and ``[model]`` sections list every setting that has a
    default, absent ones at their default: two jobs whose configurations differ only in a key one of them left
    out and the other set to its default compare equal (``fedhype run`` resumes a job given the default
    explicitly with ``--set``). Other sections always list every key (:func:`resolve`); ``data.image_size = 0``
    (the encoder's default) is the bundled encoder's size spelled out (configs/digits-domains.toml writes 112)."""
    import json

    c = json.loads(json.dumps(conf))
    d = c.get("data")
    if isinstance(d, dict) and d.get("image_size") == 0 and d.get("encoder") == DEFAULTS["data"]["encoder"]:
        from fedhype.encoders.dinov2_bundled import DEFAULT_IMAGE_SIZE

        d["image_size"] = DEFAULT_IMAGE_SIZE
    for sec, defaults in (("train", field_defaults(TrainConfig, factories=True, skip=("model", "preset"))),
                          ("model", field_defaults(ModelConfig, factories=True, skip=("dim", "n_classes")))):
        if isinstance(c.get(sec), dict):
            for k, v in json.loads(json.dumps(defaults, default=list)).items():
                c[sec].setdefault(k, v)
    return c


def train_config(conf: dict) -> TrainConfig:
    """The :class:`TrainConfig` of a resolved job configuration."""
    t = {k: v for k, v in conf["train"].items() if k in _TRAIN_KEYS}
    try:
        cfg = TrainConfig(**t, model=dict(conf["model"]))
        cfg.model_config(1, 2)  # validates the [model] section too
    except TypeError as exc:
        raise ValidationError(f"a train.* or model.* setting has the wrong type ({exc}); numbers must not be quoted") from None
    except ValidationError as exc:  # a job sets keys, not `fedhype train`'s options: its refusal names the keys only
        if type(exc) is not ValidationError:
            raise
        raise ValidationError(job_words(str(exc))) from None
    return cfg


def job_words(message: str) -> str:
    """A refusal of the training settings in a job's words: ``fedhype train``'s options named beside a key are left
    out (``train.rounds (--rounds) must be …`` → ``train.rounds must be …``) and an option named for a key is
    replaced by the key (``use --no-dp (train.no_dp = true)`` → ``use train.no_dp = true``), and one named alone by its
    key (:data:`JOB_KEYS_OF_OPTIONS`: ``give --epsilon`` → ``give train.epsilon``). A probe's ``fedhype
    run --set train.rounds=0`` was told of ``--rounds``, which ``fedhype run`` does not have."""
    import re

    message = re.sub(r"--[a-z][a-z-]* \((train|model)\.([a-z_]+)( = [^)]*)?\)", lambda m: m.group(0)[m.group(0).index("(") + 1:-1],
                     message)
    message = re.sub(r"((?:train|model)\.[a-z_]+) \(--[a-z][a-z-]*\)", r"\1", message)
    # the options named alone: their keys
    return re.sub(r"--(" + "|".join(JOB_KEYS_OF_OPTIONS) + r")\b(?![-=])", lambda m: JOB_KEYS_OF_OPTIONS[m.group(1)], message)


#: `fedhype train` options a refusal of the training settings names alone → what a job sets instead (:func:`job_words`)
JOB_KEYS_OF_OPTIONS = {"epsilon": "train.epsilon", "noise-multiplier": "train.noise_multiplier",
                       "no-dp": "train.no_dp = true", "secure-aggregation": "train.secure_aggregation = true",
                       "dropout-tolerance": "train.dropout_tolerance"}


def to_toml(conf: dict) -> str:
    """Render a resolved configuration as TOML (written by ``tomli-w``, so any string round-trips).

    TOML has no null: keys whose value is None are left out and listed in a comment at the top
    (reading the file back with :func:`resolve` gives them their default, None). ``data.dataset`` is left out where
    ``data.images`` or ``data.store`` names the real data (it is not read then; a helper's job folder read as if it
    trained on the bundled digits), and said so in a comment.
    """
    import tomli_w

    data = conf.get("data") or {}
    own = "images" if data.get("images") else "store" if data.get("store") else None
    unset = [f"{sec}.{k}" for sec, values in conf.items() for k, v in values.items() if v is None]
    body = tomli_w.dumps({sec: {k: (list(v) if isinstance(v, tuple) else v) for k, v in values.items()
                                if v is not None and not (own and sec == "data" and k == "dataset")}
                          for sec, values in conf.items()})
    return ((f"# not set (none): {', '.join(unset)}\n" if unset else "")
            + (f"# data.dataset is not used: data.{own} names the real data\n" if own else "") + body)


def _read_toml(path: Path) -> dict:
    """The TOML table of ``--config path``.

    Raises:
        ArtifactError: a file of another kind (binary — a store, a model — or JSON), exit 4 as for every option given
            a file of another kind.
        ValidationError: a text file that is not valid TOML (a typo in a config), exit 2.
    """
    import json


    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ArtifactError(f"--config {path}: not a text file (a binary file, e.g. an embedding store or a model?); "
                            "--config takes a TOML file such as configs/digits-domains.toml") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        if text.lstrip().startswith(("{", "[")):
            try:
                json.loads(text)
            except ValueError:
                pass
            else:
                raise ArtifactError(f"--config {path}: a JSON file, not TOML (a card, a release or a run's config.json?);"
                                    " --config takes a TOML file such as configs/digits-domains.toml") from None
        raise ValidationError(f"--config {path}: not valid TOML ({exc})") from None
