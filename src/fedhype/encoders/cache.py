"""Reuse an embeddings store when its provenance matches: built-in datasets and image folders.

For a built-in dataset the cache key is (dataset, encoder, weights hash, input size, limit,
seed, pooling, dtype). For an image folder it is the folder's content — the sorted relative
paths of the images to embed with the SHA-256 of each file's bytes, their class, domain and
split, and the files skipped — with the layout, encoder, weights hash, input size, pooling and
dtype (:func:`image_cache_key`); where the folder sits does not matter. A store is reused only
when its metadata records exactly that key, so changing any of them (a file's bytes, the
weights behind an encoder name) embeds again. The cache holds real embeddings: it lives in the
user's cache folder (:func:`default_cache_dir`), never in a run's output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable

from fedhype.data.images import EMPTY_FILE, NOT_AN_IMAGE
from fedhype.data.store import EmbeddingStore
from fedhype.encoders.registry import DEFAULT_ENCODER, create_encoder
from fedhype.errors import ArtifactError, ValidationError


def default_cache_dir() -> Path:
    """``$FEDHYPE_CACHE/embeddings`` (default ``~/.cache/fedhype/embeddings``)."""
    return Path(os.environ.get("FEDHYPE_CACHE") or Path.home() / ".cache" / "fedhype").expanduser() / "embeddings"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:60] or "x"


def cached_embed(
    dataset: str,
    encoder: str = DEFAULT_ENCODER,
    *,
    limit: int | None = None,
    seed: int = 0,
    image_size: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    pooling: str = "cls",
    device: str = "auto",
    dtype: str | None = None,
    batch_size: int = 64,
    num_workers: int | None = None,
    progress: bool = False,
) -> EmbeddingStore:
    """Embed built-in ``dataset`` with ``encoder``, or load the cached store with the same key.

    Args:
        dataset: a built-in dataset name (:func:`fedhype.data.datasets.load_builtin`).
        encoder: an encoder spec (:func:`fedhype.encoders.create_encoder`).
        limit, seed: the stratified subset of the dataset.
        image_size: encoder input side in pixels (``None`` or 0, the job default: the encoder's default).
        cache_dir: folder of cached stores (``None``: :func:`default_cache_dir`).
        pooling, device, dtype, batch_size, num_workers, progress: as for encoding.

    Returns:
        The store (``meta["cache_key"]`` holds the key; ``meta["cache_hit"]`` is not stored).

    Raises:
        ValidationError: unknown dataset or encoder, bad options.
    """
    from fedhype.data.datasets import load_builtin
    from fedhype.encoders.embed import embed_source

    enc = create_encoder(encoder, device=device, dtype=dtype, pooling=pooling, image_size=image_size or None)
    path, key, store = cache_lookup(dataset, enc, limit=limit, seed=seed, cache_dir=cache_dir)
    if store is not None:
        return store
    store = embed_source(load_builtin(dataset, limit=limit, seed=seed), enc, batch_size=batch_size,
                         num_workers=num_workers, progress=progress)
    cache_save(path, key, store)
    return store


def cache_lookup(dataset: str, enc, *, limit: int | None, seed: int,
                 cache_dir: str | os.PathLike | None = None) -> tuple[Path, dict[str, Any], EmbeddingStore | None]:
    """The cache file and key of (``dataset``, encoder ``enc``, subset), and the cached store if it matches.

    Returns ``(path, key, store)``; ``store`` is None on a miss (no file, another key, or a corrupt
    file, which the next :func:`cache_save` overwrites).
    """
    key: dict[str, Any] = {
        "dataset": dataset, "encoder": enc.id, "weights_hash": enc.weights_hash,
        "image_size": enc.preprocess["crop"], "limit": limit, "seed": int(seed), "pooling": enc.pooling,
        "dtype": enc.describe()["dtype"],
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = f"{_slug(dataset)}-{_slug(enc.id)}-{key['image_size']}px-{limit or 'all'}-s{seed}-{digest}.safetensors"
    path = Path(cache_dir or default_cache_dir()) / name
    return path, key, _cached(path, key)


def _cached(path: Path, key: dict[str, Any]) -> EmbeddingStore | None:
    """The store at ``path`` if it records exactly ``key``; None for no file, another key, or a corrupt
    or foreign file (embedded again, and overwritten by :func:`cache_save`)."""
    if not path.is_file():
        return None
    try:
        store = EmbeddingStore.load(path)
    except ArtifactError:
        return None
    return store if store.meta.get("cache_key") == key else None


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of the bytes of ``path`` (read in ``chunk``-byte pieces)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def image_files_key(source) -> dict[str, Any]:
    """The content part of an image folder's cache key: what is embedded, independent of the encoder.

    ``files`` is the SHA-256 over one line per record, sorted by relative path:
    ``path \t sha256(file bytes) \t class \t domain \t split``; the files skipped while scanning
    (``path \t reason``) are in ``skipped``. Every file of ``source`` (an ImageSource) is read once;
    byte-identical files are recorded in ``source.duplicates`` (groups of record ids, each sorted).

    Raises:
        OSError: a file vanished since the folder was scanned.
    """
    root = Path(source.source["root"])
    digests = {r.sample_id: file_sha256(root / r.sample_id) for r in source.records}
    groups: dict[str, list[str]] = {}
    for sid, h in digests.items():
        groups.setdefault(h, []).append(sid)
    source.duplicates = sorted(sorted(g) for g in groups.values() if len(g) > 1)
    lines = sorted(
        "\t".join((r.sample_id, digests[r.sample_id], source.class_names[r.label],
                   source.domain_names[r.domain], r.split or "")) for r in source.records)
    # an empty file's reason as worded when these keys were defined: a folder embedded then keeps its key (a job
    # resumed after the new wording was refused as "changed", a review)
    skipped = sorted(f"{s['file']}\t{NOT_AN_IMAGE if s['reason'] == EMPTY_FILE else s['reason']}"
                     for s in source.skipped)
    return {"kind": "image-folder", "files": hashlib.sha256("\n".join(lines).encode()).hexdigest(),
            "n_files": len(lines), "skipped": hashlib.sha256("\n".join(skipped).encode()).hexdigest(),
            "layout": source.source.get("layout")}


def image_cache_key(source, enc) -> dict[str, Any]:
    """The cache key of embedding the image-folder ``source`` with encoder ``enc``:
    :func:`image_files_key` plus the encoder, its weights hash, input size, pooling and dtype.

    Raises:
        OSError: a file vanished since the folder was scanned.
    """
    return {**image_files_key(source), "encoder": enc.id, "weights_hash": enc.weights_hash,
            "image_size": enc.preprocess["crop"], "pooling": enc.pooling, "dtype": enc.describe()["dtype"]}


def image_cache_lookup(source, enc, *, cache_dir: str | os.PathLike | None = None
                       ) -> tuple[Path, dict[str, Any], EmbeddingStore | None]:
    """The cache file and key of embedding the image-folder ``source`` with ``enc``, and the cached store on a hit.

    On a hit the store's ``meta["source"]`` is replaced by ``source.source`` (where the folder is
    now, the subset asked for); its embeddings, labels, domains and sample ids are the cached ones.
    Returns ``(path, key, store)``; ``store`` is None on a miss (no file, another key, a corrupt file).
    """
    key = image_cache_key(source, enc)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    # the name holds only the key's digest (no folder name): a renamed or moved folder finds its embeddings
    name = f"images-{_slug(enc.id)}-{key['image_size']}px-{digest}.safetensors"
    path = Path(cache_dir or default_cache_dir()) / name
    store = _cached(path, key)
    if store is not None:
        store.meta["source"] = dict(source.source)
    return path, key, store


def cached_embed_images(
    folder: str | os.PathLike,
    encoder: str = DEFAULT_ENCODER,
    *,
    layout: str = "auto",
    limit: int | None = None,
    seed: int = 0,
    image_size: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    pooling: str = "cls",
    device: str = "auto",
    dtype: str | None = None,
    strict: bool = False,
    batch_size: int = 64,
    num_workers: int | None = None,
    progress: bool = False,
    enc=None,
    warn: Callable[[str], None] | None = None,
) -> tuple[EmbeddingStore, bool]:
    """Embed the image folder ``folder``, or load the cached store of the same files (:func:`image_cache_key`).

    Args:
        folder: the image folder (:func:`fedhype.data.images.scan_image_folder`).
        encoder: an encoder spec (:func:`fedhype.encoders.create_encoder`); ignored when ``enc`` is given.
        layout: ``auto``, ``class`` or ``domain/class`` (:mod:`fedhype.data.layout`).
        limit, seed: a stratified subset of the folder's images.
        image_size: encoder input side in pixels (``None``: the encoder's default).
        cache_dir: folder of cached stores (``None``: :func:`default_cache_dir`).
        use_cache: False neither reads nor writes the cache (no copy of the embeddings is kept there).
        pooling, device, dtype, strict, batch_size, num_workers, progress: as for encoding.
        enc: an encoder already built (``fedhype embed`` builds it before scanning).
        warn: called with each warning about the folder's files (byte-identical copies, copies under two
            classes: :func:`fedhype.encoders.checks.duplicate_warnings`), cached or not; the store's own
            warnings are :func:`fedhype.encoders.checks.store_warnings`.

    Returns:
        ``(store, from_cache)``: float32 ``[N, D]`` embeddings (``meta["cache_key"]`` set when cached).

    Raises:
        ValidationError: an unreadable folder or ambiguous layout, unknown encoder, bad options.
    """
    from fedhype.data.images import scan_image_folder
    from fedhype.encoders.embed import embed_source

    if enc is None:
        enc = create_encoder(encoder, device=device, dtype=dtype, pooling=pooling, image_size=image_size or None)
    source = scan_image_folder(folder, layout=layout, strict=strict, limit=limit, seed=seed)
    if use_cache:
        path, key, store = image_cache_lookup(source, enc, cache_dir=cache_dir)
    else:
        image_files_key(source)  # hashes the files: finds byte-identical copies (the cache lookup does it too)
    if warn is not None:
        from fedhype.encoders.checks import duplicate_warnings

        for text in duplicate_warnings(source):
            warn(text)
    if use_cache and store is not None:
        if strict:
            check_strict_hit(store)
        return store, True
    store = embed_source(source, enc, batch_size=batch_size, num_workers=num_workers, strict=strict,
                         progress=progress)
    if use_cache:
        cache_save(path, key, store)
    return store, False


def check_strict_hit(store: EmbeddingStore) -> None:
    """Refuse a cached store of an image folder whose embedding skipped files that failed to decode, as embedding the
    folder with ``strict`` would have stopped on them (``fedhype embed --strict``, ``data.strict``).

    Raises:
        ValidationError: naming the first such file, its reason and how many there were.
    """
    bad = store.meta.get("skipped") or []
    if bad:
        raise ValidationError(f"cannot decode image {bad[0].get('file')}: {bad[0].get('reason')} ({len(bad)} "
                              "unreadable file(s) in this folder, found when it was embedded; remove or fix them, "
                              "or drop --strict / data.strict)")


def cache_save(path: Path, key: dict[str, Any], store: EmbeddingStore) -> None:
    """Record ``key`` in ``store.meta`` and write it to ``path`` (atomically)."""
    store.meta["cache_key"] = key
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        store.save(path)
    except OSError as exc:  # an unwritable or wrong $FEDHYPE_CACHE: say which folder, not a traceback
        raise ValidationError(f"cannot write the embedding cache {Path(path).parent}: {exc.strerror or exc} (set "
                              "$FEDHYPE_CACHE to a writable folder, or use --no-cache / data.cache_dir)") from None
