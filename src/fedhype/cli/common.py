"""Shared CLI plumbing: stderr console, ``--json`` output and error → exit-code mapping.

Contract (README, "CLI contract"): with ``--json`` a command prints exactly one JSON object on
stdout; progress and logs go to stderr. Exit codes: 0 ok, 1 runtime error, 2 usage/validation
error, 3 privacy budget would be exceeded, 4 corrupt or mismatched artifact. An error under
``--json`` is the object ``{"error": <message>, "kind": <KINDS[exit_code]>, "exit_code": <code>}``
(plus ``epsilon``/``limit`` for a budget refusal), also when Typer's parser rejects the command
line (unknown option, missing required option, a value of the wrong type: ``"kind": "usage"``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from fedhype.errors import FedhypeError
from fedhype.progress import LineProgress  # noqa: F401  (re-exported for the commands)

#: All human output and progress goes to stderr; stdout carries results only.
console = Console(stderr=True)

JsonOpt = typer.Option(False, "--json", help="Print exactly one JSON object on stdout (logs go to stderr).")

#: The ``"kind"`` of an error object, by exit code (README, exit codes).
KINDS = {1: "runtime", 2: "usage", 3: "budget", 4: "artifact", 130: "interrupted"}

_JSON_META = "fedhype.json"
_ARGV_META = "fedhype.argv"  # the raw arguments (to tell which name of a renamed option was used)


def _clean(obj: Any) -> Any:
    """Make ``obj`` strict-JSON: NaN/Inf become null, tensors/arrays become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _clean(obj.tolist())
    if hasattr(obj, "__fspath__"):
        return os.fspath(obj)
    return obj


def emit_json(result: dict[str, Any]) -> None:
    """Print one JSON object on stdout."""
    sys.stdout.write(json.dumps(_clean(result), allow_nan=False) + "\n")
    sys.stdout.flush()


def kv_table(title: str, rows: dict[str, Any]) -> Table:
    """A two-column rich table of ``rows`` (floats shown with 4 significant digits)."""
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for k, v in rows.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        table.add_row(str(k), str(v))
    return table


def client_labels(ids: list[str], names: list[str] | None) -> str:
    """``"0 (mnist), 1 (usps)"``: each client's id (the ledger's key) with its name where they differ."""
    names = list(names or ids)
    return ", ".join(str(i) if str(i) == str(n) else f"{i} ({n})" for i, n in zip(ids, names))


#: what an interrupted command that spends ε says (``fedhype run``, ``train``): resume, and what a resume charges
INTERRUPTED_TRAINING = (
    "interrupted (Ctrl-C or SIGTERM); nothing was half-written. Rerun the same command (`fedhype run`: as it was; "
    "`fedhype train`: with --resume): it reuses what finished (`fedhype run`: the cached embeddings and partition) "
    "and, if training had "
    "started, continues from the last completed round — the ledger already holds what an interrupted release or "
    "round was charged; without a seed, its rerun draws fresh noise and is charged again (`fedhype audit --run` "
    "shows the ledger; --max-epsilon refuses a rerun that would exceed it)")
#: what any other interrupted command says (a probe's Ctrl-C during `embed` was told about rounds and the ledger)
INTERRUPTED = ("interrupted (Ctrl-C or SIGTERM); nothing was half-written. Rerun the same command to start it again "
               "(remove a finished --out it refuses to overwrite)")


def run_command(
    body: Callable[[], dict[str, Any]],
    json_mode: bool,
    render: Callable[[dict[str, Any]], None] | None = None,
    interrupted: str = INTERRUPTED,
) -> None:
    """Run a command body and map its outcome to output and exit code.

    ``body`` returns the result object. With ``json_mode`` it is printed as one JSON object on
    stdout; otherwise ``render`` (or a key/value table) prints it to stdout for humans.
    A :class:`FedhypeError` exits with its ``exit_code`` after a one-line message on stderr (and,
    with ``--json``, ``{"error", "kind", "exit_code"}`` on stdout). An OSError of a path (missing, not a
    folder, no permission, read-only) exits 2 naming the path, any other OSError 1. Any other exception exits 1
    without a traceback (set ``FEDHYPE_DEBUG=1`` to see one); locals are never printed. Ctrl-C or SIGTERM exits 130
    with ``interrupted`` (:data:`INTERRUPTED`, or :data:`INTERRUPTED_TRAINING` for a command that spends ε) — unless
    it comes after the output is in place (:func:`output_committed`, or ``body`` returned): then the result is
    printed, exit 0, with a note on stderr.
    """
    _COMMIT.update(committed=False, late=[])
    with _terminate_as_interrupt(), _fedhype_warnings_as_lines():
        _run_body(body, json_mode, render, interrupted)
    if _COMMIT["late"]:
        console.print("note: the interrupt came after the output was written; it is complete", highlight=False)


