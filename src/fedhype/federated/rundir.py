"""The run directory: what a training run writes, and its checkpoint/commit protocol.

Layout::

    run/
      config.json          resolved configuration (train, model, data, privacy plan)
      model.safetensors    Φ and the DP client codes (+ JSON metadata: model config, client ids,
                           public client sizes, ε, δ, private flag) — what synthesis reads
                           (local-cvae: one Φ_i per client as ``hnet.models.<i>.*``)
      ledger.json          the privacy ledger (every mechanism event; ε recomputed from it)
      metrics.json         per-round metrics (ε so far; held-out diagnostics marked non-DP)
      checkpoint.json      commit point: the last completed round
      ckpt/server-r<R>.safetensors      server state after round R
      clients/<id>/state-r<R>.safetensors   private client state (ψ_i, optimiser, generators)
      .lock                one writer at a time (:meth:`RunDir.writer_lock`)

A round is committed by atomically rewriting ``checkpoint.json`` after every file of that
round is on disk; older round files are removed afterwards. A crash leaves the previous commit.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch

from fedhype.errors import ArtifactError, ValidationError
from fedhype.federated.baselines import is_local, load_local_models
from fedhype.io import DIGEST_KEY, atomic_save_tensors, exclusive_lock, atomic_write_json, load_tensors, read_json, tensor_metadata
from fedhype.models.config import ModelConfig
from fedhype.models.hypernet import HyperNetwork, fill_missing_anchors
from fedhype.privacy.ledger import LEDGER_ADVICE

MODEL_FORMAT = "fedhype-model/1"


#: The model as the statistics release set it (public DP outputs), under ``ckpt/``: a run interrupted after it was
#: saved reuses it instead of releasing (and being charged) again.
RELEASE_STATE = "release-state.safetensors"
#: The clients' released updates (public DP outputs), under ``ckpt/``, saved the moment they arrive: a run
#: interrupted during the server's post-processing reuses them (charged once).
RELEASE_OUTPUTS = "release-outputs.safetensors"


class RunDir:
    """Paths and (de)serialisation of one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    config = property(lambda self: self.root / "config.json")
    model = property(lambda self: self.root / "model.safetensors")
    ledger = property(lambda self: self.root / "ledger.json")
    metrics = property(lambda self: self.root / "metrics.json")
    checkpoint = property(lambda self: self.root / "checkpoint.json")
    #: the run's random key in the sites' ledgers across runs (:mod:`fedhype.privacy.site_ledger`), under ``ckpt/``
    run_key_file = property(lambda self: self.root / "ckpt" / "run-key.json")

    def run_key(self, create: bool = False) -> str | None:
        """The run's key in the sites' ledgers: its folder name and a random token drawn once (written before any
        site is charged, so a resume after any stop is the same run there); None before it exists (``create``
        False), e.g. before a new run has written anything.

        Raises:
            ArtifactError: an unreadable key file.
        """
        if self.run_key_file.exists():
            raw = read_json(self.run_key_file, "run key")
            key = raw.get("key") if isinstance(raw, dict) else None
            if not isinstance(key, str) or not key:
                raise ArtifactError(f"{self.run_key_file}: no key; it names this run in its sites' ledgers: restore it")
            return key
        if not create:
            return None
        import secrets

        key = f"{self.root.name[:60]}-{secrets.token_hex(6)}"
        self.run_key_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.run_key_file, {"key": key, "what": "this run's name in its sites' ledgers across runs"})
        return key

    def refuse_if_training(self, reading: str) -> None:
        """Refuse to read the run while a training process holds its lock (:meth:`writer_lock`), or, for a
        ``fedhype run`` job folder, while a job runs in it.

        A run in progress writes the next round's charge to ``ledger.json`` before its model (write-ahead): read
        between the two, the ledger reports more ε than the model and metrics, which an audit takes for an edit.

        Args:
            reading: what the caller does, for the message (e.g. "audit it").
        Raises:
            ValidationError: a live process holds the lock (its pid named); exit 2.
        """
        from fedhype.io import lock_holder

        locks = [self.root / ".lock", self.root / "run" / ".lock"]  # a run folder, or a job folder and its run
        if self.root.name == "run":
            locks.append(self.root.parent / ".lock")  # the run of a job folder: the job's lock too
        for lock in locks:
            pid = lock_holder(lock)
            if pid is not None:
                raise ValidationError(f"{self.root} is being written by another process (pid {pid}: a training run or "
                                      "a `fedhype run` job in progress): while it trains, its ledger holds the next "
                                      "round's charge before the model is committed (write-ahead), so what is read now "
                                      f"is half-way; wait for it to finish (or stop it) and {reading} then")

    @contextlib.contextmanager
    def writer_lock(self):
        """Hold an exclusive lock on the run folder for the lifetime of a training process.

        ``fcntl.flock`` on ``<run>/.lock`` (non-blocking): the kernel releases it when the process
        exits for any reason (kill -9 included), so a lock is never stale; the file records the
        holder's pid for the message. A second writer — e.g. two ``--resume`` of the same run, which
        would both train on the private records and spend budget — is refused.

        A folder this call created is removed again if the run wrote nothing into it, and a lock file
        it created in a folder that holds no run afterwards (a refused configuration leaves nothing behind).

        Raises:
            ValidationError: another process holds the lock (the message names its pid), or the folder is a release
                (its ``privacy.json``: a release is shared as written; a lock file in it failed its audit).
        """
        if (self.root / "privacy.json").is_file():
            raise ValidationError(f"{self.root} is a release folder (it holds privacy.json): a release is shared as "
                                  "written and never trained into, so nothing was written to it; train into a new "
                                  "folder (--out, out=), or resume the run folder it was released from")
        created = not self.root.exists()
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / ".lock"
        new_lock = not path.exists()
        with exclusive_lock(path, f"run directory {self.root} is being written by another process (pid {{pid}}); "
                                  "wait for it to finish, or stop it, and run the command again"):
            try:
                yield self
            finally:  # while the lock is held; a failed cleanup must not hide why the run stopped
                with contextlib.suppress(OSError):
                    if created and [p.name for p in self.root.iterdir()] == [".lock"]:
                        path.unlink(missing_ok=True)  # a run refused before writing anything leaves no folder behind
                        self.root.rmdir()
                    elif new_lock and not self.config.exists():
                        path.unlink(missing_ok=True)  # nor a lock file in a folder it refused to write into

    def server_ckpt(self, r: int) -> Path:
        return self.root / "ckpt" / f"server-r{r}.safetensors"

    def client_dir(self, client_id: str) -> Path:
        return self.root / "clients" / str(client_id)

    def committed_round(self) -> int:
        """Number of completed rounds (0 if none)."""
        if not self.checkpoint.exists():
            return 0
        return int(read_json(self.checkpoint, "checkpoint")["rounds_done"])

    def statistics_released(self) -> bool:
        """Whether the checkpoint records the statistics release of a statistics-only run (``dp-gaussian``) as
        committed; a committed DP-SGD round (:meth:`committed_round` > 0) also implies the release ran."""
        return self.checkpoint.exists() and bool(read_json(self.checkpoint, "checkpoint").get("statistics_released"))

    def release_stage(self) -> str:
        """Where the statistics release of a run to resume stands: ``"committed"`` (a round or a statistics-only
        commit came after it), ``"saved"`` (it ran and its outputs — the model it set, or the clients' updates — were saved: a resume
        reuses them, no charge),
        ``"centre saved"`` (interrupted between a centred release's two steps: the centre's outputs are reused, the
        statistics step runs again), ``"centre partly saved"`` (the centre step failed for some clients after others'
        centres arrived: those are reused, the centre step runs again for the missing clients only, then the
        statistics step), ``"statistics partly saved"`` (the statistics step failed for some clients after
        others' updates arrived: those — and a centred release's centres — are reused, the statistics step runs again
        for the missing clients only), ``"interrupted"`` (charged write-ahead in the ledger, its outputs never saved: a
        resume releases again) or ``"not started"``."""
        if self.committed_round() > 0 or self.statistics_released():
            return "committed"
        outputs = self.root / "ckpt" / RELEASE_OUTPUTS
        if (self.root / "ckpt" / RELEASE_STATE).exists():
            return "saved"
        if outputs.exists():
            from fedhype.federated.release_outputs import saved_steps

            return {"complete": "saved", "partial": "statistics partly saved", "centre": "centre saved",
                    "partial centre": "centre partly saved"}[saved_steps(outputs)]
        if self.ledger.exists() and read_json(self.ledger, "privacy ledger", LEDGER_ADVICE).get("events"):
            return "interrupted"
        return "not started"

    def commit(self, rounds_done: int, extra: dict | None = None) -> None:
        atomic_write_json(self.checkpoint, {"rounds_done": rounds_done, **(extra or {})})
        for p in (self.root / "ckpt").glob("server-r*.safetensors"):
            if int(p.stem.split("-r")[1]) < rounds_done:
                p.unlink(missing_ok=True)


