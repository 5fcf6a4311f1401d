"""Reuse an embeddings store when its provenance matches (built-in datasets only).

The cache key is (dataset, encoder, weights hash, input size, limit, seed, pooling, dtype): a
store is reused only when its metadata records exactly that key, so changing any of them (or
the weights behind an encoder name) embeds again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from fedhype.data.store import EmbeddingStore
from fedhype.encoders.registry import DEFAULT_ENCODER, create_encoder
from fedhype.errors import ArtifactError


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
        image_size: encoder input side in pixels (``None``: the encoder's default).
        cache_dir: folder of cached stores (``None``: :func:`default_cache_dir`).
        pooling, device, dtype, batch_size, num_workers, progress: as for encoding.

    Returns:
        The store (``meta["cache_key"]`` holds the key; ``meta["cache_hit"]`` is not stored).

    Raises:
        ValidationError: unknown dataset or encoder, bad options.
    """
    from fedhype.data.datasets import load_builtin
    from fedhype.encoders.embed import embed_source

    enc = create_encoder(encoder, device=device, dtype=dtype, pooling=pooling, image_size=image_size)
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
    if path.is_file():
        try:
            store = EmbeddingStore.load(path)
            if store.meta.get("cache_key") == key:
                return path, key, store
        except ArtifactError:
            pass  # corrupt or foreign file: embed again and overwrite it
    return path, key, None


def cache_save(path: Path, key: dict[str, Any], store: EmbeddingStore) -> None:
    """Record ``key`` in ``store.meta`` and write it to ``path`` (atomically)."""
    store.meta["cache_key"] = key
    store.save(path)
