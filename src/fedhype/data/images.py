"""Reading labelled image folders into an :class:`~fedhype.data.sources.ImageSource`.

Two layouts are accepted (chosen with ``layout=``, or detected where unambiguous; see
:mod:`fedhype.data.layout`):

* ``class`` (torchvision ImageFolder): ``root/<class>/...`` — one domain, named after ``root``;
  images nested deeper below a class folder stay in that class;
* ``domain/class``: ``root/<domain>/<class>/...`` — one domain per sub-folder.

Split folders (``train/``, ``val/``, ``test/``) at the top or under each domain give splits.

Every file is checked when the folder is scanned, so a corrupt file is reported up front (in
``ImageSource.skipped``, or as an error with ``strict=True``) instead of failing mid-encoding.
:func:`to_rgb` turns any PIL image mode into 8-bit RGB the same way for every record, and
:func:`stratified_subset` is the one place where a ``limit`` picks a subset of records.
"""

from __future__ import annotations

import functools
import os
import unicodedata
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from fedhype.data.roster import look_alike_names
from fedhype.data.sources import ImageRecord, ImageSource
from fedhype.errors import ValidationError

_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_16BIT_MODES = {"I", "I;16", "I;16L", "I;16B", "I;16N"}


# ---------------------------------------------------------------------------- pixel conversion
def to_rgb(img: Image.Image) -> Image.Image:
    """Convert ``img`` to a new 8-bit RGB image, upright as a viewer shows it.

    * EXIF orientation is applied (:func:`PIL.ImageOps.exif_transpose`).
    * ``'1'``, ``'L'``, ``'CMYK'``, ``'YCbCr'``, ``'LAB'``, ``'HSV'``: converted by PIL.
    * ``'P'``: palette expanded; a transparent palette entry is composited like alpha.
    * Alpha (``'RGBA'``, ``'LA'``, ``'PA'``, or a ``transparency`` key): composited on white.
    * 16-bit grey (``'I;16*'``, ``'I'``): the 0–65535 range is scaled to 0–255 as
      ``round(v · 255 / 65535)`` (values outside 0–65535 in an ``'I'`` image are clipped first),
      never clipped at 255 as a plain ``convert('L')`` would.
    * ``'F'`` (float grey): read as 0–1 when the image's maximum is ≤ 1, else as 0–255.

    Returns:
        A new ``PIL.Image.Image`` in mode ``'RGB'``, independent of any open file.
    """
    img = ImageOps.exif_transpose(img) or img
    mode = img.mode
    if mode in _16BIT_MODES:
        a = np.asarray(img).astype(np.float64)
        a = np.clip(a, 0.0, 65535.0) * (255.0 / 65535.0)
        return Image.fromarray(np.round(a).astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        a = np.nan_to_num(np.asarray(img, dtype=np.float64))
        if a.size and a.max() <= 1.0:
            a = a * 255.0
        return Image.fromarray(np.round(np.clip(a, 0, 255)).astype(np.uint8), "L").convert("RGB")
    if mode in _ALPHA_MODES or "transparency" in img.info:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")  # a copy even when already RGB


def _load_file(path: str) -> Image.Image:
    """Open ``path``, decode it fully, close the file and return ``to_rgb`` of it."""
    with Image.open(path) as im:
        im.load()
        return to_rgb(im)


#: why an empty file is skipped (cache keys hash it as :data:`NOT_AN_IMAGE`, the reason given before this one, so a
#: folder embedded then keeps its key: :func:`fedhype.encoders.cache.image_files_key`)
EMPTY_FILE = "an empty file (0 bytes): an interrupted copy or download?"
NOT_AN_IMAGE = "not an image (PIL cannot identify the format)"


def check_image_file(path: str | os.PathLike) -> str | None:
    """Check that ``path`` is a readable, complete image; return ``None`` or the reason it is not.

    PNG files are checked by ``Image.verify`` (chunk CRCs up to IEND, so truncation is caught);
    other formats, for which ``verify`` checks little, are also decoded (JPEG in draft mode at
    1/8 scale, which still reads every entropy-coded byte).
    """
    if os.path.islink(path) and not os.path.exists(path):
        return f"a symbolic link to a missing file ({os.readlink(path)})"
    try:
        import stat

        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):  # a link to /dev/zero was "an empty file (0 bytes)" (a helper), a FIFO would block
            return "not a regular file (a device, pipe or socket" + (", through a symbolic link)" if os.path.islink(path)
                                                                     else ")")
        if os.path.getsize(path) == 0:  # was "not an image (PIL cannot identify the format)" (a probe)
            return EMPTY_FILE
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    try:
        with Image.open(path) as im:
            fmt = im.format
            im.verify()
        if fmt != "PNG":
            with Image.open(path) as im:
                im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
                im.load()
    except UnidentifiedImageError:
        return NOT_AN_IMAGE
    except Image.DecompressionBombError as exc:
        return f"image too large ({exc})"
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        return f"corrupt or truncated image ({type(exc).__name__}: {exc})"
    return None


