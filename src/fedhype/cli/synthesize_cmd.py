"""``fedhype synthesize``: synthetic embeddings from a trained run (DP by post-processing)."""

from __future__ import annotations

import contextlib
import glob
import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from fedhype.cli.common import (
    JsonOpt, check_out_file, console, existing, kv_table, output_committed, refuse_inside_release, run_command, seed_value,
    warn)
from fedhype.resources import available_memory, format_bytes
from fedhype.pipeline.config import DEFAULTS
from fedhype.synthesis.defaults import WARNING_NOTES

#: Samples per class when neither --per-class nor --n is given, and the code when --code is not: the
#: job's ``[synthesis]`` defaults (:data:`fedhype.pipeline.config.DEFAULTS`, their one source).
DEFAULT_PER_CLASS = DEFAULTS["synthesis"]["per_class"]
DEFAULT_CODE = DEFAULTS["synthesis"]["code"]
DEFAULT_ANCHOR = DEFAULTS["synthesis"]["anchor"]


#: Most embeddings one synthetic store holds: their sample ids ("syn/<i>") must fit the header that
#: safetensors allows (:data:`fedhype.data.store.MAX_HEADER_BYTES`, 100 MB; 5 million ids take ~75 MB).
MAX_SYNTHETIC = 5_000_000


def bytes_per_embedding(dim: int) -> int:
    """Peak memory of a draw per embedding of dimension ``dim``, in bytes: the decoded batches, their
    concatenation and the serialised copy written to disk (3 × 4·D), plus label, domain and sample id (~160)."""
    return 3 * 4 * int(dim) + 160


def bytes_on_disk(dim: int) -> int:
    """Size of one embedding in a written store, in bytes: 4·D (float32) plus label, domain and sample id (~40)."""
    return 4 * int(dim) + 40


def free_disk(path: Path) -> int | None:
    """Free bytes on the file system that would hold ``path`` (its nearest existing folder); None if unknown."""
    import shutil

    p = Path(path).absolute().parent
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def check_size(total: int, dim: int, flag: str, out: Path | None = None, copies: int = 1) -> None:
    """Refuse a draw of ``total`` embeddings of dimension ``dim`` above :data:`MAX_SYNTHETIC`, beyond memory, or
    beyond the free disk space where ``out`` (and ``copies − 1`` more copies, e.g. a release folder's) is written.

    Args:
        flag: how the user asked for ``total`` (e.g. ``"--n 10^12"``), named in the message.

    Raises:
        ValidationError: (exit 2) with the limit, or the memory or disk space needed and available.
    """
    from fedhype.errors import ValidationError

    if total > MAX_SYNTHETIC:
        raise ValidationError(
            f"{flag} asks for {total:,} synthetic embeddings; one store holds at most {MAX_SYNTHETIC:,} (its sample "
            "ids must fit the 100 MB header safetensors allows): draw several stores with different --seed")
    need, avail = total * bytes_per_embedding(dim), available_memory()
    if avail is not None and need > avail:
        raise ValidationError(
            f"{flag} asks for {total:,} synthetic embeddings of dimension {dim}, which need about {format_bytes(need)} "
            f"of memory; {format_bytes(avail)} is available: draw fewer, or several stores with different --seed")
    free = free_disk(out) if out is not None else None
    need = total * bytes_on_disk(dim) * copies
    if free is not None and need > free:  # a probe: a multi-GB store was started without a look at the disk
        raise ValidationError(
            f"{flag}: the store{' and its release copy need' if copies > 1 else ' needs'} about {format_bytes(need)} on disk "
            f"where --out {out} goes; {format_bytes(free)} is free there: free space, write elsewhere, or draw fewer")


def _auto_or_int(value: Optional[str]) -> Optional[int | str]:
    """``--per-class``: ``auto`` or an integer (its range is checked by :func:`_counts`, with advice)."""
    if value is None or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"must be auto or an integer ≥ 1, got {value!r}") from None


