"""Embed an :class:`~fedhype.data.sources.ImageSource` with a frozen encoder into an EmbeddingStore.

Images are decoded and transformed in DataLoader worker processes while the main process runs
batched inference; a rich progress bar on stderr shows images/s. A record whose image fails to
decode is skipped and listed in the store's metadata (or, with ``strict=True``, stops the run).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch.utils.data import DataLoader, Dataset

from fedhype import __version__
from fedhype.progress import LineProgress
from fedhype.data.sources import ImageSource
from fedhype.data.store import EmbeddingStore
from fedhype.encoders.base import Encoder
from fedhype.errors import ValidationError

_console = Console(stderr=True)


#: An image whose smaller side is below this fraction of the encoder's input side is upscaled so far that its
#: embedding says little of it (a probe's 1×1 and 2×2 images were embedded without a word): listed in the store's
#: ``meta["small_images"]`` (:func:`small_images`), which ``fedhype embed`` warns about
SMALL_IMAGE_FRACTION = 1 / 8


class _RecordDataset(Dataset):
    """Decodes and transforms one record: ``(pixels, index, "", (width, height))``; a failure becomes
    ``(zeros, index, reason, (0, 0))``."""

    def __init__(self, source: ImageSource, transform, crop: int) -> None:
        self.records = source.records
        self.transform = transform
        self.crop = crop

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        try:
            img = self.records[i].load()
            return self.transform(img), i, "", tuple(int(v) for v in img.size)
        except Exception as exc:  # noqa: BLE001 - any decode failure skips the record
            return torch.zeros(3, self.crop, self.crop), i, f"{type(exc).__name__}: {exc}", (0, 0)


def default_workers() -> int:
    """Decode workers: ``cpu_count - 1`` capped at 4 (1 on 2 cores), 0 on a single core."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(4, n - 1))


