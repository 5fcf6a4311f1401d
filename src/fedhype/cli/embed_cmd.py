"""``fedhype embed``: images (a folder or a built-in dataset) → embeddings store, via a frozen encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from fedhype.cli.choices import DTYPES, LAYOUTS, POOLINGS, choice
from fedhype.cli.common import (JsonOpt, check_out_file, console, existing, log_line, one_line, out_lock, run_command,
                                seed_value, warn)
from fedhype.errors import ValidationError


def _check_options(dataset: str | None, dtype: str | None, device: str, batch_size: int, workers: int | None,
                   limit: int | None) -> None:
    """The cheap checks, before a model is loaded or a folder scanned (``create_encoder`` then checks
    --encoder, --pooling and --image-size before it loads weights).

    Raises:
        ValidationError: unknown --dataset, or a bad --dtype, --device, --batch-size, --workers or --limit.
    """
    from fedhype.encoders.base import resolve_device, resolve_dtype

    if dataset is not None:
        from fedhype.data.datasets import BUILTIN_DATASETS

        if dataset not in BUILTIN_DATASETS:
            raise ValidationError(f"unknown built-in dataset {dataset!r}; available: {', '.join(BUILTIN_DATASETS)}")
    resolve_dtype(dtype, resolve_device(device))
    if batch_size < 1:
        raise ValidationError(f"--batch-size must be ≥ 1, got {batch_size}")
    if workers is not None and workers < 0:
        raise ValidationError(f"--workers must be ≥ 0, got {workers}")
    if limit is not None and limit < 1:
        raise ValidationError(f"--limit must be ≥ 1, got {limit}")


def _render(result: dict[str, Any]) -> None:
    out = Console()
    table = Table(title=f"embeddings store {result['store']}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key in ("n", "dim", "encoder", "weights_hash", "image_size", "images_per_s"):
        table.add_row(key, str(result[key]))
    table.add_row("classes", ", ".join(f"{k}: {v}" for k, v in result["class_counts"].items()))
    table.add_row("domains", ", ".join(f"{k}: {v}" for k, v in result["domain_counts"].items()))
    if result.get("layout"):
        table.add_row("layout", str(result["layout"]))
    if result.get("splits"):
        table.add_row("given splits", ", ".join(f"{k}: {v}" for k, v in result["splits"].items()))
    skipped = result["skipped"] or []
    # the first SHOWN were named on stderr as the scan found them (`skipped:` lines); the summary names the next ones
    # (a helper read each skipped file twice, once per stream)
    where = ("" if not skipped else " (each named on stderr, and in --json)" if len(skipped) <= SHOWN else
             f" (the first {SHOWN} named on stderr, the next ones below; every one in --json)")
    table.add_row("skipped", f"{len(skipped)}{where}")
    table.add_row("from cache", str(result.get("from_cache", False)))
    out.print(table)
    for s in skipped[SHOWN:SHOWN + 20]:
        out.print(one_line(f"  skipped {s['file']}: {s['reason']}"), highlight=False, markup=False)
    if len(skipped) > SHOWN + 20:
        out.print(f"  ... and {len(skipped) - SHOWN - 20} more (see --json)")


def embed(
    images: Path | None = typer.Option(None, "--images", help="Folder of <class>/<image> or <domain>/<class>/<image> files "
                                       "(see --layout); train/, val/, test/ folders give splits.",
                                       callback=existing("image folder", "one sub-folder per class, or per domain holding "
                                                         "class folders", kind="dir")),
    layout: str = typer.Option("auto", "--layout", help="--images: class (<class>/..., nested folders stay in their "
                               "class, as torchvision ImageFolder) | domain/class | auto (detected where unambiguous, "
                               "else refused).", click_type=choice(LAYOUTS)),
    dataset: str | None = typer.Option(None, "--dataset", help="Built-in dataset: digits-domains | fashion-mnist."),
    encoder: str = typer.Option("dinov2-vits14", "--encoder", help="dinov2-vits14 | efficientnet-lite0 | hf:<hub-id-or-dir> | timm:<name>."),
    weights: Path | None = typer.Option(None, "--weights", help="Weights file for timm: encoders (safetensors or torch state dict).",
                                        callback=existing("encoder weights file")),
    pooling: str = typer.Option("cls", "--pooling", help="Transformer token pooling: cls | mean.", click_type=choice(POOLINGS)),
    image_size: int | None = typer.Option(None, "--image-size", help="Encoder input side in pixels (default: the encoder's own: 112 for "
                                            "dinov2-vits14, 224 for efficientnet-lite0; `fedhype run` and fedhype.embed use the same)."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda."),
    dtype: str = typer.Option("auto", "--dtype", help="auto | float32 | bfloat16 | float16. auto: bfloat16 autocast on GPUs "
                              "and on CPUs with AMX-BF16 (3.28× float32 measured there) or AMD CPUs with AVX512-BF16 (1.90×), float32 "
                              "elsewhere (AVX512-BF16 on an Intel CPU without AMX measured 0.56× float32).", click_type=choice(DTYPES)),
    batch_size: int = typer.Option(64, "--batch-size", help="Images per forward pass."),
    workers: int | None = typer.Option(None, "--workers", help="Image decoding worker processes (default: cores − 1, at most 4)."),
    limit: int | None = typer.Option(None, "--limit", help="Keep a stratified (domain, class) subset of at most N images."),
    seed: int = typer.Option(0, "--seed", callback=seed_value, help="Seed of the --limit subset."),
    strict: bool = typer.Option(False, "--strict", help="Stop on the first unreadable image instead of skipping it."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Embed again even when the embedding cache ($FEDHYPE_CACHE, "
                                  "default ~/.cache/fedhype) holds these embeddings (an image folder is matched by its "
                                  "files' content); with --images nothing is written to the cache either."),
    out: Path = typer.Option(..., "--out", help="Embeddings store to write (.safetensors); an existing file is refused "
                             "unless --overwrite."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out, if it is a real embeddings "
                                   "store (a synthetic store, partition or any other file is never replaced)."),
    json_mode: bool = JsonOpt,
) -> None:
    """Embed images with a frozen pretrained encoder and write an embeddings store."""

    def body() -> dict[str, Any]:
        if (images is None) == (dataset is None):
            raise ValidationError("give exactly one of --images DIR or --dataset NAME")
        if dataset is not None and layout != "auto":
            raise ValidationError(f"--layout {layout} applies to --images folders; a built-in --dataset has its own domains")
        from fedhype.data.store import FORMAT

        check_out_file(out, overwrite, writes=f"{FORMAT} (real)", command="embed")
        _check_options(dataset, dtype, device, batch_size, workers, limit)
        # one writer of --out at a time (a helper's two embeds into one path both said they wrote it)
        with out_lock(out, "embed", overwrite):
            return written()

    def written() -> dict[str, Any]:
        """Embed (or reuse the cache) and write --out, under its lock."""
        from fedhype.encoders import create_encoder
        from fedhype.encoders.embed import embed_source

        # create_encoder checks --encoder, --pooling and --image-size before it loads weights
        enc = create_encoder(encoder, device=device, dtype=dtype, pooling=pooling, image_size=image_size,
                             weights=str(weights) if weights else None)
        if images is not None:
            from fedhype.data.images import scan_image_folder
            from fedhype.encoders.cache import cache_save, check_strict_hit, image_cache_lookup, image_files_key

            source = scan_image_folder(images, layout=layout, strict=strict, limit=limit, seed=seed)
            src = source.source
            log_line(f"embed: {images} read as layout {src['layout']!r}" + (" (detected)" if layout == "auto" else "")
                     + f": {len(source.class_names)} classes, {len(source.domain_names)} domain(s)"
                     + (f", given splits {src['split_counts']}" if src.get("splits") else ""))
            cache_path, cache_key, hit = (None, None, None) if no_cache else image_cache_lookup(source, enc)
            if no_cache:
                image_files_key(source)  # hashes the files: finds byte-identical copies (the cache lookup does it too)
            _warn_duplicates(source)
            _warn_skipped(source)  # before a cache hit too (a helper's rerun listed them in the JSON only)
            if hit is not None:
                if strict:  # files that failed to decode when the folder was embedded (a review: skipped silently)
                    check_strict_hit(hit)
                hit.save(out)
                console.print(f"reused the cached embeddings {cache_path} (the same files, layout, encoder, weights, "
                              f"size; --no-cache embeds again); wrote {out} ({len(hit)} × {hit.dim})", highlight=False)
                _warn_store(hit, out, limit, images=True)
                return _summary(out, hit, enc, cached=True, duplicates=source.duplicates, source=source)
        else:
            from fedhype.data.datasets import load_builtin
            from fedhype.encoders.cache import cache_lookup

            cache_path, cache_key, hit = cache_lookup(dataset, enc, limit=limit, seed=seed)
            if hit is not None and not no_cache:
                hit.save(out)
                console.print(f"reused the cached embeddings {cache_path} (same dataset, encoder, weights, size, "
                              f"subset; --no-cache embeds again); wrote {out} ({len(hit)} × {hit.dim})", highlight=False)
                _warn_store(hit, out, limit, images=False)
                return _summary(out, hit, enc, cached=True)
            source = load_builtin(dataset, limit=limit, seed=seed)
            _warn_skipped(source)
        log_line(f"encoder {enc.id}: {enc.dim}-d, {enc.preprocess['crop']} px, {enc.device}, "
                 f"{enc.describe()['dtype']}; {len(source)} images")
        # a rich bar in a terminal, plain periodic lines in a pipe or log (embed_source decides)
        store = embed_source(source, enc, batch_size=batch_size, num_workers=workers, strict=strict, progress=True)
        if dataset is not None or not no_cache:
            from fedhype.encoders.cache import cache_save

            cache_save(cache_path, cache_key, store)
        store.save(out)
        console.print(f"wrote {out} ({len(store)} × {store.dim})", highlight=False)
        _warn_store(store, out, limit, images=images is not None)
        return _summary(out, store, enc, cached=False, duplicates=source.duplicates,
                        source=source if images is not None else None)

    run_command(body, json_mode, _render)


#: how many skipped files ``embed`` names on stderr as it finds them (the summary names the next ones)
SHOWN = 5


def _warn_skipped(source) -> None:
    """The files the folder scan skipped as ``skipped:`` lines: the first :data:`SHOWN`, then how many more."""
    for s in source.skipped[:SHOWN]:
        warn(f"{s['file']}: {s['reason']}", "skipped")
    if len(source.skipped) > SHOWN:  # a helper counted 5 lines for 14 skipped files, with no word of the rest
        warn(f"… and {len(source.skipped) - SHOWN} more file(s) ({len(source.skipped)} in all; each is listed with its "
             "reason under `skipped` in the result: the summary at the end, or the --json object)", "skipped")


def _warn_duplicates(source) -> None:
    """:func:`fedhype.encoders.checks.duplicate_warnings` as ``warning:`` lines."""
    from fedhype.encoders.checks import duplicate_warnings

    for text in duplicate_warnings(source, listed=True):
        warn(text)


def _warn_store(store, out: Path, limit: int | None, images: bool) -> None:
    """:func:`fedhype.encoders.checks.store_warnings` of the written store as ``warning:`` lines (its skipped files
    were printed one by one before embedding)."""
    from fedhype.encoders.checks import store_warnings

    for text in store_warnings(store, where=str(out), limit=limit, images=images):
        warn(text)


def _summary(out: Path, store, enc, cached: bool, duplicates: list | None = None, source=None) -> dict[str, Any]:
    from fedhype.encoders import checks

    return {
        "store": str(out),
        "n": len(store),
        "dim": store.dim,
        "encoder": enc.id,
        "weights_hash": enc.weights_hash,
        "class_counts": dict(zip(store.class_names, store.class_counts())),
        "domain_counts": dict(zip(store.domain_names, store.domain_counts())),
        "skipped": store.meta.get("skipped"),
        "duplicates": duplicates or [],
        "label_conflicts": checks.label_conflicts(source) if source is not None else [],
        "empty_classes": checks.empty_classes(store),
        "small_images": store.meta.get("small_images"),
        "images_per_s": None if cached else store.meta.get("images_per_s"),
        "from_cache": cached,
        "image_size": (store.meta.get("preprocess") or {}).get("crop"),
        "layout": (store.meta.get("source") or {}).get("layout"),
        "splits": (store.meta.get("source") or {}).get("split_counts"),
    }


def register(app: typer.Typer) -> None:
    app.command("embed")(embed)
