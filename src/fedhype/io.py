"""Atomic file writes: write to a temporary file in the same folder, fsync, then rename.

Nothing fedhype writes is ever left half-written: a reader sees the old file or the new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file, save_file

from fedhype.errors import ArtifactError, ValidationError


def _writable_target(path: str | os.PathLike) -> Path:
    """``path`` as a Path, refusing a folder (ValidationError) before any temporary file is made."""
    path = Path(path)
    if path.is_dir():
        raise ValidationError(f"{path} is a folder; give the path of the file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def check_writable_folder(out: str | os.PathLike, done: str = "nothing was done", *, shown=None,
                          is_file: bool = False) -> Path | None:
    """Refuse an ``--out`` that cannot be written, before any work: a file is created and removed in ``out`` (a
    folder), or in the nearest folder above it that exists (where ``out`` would be made; with ``is_file``, ``out``
    is a file to write and only the folders above it are probed). Permission bits do not stop
    root; a read-only mount or /proc does. Returns the folder probed (None where no folder above exists).

    Raises:
        ValidationError: naming ``shown`` (default ``out``: the ``--out`` the user gave), the folder that cannot be
            written and ``done`` (what was not done), or a file where a folder above ``out`` should be.
    """
    out = Path(out)
    shown = out if shown is None else shown
    above = next((p for p in ((() if is_file else (out.absolute(),)) + tuple(out.absolute().parents))
                  if p.exists()), None)
    if above is None:
        return None
    if not above.is_dir():
        if above == out.absolute():
            return above  # --out is an existing file: each command's own rule names it
        raise ValidationError(f"--out {shown}: {above} is a file, not a folder; give a path in a folder ({done})")
    try:
        with tempfile.NamedTemporaryFile(dir=above, prefix=".fedhype-write-check-"):
            pass
    except OSError as exc:
        raise ValidationError(f"--out {shown}: cannot write into {above} ({exc.strerror or exc}); give an --out in a "
                              f"folder you can write to ({done})") from None
    return above


def _holder_pid(fd: int) -> str:
    """The pid a lock file's holder wrote into it (:func:`exclusive_lock`), or "unknown"."""
    return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, busy: str):
    """Hold ``fcntl.flock`` on the file ``path`` (made if missing, not removed here: a caller removes it, if at all,
    inside the block, while it holds the lock) for the ``with`` block, recording this process's pid in it.

    The kernel releases the lock when the process exits for any reason (kill -9 included), so it is never stale. A
    lock taken on a file another process removed meanwhile (it had it open) is dropped and taken again on the file
    now at ``path``, so two processes never both hold ``path``.

    Raises:
        ValidationError: another process holds it: ``busy`` with the holder's pid put in for ``{pid}``.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            os.close(fd)
            raise ValidationError(busy.format(pid=holder)) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file it locked: lock the one at path now
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def lock_holder(path: str | os.PathLike) -> str | None:
    """The pid recorded in the lock file ``path`` if a live process holds it (:func:`exclusive_lock`), else None.

    Takes a shared ``flock`` for an instant: it fails exactly while a writer holds the exclusive one (the kernel drops
    a dead process's lock, so a pid left in the file of a killed writer does not count). Nothing is created.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder_pid(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


#: the format tag of a release folder's ``privacy.json`` (:mod:`fedhype.pipeline.release`)
RELEASE_FORMAT = "fedhype-release/1"


def enclosing_release(path: str | os.PathLike) -> Path | None:
    """The release folder (one holding a ``privacy.json`` of :data:`RELEASE_FORMAT`) that ``path`` — a file or folder
    to be written, existing or not — would lie inside, or None.

    A release holds only what its ``privacy.json`` lists, so nothing is written into it or any folder below it (a
    probe's ``synthesize --release`` and ``prototypes train --out`` wrote sub-folders into a received release, whose
    audit then failed; a helper's ``fedhype site --out`` and ``Partition.save`` wrote private record ids there)."""
    for folder in Path(os.path.abspath(path)).parents:
        manifest = folder / "privacy.json"
        if not manifest.is_file():
            continue
        try:
            claimed = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(claimed, dict) and claimed.get("format") == RELEASE_FORMAT:
            return folder
    return None


def refuse_inside_release(path: str | os.PathLike, what: str) -> None:
    """Refuse (``ValidationError``, exit 2) to write ``path`` inside a release folder (:func:`enclosing_release`).

    ``what`` names it for the message (an option such as ``--out``, or ``Partition.save``)."""
    release = enclosing_release(path)
    if release is not None:
        raise ValidationError(f"{what} {path} is inside the release folder {release}, which holds only what its "
                              "privacy.json lists (a file added to it fails its audit, and what may not leave the "
                              "site would leave with it): write elsewhere")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + ``os.replace``).

    Raises:
        ValidationError: ``path`` is a folder.
    """
    path = _writable_target(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


#: the largest JSON file :func:`artifact_format` parses whole (a partition of a million records is about 30 MB)
SNIFF_JSON_BYTES = 64 * 2**20


def _json_format_head(path: Path) -> str | None:
    """The top-level ``"format"`` of a large JSON file, read from its first 64 KiB: the object's leading keys are
    decoded one by one (fedhype writes ``"format"`` among the first, after at most a short ``"private"`` note);
    ``None`` if it is not found there."""
    with open(path, "rb") as fh:
        head = fh.read(65536).decode("utf-8", errors="replace")
    dec, i = json.JSONDecoder(), 0

    def skip(j: int, char: str = "") -> int:
        while j < len(head) and head[j].isspace():
            j += 1
        if char:
            if head[j:j + 1] != char:
                raise ValueError(char)
            j += 1
        return j

    try:
        i = skip(0, "{")
        for _ in range(8):
            key, i = dec.raw_decode(head, skip(i))
            value, i = dec.raw_decode(head, skip(skip(i, ":")))
            if key == "format":
                return value if isinstance(value, str) and value.startswith("fedhype-") else None
            i = skip(i, ",")
    except (ValueError, IndexError):  # not JSON, or a value running past the head
        return None
    return None


def artifact_format(path: str | os.PathLike) -> str | None:
    """The fedhype format id of an existing file, read from its header only (no tensor is loaded).

    A safetensors file carries it in the ``"fedhype"`` metadata JSON, a JSON file as its top-level
    ``"format"``. An embeddings store's id gets its kind appended: ``"fedhype-embeddings/1 (real)"``
    or ``"fedhype-embeddings/1 (synthetic)"``.

    A path that is not a regular file (a device, pipe or socket) is not opened: reading ``/dev/zero`` never ends
    and opening a pipe waits for a writer (a new user's probe gave ``--out /dev/full`` and the command was killed
    for memory). A JSON file above :data:`SNIFF_JSON_BYTES` is not parsed whole: its format is read from its first
    64 KiB, where fedhype writes it among the first keys (``{"private": "…", "format": "fedhype-partition/1", …``).

    Returns:
        e.g. ``"fedhype-partition/1"``, ``"fedhype-model/1"``; ``None`` for a file that is not a
        readable fedhype artifact (another file, or a corrupt or truncated one, or not a regular file).
    """
    path = Path(path)
    if not path.is_file():
        return None
    header: Any = None
    try:
        raw = tensor_metadata(path).get("fedhype")
        header = json.loads(raw) if raw else None
    except Exception:  # noqa: BLE001 - not a (readable) safetensors file: perhaps JSON
        try:
            if path.stat().st_size > SNIFF_JSON_BYTES:
                return _json_format_head(path)
            with open(path, encoding="utf-8") as fh:
                header = json.load(fh)
        except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return None
    if not isinstance(header, dict) or not isinstance(header.get("format"), str):
        return None
    fmt = header["format"]
    if fmt.startswith("fedhype-embeddings/"):
        meta = header.get("meta") if isinstance(header.get("meta"), dict) else {}
        fmt += f" ({meta.get('kind', 'real')})"
    return fmt


def require_file(path: Path, what: str, hint: str = "") -> None:
    """Raise :class:`ArtifactError` unless ``path`` is a regular file, saying what it is instead."""
    if path.is_file():
        return
    tail = f" ({hint})" if hint else ""
    if not path.exists():
        raise ArtifactError(f"{what} not found: {path}{tail}")
    kind = "a folder" if path.is_dir() else "not a regular file (a device, pipe or socket)"
    raise ArtifactError(f"{what} {path} is {kind}; give the file itself{tail}")


#: what to do about an unreadable file of a run folder: it cannot be re-created without training again
_RUN_FILE_ADVICE = ("it is part of a run folder that `fedhype train` wrote and cannot be re-created without training "
                    "again (which spends budget again): restore the run folder from a backup, or use the release "
                    "folder it was shared as")
_ADVICE = {"run config": _RUN_FILE_ADVICE, "checkpoint": _RUN_FILE_ADVICE,
           "site file": ("restore it from a backup, or split again into the same folder with `fedhype site --overwrite "
                         "--same-records` (the folder's site-ledger.json, its records' spend, stays with them)")}


def read_json(path: str | os.PathLike, what: str = "JSON file", advice: str | None = None) -> Any:
    """Read JSON, raising :class:`ArtifactError` naming ``path`` when missing or invalid (followed by
    ``advice`` when it is not JSON: what to do about it; default "re-create it", or for a run's ``config.json`` /
    ``checkpoint.json`` how to restore it)."""
    advice = advice or _ADVICE.get(what, "re-create it")
    path = Path(path)
    require_file(path, what)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if _looks_like_safetensors(path):
            raise ArtifactError(f"{what} {path} is a safetensors file (an embeddings store or a model?), not JSON; "
                                f"give the {what}") from None
        raise ArtifactError(f"{what} {path} is not valid JSON ({exc}); {advice}") from None
    if what in _SEALED and isinstance(obj, dict) and CONFIG_DIGEST in obj:
        rest = {k: v for k, v in obj.items() if k != CONFIG_DIGEST}
        if obj[CONFIG_DIGEST] != sealed(rest)[CONFIG_DIGEST]:
            # a helper raised train.rounds in a run's config.json by hand: the resume ran the extra rounds and blamed
            # the ε above target on a recharged round (the audit alone caught it)
            raise ArtifactError(f"{what} {path}: edited after it was written (its {CONFIG_DIGEST} does not match its "
                                "content; the resume, the audit and synthesis take the run's settings from it): "
                                f"{advice}. To train with other settings, start a new run")
        return rest
    return obj


#: the key of a sealed JSON file (:func:`sealed`: a run's config.json, a hyper-prototype model's) holding the
#: SHA-256 of the rest of it
CONFIG_DIGEST = "config_sha256"
#: the ``what`` of :func:`read_json` whose files are sealed when written: read back without the digest, and refused
#: (ArtifactError) where it does not match (files written before the seal have none and read as before)
_SEALED = ("run config",)


def sealed(obj: dict) -> dict:
    """``obj`` with :data:`CONFIG_DIGEST` set to the :func:`json_digest` of the rest of it, so that an edit by hand
    shows when the file written from it is read (:func:`read_json`). The digest is taken of the object as the file
    will hold it (JSON round trip: integer keys become strings and sort as strings), so writing and reading agree."""
    rest = {k: v for k, v in obj.items() if k != CONFIG_DIGEST}
    return {**rest, CONFIG_DIGEST: json_digest(json.loads(json.dumps(rest, default=_json_default)))}


def _looks_like_safetensors(path: Path) -> bool:
    """A safetensors file: an 8-byte little-endian header length n that fits the file, then a JSON header."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
        n = int.from_bytes(head[:8], "little")
        return len(head) == 9 and head[8:9] == b"{" and 0 < n < path.stat().st_size
    except OSError:
        return False


def atomic_save_tensors(
    path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> Path:
    """Save ``tensors`` to a safetensors file atomically (contiguous CPU copies).

    The metadata also records :data:`DIGEST_KEY`, the :func:`tensor_digest` of the tensors, which
    :func:`load_tensors` verifies: a file modified or corrupted after it was written is refused.

    Raises:
        ValidationError: ``path`` is a folder.
    """
    path = _writable_target(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        data = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        save_file(data, tmp, metadata={**dict(metadata or {}), DIGEST_KEY: tensor_digest(data)})
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def not_safetensors(path: Path) -> str | None:
    """Why ``path`` is no safetensors file, when its first bytes say so (a JSON/TOML/text file given by mistake),
    else None. A safetensors file starts with an 8-byte little-endian header length."""
    try:
        with open(path, "rb") as fh:
            start = fh.read(512)
    except OSError:
        return None
    # image signatures read as header lengths far above 2⁶⁰: never a safetensors file (a probe's PNG was "corrupt or
    # truncated (header too large)")
    for magic, kind in ((b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image")):
        if start.startswith(magic):
            return f"it is {kind}, not a safetensors file (images are embedded into a store with `fedhype embed`)"
    head, text = start[:8], start.lstrip()
    first = text.split(b"\n", 1)[0].strip()
    if re.fullmatch(rb"\[\[?[A-Za-z0-9_.\"' -]+\]\]?(\s*#.*)?", first):  # a TOML table header, e.g. [train]
        return "it is a TOML file (a config?), not a safetensors file"
    if text[:1] in (b"{", b"["):
        return "it is a JSON file (a partition, card, config or report?), not a safetensors file"
    if len(head) == 8 and int.from_bytes(head, "little") > (1 << 32) and all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return "it is a text file, not a safetensors file"
    return None


def tensor_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata of a safetensors file (``{}`` when it has none); the tensors are not read.

    Raises:
        ArtifactError: the file is missing, not a safetensors file, or its header is corrupt or truncated (naming
            ``path``; exit code 4). A probe's truncated model ended ``fedhype audit`` in an internal error.
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            return dict(fh.metadata() or {})
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types (SafetensorError, OSError)
        why = not_safetensors(Path(path)) if Path(path).is_file() else "no such file"
        raise ArtifactError(f"{path}: {why}" if why else
                            f"{path} is corrupt or truncated ({type(exc).__name__}: {exc})") from None


def load_tensors(path: str | os.PathLike, what: str = "tensor file") -> dict[str, torch.Tensor]:
    """Load a safetensors file and verify its content digest (:data:`DIGEST_KEY`, when recorded).

    Raises:
        ArtifactError: unreadable, truncated, or its tensors differ from the digest recorded when it
            was written (naming ``path``; exit code 4).
    """
    path = Path(path)
    require_file(path, what)
    try:
        tensors = load_file(str(path))
        recorded = tensor_metadata(path).get(DIGEST_KEY)
    except Exception as exc:  # safetensors raises its own error types
        why = not_safetensors(path)
        raise ArtifactError(f"{what} {path}: {why}" if why else
                            f"{what} {path} is corrupt or truncated ({type(exc).__name__}: {exc})") from None
    if recorded is not None and tensor_digest(tensors) != recorded:
        raise ArtifactError(f"{what} {path} was modified or corrupted after it was written (its content digest does not "
                            "match the one recorded in the file); restore it from a backup or rerun the step that wrote it")
    return tensors


def json_digest(obj: Any) -> str:
    """SHA-256 (hex) of ``obj`` as canonical JSON (sorted keys, no spaces, UTF-8, non-ASCII kept; paths and numpy or
    torch scalars and arrays as :func:`atomic_write_json` writes them): the same digest whatever a file's whitespace
    or key order, and the same for an object and the file written from it (federation files, a hyper-prototype
    model's config).

    Raises:
        TypeError: ``obj`` holds a value JSON cannot write.
    """
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                     default=_json_default).encode("utf-8")).hexdigest()


#: safetensors metadata key of the content digest written by :func:`atomic_save_tensors`
DIGEST_KEY = "fedhype_content_sha256"


def tensor_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes of ``tensors`` (sorted by name)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        if t.numel():  # the tensor's own bytes (a buffer, not a copy)
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