def embed_source(
    source: ImageSource,
    encoder: Encoder,
    *,
    batch_size: int = 64,
    num_workers: int | None = None,
    progress: bool = True,
    strict: bool = False,
) -> EmbeddingStore:
    """Embed every record of ``source``.

    Args:
        source: images with labels, domains and stable sample ids.
        encoder: a frozen encoder (its ``transform`` runs in the workers).
        batch_size: images per forward pass.
        num_workers: DataLoader decode workers; ``None`` → :func:`default_workers`.
        progress: show progress on stderr: a rich bar in a terminal, plain periodic lines
            (``embed: <encoder>: done/total (pct) rate img/s  t s``, every 5 s) in a pipe or log.
        strict: raise on the first image that fails to decode instead of skipping it.

    Returns:
        An :class:`EmbeddingStore` with float32 embeddings ``[N, encoder.dim]`` (N = decodable
        records) and ``meta`` holding ``kind="real"``, the encoder description, source
        provenance, counts, skipped files (``source.skipped`` plus decode failures, each
        ``{"file", "reason"}``), fedhype version, ``elapsed_s`` and ``images_per_s``, and, where some images
        have a side below :data:`SMALL_IMAGE_FRACTION` of the encoder's input, ``small_images``
        (:func:`small_images`).

    Raises:
        ValidationError: empty source, bad batch size, no decodable image, or (strict) a bad image.
    """
    if len(source) == 0:
        raise ValidationError("no images to embed: the input has no usable image files")
    if batch_size < 1:
        raise ValidationError(f"--batch-size must be ≥ 1, got {batch_size}")
    workers = default_workers() if num_workers is None else int(num_workers)
    if workers < 0:
        raise ValidationError(f"--workers must be ≥ 0, got {workers}")
    dataset = _RecordDataset(source, encoder.transform, encoder.preprocess["crop"])
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=workers, persistent_workers=False,
        pin_memory=encoder.device.type == "cuda", prefetch_factor=4 if workers else None,
    )
    chunks: list[torch.Tensor] = []
    kept: list[int] = []
    failed: list[dict[str, str]] = []
    small: list[tuple[str, int, int]] = []
    start = time.perf_counter()
    plain = LineProgress(f"embed: {encoder.id}", len(dataset), "img", every_s=5.0) \
        if progress and not _console.is_terminal else None
    with Progress(
        TextColumn("[bold]embedding[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} img/s"), TimeElapsedColumn(), TimeRemainingColumn(),
        console=_console, disable=not progress or plain is not None, transient=False,
    ) as bar:
        task = bar.add_task(encoder.id, total=len(dataset), rate="-")
        done = 0
        for pixels, index, reasons, (widths, heights) in loader:
            ok = torch.tensor([not r for r in reasons], dtype=torch.bool)
            for i, r, w, h in zip(index.tolist(), reasons, widths.tolist(), heights.tolist()):
                if r:
                    if strict:
                        raise ValidationError(f"cannot decode image {source.records[i].sample_id}: {r} (--strict)")
                    failed.append({"file": source.records[i].sample_id, "reason": r})
                elif min(w, h) < SMALL_IMAGE_FRACTION * encoder.preprocess["crop"]:
                    small.append((source.records[i].sample_id, w, h))
            if ok.any():
                chunks.append(encoder(pixels[ok]))
                kept.extend(index[ok].tolist())
            done += len(reasons)
            rate = done / max(time.perf_counter() - start, 1e-9)
            bar.update(task, advance=len(reasons), rate=f"{rate:.1f}")
            if plain is not None:
                plain.update(len(reasons))
    elapsed = time.perf_counter() - start
    if not kept:
        raise ValidationError(f"none of the {len(dataset)} images could be decoded; first failure: {failed[0]}")
    records = [source.records[i] for i in kept]
    store = EmbeddingStore(
        embeddings=torch.cat(chunks),
        labels=torch.tensor([r.label for r in records], dtype=torch.int64),
        domains=torch.tensor([r.domain for r in records], dtype=torch.int64),
        sample_ids=[r.sample_id for r in records],
        class_names=list(source.class_names),
        domain_names=list(source.domain_names),
    )
    store.meta = _metadata(source, encoder, store, list(source.skipped) + failed, elapsed, len(dataset), workers, batch_size)
    if small:
        store.meta["small_images"] = small_images(small, encoder.preprocess["crop"])
    return store


def small_images(small: list[tuple[str, int, int]], crop: int, k: int = 5) -> dict[str, Any]:
    """``meta["small_images"]``: how many images have a side below :data:`SMALL_IMAGE_FRACTION` of the encoder's
    input side ``crop``, the limit in pixels, and up to ``k`` examples (``"<id> (W×H)"``, smallest first)."""
    ex = sorted(small, key=lambda t: (min(t[1], t[2]), t[0]))[:k]
    return {"n": len(small), "below_px": SMALL_IMAGE_FRACTION * crop, "input_px": int(crop),
            "examples": [f"{sid} ({w}×{h})" for sid, w, h in ex]}


def small_images_warning(info: dict[str, Any]) -> str:
    """The one warning about ``meta["small_images"]`` (:func:`small_images`)."""
    return (f"{info['n']} image(s) have a side below {info['below_px']:g} px, 1/{round(1 / SMALL_IMAGE_FRACTION)} of "
            f"the encoder's {info['input_px']} px input (e.g. {', '.join(info['examples'])}): upscaled that far they "
            "give embeddings that say little of the image; remove them, or use larger images")


def _metadata(source, encoder, store, skipped, elapsed, n_seen, workers, batch_size) -> dict[str, Any]:
    return {
        "kind": "real",
        **encoder.describe(),
        "source": dict(source.source),
        "n": len(store),
        "n_input": n_seen,
        "class_counts": store.class_counts(),
        "domain_counts": store.domain_counts(),
        "skipped": skipped,
        "fedhype_version": __version__,
        "elapsed_s": round(elapsed, 3),
        "images_per_s": round(n_seen / max(elapsed, 1e-9), 2),
        "batch_size": batch_size,
        "num_workers": workers,
    }