def _counts(per_class: Optional[int], n: Optional[int]) -> tuple[Optional[int | str], Optional[int]]:
    """``(per_class, n)`` to draw, checked: exactly one is set (``per_class`` by default: the job's
    ``synthesis.per_class``, ``"auto"``, resolved from the model by :func:`fedhype.synthesis.auto_per_class`).

    Raises:
        ValidationError: both given, or a count below 1 (the message says what to give instead).
    """
    from fedhype.errors import ValidationError

    if per_class is not None and n is not None:
        raise ValidationError("give either --per-class N (samples of every class) or --n N (a total, split by "
                              "--label-weights), not both")
    if per_class is not None and per_class != "auto" and per_class < 1:
        raise ValidationError(f"--per-class must be ≥ 1 (synthetic embeddings drawn for every class), got {per_class}; "
                              "e.g. --per-class 300, or --n N for a total over all classes")
    if n is not None and n < 1:
        raise ValidationError(f"--n must be ≥ 1 (the total number of synthetic embeddings), got {n}; e.g. --n 1000, "
                              "or --per-class N for N of every class")
    return (DEFAULT_PER_CLASS if per_class is None and n is None else per_class), n


def _check_temperature(t: float) -> float:
    from fedhype.errors import ValidationError

    from fedhype.synthesis.defaults import MAX_TEMPERATURE

    if not (math.isfinite(t) and 0 < t <= MAX_TEMPERATURE):
        raise ValidationError(f"--temperature must be > 0 and ≤ {MAX_TEMPERATURE:g}, got {t:g}: it scales the prior's "
                              "standard deviation (1 = the model's distribution, below 1 closer to the class means, "
                              "above 1 more spread out); use e.g. --temperature 1")
    return t


def _weights(text: Optional[str]) -> Optional[list[float]]:
    if text is None:
        return None
    from fedhype.errors import ValidationError

    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise ValidationError(f"--label-weights {text!r}: expected comma-separated numbers, one per class") from None


def _rounds_done(src: Path) -> int | None:
    """Rounds the run's model holds (its metadata), or None."""
    from fedhype.federated.rundir import load_model

    try:
        return int(load_model(src / "model.safetensors" if src.is_dir() else src)[2].get("rounds_done"))
    except (TypeError, ValueError):
        return None