# ---------------------------------------------------------------------------- stratified subsets
def stratified_subset(keys: list[tuple], limit: int | None, seed: int) -> np.ndarray:
    """Positions of a stratified random subset of at most ``limit`` items.

    Strata are the distinct ``keys`` (e.g. ``(domain, label)``). When ``limit ≥ #strata`` every
    stratum keeps one item and the remaining ``limit − #strata`` slots are shared in proportion
    to the strata's remaining sizes (largest-remainder rounding, capped at each stratum's size);
    when ``limit < #strata``, ``limit`` strata drawn at random keep one item each.

    Args:
        keys: one hashable stratum key per item.
        limit: maximum number of items; ``None`` or ``≥ len(keys)`` keeps everything.
        seed: seed of the ``numpy`` Generator that draws strata and items (deterministic).

    Returns:
        int64 array of sorted positions into ``keys``.

    Raises:
        ValidationError: if ``limit`` is < 1.
    """
    n = len(keys)
    if limit is None or limit >= n:
        return np.arange(n, dtype=np.int64)
    if limit < 1:
        raise ValidationError(f"limit must be a positive number of images, got {limit}")
    rng = np.random.default_rng(seed)
    strata: dict[tuple, list[int]] = {}
    for i, k in enumerate(keys):
        strata.setdefault(tuple(k), []).append(i)
    names = sorted(strata)
    sizes = np.array([len(strata[s]) for s in names], dtype=np.int64)
    quota = np.zeros(len(names), dtype=np.int64)
    if limit < len(names):
        quota[rng.choice(len(names), size=limit, replace=False)] = 1
    else:
        quota[:] = 1
        spare, room = limit - len(names), sizes - 1
        share = spare * room / room.sum()
        quota += np.floor(share).astype(np.int64)
        left = spare - int(np.floor(share).sum())
        order = np.lexsort((np.arange(len(names)), -(share - np.floor(share))))
        for j in order:
            if left == 0:
                break
            if quota[j] < sizes[j]:
                quota[j] += 1
                left -= 1
    chosen = [rng.choice(strata[s], size=int(q), replace=False) for s, q in zip(names, quota) if q]
    return np.sort(np.concatenate(chosen).astype(np.int64))


def subset_source(source: ImageSource, limit: int | None, seed: int) -> ImageSource:
    """``source`` reduced to a stratified subset by ``(domain, label[, split])`` (see :func:`stratified_subset`)."""
    if limit is None or limit >= len(source):
        return source
    # (domain, class), and the given split where the source has one: a subset keeps every split's classes
    keys = [(r.domain, r.label) if r.split is None else (r.domain, r.label, r.split) for r in source.records]
    pos = stratified_subset(keys, limit, seed)
    records = [source.records[i] for i in pos]
    meta = {**source.source, "limit": int(limit), "limit_seed": int(seed), "n_before_limit": len(source)}
    if "split_counts" in meta:  # the counts of the subset kept, not of the whole folder
        meta["split_counts"] = {s: sum(r.split == s for r in records) for s in ("train", "val", "test")
                                if any(r.split == s for r in records)}
    kept = {r.sample_id for r in records}
    return ImageSource(records=records, class_names=source.class_names, domain_names=source.domain_names,
                       source=meta, skipped=source.skipped,
                       linked_outside=[i for i in source.linked_outside if i in kept])