def save_model(path: Path, hnet: HyperNetwork, codes: torch.Tensor, meta: dict) -> None:
    """Write Φ and the codes ``[n_clients, code_dim]`` with JSON metadata (atomic)."""
    t = {f"hnet.{k}": v for k, v in hnet.state_dict().items()}
    t["codes"] = codes.detach()
    atomic_save_tensors(path, t, {"fedhype": json.dumps({"format": MODEL_FORMAT, **meta})})


def backfill_release_means(hnet, release_state: str | Path) -> bool:
    """Give a model trained before the release's class means were kept (NaN ``anchor_cb``) those of its run's
    release checkpoint (``run/ckpt/release-state.safetensors``: the model as the statistics release set it, public
    DP outputs, no ε). Returns True when it filled them.

    ``hnet``: a :class:`HyperNetwork`, or ``local-cvae``'s :class:`~fedhype.federated.baselines.LocalModels` (each
    client's model from its own part of the checkpoint). Only when that checkpoint shows the linear-Gaussian start
    (MLP output layer zero), the state whose class means :func:`fedhype.federated.class_stats.apply_class_stats`
    records; a model that has them is left alone.

    Raises:
        ArtifactError: the checkpoint exists but cannot be read.
    """
    release_state = Path(release_state)
    models = list(hnet.models) if hasattr(hnet, "models") else [hnet]
    prefixes = [f"local.{i}.hnet." for i in range(len(models))] if hasattr(hnet, "models") else ["hnet."]
    todo = [(m, p) for m, p in zip(models, prefixes)
            if getattr(m, "anchor_cb", None) is not None and not bool(torch.isfinite(m.anchor_cb).all())]
    if not todo or not release_state.exists():
        return False
    t = load_tensors(release_state, what="released statistics")
    filled = False
    for m, p in todo:
        cb, wo = t.get(p + "base.cb"), t.get(p + "base.wo")
        if cb is None or wo is None or bool(wo.any()):
            continue
        with torch.no_grad():
            m.anchor_cb.copy_(cb)
            if hasattr(m, "anchor_cs_cb_w") and p + "heads.cs_cb_w" in t:
                m.anchor_cs_cb_w.copy_(t[p + "heads.cs_cb_w"])
        filled = True
    return filled


