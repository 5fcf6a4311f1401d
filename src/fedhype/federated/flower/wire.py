"""What crosses the wire between the Flower ServerApp and a SuperNode's ClientApp — and nothing else.

Every message is a Flower ``RecordDict`` with fixed record names (:data:`TASK`, :data:`REPLY`,
:data:`QUERY`, :data:`IDENTITY`); arrays travel as Flower ``Array`` (NumPy ``.npy`` bytes, written and
read with ``allow_pickle=False``), scalars in a ``ConfigRecord``.

server → node, message type ``train`` (one per sampled client and round)
    ``theta``        ArrayRecord — θ_i^0 = h_Φ(c_i): generated parameter name → float32 array
    ``space``        ArrayRecord, only with ``model.class_bias`` — the client's model space
                     ``mean`` [D] and ``scale`` [] (post-processing of the DP class statistics)
    ``task``         ConfigRecord — ``round``, ``client``, ``steps``, ``batch-size``, ``lr``,
                     ``clip-norm``, ``dp``, ``noise-multiplier`` (only with DP), ``grad-method``,
                     ``model`` (JSON of the ModelConfig), ``run`` (state key), ``n-train``,
                     ``data-key``, ``fedhype-version``
node → server, the reply: a :class:`~fedhype.privacy.dp_step.PrivatizedUpdate` and nothing else
    ``update``       ArrayRecord — its Δθ_i (same names and shapes as θ_i^0)
    ``update-meta``  ConfigRecord — ``client``, ``round``, ``steps``, ``clip-norm``, ``sample-rate``,
                     ``private``, ``noise-multiplier`` (only if private)
server → node, message type ``train.class_stats`` (once, before round 0, with ``model.class_bias``)
    ``stats-task``   ConfigRecord — ``client``, ``n-classes``, ``dp``, ``noise-multiplier`` (with DP),
                     ``release-weights`` (a, b, c), ``run``, ``n-train``, ``data-key``, ``fedhype-version``
                     ``stage`` — ``"centre"`` (the centred release's first step) or ``"statistics"``;
                     with a centred release, the statistics request carries the public ``centre``
                     (list of D floats) and ``radius`` (:mod:`fedhype.privacy.centring`)
node → server, the reply: the PrivatizedUpdate of :func:`~fedhype.privacy.centring.privatize_centre`
    (``sum`` [D], ``count`` [1]) or of :func:`~fedhype.privacy.dp_step.privatize_class_sums`
    (``update``: ``class_sums`` [K, D], ``class_counts`` [K], and ``second_moment`` [D, D] when c > 0;
    ``update-meta`` with round −1)
server → node, message type ``query`` (once per Flower run), and its reply ``identity``: see
    :mod:`fedhype.federated.flower.handshake`

The server decodes a reply with :func:`decode_update`, which accepts exactly the two records
above, checks every public scalar against the plan (:class:`Expected`) and the tensors against
θ_i^0 (:meth:`PrivatizedUpdate.from_wire`); anything else is refused with an ArtifactError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedhype import __version__
from fedhype.errors import ArtifactError, FedhypeError
from fedhype.federated.flower.handshake import check_version
from fedhype.federated.transport import RoundTask
from fedhype.models.config import ModelConfig
from fedhype.privacy.dp_step import RELEASE_SENSITIVITY, DPConfig, PrivatizedUpdate, ReleaseWeights

TRAIN, STATS_TYPE = "train", "train.class_stats"
THETA, SPACE, TASK, UPDATE, UPDATE_META, STATS_TASK = "theta", "space", "task", "update", "update-meta", "stats-task"
#: Record names of a reply (a reply with other records is refused).
REPLY_RECORDS = {UPDATE, UPDATE_META}
STATS_KEYS = {"client", "n-classes", "dp", "run", "n-train", "data-key", "fedhype-version", "release-weights",
              "stage", "federation"}  # + σ with DP, + centre and radius for a centred release's statistics
TASK_KEYS = {"round", "client", "steps", "batch-size", "lr", "clip-norm", "dp", "grad-method", "model", "run",
             "n-train", "data-key", "fedhype-version", "federation"}  # + "noise-multiplier" with DP
META_KEYS = {"client", "round", "steps", "clip-norm", "sample-rate", "private"}  # + "noise-multiplier" if private


# ---------------------------------------------------------------------------- arrays
def _to_record(tensors: dict[str, torch.Tensor] | Any) -> ArrayRecord:
    return ArrayRecord({k: Array(v.detach().to(torch.float32).cpu().contiguous().numpy()) for k, v in tensors.items()})


def _from_record(rec: ArrayRecord, like: dict[str, torch.Tensor] | None, where: str) -> dict[str, torch.Tensor]:
    """float32 tensors of ``rec``; with ``like``, names and shapes are checked before decoding."""
    if like is not None and set(rec) != set(like):
        raise ArtifactError(f"{where}: array names differ from θ (unexpected {sorted(set(rec) - set(like))}, "
                            f"missing {sorted(set(like) - set(rec))}); refused")
    out = {}
    for k, arr in rec.items():
        if arr.stype != "numpy.ndarray" or arr.dtype != "float32" or (
                like is not None and tuple(arr.shape) != tuple(like[k].shape)):
            raise ArtifactError(f"{where}: array {k!r} is {arr.dtype} {tuple(arr.shape)} ({arr.stype}); "
                                "expected float32 of θ's shape; refused")
        a = arr.numpy()
        if a.dtype != np.float32 or tuple(a.shape) != tuple(arr.shape):
            raise ArtifactError(f"{where}: array {k!r} does not match its declared dtype/shape; refused")
        out[k] = torch.from_numpy(a.copy())
    return out


def _records(content: RecordDict, names: set[str], where: str) -> None:
    if set(content) != names:
        raise ArtifactError(f"{where}: records {sorted(content)}, expected exactly {sorted(names)}; refused")


def _config(content: RecordDict, name: str, keys: set[str], optional: set[str], where: str) -> dict[str, Any]:
    rec = content[name]
    if not isinstance(rec, ConfigRecord):
        raise ArtifactError(f"{where}: record {name!r} must be a ConfigRecord; refused")
    got = set(rec)
    if not keys <= got or got - keys - optional:
        raise ArtifactError(f"{where}: {name!r} keys {sorted(got)}, expected {sorted(keys)} "
                            f"(+ optional {sorted(optional)}); refused")
    return dict(rec)


# ---------------------------------------------------------------------------- train task (server → node)
def encode_task(task: RoundTask, *, run_key: str, n_train: int, data_key: str,
                space: tuple[torch.Tensor, torch.Tensor] | None = None, federation: str = "") -> RecordDict:
    """The ``train`` message content for ``task`` (θ_i^0, the model space and public settings only;
    ``federation``: the digest of the server's federation file, :func:`~fedhype.federated.flower.handshake.federation_digest`)."""
    cfg: dict[str, Any] = {"round": task.round, "client": task.client, "steps": task.steps,
                           "batch-size": task.batch_size, "lr": float(task.lr), "clip-norm": float(task.dp.clip_norm),
                           "dp": bool(task.dp.enabled), "grad-method": task.dp.grad_method,
                           "model": json.dumps(task.model.to_dict()), "run": run_key, "n-train": int(n_train),
                           "data-key": data_key, "fedhype-version": __version__, "federation": str(federation)}
    if task.dp.enabled:
        cfg["noise-multiplier"] = float(task.dp.noise_multiplier)
    content = RecordDict({THETA: _to_record(task.theta_tensors()), TASK: ConfigRecord(cfg)})
    if space is not None:
        content[SPACE] = _to_record({"mean": space[0], "scale": space[1]})
    return content


def decode_task(content: RecordDict) -> tuple[RoundTask, dict[str, Any]]:
    """``(task, {"run", "n-train", "data-key", "space", "federation"})`` from a ``train`` message (node side);
    ``space`` is ``(mean [D], scale [])`` or None.

    Raises:
        ArtifactError: unexpected records or keys, or a task from another fedhype version.
    """
    where = "train message"
    if set(content) not in ({THETA, TASK}, {THETA, TASK, SPACE}):
        raise ArtifactError(f"{where}: records {sorted(content)}, expected {THETA!r}, {TASK!r} [and {SPACE!r}]")
    c = _config(content, TASK, TASK_KEYS, {"noise-multiplier"}, where)
    check_version(c, where)
    try:
        m = json.loads(c["model"])
        model = ModelConfig(**{**m, "mmd_bandwidths": tuple(m["mmd_bandwidths"])})
        dp = DPConfig(c.get("noise-multiplier"), float(c["clip-norm"]), enabled=bool(c["dp"]),
                      grad_method=str(c["grad-method"]))
    except (TypeError, KeyError, ValueError) as exc:
        raise ArtifactError(f"{where}: bad model or DP settings ({exc})") from None
    theta = _from_record(content[THETA], None, where)
    space = None
    if SPACE in content:
        like = {"mean": torch.zeros(model.dim), "scale": torch.zeros(())}
        sp = _from_record(content[SPACE], like, where)
        space = (sp["mean"], sp["scale"])
    task = RoundTask(round=int(c["round"]), index=-1, client=str(c["client"]), theta=theta, model=model, dp=dp,
                     batch_size=int(c["batch-size"]), steps=int(c["steps"]), lr=float(c["lr"]))
    return task, {"run": str(c["run"]), "n-train": int(c["n-train"]), "data-key": str(c["data-key"]),
                  "space": space, "federation": str(c["federation"])}


def encode_stats_request(client: str, n_classes: int, dp: DPConfig, weights: ReleaseWeights, *, run_key: str,
                         n_train: int, data_key: str, stage: str = "statistics", centring=None,
                         federation: str = "") -> RecordDict:
    """The ``train.class_stats`` message content (public settings only: σ, the release weights and,
    for a centred release, its public centre and radius)."""
    cfg: dict[str, Any] = {"client": client, "n-classes": int(n_classes), "dp": bool(dp.enabled), "run": run_key,
                           "release-weights": weights.as_list(), "stage": stage,
                           "n-train": int(n_train), "data-key": data_key, "fedhype-version": __version__,
                           "federation": str(federation)}
    if dp.enabled:
        cfg["noise-multiplier"] = float(dp.noise_multiplier)
    if centring is not None:
        cfg["centre"] = [float(v) for v in centring.centre.tolist()]
        cfg["radius"] = float(centring.radius)
    return RecordDict({STATS_TASK: ConfigRecord(cfg)})


def decode_stats_request(content: RecordDict) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({"client", "n-classes", "dp"}, {"run", "n-train", "data-key", "federation"})`` (node side)."""
    where = "class-statistics request"
    _records(content, {STATS_TASK}, where)
    c = _config(content, STATS_TASK, STATS_KEYS, {"noise-multiplier", "centre", "radius"}, where)
    check_version(c, where)
    if c["stage"] not in ("centre", "statistics") or (("centre" in c) != ("radius" in c)) or \
            (c["stage"] == "centre" and "centre" in c):
        raise ArtifactError(f"{where}: stage {c['stage']!r} with centre {'centre' in c} and radius {'radius' in c} "
                            "is not a release fedhype knows; refused")
    try:
        from fedhype.privacy.centring import Centring

        dp = DPConfig(c.get("noise-multiplier"), RELEASE_SENSITIVITY, enabled=bool(c["dp"]))
        weights = ReleaseWeights(*[float(w) for w in c["release-weights"]])
        centring = Centring(torch.tensor([float(v) for v in c["centre"]], dtype=torch.float32), float(c["radius"])) \
            if "centre" in c else None
    except (TypeError, ValueError, FedhypeError) as exc:
        raise ArtifactError(f"{where}: bad DP settings ({exc})") from None
    return ({"client": str(c["client"]), "n-classes": int(c["n-classes"]), "dp": dp, "weights": weights,
             "stage": str(c["stage"]), "centring": centring},
            {"run": str(c["run"]), "n-train": int(c["n-train"]), "data-key": str(c["data-key"]),
             "federation": str(c["federation"])})


# ---------------------------------------------------------------------------- update (node → server)
def encode_update(update: PrivatizedUpdate, round_idx: int) -> RecordDict:
    """The reply content for ``update``: its Δθ_i and public scalars, nothing else.

    Raises:
        TypeError: ``update`` is not a PrivatizedUpdate (the privacy boundary is a type).
    """
    if type(update) is not PrivatizedUpdate:
        raise TypeError(f"only a PrivatizedUpdate may leave a client, got {type(update).__name__}")
    meta: dict[str, Any] = {"client": update.client, "round": int(round_idx), "steps": update.steps,
                            "clip-norm": update.clip_norm, "sample-rate": update.sample_rate, "private": update.private}
    if update.private:
        meta["noise-multiplier"] = float(update.noise_multiplier)
    return RecordDict({UPDATE: _to_record(dict(update.tensors)), UPDATE_META: ConfigRecord(meta)})


@dataclass(frozen=True)
class Expected:
    """What the server planned for one reply: the update must match it exactly.

    Attributes:
        client, round: whose update, for which round (−1: the class statistics).
        like: name → tensor of the expected shapes (θ_i^0 for a round).
        steps, sample_rate, clip_norm, private, noise_multiplier: the public metadata planned
            (and written ahead into the ledger).
    """

    client: str
    round: int
    like: dict[str, torch.Tensor]
    steps: int
    sample_rate: float
    clip_norm: float
    private: bool
    noise_multiplier: float | None

    @classmethod
    def of_task(cls, task: RoundTask, sample_rate: float) -> "Expected":
        """The reply to a round task; ``sample_rate`` = q_i = min(1, B / n_i) of the plan."""
        return cls(task.client, task.round, task.theta_tensors(), task.steps, float(sample_rate), float(task.dp.clip_norm),
                   bool(task.dp.enabled), float(task.dp.noise_multiplier) if task.dp.enabled else None)

    @classmethod
    def of_centre(cls, client: str, dim: int, dp: DPConfig) -> "Expected":
        """The reply to a centre request (the centred release's first step, σ_A)."""
        return cls(client, -1, {"sum": torch.zeros(dim), "count": torch.zeros(1)}, 1, 1.0, float(RELEASE_SENSITIVITY),
                   bool(dp.enabled), float(dp.noise_multiplier) if dp.enabled else None)

    @classmethod
    def of_stats(cls, client: str, n_classes: int, dim: int, dp: DPConfig, weights: ReleaseWeights) -> "Expected":
        """The reply to a class-statistics request (one un-subsampled Gaussian release)."""
        like = {"class_sums": torch.zeros(n_classes, dim), "class_counts": torch.zeros(n_classes)}
        if weights.second_moment > 0:
            like["second_moment"] = torch.zeros(dim, dim)
        return cls(client, -1, like, 1, 1.0, float(RELEASE_SENSITIVITY), bool(dp.enabled),
                   float(dp.noise_multiplier) if dp.enabled else None)


def decode_update(content: RecordDict, exp: Expected) -> PrivatizedUpdate:
    """Rebuild the PrivatizedUpdate of a reply (server side), or refuse it.

    Accepts exactly the records ``update`` and ``update-meta``; the client, round, K, C, σ, the
    private flag and q must equal the plan ``exp``; tensors must have the planned names and shapes
    (float32, finite: :meth:`PrivatizedUpdate.from_wire`).

    Raises:
        ArtifactError: anything else (the message names the client and what differs).
    """
    where = f"reply of client {exp.client!r} ({'round ' + str(exp.round + 1) if exp.round >= 0 else 'class statistics'})"
    _records(content, REPLY_RECORDS, where)
    if not isinstance(content[UPDATE], ArrayRecord):
        raise ArtifactError(f"{where}: record {UPDATE!r} must be an ArrayRecord; refused")
    m = _config(content, UPDATE_META, META_KEYS, {"noise-multiplier"}, where)
    planned = {"client": exp.client, "round": exp.round, "steps": exp.steps, "clip-norm": exp.clip_norm,
               "sample-rate": exp.sample_rate, "private": exp.private}
    if exp.private:
        planned["noise-multiplier"] = exp.noise_multiplier
    if m != planned or any(type(m[k]) is not type(v) for k, v in planned.items()):
        diff = {k: (m.get(k), planned.get(k)) for k in set(m) | set(planned) if m.get(k) != planned.get(k)}
        raise ArtifactError(f"{where}: metadata differs from the plan (got, planned): {diff or 'types'}; refused")
    tensors = _from_record(content[UPDATE], exp.like, where)
    return PrivatizedUpdate.from_wire(client=exp.client, tensors=tensors, like=exp.like, steps=m["steps"],
                                      noise_multiplier=m.get("noise-multiplier"), clip_norm=m["clip-norm"],
                                      sample_rate=m["sample-rate"], private=m["private"])


# ---------------------------------------------------------------------------- audit
def describe(content: RecordDict) -> dict[str, Any]:
    """The structure of a message content, without values of arrays: record → type and keys
    (arrays: ``[dtype, shape]``; config values: their Python type name). For the wire log."""
    out: dict[str, Any] = {}
    for name, rec in content.items():
        if isinstance(rec, ArrayRecord):
            out[name] = {"type": "ArrayRecord", "arrays": {k: [a.dtype, list(a.shape)] for k, a in rec.items()}}
        else:
            out[name] = {"type": type(rec).__name__, "keys": {k: type(v).__name__ for k, v in rec.items()}}
    return out