# ---------------------------------------------------------------------------- folder scanning
def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as exc:  # a symlink loop, a folder without read permission, a vanished folder
        raise ValidationError(f"cannot read the folder {folder}: {exc.strerror or exc} (fix or remove it)") from None


def _hidden_under(folder: Path, shown: int = 3) -> str:
    """The hidden entries (names starting with '.') directly in ``folder``, up to ``shown`` of them and a count, or ""."""
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.name.startswith("."))
    except OSError:
        return ""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _files_under(folder: Path, _seen: frozenset = frozenset()) -> list[Path]:
    """Non-hidden files below ``folder`` (recursively, hidden folders skipped), sorted; a folder link
    that leads back to a folder above it is refused (it would list the same images forever)."""
    try:
        real = Path(os.path.realpath(folder))
    except OSError as exc:
        raise ValidationError(f"cannot read the folder {folder}: {exc}") from None
    if real in _seen:
        raise ValidationError(f"{folder} links back to {real}, a folder above it (a symlink loop): remove the link")
    out: list[Path] = []
    for e in _entries(folder):
        if e.is_dir():
            out.extend(_files_under(Path(e.path), _seen | {real}))
        elif e.is_file() or e.is_symlink():  # a dangling link is listed, then skipped as unreadable
            out.append(Path(e.path))
    return out