def model_digest(path: str | Path) -> str | None:
    """The content digest recorded in a model file (``run/model.safetensors`` or a run directory): what a synthetic
    store's provenance names as the model it was drawn from (``fedhype audit --synthetic`` compares them). None for a
    file written without one."""
    path = Path(path)
    return tensor_metadata(path / "model.safetensors" if path.is_dir() else path).get(DIGEST_KEY)


def load_model(path: str | Path) -> tuple[HyperNetwork, torch.Tensor, dict]:
    """Read a trained model: (h_Φ, codes float32 [n_clients, code_dim], metadata).

    For a ``local-cvae`` run h is a :class:`~fedhype.federated.baselines.LocalModels` (one model
    per client; ``h(codes[i])`` is client i's θ_i, any other code raises ValidationError).

    Raises:
        ArtifactError: missing/corrupt file or wrong format.
    """
    path = Path(path)
    if path.is_dir() and path.name.endswith(".safetensors"):  # said "model not found: …/model.safetensors/model.safetensors"
        raise ArtifactError(f"model {path} is a folder, not the model file; give the run folder or its model.safetensors")
    if path.is_dir():
        path = path / "model.safetensors"
    t = load_tensors(path, what="model")
    raw = tensor_metadata(path).get("fedhype")
    try:
        meta = json.loads(raw or "{}")
    except json.JSONDecodeError:
        raise ArtifactError(f"model {path}: metadata is not valid JSON") from None
    if meta.get("format") != MODEL_FORMAT:
        # a helper's `synthesize --run PROTO` read "not a fedhype model (format None)": name what the file is
        other = meta.get("format") or tensor_metadata(path).get("format")
        kind = {"fedhype-hyperprototypes/1": "a hyper-prototype classifier (`fedhype prototypes train`)",
                "fedhype-dp-linear/1": "a DP linear classifier (`fedhype prototypes dp-linear`)",
                "fedhype-embeddings/1": "an embeddings store"}.get(other, f"not a fedhype generator (format {other!r})")
        raise ArtifactError(f"model {path}: {kind}, not a generator model; give the folder of a run (`fedhype train`, "
                            "`fedhype run`'s run/) or of a release, or its model.safetensors")
    # models written before the DP class statistics (fedhype 0.1.0) have no class bias and the
    # fixed √D·x/‖x‖ space (the buffers' defaults)
    cfg = ModelConfig(**{"class_bias": False, **meta["model"], "mmd_bandwidths": tuple(meta["model"]["mmd_bandwidths"])})
    if is_local(meta):  # local-cvae: one model per client, keyed by its code (fedhype.federated.baselines)
        hnet = load_local_models(cfg, len(meta["clients"]), t["codes"])
    else:
        hnet = HyperNetwork(cfg, torch.Generator().manual_seed(0))
    state = {k[5:]: v for k, v in t.items() if k.startswith("hnet.")}
    for k, v in hnet.state_dict().items():
        if k.endswith(("space_mean", "space_scale")) and k not in state:
            state[k] = v
    state = fill_missing_anchors(hnet, state)  # written before the release means were kept: none
    try:
        hnet.load_state_dict(state)
    except RuntimeError as exc:
        raise ArtifactError(f"model {path}: weights do not match its config ({exc})") from None
    return hnet, t["codes"], meta