def _run_body(body, json_mode, render, interrupted) -> None:
    try:
        result = body()
    except FedhypeError as exc:
        _fail(_with_flags(str(exc)), exc.exit_code, json_mode, extra=_error_extra(exc))
    except KeyboardInterrupt:
        _fail(interrupted, 130, json_mode)
    except Exception as exc:  # noqa: BLE001 - a full disk, whatever library hit it (safetensors raised its own error)
        if os.environ.get("FEDHYPE_DEBUG") or not _disk_full(exc):
            _other_error(exc, json_mode)
        else:
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            _fail(f"no space left on device{where}: free space (or give an --out elsewhere for a new run), then rerun "
                  "the same command; nothing was half-written" + (
                      " — a run resumes from its last completed round, and the ledger keeps what was already "
                      "charged (`fedhype audit --run` shows it)" if interrupted is INTERRUPTED_TRAINING else ""),
                  1, json_mode)
    else:
        output_committed()  # the body returned: its outputs are written; printing its result is not interrupted
        if json_mode:
            emit_json(result)
        elif render is not None:
            render(result)
        else:
            Console().print(kv_table("result", {k: v for k, v in result.items() if not isinstance(v, (dict, list))}))


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is the file system's "no space left" (an OSError with ENOSPC, or a library's error naming it)."""
    return (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left on device" in str(exc)


def _other_error(exc: Exception, json_mode: bool) -> None:
    """The CLI boundary for errors other than fedhype's own, Ctrl-C and a full disk (see :func:`run_command`)."""
    if os.environ.get("FEDHYPE_DEBUG"):
        raise exc
    if isinstance(exc, OSError):  # a path the user gave that cannot be read or written: say which, without a traceback
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        usage = exc.errno in _PATH_ERRNOS
        _fail(f"{exc.strerror or type(exc).__name__}{where}; " + (
            "check the paths given (e.g. --out, --store) and their permissions" if usage else
            "the machine refused the file operation (disk space, file system)"), 2 if usage else 1, json_mode)
    _fail(f"internal error: {type(exc).__name__}: {exc} (set FEDHYPE_DEBUG=1 for a traceback)", 1, json_mode)


#: whether the running command's output is in place (:func:`output_committed`) and the signals that came after
_COMMIT: dict[str, Any] = {"committed": False, "late": []}


def output_committed() -> None:
    """Mark the running command's output as in place (call it right after its last atomic rename): a Ctrl-C or
    SIGTERM from here until its result is printed no longer interrupts it — the command finished, so it prints its
    result and exits 0 (with a note), instead of exit 130 and "nothing was half-written" beside a complete file (a new
    user's `synthesize` stopped 3.6 s in said so, and a script rerunning it met "--out already exists")."""
    _COMMIT["committed"] = True


@contextlib.contextmanager
def _fedhype_warnings_as_lines():
    """fedhype's own warnings (:class:`fedhype.errors.FedhypeWarning`, raised below the CLI) printed as the command's
    other warnings are (:func:`warn`: one line, no file name or line number); other warnings as Python prints them."""
    import warnings

    from fedhype.errors import FedhypeWarning

    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, FedhypeWarning):
                warn(str(message))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (``kill``, docker stop, systemd, Slurm) handled as Ctrl-C while a command body runs: the same
    clean stop (finally blocks, atomic writes, the run lock), exit 130 and, with ``--json``, the same error
    object; after :func:`output_committed` both are noted and dropped. Only the main thread can take signals;
    elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):  # noqa: ARG001
        if _COMMIT["committed"]:
            _COMMIT["late"].append(signum)
            return
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


#: errors of a path itself (missing, not a folder, a folder, no permission, read-only): the user's to fix (exit 2)
_PATH_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.EEXIST,
                errno.ENAMETOOLONG}


def _with_flags(message: str) -> str:
    """``message`` with each configuration key this command has an option for named by that option too:
    "train.rounds must be ≥ 1" → "--rounds (train.rounds) must be ≥ 1" (the job-file key alone told a user of
    `fedhype train --rounds 0` nothing about the flag they gave); a key the message already follows with that
    option, "train.rounds (--rounds)", is turned the same way. The options are the running command's, whose
    defaults come from :func:`config_default` (``job_default = "section.key"``)."""
    import re

    import click

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return message
    flags = {}
    for param in ctx.command.params:
        key = getattr(param.default, "job_default", None)
        opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        if key and opts:
            flags[key] = opts[0]
    if not flags:
        return message
    def named(m: "re.Match") -> str:
        key, flag = m.group(1), flags.get(m.group(1))
        if flag is None or (m.group(2) and m.group(2) != f" ({flag})"):
            return m.group(0)
        # "train.rounds (--rounds) must be …" (the configuration's own refusal names the flag after the key): the
        # flag the user gave first, as for the others
        return f"{flag} ({key})"

    # a key inside quotes is the user's own input, quoted back: left as typed (a probe read "--set '--seed
    # (train.seed)=7'")
    return re.sub(r"(?<![\w.('\"-])((?:train|model|synthesis|evaluate|partition|data)\.[a-z_]+)\b(?!\))"
                  r"( \(--[a-z-]+\))?", named, message)