def scan_image_folder(
    root: str | os.PathLike, *, layout: str = "auto", strict: bool = False, limit: int | None = None, seed: int = 0
) -> ImageSource:
    """Scan a labelled image folder into an :class:`ImageSource` (images are decoded lazily).

    ``layout`` says which folders are classes and domains (:mod:`fedhype.data.layout`): ``class``
    (torchvision ImageFolder: ``root/<class>/...``, nested folders stay in their class; one
    domain named after ``root``), ``domain/class`` (``root/<domain>/<class>/...``) or ``auto``
    (detected where unambiguous, refused otherwise). Split folders (``train/``, ``val/``,
    ``validation/``, ``test/``) at the top or directly under each domain give each record's
    split (:attr:`ImageRecord.split`; recorded in ``source["splits"]``). Class names are the
    sorted union of class folder names; domain names the sorted domain folder names. Sample ids
    are POSIX paths relative to ``root``. Hidden files and folders (leading dot) are ignored.

    Args:
        root: the folder.
        layout: ``"auto"``, ``"class"`` or ``"domain/class"``.
        strict: raise on the first unusable file instead of skipping it.
        limit: keep a stratified subset of at most ``limit`` images (:func:`stratified_subset`,
            strata (domain, class, split)).
        seed: seed for ``limit``.

    Returns:
        An ``ImageSource``; unusable files are listed in ``skipped`` as ``{"file", "reason"}``;
        ``source`` holds ``root``, ``layout`` (the one used), ``layout_asked`` and, when the tree
        gives splits, ``splits = {"component": i, "folders": {folder name: split}}`` (the split
        of a record is component ``i`` of its sample id).

    Raises:
        ValidationError: missing root, root is a file, an unknown or (``auto``) ambiguous layout,
            empty class or domain folder, a class folder without a usable image, no usable image
            at all, or (``strict``) any unusable file — each message names the path and what to do.
    """
    from fedhype.data.layout import read_layout

    root = Path(root)
    if not root.exists():
        raise ValidationError(f"image folder not found: {root} (give an existing folder of <class>/<image> files)")
    if not root.is_dir():
        raise ValidationError(f"{root} is a file, not a folder: give the folder that holds the class folders")
    plan = read_layout(root, layout)

    skipped: list[dict[str, str]] = []

    def skip(path: Path, reason: str) -> None:
        rel = path.relative_to(root).as_posix()
        if strict:
            raise ValidationError(f"unusable file {root / rel}: {reason} (remove or fix it, or drop --strict)")
        skipped.append({"file": rel, "reason": reason})

    for f in plan.stray:
        skip(f, "not inside a class folder")

    # two sibling folders whose names differ only in Unicode normalisation (NFD "über" beside NFC "über"): each is read
    # in NFC, so they would become one class silently (a probe's c0 and c1 images merged); across sites it is meant
    siblings: dict[tuple[Path, str], set[str]] = {}
    for cf in plan.folders:
        siblings.setdefault((cf.path.parent, unicodedata.normalize("NFC", cf.class_name)), set()).add(cf.path.name)
    for (parent, _), raw in sorted(siblings.items()):
        if len(raw) > 1:
            forms = ", ".join(f"{n!r} ({'NFC' if unicodedata.is_normalized('NFC', n) else 'not NFC'})"
                              for n in sorted(raw))
            raise ValidationError(f"class folders {forms} under {parent} have the same name in two Unicode "
                                  "spellings: they would be read as one class; merge them, or rename one")
    found: list[tuple[Path, str, str, str | None]] = []  # (file, domain name, class name, split)
    for cf in plan.folders:
        files = _files_under(cf.path)
        if not files:
            hidden = _hidden_under(cf.path)
            raise ValidationError(f"class folder {cf.path} " + (
                f"holds only hidden entries ({hidden}: names starting with '.' are never read): move the images out "
                "of them, or remove the folder" if hidden else "is empty: add images to it or remove it"))
        n_ok = 0
        for f in files:
            reason = check_image_file(f)
            if reason is None:
                # folder names in NFC: the same name from a macOS (NFD) and a Linux (NFC) site is one class
                found.append((f, unicodedata.normalize("NFC", cf.domain_name), unicodedata.normalize("NFC", cf.class_name),
                              cf.split))
                n_ok += 1
            else:
                skip(f, reason)
        if n_ok == 0:
            raise ValidationError(
                f"class folder {cf.path} has no usable image ({len(files)} files skipped, e.g. "
                f"{skipped[-1]['file']}: {skipped[-1]['reason']}); fix or remove them"
            )
    if not found:
        raise ValidationError(
            f"no usable image under {root}: expected {root}/<class>/<image> or {root}/<domain>/<class>/<image>"
            + (f" ({len(skipped)} files skipped)" if skipped else "")
        )
    found.sort(key=lambda t: t[0])
    class_names = sorted({c for _, _, c, _ in found})
    clash = look_alike_names(class_names)  # e.g. mnist/"T-shirt "/ and optdigits/tshirt/: two classes
    if clash:
        where = sorted({cf.path.relative_to(root).as_posix() for cf in plan.folders
                        if unicodedata.normalize("NFC", cf.class_name) in clash[0]})
        raise ValidationError(f"class folders {where} under {root} differ only in case, spaces or punctuation: they would "
                              "be separate classes; rename them to one spelling")
    domain_names = sorted({d for _, d, _, _ in found})
    cindex = {c: i for i, c in enumerate(class_names)}
    dindex = {d: i for i, d in enumerate(domain_names)}
    records = [
        ImageRecord(
            sample_id=f.relative_to(root).as_posix(),
            label=cindex[c],
            domain=dindex[d],
            load=functools.partial(_load_file, str(f)),
            split=split,
        )
        for f, d, c, split in found
    ]
    source = {"dataset": "image-folder", "root": str(root), "layout": plan.layout, "layout_asked": plan.asked,
              "n_images": len(records), "n_skipped": len(skipped)}
    if plan.split_component is not None:
        source["splits"] = {"component": plan.split_component, "folders": dict(sorted(plan.split_folders.items()))}
        source["split_counts"] = {s: sum(r.split == s for r in records) for s in ("train", "val", "test")
                                  if any(r.split == s for r in records)}
    top = Path(os.path.realpath(root))
    outside = [r.sample_id for r, (f, *_) in zip(records, found) if not Path(os.path.realpath(f)).is_relative_to(top)]
    src = ImageSource(records=records, class_names=class_names, domain_names=domain_names, source=source,
                      skipped=skipped, linked_outside=outside)
    return subset_source(src, limit, seed)