def model_run_mismatches(meta: dict, config: dict, rounds_done: int | None,
                         ledger_rounds: int | None = None) -> list[dict]:
    """Where a model's metadata disagrees with the run folder it sits in: the clients' data keys and names
    (``config.json``'s ``partition``), the method and noise seed (its ``train``), the committed rounds (``checkpoint.json``) and the DP-SGD rounds its ledger
    charged. A probe copied another run's model into a run folder (trained on another partition: 613 of one
    client's training records were the run's held-out records) and the release written from it passed the audit.

    Args:
        meta: the model's metadata (:func:`load_model`); config: the run's ``config.json``.
        rounds_done: ``checkpoint.json``'s committed rounds (None: no checkpoint). The model is written just before
            the commit point, so an interrupted run's model may be one round ahead of it.
        ledger_rounds: the number of DP-SGD rounds the ledger charged (1 + the last round of its events; None: not
            compared). A model cannot have more.

    Returns:
        ``[{"name", "claimed", "recomputed", "reason"}]``, empty when the model belongs to the folder (keys a file
        does not record are not compared).
    """
    out = []
    part = config.get("partition") if isinstance(config.get("partition"), dict) else {}
    for key, mkey, what in (("keys", "data_keys", "the clients' data keys"), ("clients", "client_names", "the clients")):
        mine, theirs = meta.get(mkey), part.get(key)
        if mine is not None and theirs is not None and list(mine) != list(theirs):
            out.append({"name": f"model.safetensors: {mkey} vs config.json partition.{key}", "claimed": mine,
                        "recomputed": theirs,
                        "reason": f"the model was trained on other data than this run ({what} differ): another run's "
                                  "model, so this folder's ledger does not account for it"})
    names, recorded = meta.get("class_names"), config.get("class_names")
    if names is not None and isinstance(recorded, list) and [str(c) for c in names] != [str(c) for c in recorded]:
        out.append({"name": "model.safetensors: class_names vs config.json", "claimed": list(names),
                    "recomputed": recorded,  # a helper relabelled a model's metadata; its release and audit passed
                    "reason": "the model names its classes (label i is the i-th name) otherwise than the run recorded "
                              "when it trained: edited, or another run's model; a release would name each synthetic "
                              "class wrongly"})
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    for key, what in (("method", "the method (the one the run resolved)"), ("seed", "the noise seed")):
        if key in meta and key in train and meta[key] != train[key]:  # a second probe: dp-gaussian's or a seeded
            out.append({"name": f"model.safetensors: {key} vs config.json train.{key}", "claimed": meta[key],
                        "recomputed": train[key],  # run's model, copied in, passed every check
                        "reason": f"the model was trained with another {what} than this run: another run's model"})
    done = meta.get("rounds_done")
    if isinstance(done, int) and rounds_done is not None and done not in (rounds_done, rounds_done + 1):
        out.append({"name": "model.safetensors: rounds_done vs checkpoint.json", "claimed": done,
                    "recomputed": rounds_done,
                    "reason": "the model has another number of rounds than this run committed: another run's model"})
    if isinstance(done, int) and ledger_rounds is not None and done > ledger_rounds:
        out.append({"name": "model.safetensors: rounds_done vs the ledger's DP-SGD rounds", "claimed": done,
                    "recomputed": ledger_rounds,
                    "reason": f"the model claims {done} DP-SGD round(s), the ledger charged {ledger_rounds}: rounds no "
                              "ledger accounts for (another run's model)"})
    return out