def _error_extra(exc: FedhypeError) -> dict[str, Any]:
    extra = {}
    for key in ("epsilon", "limit"):
        if getattr(exc, key, None) is not None:
            extra[key] = getattr(exc, key)
    return extra


def error_object(message: str, code: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``--json`` error object: ``{"error", "kind", "exit_code", **extra}``."""
    return {"error": message, "kind": KINDS.get(code, "runtime"), "exit_code": code, **(extra or {})}


def _fail(message: str, code: int, json_mode: bool, extra: dict[str, Any] | None = None) -> None:
    from rich.markup import escape

    # the message is text, not markup: "[partition]" or "[train]" in it would vanish as a style tag
    console.print(f"[bold red]error[/]: {escape(one_line(message))}", highlight=False, markup=True, soft_wrap=True)
    if json_mode:
        emit_json(error_object(message, code, extra))
    raise typer.Exit(code)


# ---------------------------------------------------------------------------- parser errors
#: The parser's usage-error class (unknown option, missing option, bad value: exit code 2), found
#: through Typer's public ``BadParameter`` so that the CLI never imports click itself.
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _usage_failure(exc: Exception) -> None:
    """Print a parser (usage) error as the one ``--json`` error object; exit 2."""
    ctx = getattr(exc, "ctx", None)
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    _fail(exc.format_message() + hint, 2, True)  # type: ignore[attr-defined]


class JsonUsageGroup(TyperGroup):
    """The root command group: with ``--json`` among the arguments, a parser error (unknown option,
    missing required option, a value of the wrong type, a missing input file) prints one JSON error
    object on stdout, ``{"error", "kind": "usage", "exit_code": 2}``, and exits 2. Without
    ``--json`` Typer's own message is kept. Used as ``typer.Typer(cls=JsonUsageGroup)``.
    """

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        json_mode = "--json" in args
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as exc:
            if json_mode:
                _usage_failure(exc)
            raise
        ctx.meta[_JSON_META] = json_mode
        ctx.meta[_ARGV_META] = list(args)
        return ctx

    def invoke(self, ctx: Any) -> Any:
        try:
            argv = ctx.meta.get(_ARGV_META) or []
            name = next((a for a in argv if a in self.commands), None)
            if name is not None:
                clash = given_twice(self.commands[name], argv[argv.index(name) + 1:])
                if clash:  # the command's usage and help, not the group's (a probe read "see `fedhype --help`")
                    import click

                    raise UsageError(clash, click.Context(self.commands[name], info_name=name, parent=ctx))
            return super().invoke(ctx)
        except UsageError as exc:
            if ctx.meta.get(_JSON_META):
                _usage_failure(exc)
            raise


#: the options (by parameter name, = their ``train.*`` keys) that set the privacy budget: never given twice with
#: different values (:func:`given_twice`)
PRIVACY_OPTIONS = ("epsilon", "delta", "noise_multiplier", "max_epsilon", "no_dp", "secure_aggregation")


def given_twice(command: Any, args: list[str]) -> str | None:
    """The message for an option of ``command`` given twice with different values in ``args``, else None.

    Click keeps the last value of an option given twice; a probe's ``fedhype train --epsilon 1 --epsilon 4`` (a
    wrapper's default and the user's own flag) charged every site ε = 4 without a word. The options that set the
    privacy budget (:data:`PRIVACY_OPTIONS`: ε, δ, σ, the ε cap, ``--no-dp``, secure aggregation; a flag and its
    ``--no-`` form included) and their ``--set train.*`` keys may be given twice only with the same value; every
    other option keeps the usual rule (the last one given is used), so a script's defaults can still be overridden.
    """
    import click

    single: dict[str, Any] = {}
    for p in getattr(command, "params", []):
        if isinstance(p, click.Option) and not p.multiple and not p.count:
            for o in (*p.opts, *p.secondary_opts):
                single[o] = p
    seen: dict[str, list[tuple[str, Any]]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        opt, eq, val = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if opt == "--set":
            item = val if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 0 if eq else 1
            key, has, value = item.partition("=")
            if has and key.strip() in {f"train.{k}" for k in PRIVACY_OPTIONS}:
                seen.setdefault(f"--set {key.strip()}", []).append((f"--set {item}", value.strip()))
        elif opt in single and single[opt].name in PRIVACY_OPTIONS:
            p = single[opt]
            if p.is_flag:
                value: Any = opt in p.opts
            else:
                raw = val if eq else (args[i + 1] if i + 1 < len(args) else None)
                i += 0 if eq else 1
                try:  # --epsilon 1 and --epsilon 1.0 agree
                    value = p.type.convert(raw, p, None) if raw is not None else None
                except Exception:  # noqa: BLE001 - a bad value is the parser's to report
                    value = raw
            # an old and a new name of one option (--split, --fractions) are the command's to reconcile: it names
            # the rename; the same name twice, or a flag and its --no- form, are caught here
            seen.setdefault(p.name if p.is_flag else f"{p.name} {opt}", []).append(
                (arg if eq or p.is_flag else f"{opt} {args[i]}", value))
        i += 1
    for uses in seen.values():
        if len({str(v) for _, v in uses}) > 1:
            return (" and ".join(u for u, _ in uses) + " contradict each other (only one would be used): give it "
                    "once")
    return None


# ---------------------------------------------------------------------------- defaults from the configuration
def config_default(section: str, key: str) -> Callable[[], Any]:
    """A ``default_factory`` for an option whose default is the configuration's ``section.key``.

    ``train`` and ``model`` read the field defaults of :class:`~fedhype.federated.config.TrainConfig`
    and :class:`~fedhype.models.config.ModelConfig` (the one source of the shipped job's defaults;
    None for a field without one); any other section reads :data:`fedhype.pipeline.config.DEFAULTS`.
    Read when the command runs or prints its help, never at import. The factory carries
    ``job_default = "section.key"`` for :class:`JobDefaultsCommand`.

    Raises (when called):
        KeyError: no such key in the section (a programming error).
    """

    def factory() -> Any:
        from dataclasses import MISSING, fields

        if section in ("train", "model"):
            from fedhype.federated.config import TrainConfig
            from fedhype.models.config import ModelConfig

            cls = TrainConfig if section == "train" else ModelConfig
            found = {f.name: f for f in fields(cls)}
            if key not in found:
                raise KeyError(f"{cls.__name__} has no field {key!r}")
            f = found[key]
            if f.default is MISSING and f.default_factory is not MISSING and key != "model":
                return f.default_factory()  # a default read when the config is made (dp_sgd_min_records)
            return None if f.default is MISSING else f.default
        from fedhype.pipeline.config import DEFAULTS

        return DEFAULTS[section][key]

    factory.job_default = f"{section}.{key}"  # type: ignore[attr-defined]
    return factory


def auto_or_count(value: Any) -> Any:
    """Typer callback of an option taking ``auto`` or an integer ≥ 1 (``--latent``): the value as ``"auto"`` or int.

    Raises:
        typer.BadParameter: anything else (exit 2, the option named by Typer).
    """
    if value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    try:
        n = int(str(value))
    except ValueError:
        n = 0
    if n < 1:
        raise typer.BadParameter(f"must be auto or an integer ≥ 1, got {value!r}")
    return n


def config_option(section: str, key: str, *flags: str, help: str, **kwargs: Any) -> Any:
    """A Typer option whose default is the configuration's ``section.key`` (:func:`config_default`)."""
    return typer.Option(..., *flags, default_factory=config_default(section, key), help=help, **kwargs)