def register(app: typer.Typer) -> None:
    @app.command("synthesize")
    def synthesize_cmd(
        run: Path = typer.Option(..., "--run", help="Run directory (or its model.safetensors).",
                                 callback=existing("run directory or model.safetensors", "train one with `fedhype train`",
                                                   kind="any")),
        out: Path = typer.Option(..., "--out", help="Synthetic embeddings store to write (.safetensors); an existing "
                                 "file is refused unless --overwrite."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out, if it is a synthetic "
                                       "store (a real embeddings store, partition or any other file is never replaced)."),
        code: str = typer.Option(DEFAULT_CODE, "--code", help="client:<id> | neutral | mix:<id>=<w>,... | mixture (every client; each class drawn from the "
                                "clients that hold it, by their DP class counts) | mixture:<id>=<w>,..."),
        per_class: Optional[str] = typer.Option(None, "--per-class", callback=_auto_or_int, metavar="auto|INTEGER",
                                                help="Samples per class (≥ 1; auto, or neither --per-class nor --n: 300 "
                                                     "from a DP model of latent 64, 3,000 from a larger one: a --no-dp "
                                                     "run's, or a DP run's L = 128 from 500 training records per class)."),
        n: Optional[int] = typer.Option(None, "--n", help="Total samples (split by --label-weights; uniform by default)."),
        label_weights: Optional[str] = typer.Option(None, "--label-weights", help="Comma-separated class weights for --n."),
        temperature: float = typer.Option(1.0, "--temperature", help="Scale of the prior's std, > 0 (1 = model distribution)."),
        anchor: bool = typer.Option(DEFAULT_ANCHOR, "--anchor/--no-anchor", help="Put each code's class means back on "
                                    "the statistics release's (post-processing, no ε; docs/method.md decision 18)."),
        seed: Optional[int] = typer.Option(None, "--seed", callback=seed_value, help="Sampling seed (default: OS entropy)."),
        release: Optional[Path] = typer.Option(None, "--release", help="Also write a release folder here: what may be "
                                               "shared (the DP model, ledger, public config, this synthetic store, "
                                               "privacy.json recomputed from the ledger), nothing else of the run; "
                                               "a --no-dp run's is not private."),
        json_out: bool = JsonOpt,
    ) -> None:
        """Decode synthetic class-conditional embeddings from the DP hypernetwork and codes."""

        def body() -> dict:
            from fedhype.data.store import FORMAT

            if release is not None and out.resolve().is_relative_to(release.resolve()):
                from fedhype.errors import ValidationError

                # a probe's --out release_x/s.safetensors --release release_x made release_x for the store, then
                # refused it as existing, and left it behind
                raise ValidationError(f"--out {out} is inside --release {release}: the release folder is written "
                                      "whole, with its own copy of the store; give an --out outside it")
            check_out_file(out, overwrite, writes=f"{FORMAT} (synthetic)", command="synthesize")
            if release is not None and release.exists():
                from fedhype.errors import ValidationError

                raise ValidationError(f"--release {release} exists; a release is written into a new folder")
            if release is not None:
                refuse_inside_release(release, "--release")
            k, total = _counts(per_class, n)
            _check_temperature(temperature)
            weights = _weights(label_weights)
            if weights is not None and total is None:  # a probe's --per-class 5 --label-weights 1,1,1 drew 5 of each
                from fedhype.errors import ValidationError

                raise ValidationError("--label-weights splits a total --n between the classes; with --per-class (or "
                                      "its default) every class gets the same count: give --n N with it")
            src = run
            if src.is_dir() and not (src / "model.safetensors").exists() and (src / "run" / "model.safetensors").exists():
                src = src / "run"  # a `fedhype run` output folder: its model is in run/
            if src.is_dir() and not (src / "model.safetensors").exists():
                from fedhype.errors import ValidationError

                raise ValidationError(f"--run {run} holds no model.safetensors: not a `fedhype train` run directory, "
                                      "or its first round has not finished; give the run directory (or the model file)")
            from fedhype.federated.rundir import RunDir, check_model_belongs, load_model

            RunDir(src if src.is_dir() else src.parent).refuse_if_training("synthesize from it")
            if src.is_dir():  # another run's model, or one relabelled by hand, is not drawn under this run's ledger
                check_model_belongs(src)
            hnet, _, meta = load_model(src / "model.safetensors" if src.is_dir() else src)
            if k == "auto":
                from fedhype.synthesis import auto_per_class

                k = auto_per_class(meta, hnet.cfg.latent)
            n_classes = hnet.cfg.n_classes
            check_size(total if total is not None else k * n_classes, hnet.cfg.dim,
                       f"--n {total}" if total is not None else f"--per-class {k} × {n_classes} classes",
                       out=out, copies=2 if release else 1)
            with _writing(out, release, overwrite):
                return _draw_and_write(src, out, release, code, k, total, weights, seed, temperature, anchor)

        run_command(body, json_out, lambda r: Console().print(kv_table("fedhype synthesize", {
            k: v for k, v in r.items() if k not in ("class_counts", "notes", "absent_classes")})))