def ledger_rounds(ledger) -> int:
    """The DP-SGD rounds a run's ledger charged: 1 + the last round of its ``dp-sgd`` events (0 without any)."""
    from fedhype.privacy.events import DP_SGD

    return 1 + max((e.round for e in ledger.events if e.mechanism == DP_SGD and e.round >= 0), default=-1)


def check_model_belongs(run_dir: str | Path) -> None:
    """Refuse a run folder whose model is not its own (:func:`model_run_mismatches` against its ``config.json``,
    ``checkpoint.json`` and ``ledger.json``): a release written from it would claim this ledger's ε for it.

    Raises:
        ArtifactError: naming the first disagreement (exit code 4).
    """
    from fedhype.privacy.ledger import PrivacyLedger

    run = RunDir(run_dir)
    if not run.model.exists() or not run.config.exists():
        return
    meta = load_model(run.model)[2]
    ledger = PrivacyLedger.load(run.ledger) if run.ledger.exists() else None
    bad = model_run_mismatches(meta, read_json(run.config, "run config"),
                               run.committed_round() if run.checkpoint.exists() else None,
                               None if ledger is None else ledger_rounds(ledger))
    if bad:
        b = bad[0]
        def brief(v):  # data keys are 32 hex digits each: their first 8 tell them apart
            return [x[:8] + "…" if isinstance(x, str) and len(x) > 12 else x for x in v] if isinstance(v, list) else v

        raise ArtifactError(f"{run.model}: {b['name']}: {brief(b['claimed'])!r} against {brief(b['recomputed'])!r}: "
                            f"{b['reason']}; put back the model this run trained (or train again)")