class JobDefaultsCommand(TyperCommand):
    """A command whose ``--help`` shows the values of its :func:`config_default` defaults (read only then)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for param in self.params:
            if getattr(param.default, "job_default", None):
                value = param.default()
                param.default = value
                param.show_default = value is not None and not isinstance(value, bool)
        super().format_help(ctx, formatter)


# ---------------------------------------------------------------------------- renamed options
def renamed_option(default: Any, new: str, old: str, *, help: str, callback: Callable[[Any], Any] | None = None,
                   **kwargs: Any) -> Any:
    """An option called ``new`` that still answers to its old name ``old`` for one release.

    Using ``old`` works as before and prints ``warning: --old is deprecated …; use --new`` on
    stderr (the raw arguments are kept by :class:`JsonUsageGroup`). ``callback`` (a one-argument
    check such as :func:`existing`) runs on the value either way.
    """

    def check(ctx: typer.Context, value: Any) -> Any:
        argv = ctx.meta.get(_ARGV_META) or []
        if any(a == old or a.startswith(old + "=") for a in argv) and any(a == new or a.startswith(new + "=") for a in argv):
            raise typer.BadParameter(f"{old} is the old name of {new}; give only {new}")
        if any(a == old or a.startswith(old + "=") for a in argv):
            typer.echo(f"warning: {old} is deprecated and will be removed in the next release; use {new}", err=True)
        return callback(value) if callback is not None else value

    return typer.Option(default, new, old, help=f"{help} (Old name {old}: deprecated.)", callback=check, **kwargs)


# ---------------------------------------------------------------------------- input paths
def seed_value(value: Any) -> Any:
    """The ``callback`` of every ``--seed`` but train's (whose TrainConfig says the same): a whole number in
    [0, 2^63), what NumPy and ``torch.Generator`` take, or None. A probe's ``--seed -1`` ended in an internal error
    in six commands and was kept by two (``synthesize --seed -5`` drew as 2^64 − 5).

    Raises:
        typer.BadParameter: a seed out of that range (exit 2, naming ``--seed``).
    """
    from fedhype.pipeline.arguments import MAX_SEED

    if value is not None and not 0 <= value < MAX_SEED:
        raise typer.BadParameter(f"must be a whole number ≥ 0 and below 2^63, got {value}")
    return value


def existing(what: str, hint: str = "", *, kind: str = "file", inside: str | None = None) -> Callable[[Any], Any]:
    """A Typer option callback refusing a path that does not exist (a usage error, exit 2).

    Args:
        what: what the path should be, e.g. ``"embeddings store"``.
        hint: what to do, e.g. ``"create it with `fedhype embed`"``.
        kind: ``"file"``, ``"dir"`` or ``"any"`` (a file or a folder).
        inside: with ``kind="any"``, the file a folder must hold (``"card.json"``: a site folder given for its card).

    The message reads ``Invalid value for '--store': PATH: no such file (the embeddings store;
    create it with `fedhype embed`)``. ``None`` (option not given) and lists (repeatable options)
    are handled.
    """

    def check(value: Any) -> Any:
        for p in (value if isinstance(value, (list, tuple)) else [value]):
            if p is None:
                continue
            path = Path(p)
            tail = f" (the {what}{'; ' + hint if hint else ''})"
            if not path.exists():
                noun = {"file": "file", "dir": "folder"}.get(kind, "file or folder")
                raise typer.BadParameter(f"{path}: no such {noun}{tail}")
            if kind == "file" and path.is_dir():
                raise typer.BadParameter(f"{path} is a folder, not a file{tail}")
            if kind == "file" and not path.is_file():
                raise typer.BadParameter(f"{path} is not a regular file (a device, pipe or socket){tail}")
            if kind == "dir" and not path.is_dir():
                raise typer.BadParameter(f"{path} is a file, not a folder{tail}")
            if inside and path.is_dir() and not (path / inside).is_file():
                raise typer.BadParameter(f"{path} is a folder without {inside}{tail}")
        return value

    return check


# ---------------------------------------------------------------------------- output paths
#: What a file is, by its :func:`fedhype.io.artifact_format`, as the overwrite refusals name it.
ARTIFACT_NAMES = {
    "fedhype-embeddings/1 (real)": "a real embeddings store (written by `fedhype embed`)",
    "fedhype-embeddings/1 (synthetic)": "a synthetic embeddings store (written by `fedhype synthesize`)",
    "fedhype-partition/1": "a partition (written by `fedhype partition`)",
    "fedhype-model/1": "a trained model (written by `fedhype train`)",
    "fedhype-ledger/1": "a privacy ledger (written by `fedhype train`)",
}


def describe_artifact(fmt: str | None) -> str:
    """Human name of an artifact format id (``None``: a file that is not a fedhype artifact)."""
    if fmt is None:
        return "a file that is not a readable fedhype artifact"
    return ARTIFACT_NAMES.get(fmt, f"a {fmt} file")


@contextlib.contextmanager
def out_lock(target: Path, command: str, overwrite: bool | None = None):
    """Hold a lock on the output ``target`` while ``fedhype <command>`` writes it (``.<name>.lock`` beside it, removed
    on the way out; :func:`fedhype.io.exclusive_lock`): two commands writing the same path both said they wrote it,
    one output silently replacing the other (new users' probes: `synthesize`, then `embed`). ``overwrite``: False
    checks again, under the lock, that ``target`` was not written meanwhile (None: the caller checks).

    Raises:
        ValidationError: another process writes ``target`` (its pid named), or it appeared meanwhile.
    """
    from fedhype.errors import ValidationError
    from fedhype.io import exclusive_lock

    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / f".{target.name}.lock"
    with exclusive_lock(lock, f"{target} is being written by another `fedhype {command}` (pid {{pid}}); wait for it "
                              "to finish, or give another path"):
        try:
            if overwrite is False and target.exists():
                raise ValidationError(f"--out {target} was written meanwhile by another process; give another --out, "
                                      "or --overwrite")
            yield
        finally:
            lock.unlink(missing_ok=True)  # inside the lock


def class_list(classes: str | None) -> list[str] | None:
    """``--classes a,b,c`` as ``["a", "b", "c"]`` (None where not given).

    Raises:
        ValidationError: an empty or repeated name (a helper's ``--classes ""`` was taken as not given).
    """
    from fedhype.errors import ValidationError

    if classes is None:
        return None
    names = [k.strip() for k in classes.split(",")]
    if any(not k for k in names):
        raise ValidationError(f"--classes {classes!r} includes an empty name (a stray comma?): give the class names, "
                              "distinct and comma-separated")
    if len(set(names)) != len(names):
        twice = sorted({k for k in names if names.count(k) > 1})
        raise ValidationError(f"--classes {classes!r} names {', '.join(map(repr, twice))} more than once: give the "
                              "class names, distinct and comma-separated")
    return names


def check_out_file(out: Path, overwrite: bool, *, writes: str, command: str) -> None:
    """The one overwrite rule for a command's ``--out`` file (checked before any work is done).

    * a folder is refused;
    * an existing file is refused unless ``overwrite`` (``--overwrite``);
    * even with ``overwrite``, only a file of the kind the command writes is replaced: e.g.
      ``fedhype synthesize`` never replaces a real embeddings store, a partition or a model, and
      no command replaces a file that is not a readable fedhype artifact of its kind.

    Args:
        out: the ``--out`` path.
        writes: the :func:`fedhype.io.artifact_format` id of what the command writes, e.g.
            ``"fedhype-embeddings/1 (synthetic)"``.
        command: the command's name, e.g. ``"synthesize"``.

    Raises:
        ValidationError: (exit 2) naming the file and what it is.
    """
    from fedhype.errors import ValidationError
    from fedhype.io import artifact_format, check_writable_folder

    if out.is_dir():
        raise ValidationError(f"--out {out} is a folder; give a file name such as {out / 'out.safetensors'}"
                              if writes.startswith("fedhype-embeddings") else
                              f"--out {out} is a folder; give a file name such as {out / 'partition.json'}")
    if out.exists() and not out.is_file():  # checked before anything opens it: a pipe's open waits for a writer
        raise ValidationError(f"--out {out} is not a regular file (a device, pipe or socket): give the name of a "
                              "file to write, in a folder you can write")
    suffix = ".safetensors" if writes.startswith("fedhype-embeddings") else ".json"
    if out.suffix.lower() != suffix:  # a probe's `synthesize --out x.npy` wrote a safetensors file named .npy
        warn(f"--out {out}: `fedhype {command}` writes a {suffix[1:]} file whatever its name; name it *{suffix} so "
             "that it is read as one")
    from fedhype.pipeline.release import release_holding

    # a probe got "File exists: emb.safetensors" under a file, and `embed --out` into a read-only folder embedded
    # every image, then failed: the folder that would hold the file is probed before any work
    check_writable_folder(out, is_file=True)
    if not out.exists():
        refuse_inside_release(out, "--out")  # a file added to a release folder is outside its claim (its audit fails)
        return

    if release_holding(out) is not None:  # hashed in a release's privacy.json: replacing it breaks the release
        raise ValidationError(f"--out {out} is a file of the release folder {out.parent} (hashed in its privacy.json; "
                              "`fedhype audit --release` would report it changed): write elsewhere, even with --overwrite")
    found = artifact_format(out)
    what = describe_artifact(found)
    if not overwrite:
        raise ValidationError(f"--out {out} already exists ({what}); choose another --out, or pass --overwrite "
                              "to replace it")
    if found != writes:
        raise ValidationError(f"--out {out} is {what}, not {describe_artifact(writes)}: `fedhype {command}` does "
                              "not replace it, even with --overwrite; choose another --out (or delete the file "
                              "yourself)")


def refuse_inside_release(path: Path, option: str) -> None:
    """Refuse a file or folder to be written inside a release folder (exit 2): a release holds only what its
    ``privacy.json`` lists (:func:`fedhype.io.enclosing_release`)."""
    from fedhype.io import refuse_inside_release as refuse

    refuse(path, option)


def check_out_dir(out: Path, command: str, hint: str) -> None:
    """Refuse an ``--out`` run/job folder that is an existing file (a usage error, exit 2); one inside a release
    folder is refused by :func:`check_out_kind`, which every caller runs after this.

    Raises:
        ValidationError: naming the file; ``hint`` says what to give instead.
    """
    from fedhype.errors import ValidationError

    if out.exists() and not out.is_dir():
        raise ValidationError(f"--out {out} is a file, not a folder: `fedhype {command}` writes a folder there; {hint}")


def folder_kind(path: Path) -> str:
    """What an output folder already holds, read cheaply (no torch): ``"missing"``, ``"empty"``,
    ``"file"`` (not a folder), ``"job"`` (a ``fedhype run`` folder), ``"run"`` (a training run), ``"prototypes"`` (a
    hyper-prototype model), ``"dp-linear"`` (a DP linear reference: it spent budget), ``"site"`` (a ``fedhype site``
    folder) or ``"other"``."""
    if not path.exists():
        return "missing"
    if not path.is_dir():
        return "file"
    names = {p.name for p in path.iterdir()} - {".lock"}
    if not names:
        return "empty"
    conf: Any = None
    if "config.json" in names:
        try:
            conf = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            conf = None
    if isinstance(conf, dict):
        if str(conf.get("format", "")).startswith("fedhype-hyperprototypes"):
            return "prototypes"
        if {"data", "partition", "train"} <= set(conf) and "privacy_plan" not in conf:
            return "job"
        if "privacy_plan" in conf or "train" in conf:
            return "run"
    if "model.safetensors" in names and "ledger.json" in names and "config.json" not in names:
        return "dp-linear"
    if names & {"model.safetensors", "ledger.json", "checkpoint.json"}:
        return "run"
    if "site.json" in names or "card.json" in names:  # a probe's `train --out <site folder>` read "files fedhype did
        return "site"  # not write"
    return "other"


_KIND_WORDS = {"job": "a `fedhype run` job", "run": "a training run (its ledger records spent privacy budget)",
               "site": "a site (`fedhype site`: its split, card and ledger across runs; a run goes into a folder of "
                       "its own, and takes the site with --site)",
               "prototypes": "a hyper-prototype model", "dp-linear": "a DP linear reference (it spent privacy budget)",
               "other": "files fedhype did not write"}


def check_out_kind(out: Path, command: str, allowed: tuple[str, ...]) -> str:
    """Refuse an ``--out`` folder holding something else than ``allowed`` kinds (:func:`folder_kind`); exit 2.

    A folder that records spent privacy budget is never replaced by another command's output.
    """
    from fedhype.errors import ValidationError

    kind = folder_kind(out)
    if kind == "file":
        check_out_dir(out, command, "nothing was changed: give a new or empty folder")
    refuse_inside_release(out, "--out")
    if kind not in ("missing", "empty", *allowed):
        raise ValidationError(f"--out {out} already holds {_KIND_WORDS[kind]}; `fedhype {command}` does not write into it "
                              "(nothing was changed): give a new or empty folder")
    return kind


# ---------------------------------------------------------------------------- progress on stderr
def one_line(text: str) -> str:
    """``text`` with every control character (newlines, ESC, …; Unicode category Cc, and the line and paragraph
    separators) written as its Python escape (``\\n``, ``\\x1b``): a file or class name that holds one prints as one
    line and sends no terminal escape (a helper's file named "bad\\nskipped: nothing to see.png" printed as two
    skipped files, and one with ESC[31m turned the terminal red)."""
    import unicodedata

    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(ch) == "Cc" or ch in "\u2028\u2029" else ch for ch in text)


def warn(text: str, level: str = "warning") -> None:
    """One warning or note on stderr: ``level`` in yellow, then ``text`` as written.

    The text is escaped (a path or class name with brackets prints as it is, never as rich markup; a control
    character as its escape, :func:`one_line`) and never wrapped, so a log file keeps one line per warning. Every
    command's warnings go through here.
    """
    from rich.markup import escape

    console.print(f"[yellow]{level}[/]: {escape(one_line(text))}", highlight=False, soft_wrap=True)


def log_line(text: str) -> None:
    """One plain progress/log line on stderr (never wrapped, control characters escaped: :func:`one_line`; so log
    files keep one line per event)."""
    console.print(one_line(text), highlight=False, markup=False, soft_wrap=True)


def seeded_note(sites: bool) -> str:
    """What a seeded DP run's ε means, said by every command that trains with ``--seed`` before it spends (a new
    user's seeded `train --site` said nothing while the sites' ledgers counted the run as ε = ∞)."""
    return ("--seed makes the noise reproducible, which is not secure: whoever holds the seed (the model's metadata "
            "carries it) can regenerate the noise and remove it, so the ε of this run holds only while the seed stays "
            "secret and its release must not be shared as private" + ("; the sites' ledgers count this run as ε = ∞"
                                                                       if sites else "")
            + ". Leave out --seed (noise from OS entropy) for a release")


def round_printer(rounds: int) -> Callable[[dict], None]:
    """A progress callback printing one plain stderr line per training round (ε and held-out
    diagnostics); lines are never wrapped, so they read the same in a terminal, a pipe or a log."""

    def show(m: dict) -> None:
        eps = m.get("epsilon")
        d = m.get("diagnostics_not_dp", {})
        diag = (f"val −ELBO={d['val_neg_elbo']:.1f}  val MMD²={d['val_mmd2']:.4f}  "
                if all(isinstance(d.get(k), (int, float)) and d[k] == d[k] for k in ("val_neg_elbo", "val_mmd2")) else "")
        log_line(f"train: round {m['round'] + 1}/{rounds}  ε={'–' if eps is None else f'{eps:.3f}'}  "
                 f"{diag}({m['seconds']:.1f}s)")

    return show


def print_above_target(res: dict) -> None:
    """The line `train` and `run` print when the accountant's ε ended above the target (a recharged round)."""
    from fedhype.privacy.plan import epsilon_text

    from fedhype.privacy.ledger import charged_again_clause

    what = _recharged(res)
    console.print(f"[bold red]ε = {epsilon_text(res['epsilon'], res['target_epsilon'])} is above the target "
                  f"ε = {res['target_epsilon']:g}[/]: "
                  + (f"{charged_again_clause(what)}, interrupted before (fresh noise)" if what
                     else "the plan's noise spends more than the target (no ledger event was charged again)")
                  + " (`fedhype audit --run` names the events charged again; ledger.json keeps every release)",
                  highlight=False)


def _recharged(res: dict) -> str | None:
    """:func:`fedhype.privacy.ledger.recharged_text` of the run behind a train or run result (None if unreadable)."""
    from fedhype.privacy.ledger import PrivacyLedger, recharged_text

    run = res.get("run_dir") or (Path(res["report"]).parent / "run" if res.get("report") else None)
    try:
        return recharged_text(PrivacyLedger.load(Path(run) / "ledger.json")) if run else None
    except Exception:  # noqa: BLE001 - the line keeps its generic words; the audit checks the ledger
        return None


# ---------------------------------------------------------------------------- a site's own held-out records
def open_site(site_dir: Path, against: Any, against_name: str, run_name: str) -> tuple[Any, Any, str | None]:
    """The site of ``--site`` (a site folder from ``fedhype site``, or its ``site.json``) and its store, checked
    against what is scored on its records: ``fedhype evaluate --site`` and ``fedhype prototypes evaluate --site``.

    Args:
        site_dir: the ``--site`` path.
        against: what the site's records are compared with: a synthetic store, or any object with its ``meta``,
            ``dim`` and ``class_names`` (a model trained on one: :func:`fedhype.eval.inputs.check_provenance` reads
            the embedding provenance, the run's data keys and client names from ``meta``).
        against_name: how errors name it, e.g. ``"synthetic store syn.safetensors"``.
        run_name: how the warning names the run that made it, e.g. ``"syn.safetensors"``.

    Returns:
        ``(site, its store, warning)``: the warning (printed on stderr; None where it does not apply) that the site is
        not one of the run's clients, so whether its held-out split is held out from the run cannot be checked.

    Raises:
        ArtifactError: a missing or corrupt site file or store, another embedding, or a site the run trained on
            given with another split (its site key). ValidationError: another embedding dimension.
    """
    from fedhype.data.sites import Site
    from fedhype.eval.inputs import check_compatible, check_provenance

    s = Site.load(site_dir)
    own = s.store()
    check_provenance(own, against, f"site {s.name!r} store {s.store_path}", against_name, site=s)
    run_clients = against.meta.get("client_names")
    outsider = None
    if run_clients and s.name not in run_clients:
        # a synthetic store carries no digest of its run's data (that would not be DP), so whether this site's
        # records were in the run cannot be checked here; a probe scored a site 26 of whose 36 test records a pooled
        # run had trained on: said as a warning, in the JSON object too
        outsider = (f"site {s.name!r} is not one of the clients of the run of {run_name} "
                    f"({', '.join(run_clients)}): its test split is held out from that run only if none of its records "
                    "were in the run's training data (a run on a partition of the same store trained on them: the "
                    "scores would be optimistic); this cannot be checked from a synthetic store")
        warn(outsider)
    if own.dim != against.dim:
        check_compatible(own, against, f"site {s.name!r} store {s.store_path}", against_name)
    return s, own, outsider


def site_records(site: Any, store: Any, split: str, class_names: list[str], site_dir: Path, against_name: str,
                 minimum: int = 2, instead: str = "give another --split") -> Any:
    """``split`` records of the site of ``--site`` (:func:`open_site`), labels renumbered by name to
    ``class_names`` (the classes of ``against_name``, which may hold more than the site).

    Raises:
        ValidationError: a class of the site missing from ``class_names``, naming the site and ``against_name``;
            a split of fewer than ``minimum`` records (2 for MMD² and TRTR; no score can be computed on fewer),
            with ``instead`` as the first remedy.
    """
    from fedhype.errors import ValidationError

    try:
        records = site.records(split, list(class_names), store)
    except ValidationError as exc:
        raise ValidationError(f"site {site.name!r} ({site_dir}): {exc} of {against_name}") from None
    if len(records) < minimum:  # a probe's 3-image site had an empty test split: "real set: MMD² needs at least 2
        # samples"
        raise ValidationError(f"site {site.name!r} ({site_dir}): its {split} split holds {len(records)} record(s), and "
                              f"a score needs at least {minimum}: {instead}, or split the site again with more "
                              "records or other --fractions (`fedhype site … --overwrite`)")
    return records