def _draw_and_write(src, out, release, code, k, total, weights, seed, temperature, anchor) -> dict:
    import time

    from fedhype.synthesis import synthesize

    t0 = time.perf_counter()
    store = synthesize(src, code, per_class=k, n=total, label_weights=weights, seed=seed, temperature=temperature,
                       anchor=anchor)
    secs = time.perf_counter() - t0
    store.save(out)
    if release is None:
        output_committed()
    else:
        from fedhype.pipeline.release import write_release

        run_dir = src if src.is_dir() else src.parent
        conf_path = run_dir / "config.json"
        planned = None
        if conf_path.is_file():
            import json

            from fedhype.federated.config import TrainConfig

            try:
                planned = TrainConfig(**json.loads(conf_path.read_text(encoding="utf-8"))["train"]).rounds_run()
            except (KeyError, TypeError, ValueError):
                planned = None
        done = store.meta.get("rounds_done") or _rounds_done(src)
        if planned is not None and done is not None and done < planned:
            from fedhype.eval.audit_ledger import is_job_dir

            # a job's run resumes by running the job again (a helper was pointed at `train --resume`)
            how = (f"run the job again — `fedhype run` with its --config/--set and --out {run_dir.parent} — first"
                   if run_dir.name == "run" and is_job_dir(run_dir.parent)
                   else "resume the run with `fedhype train --resume` first")
            warn(f"the run has {done} of its {planned} rounds: this release holds a partly trained model ({how} for "
                 "the full one)")
        try:
            write_release(run_dir, release, synthetic=out)
            output_committed()
        except BaseException:
            # the release folder appears whole or not at all; without it the store is removed too, so that
            # the same command can be run again (a probe's interrupted run left --out and refused the rerun)
            out.unlink(missing_ok=True)
            raise
        console.print(f"wrote the release folder {release} "
                      + ("(seeded noise: not to be shared as private; its README.md and privacy.json say why)"
                         if store.meta["private"] and _noise_seeded(release) else
                         "(what may be shared)" if store.meta["private"] else
                         "(NOT private: trained with --no-dp; it must not leave the site as private data)"),
                      highlight=False, soft_wrap=True)
    m = store.meta
    if not m["private"]:
        console.print("[bold yellow]NON-PRIVATE: the run was trained with --no-dp[/]")
    for nt in m.get("notes") or ([{"kind": "codes", "text": m["codes_note"]}] if m.get("codes_note") else []):
        level = "warning" if nt["kind"] in WARNING_NOTES else "note"
        warn(nt['text'], level)
    if anchor and str(m.get("anchor", "")).startswith("none"):  # a probe: --anchor did nothing, silently
        warn(f"--anchor: {m['anchor']}; the store is drawn unanchored", "note")
    return {"store": str(out), "n": len(store), "dim": store.dim, "code": m["code"], "anchor": m.get("anchor"),
            "epsilon": m["epsilon"],
            "delta": m["delta"], "private": m["private"], "seed": m["seed"], "class_counts": dict(zip(store.class_names, store.class_counts())),  # as embed's (a probe: a list here)
            "absent_classes": [a["class"] for a in m.get("absent_classes") or []],
            "notes": [nt["text"] for nt in m.get("notes") or []],
            "embeddings_per_s": len(store) / max(secs, 1e-9), "release": None if release is None else str(release)}


@contextlib.contextmanager
def _writing(out: Path, release: Path | None, overwrite: bool):
    """Hold a lock on ``--out`` (and ``--release``) while a synthetic store (and its release) is drawn and written, and
    check again under it what was checked before: two `synthesize` runs into the same --out or --release both said
    they wrote it, one store silently replacing the other (a new user's probe). The lock files
    (``.<name>.lock`` beside each) are removed on the way out.

    Raises:
        ValidationError: another `synthesize` writes the same --out or --release (its pid named), or it appeared
            meanwhile (an existing --out without --overwrite, an existing --release).
    """
    from fedhype.cli.common import out_lock
    from fedhype.errors import ValidationError

    targets = [out] + ([release] if release is not None else [])
    with contextlib.ExitStack() as stack:
        for target in targets:
            stack.enter_context(out_lock(target, "synthesize"))
        if out.exists() and not overwrite:
            raise ValidationError(f"--out {out} was written meanwhile by another process; give another --out, or "
                                  "--overwrite")
        # what a writer killed with SIGKILL leaves (its temporary store, a release's staging folder): named, not
        # removed — another program could be writing the same path (a probe found 1.2 GB of them, never cleaned up)
        stale = [*out.parent.glob(f".{glob.escape(out.name)}.*.tmp")] + (
            [p for p in release.parent.glob(f".{glob.escape(release.name)}.*") if p.is_dir()] if release is not None
            else [])
        if stale:
            warn(f"{len(stale)} temporary file(s) of an earlier write that was killed are beside the output (e.g. "
                 f"{stale[0]}): unless another program writes the same path now, delete them to free the space")
        if release is not None and release.exists():
            raise ValidationError(f"--release {release} was written meanwhile by another process; a release is written "
                                  "into a new folder")
        yield


def _noise_seeded(release: Path) -> bool:
    """Whether the release's training noise was seeded (its privacy.json, recomputed from the ledger)."""
    import json

    try:
        return bool(json.loads((release / "privacy.json").read_text(encoding="utf-8")).get("noise_seeded"))
    except (OSError, ValueError, AttributeError):
        return False
