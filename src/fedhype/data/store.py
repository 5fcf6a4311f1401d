"""The embeddings store: the one file format every stage reads (real and synthetic alike).

A store is a single safetensors file holding

* ``embeddings`` — float32 ``[N, D]``
* ``labels`` — int64 ``[N]`` class index in ``0 .. n_classes-1``
* ``domains`` — int64 ``[N]`` domain / client-of-origin index

and, in the safetensors header metadata under the key ``"fedhype"``, one JSON object with the
format version, ``sample_ids`` (N unique strings, stable across runs), ``class_names``,
``domain_names``, ``kind`` (``"real"`` or ``"synthetic"``), free-form provenance (encoder id and
weights hash, preprocessing, source, skipped files, or for synthetic stores the run, ε, δ and
code spec) and a SHA-256 digest of the tensors. Being one file, a store is written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from fedhype.errors import ArtifactError, ValidationError
from fedhype.io import atomic_save_tensors, require_file, tensor_digest

FORMAT = "fedhype-embeddings/1"
_META_KEY = "fedhype"
#: safetensors refuses to write (or read) a header above 100,000,000 bytes; a store's header holds
#: its sample ids, so this bounds the number of rows one store can have (~5 million synthetic ids).
MAX_HEADER_BYTES = 100_000_000


def opaque_id(sample_id: str) -> str:
    """The id a partition lists for a record: BLAKE2b-80 of its sample id, as 20 hex digits.

    A partition file then names no file path and no class folder, and still applies to every store of
    the same images (another encoder). It is not a secret: whoever guesses a path can check its hash,
    so a partition stays private to the data holder.
    """
    return hashlib.blake2b(sample_id.encode("utf-8"), digest_size=10).hexdigest()


@dataclass
class EmbeddingStore:
    """Embeddings with labels, domain ids and stable sample ids.

    Attributes:
        embeddings: float32 tensor ``[N, D]``.
        labels: int64 tensor ``[N]``, values in ``[0, len(class_names))``.
        domains: int64 tensor ``[N]``, values in ``[0, len(domain_names))``.
        sample_ids: ``N`` unique strings.
        class_names: names of the classes, index = label.
        domain_names: names of the domains, index = domain id.
        meta: JSON-serialisable provenance (``kind``, ``encoder``, ``source``, ...).

    Raises:
        ValidationError: on construction, if shapes, dtypes or ids are inconsistent.
    """

    embeddings: torch.Tensor
    labels: torch.Tensor
    domains: torch.Tensor
    sample_ids: list[str]
    class_names: list[str]
    domain_names: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.embeddings = torch.as_tensor(self.embeddings).to(torch.float32).contiguous()
        self.labels = torch.as_tensor(self.labels).to(torch.int64).contiguous()
        self.domains = torch.as_tensor(self.domains).to(torch.int64).contiguous()
        self.sample_ids = [str(s) for s in self.sample_ids]
        self.validate()

    # ------------------------------------------------------------------ properties
    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    def __repr__(self) -> str:
        """A one-line summary (the dataclass's own repr printed every embedding and sample id: a new user's
        ``print(store)`` of 960 images ran to tens of KB): size, D, kind, classes and domains (five named)."""
        from fedhype.errors import listed

        return (f"EmbeddingStore({len(self)} × {self.dim}, kind={self.kind!r}, {self.n_classes} classes "
                f"[{listed(self.class_names)}], {len(self.domain_names)} domains [{listed(self.domain_names)}])")

    @property
    def dim(self) -> int:
        """Embedding dimension D."""
        return int(self.embeddings.shape[1])

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def kind(self) -> str:
        return str(self.meta.get("kind", "real"))

    def class_counts(self) -> list[int]:
        """Number of records per class (length ``n_classes``)."""
        return torch.bincount(self.labels, minlength=self.n_classes).tolist()

    def domain_counts(self) -> list[int]:
        """Number of records per domain (length ``len(domain_names)``)."""
        return torch.bincount(self.domains, minlength=len(self.domain_names)).tolist()

    # ------------------------------------------------------------------ checks
    def validate(self, where: str = "embeddings store") -> None:
        """Check shapes, dtypes, label/domain ranges, finiteness and id uniqueness.

        Raises:
            ValidationError: naming ``where`` and the field at fault (for NaN/Inf embeddings: the
                first bad row index, its sample id and the number of bad rows).
        """
        e = self.embeddings
        if e.ndim != 2:
            raise ValidationError(f"{where}: 'embeddings' must be 2-D [N, D], got shape {tuple(e.shape)}")
        n = e.shape[0]
        for name, t in (("labels", self.labels), ("domains", self.domains)):
            if t.shape != (n,):
                raise ValidationError(f"{where}: '{name}' must have shape [{n}], got {tuple(t.shape)}")
        if len(self.sample_ids) != n:
            raise ValidationError(f"{where}: {len(self.sample_ids)} sample_ids for {n} embeddings")
        if len(set(self.sample_ids)) != n:
            raise ValidationError(f"{where}: sample_ids are not unique")
        if not self.class_names:
            raise ValidationError(f"{where}: 'class_names' is empty")
        if not self.domain_names:
            raise ValidationError(f"{where}: 'domain_names' is empty")
        if n:
            if int(self.labels.min()) < 0 or int(self.labels.max()) >= len(self.class_names):
                raise ValidationError(f"{where}: labels outside [0, {len(self.class_names)})")
            if int(self.domains.min()) < 0 or int(self.domains.max()) >= len(self.domain_names):
                raise ValidationError(f"{where}: domain ids outside [0, {len(self.domain_names)})")
            # one pass without a [N, D] mask: a row sum is finite unless the row holds NaN/Inf (or overflows,
            # which the exact check below then clears)
            bad = torch.zeros(0, dtype=torch.int64) if bool(torch.isfinite(e.sum(dim=1)).all()) \
                else (~torch.isfinite(e)).any(dim=1).nonzero().flatten()
            if bad.numel():
                i = int(bad[0])
                raise ValidationError(f"{where}: embeddings contain NaN or Inf: first at row {i} (sample id "
                                      f"{self.sample_ids[i]!r}), {bad.numel()} of {n} rows in all")

    # ------------------------------------------------------------------ selection
    def subset(self, index: np.ndarray | torch.Tensor | list[int]) -> "EmbeddingStore":
        """A new store with the rows ``index`` (int positions), metadata copied."""
        idx = torch.as_tensor(np.asarray(index, dtype=np.int64))
        return EmbeddingStore(
            embeddings=self.embeddings[idx],
            labels=self.labels[idx],
            domains=self.domains[idx],
            sample_ids=[self.sample_ids[i] for i in idx.tolist()],
            class_names=list(self.class_names),
            domain_names=list(self.domain_names),
            meta=dict(self.meta),
        )

    def positions(self, sample_ids: list[str]) -> np.ndarray:
        """Row positions of ``sample_ids`` (the store's own ids, or their :func:`opaque_id` as a partition lists them).

        Raises:
            ArtifactError: if an id is not in this store (a partition made from another store).
        """
        lookup = self._lookup(opaque=False)
        if not lookup.keys() >= set(sample_ids):
            # a partition's opaque ids (fedhype.data.partition.opaque_id), possibly beside plain ones
            lookup = self._lookup(opaque=True)
        try:
            return np.fromiter((lookup[s] for s in sample_ids), dtype=np.int64, count=len(sample_ids))
        except KeyError as exc:
            raise ArtifactError(
                f"sample id {exc.args[0]!r} is not in this embeddings store; "
                "the partition was made from a different store"
            ) from None

    def _lookup(self, opaque: bool) -> dict[str, int]:
        """id → row, built once per store (again only if ``sample_ids`` is replaced or grows): one client's rows
        used to rebuild it over every id, quadratic in the clients (10,000 clients of 40 records: hours)."""
        cache = self.__dict__.get("_lookups")
        if cache is None or cache[0] is not self.sample_ids or cache[1] != len(self.sample_ids):
            cache = (self.sample_ids, len(self.sample_ids), {})  # holds the list: its identity stays unique
            self.__dict__["_lookups"] = cache
        tables = cache[2]
        if opaque not in tables:
            lookup = {s: i for i, s in enumerate(self.sample_ids)}
            if opaque:
                lookup.update({opaque_id(s): i for i, s in enumerate(self.sample_ids)})
            tables[opaque] = lookup
        return tables[opaque]

    # ------------------------------------------------------------------ persistence
    def tensors(self) -> dict[str, torch.Tensor]:
        return {"embeddings": self.embeddings, "labels": self.labels, "domains": self.domains}

    def digest(self) -> str:
        """SHA-256 over the tensors (see :func:`fedhype.io.tensor_digest`)."""
        return tensor_digest(self.tensors())

    def save(self, path: str | os.PathLike) -> Path:
        """Write the store atomically to ``path`` (a ``.safetensors`` file).

        Raises:
            ValidationError: ``path`` is a folder, or inside a release folder (:func:`fedhype.io.enclosing_release`),
                or the header (sample ids, names, metadata) would exceed safetensors' :data:`MAX_HEADER_BYTES` (too many
                rows for one store).
        """
        from fedhype.io import refuse_inside_release

        refuse_inside_release(path, "the store")
        header = {
            "format": FORMAT,
            "n": len(self),
            "dim": self.dim,
            "class_names": self.class_names,
            "domain_names": self.domain_names,
            "sample_ids": self.sample_ids,
            "digest": self.digest(),
            "meta": self.meta,
        }
        text = json.dumps(header, default=str)
        size = len(text.encode("utf-8"))
        if size > MAX_HEADER_BYTES - 1_000_000:  # the tensor entries of the header need a little room too
            raise ValidationError(
                f"{path}: {len(self)} embeddings are too many for one store: its header (sample ids and metadata) "
                f"would be {size / 1e6:.0f} MB, above the {MAX_HEADER_BYTES / 1e6:.0f} MB safetensors allows; "
                "write several smaller stores")
        return atomic_save_tensors(path, self.tensors(), {_META_KEY: text})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "EmbeddingStore":
        """Read and validate a store.

        Raises:
            ArtifactError: missing, truncated, corrupt or mismatched file (exit code 4).
        """
        path = Path(path)
        require_file(path, "embeddings store", "create it with `fedhype embed`")
        try:
            with safe_open(str(path), framework="pt") as fh:
                raw = (fh.metadata() or {}).get(_META_KEY)
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        except Exception as exc:
            from fedhype.io import not_safetensors

            why = not_safetensors(path)
            raise ArtifactError(f"embeddings store {path}: {why}; give an embeddings store (.safetensors): `fedhype embed` writes a real one, `fedhype synthesize` a synthetic one" if why
                                else f"embeddings store {path} is corrupt or truncated ({exc}); re-create it") from None
        if raw is None:
            raise ArtifactError(f"{path} is a safetensors file but not a fedhype embeddings store (no metadata)")
        try:
            header = json.loads(raw)
        except json.JSONDecodeError:
            raise ArtifactError(f"embeddings store {path}: metadata is not valid JSON") from None
        if header.get("format") != FORMAT:
            raise ArtifactError(f"embeddings store {path}: format {header.get('format')!r}, expected {FORMAT!r}")
        missing = {"embeddings", "labels", "domains"} - set(tensors)
        if missing:
            raise ArtifactError(f"embeddings store {path}: missing tensors {sorted(missing)}")
        if tensors["embeddings"].dtype != torch.float32 or tensors["labels"].dtype != torch.int64:
            raise ArtifactError(f"embeddings store {path}: wrong dtypes (embeddings float32, labels int64 expected)")
        if tensor_digest(tensors) != header.get("digest"):
            raise ArtifactError(f"embeddings store {path}: tensor digest mismatch (file modified or corrupt)")
        try:
            store = cls(
                embeddings=tensors["embeddings"],
                labels=tensors["labels"],
                domains=tensors["domains"],
                sample_ids=header["sample_ids"],
                class_names=header["class_names"],
                domain_names=header["domain_names"],
                meta=header.get("meta", {}),
            )
        except (ValidationError, KeyError) as exc:
            raise ArtifactError(f"embeddings store {path}: {exc}") from None
        if store.dim != header.get("dim") or len(store) != header.get("n"):
            raise ArtifactError(f"embeddings store {path}: header says n={header.get('n')}, dim={header.get('dim')}")
        return store

    def summary(self) -> dict[str, Any]:
        """Small JSON-able description (no data)."""
        return {
            "n": len(self),
            "dim": self.dim,
            "kind": self.kind,
            "classes": self.class_names,
            "domains": self.domain_names,
            "class_counts": self.class_counts(),
            "domain_counts": self.domain_counts(),
        }


def _nearest_two(a: "EmbeddingStore", b: "EmbeddingStore", chunk: int = 4096) -> "torch.Tensor | None":
    """For each row of ``a``, the Euclidean distances [N_a, 2] float64 to its nearest and second-nearest rows of ``b``
    (inf where ``b`` has fewer), both scaled to unit norm, computed in chunks of ``chunk`` rows; None where the
    dimensions differ or ``b`` is empty. In float64: ``torch.cdist``'s matrix-product path in float32 puts a row
    ~3e-4 from itself (a store against itself found 24 of its 36 rows within 1e-4)."""
    from torch.nn.functional import normalize

    x, y = normalize(a.embeddings.to(torch.float64), dim=1), normalize(b.embeddings.to(torch.float64), dim=1)
    if x.shape[1] != y.shape[1] or not len(y):
        return None
    out = torch.full((len(x), 2), float("inf"), dtype=torch.float64)
    for i in range(0, len(x), chunk):
        best = out[i:i + chunk]
        for j in range(0, len(y), chunk):
            best = torch.cat([best, torch.cdist(x[i:i + chunk], y[j:j + chunk])], 1).topk(2, dim=1, largest=False).values
        out[i:i + chunk] = best
    return out


def near_duplicates(a: "EmbeddingStore", b: "EmbeddingStore", tol: float, chunk: int = 4096) -> int:
    """How many rows of ``a`` have a row of ``b`` within Euclidean distance ``tol`` once both are scaled to unit
    norm: the same images, embedded again or renamed (both [N, D], compared in float64 in chunks of ``chunk``
    rows; 0 where the dimensions differ). Scale of ``tol``: the bundled DINOv2's bfloat16 and float32 embeddings of
    one image are ≤ 0.03 apart (cosine ≥ 0.99957, benchmarks/results/embed_dtype.md), the nearest two distinct
    records of the bundled digits' test split 0.117."""
    d = _nearest_two(a, b, chunk)
    return 0 if d is None else int((d[:, 0] <= tol).sum())


def same_images(a: "EmbeddingStore", b: "EmbeddingStore", tol: float, ratio: float = 0.5,
                chunk: int = 4096) -> int:
    """How many rows of ``a`` are, by their embeddings, one of ``b``'s images: within ``tol`` of their nearest row of
    ``b`` (Euclidean, both scaled to unit norm) *and* at most ``ratio`` times as far from it as from the second
    nearest (Lowe's ratio test, Lowe 2004, Sec. 7.1): a distance alone cannot tell the same image from a near one
    where an encoder maps distinct images close together (a random tiny DINOv2 put two sites' distinct digits
    0.0095 apart, less than their own nearest pairs). Both [N, D], compared in float64, in chunks of ``chunk`` rows; 0 where the
    dimensions differ. Exact duplicates within ``b`` (both at distance 0) still count."""
    d = _nearest_two(a, b, chunk)
    return 0 if d is None else int(((d[:, 0] <= tol) & (d[:, 0] <= ratio * d[:, 1])).sum())
