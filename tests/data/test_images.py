"""Image-folder scanning and pixel conversion, on real digits (sklearn load_digits) written as files."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from fedhype.data.images import scan_image_folder, stratified_subset, to_rgb
from fedhype.errors import ValidationError

_DIGITS = load_digits()


def digit(i: int, size: int = 32) -> np.ndarray:
    """Real optdigits image ``i`` as uint8 ``[size, size]`` (0–16 scaled to 0–255, nearest upscaling)."""
    px = np.round(_DIGITS.images[i] * 255 / 16).astype(np.uint8)
    return np.asarray(Image.fromarray(px, "L").resize((size, size), Image.NEAREST))


def first_of(label: int, k: int = 3) -> list[int]:
    return np.flatnonzero(_DIGITS.target == label)[:k].tolist()


def write_class_tree(root: Path, labels=(0, 1, 2), k: int = 3, ext: str = "png") -> dict[str, np.ndarray]:
    """root/<label>/<i>.<ext> grey digits; returns {relative path: pixels}."""
    written = {}
    for lab in labels:
        (root / str(lab)).mkdir(parents=True, exist_ok=True)
        for i in first_of(lab, k):
            rel = f"{lab}/{i}.{ext}"
            Image.fromarray(digit(i), "L").save(root / rel)
            written[rel] = digit(i)
    return written


def single(tmp_path: Path, name: str, save) -> np.ndarray:
    """Scan a tree holding one file made by ``save(path)``; return the loaded RGB pixels."""
    (tmp_path / "t" / "7").mkdir(parents=True)
    save(tmp_path / "t" / "7" / name)
    src = scan_image_folder(tmp_path / "t", strict=True)
    assert len(src) == 1 and src.records[0].sample_id == f"7/{name}"
    img = src.records[0].load()
    assert img.mode == "RGB"
    return np.asarray(img)


# ---------------------------------------------------------------------------- layouts
def test_imagefolder_tree_labels_ids_and_pixels(tmp_path):
    root = tmp_path / "clinic-a"
    written = write_class_tree(root)
    src = scan_image_folder(root)
    assert src.class_names == ["0", "1", "2"]
    assert src.domain_names == ["clinic-a"]
    assert sorted(r.sample_id for r in src.records) == sorted(written)
    assert src.skipped == [] and src.source["layout"] == "class" and src.source["layout_asked"] == "auto"
    assert "splits" not in src.source and all(r.split is None for r in src.records)
    for r in src.records:
        assert src.class_names[r.label] == r.sample_id.split("/")[0] and r.domain == 0
        px = np.asarray(r.load())
        assert px.shape == (32, 32, 3)
        np.testing.assert_array_equal(px[..., 1], written[r.sample_id])


def test_domain_tree_union_of_classes(tmp_path):
    write_class_tree(tmp_path / "site-b", labels=(1, 2))
    write_class_tree(tmp_path / "site-a", labels=(0, 1), k=2)
    src = scan_image_folder(tmp_path, layout="domain/class")  # a two-level tree is ambiguous under auto
    assert src.source["layout"] == "domain/class"
    assert src.domain_names == ["site-a", "site-b"] and src.class_names == ["0", "1", "2"]
    got = Counter((src.domain_names[r.domain], src.class_names[r.label]) for r in src.records)
    assert got == {("site-a", "0"): 2, ("site-a", "1"): 2, ("site-b", "1"): 3, ("site-b", "2"): 3}
    assert all(r.sample_id.startswith(src.domain_names[r.domain] + "/") for r in src.records)


# ---------------------------------------------------------------------------- modes
def test_grey_L_png(tmp_path):
    px = single(tmp_path, "a.png", lambda p: Image.fromarray(digit(5), "L").save(p))
    assert (px == digit(5)[..., None]).all()


def test_palette_png_with_transparency(tmp_path):
    idx = (digit(3) > 100).astype(np.uint8)  # 0 = background, 1 = stroke
    palette = [10, 20, 30, 200, 50, 60] + [0] * (256 * 3 - 6)

    def save(p):
        im = Image.fromarray(idx, "P")
        im.putpalette(palette)
        im.save(p, transparency=0)  # index 0 transparent → white

    px = single(tmp_path, "p.png", save)
    np.testing.assert_array_equal(px[idx == 1], np.tile([200, 50, 60], ((idx == 1).sum(), 1)))
    assert (px[idx == 0] == 255).all()


def test_rgba_composited_on_white(tmp_path):
    d = digit(8)
    rgba = np.zeros((32, 32, 4), np.uint8)
    rgba[..., 2] = 255  # blue strokes
    rgba[..., 3] = np.where(d > 0, 255, 0)
    rgba[:4, :, 3] = np.where(d[:4] > 0, 255, 128)  # half-transparent black background rows
    rgba[:4, :, 2] = np.where(d[:4] > 0, 255, 0)
    px = single(tmp_path, "a.png", lambda p: Image.fromarray(rgba, "RGBA").save(p))
    stroke, clear = d > 0, d == 0
    clear[:4] = False
    assert (px[stroke] == [0, 0, 255]).all() and (px[clear] == 255).all()
    half = (d[:4] == 0)
    assert np.all(np.abs(px[:4][half].astype(int) - 127) <= 1)


def test_cmyk_jpeg(tmp_path):
    rgb = np.stack([digit(2), 255 - digit(2), np.full((32, 32), 90, np.uint8)], -1)

    def save(p):
        Image.fromarray(rgb, "RGB").convert("CMYK").save(p, quality=95)

    px = single(tmp_path, "c.jpg", save)
    assert Image.open(tmp_path / "t" / "7" / "c.jpg").mode == "CMYK"
    assert np.abs(px.astype(int) - rgb).mean() < 8  # JPEG loss only; inverted CMYK would be ~130


def test_16bit_png_scaled_not_clipped(tmp_path):
    v = _DIGITS.images[4].astype(np.uint16) * 4095  # 0..65520
    px = single(tmp_path, "d.png", lambda p: Image.fromarray(v).save(p))
    assert Image.open(tmp_path / "t" / "7" / "d.png").mode.startswith("I")
    expected = np.round(v.astype(np.float64) * 255 / 65535).astype(np.uint8)
    np.testing.assert_array_equal(px[..., 0], expected)
    assert len(np.unique(px)) == len(np.unique(v))  # a clip at 255 would merge all non-zero levels


def test_exif_orientation_is_applied(tmp_path):
    shown = np.zeros((48, 32), np.uint8)  # what a viewer should show: a digit in the top 32 rows
    shown[:32] = digit(7)
    stored = np.rot90(shown)  # orientation 6 = stored rotated 90° counter-clockwise

    def save(p):
        exif = Image.Exif()
        exif[0x0112] = 6
        Image.fromarray(np.ascontiguousarray(stored), "L").save(p, exif=exif.tobytes(), quality=95)

    px = single(tmp_path, "e.jpg", save)[..., 0].astype(float)
    assert px.shape == shown.shape
    assert np.abs(px - shown).mean() < 6
    assert np.abs(px - np.flipud(np.fliplr(shown))).mean() > 20  # a wrong rotation would be far


def test_to_rgb_grey_1bit():
    img = Image.fromarray(digit(0) > 100).convert("1")
    out = np.asarray(to_rgb(img))
    assert out.shape == (32, 32, 3) and set(np.unique(out)) == {0, 255}
    assert ((out[..., 0] == 255) == (digit(0) > 100)).all()


# ---------------------------------------------------------------------------- bad inputs
def test_truncated_files_are_skipped(tmp_path):
    root = tmp_path / "r"
    write_class_tree(root, labels=(0, 1))
    Image.fromarray(digit(9), "L").save(tmp_path / "full.png")
    Image.fromarray(digit(9), "L").save(tmp_path / "full.jpg", quality=95)
    for ext in ("png", "jpg"):
        data = (tmp_path / f"full.{ext}").read_bytes()
        (root / "1" / f"cut.{ext}").write_bytes(data[: len(data) // 2])
    src = scan_image_folder(root)
    assert len(src) == 6
    skipped = {s["file"]: s["reason"] for s in src.skipped}
    assert set(skipped) == {"1/cut.png", "1/cut.jpg"}
    assert all("truncated" in r or "corrupt" in r for r in skipped.values())


def test_text_file_skipped_and_hidden_file_ignored(tmp_path):
    write_class_tree(tmp_path, labels=(0, 1))
    (tmp_path / "0" / "notes.txt").write_text("scanned by the clinic on Monday\n")
    (tmp_path / "1" / ".DS_Store").write_bytes(b"\x00\x01junk")
    src = scan_image_folder(tmp_path)
    assert src.skipped == [{"file": "0/notes.txt", "reason": "not an image (PIL cannot identify the format)"}]
    assert len(src) == 6


def test_strict_aborts_naming_the_file(tmp_path):
    write_class_tree(tmp_path, labels=(0, 1))
    (tmp_path / "1" / "bad.png").write_bytes(b"not a png at all")
    with pytest.raises(ValidationError, match=r"1/bad\.png.*not an image"):
        scan_image_folder(tmp_path, strict=True)


def test_empty_class_folder(tmp_path):
    write_class_tree(tmp_path, labels=(0, 1))
    (tmp_path / "2").mkdir()
    with pytest.raises(ValidationError, match=r"class folder .*/2 is empty"):
        scan_image_folder(tmp_path)
    # only hidden entries (a helper's 2/.thumbs/t.png was refused as "empty"): said, with what is never read
    (tmp_path / "2" / ".thumbs").mkdir()
    shutil.copyfile(next((tmp_path / "1").iterdir()), tmp_path / "2" / ".thumbs" / "t.png")
    (tmp_path / "2" / ".DS_Store").write_bytes(b"x")
    with pytest.raises(ValidationError, match=r"class folder .*/2 holds only hidden entries \(\.DS_Store, \.thumbs: "
                                              r"names starting with '\.' are never read\)"):
        scan_image_folder(tmp_path)


def test_class_folder_without_usable_image(tmp_path):
    write_class_tree(tmp_path, labels=(0,))
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "a.png").write_text("oops")
    with pytest.raises(ValidationError, match=r"class folder .*/1 has no usable image"):
        scan_image_folder(tmp_path)


def test_empty_root(tmp_path):
    (tmp_path / ".hidden").write_text("x")
    with pytest.raises(ValidationError, match=r"no usable image under .*<class>/<image>"):
        scan_image_folder(tmp_path)


def test_missing_root(tmp_path):
    with pytest.raises(ValidationError, match=r"image folder not found: .*nowhere"):
        scan_image_folder(tmp_path / "nowhere")


def test_root_is_a_file(tmp_path):
    (tmp_path / "x.png").write_bytes(b"")
    with pytest.raises(ValidationError, match=r"x\.png is a file, not a folder"):
        scan_image_folder(tmp_path / "x.png")


# ---------------------------------------------------------------------------- limits
def test_limit_is_stratified_and_seeded(tmp_path):
    write_class_tree(tmp_path / "a", labels=(0, 1, 2), k=6)
    write_class_tree(tmp_path / "b", labels=(0, 1), k=6)
    full = scan_image_folder(tmp_path, layout="domain/class")
    assert len(full) == 30
    sub = scan_image_folder(tmp_path, layout="domain/class", limit=10, seed=1)
    strata = Counter((r.domain, r.label) for r in sub.records)
    assert len(sub) == 10 and len(strata) == 5 and set(strata.values()) == {2}
    again = scan_image_folder(tmp_path, layout="domain/class", limit=10, seed=1)
    other = scan_image_folder(tmp_path, layout="domain/class", limit=10, seed=2)
    ids = [r.sample_id for r in sub.records]
    assert ids == [r.sample_id for r in again.records] and ids != [r.sample_id for r in other.records]
    assert sub.source["limit"] == 10 and sub.source["n_before_limit"] == 30


def test_stratified_subset_fewer_slots_than_strata():
    keys = [(d, c) for d in range(2) for c in range(5) for _ in range(4)]
    pos = stratified_subset(keys, 7, seed=0)
    assert len(pos) == 7 and len({keys[i] for i in pos}) == 7
    pos = stratified_subset(keys, 33, seed=0)
    assert len(pos) == 33 and len(set(pos.tolist())) == 33 and len({keys[i] for i in pos}) == 10
    with pytest.raises(ValidationError):
        stratified_subset(keys, 0, seed=0)


def test_mixed_layout_is_refused_not_flattened(tmp_path):
    import numpy as np
    from PIL import Image

    from fedhype.data.images import scan_image_folder
    from fedhype.errors import ValidationError

    img = Image.fromarray((np.arange(64, dtype=np.uint8).reshape(8, 8) * 4))
    for rel in ("siteA/cat/a.png", "siteA/dog/b.png", "dog/c.png"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        img.save(tmp_path / rel)
    with pytest.raises(ValidationError, match="mixed layout"):
        scan_image_folder(tmp_path)


def test_a_dangling_link_is_listed_as_skipped(tmp_path):
    import os

    for c in "ab":
        (tmp_path / c).mkdir()
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / c / "1.png")
    os.symlink(tmp_path / "gone.png", tmp_path / "a" / "dangling.png")
    src = scan_image_folder(tmp_path, layout="class")
    assert len(src.records) == 2
    assert src.skipped == [{"file": "a/dangling.png", "reason": f"a symbolic link to a missing file ({tmp_path / 'gone.png'})"}]


def test_images_linked_from_outside_the_folder_are_read_and_said(tmp_path):
    """A helper's symlinked folder in a class pulled another site's 150 images into it without a word. They are still
    read (as torchvision's ImageFolder does), and the warning every embed path prints names them; a link that stays
    inside the folder says nothing."""
    import os

    from fedhype.encoders.checks import duplicate_warnings

    root, other = tmp_path / "site", tmp_path / "other_site"
    write_class_tree(root, labels=(0, 1), k=2)
    write_class_tree(other, labels=(0,), k=3)
    os.symlink(other / "0", root / "0" / "more")  # a folder link out of the tree
    os.symlink(root / "1", root / "0" / "inside")  # a folder link within it
    src = scan_image_folder(root, layout="class")
    assert sorted(src.linked_outside) == sorted(f"0/more/{p.name}" for p in (other / "0").iterdir())
    assert len(src.linked_outside) == 3 and not any(i.startswith("0/inside/") for i in src.linked_outside)
    said = duplicate_warnings(src)
    assert said[0].startswith(f"3 image file(s) lie outside {root}, reached through a symbolic link (e.g. 0/more/")
    sub = scan_image_folder(root, layout="class", limit=4)  # a subset names the linked files it kept
    assert len(sub) == 4 and set(sub.linked_outside) == {r.sample_id for r in sub.records} & set(src.linked_outside)
    (root / "0" / "more").unlink()
    assert scan_image_folder(root, layout="class").linked_outside == []
    assert not any("symbolic link" in w for w in duplicate_warnings(scan_image_folder(root, layout="class")))


def test_class_folder_names_are_read_in_nfc_and_look_alike_site_classes_are_refused(tmp_path):
    """The same class name from a macOS site (NFD folder names) and a Linux one (NFC) became two classes
    (a new user's probe); folder names are now read in NFC, and a roster of older stores that still
    differ only in Unicode form is refused, naming the pair."""
    import unicodedata

    from fedhype.data.roster import Roster
    from fedhype.data.sites import SiteCard

    nfc, nfd = unicodedata.normalize("NFC", "tumeur é"), unicodedata.normalize("NFD", "tumeur é")
    assert nfc != nfd
    for name in (nfd, "0"):
        (tmp_path / "t" / name).mkdir(parents=True)
        Image.fromarray(digit(0), "L").save(tmp_path / "t" / name / "a.png")
    src = scan_image_folder(tmp_path / "t")
    assert src.class_names == ["0", nfc]
    enc = {"encoder": "dinov2-vits14"}
    cards = [SiteCard("a", "0" * 32, 10, 8, enc, ["0", nfc]), SiteCard("b", "1" * 32, 10, 8, enc, ["0", nfd])]
    with pytest.raises(ValidationError, match="look the same but are spelled with different Unicode forms"):
        Roster.from_cards(cards)
    assert Roster.from_cards([cards[0], SiteCard("b", "1" * 32, 10, 8, enc, ["0", nfc])]).class_names == ["0", nfc]


def test_site_class_names_that_differ_in_case_spaces_or_punctuation_are_refused():
    """`hospital_d/"T-shirt "/` and `hospital_a/tshirt/` trained as two classes with no word (a new user's probe):
    each site then "lacked" the other's t-shirts. Such names are refused, naming the sites; distinct names pass."""
    from fedhype.data.roster import Roster
    from fedhype.data.sites import SiteCard

    enc = {"encoder": "dinov2-vits14"}
    a = SiteCard("hospital_a", "0" * 32, 10, 8, enc, ["dress", "tshirt"])
    for other in ("T-shirt ", "TSHIRT", "t_shirt", "t shirt"):
        d = SiteCard("hospital_d", "1" * 32, 10, 8, enc, ["dress", other])
        with pytest.raises(ValidationError, match=r"differ only in case, spaces or punctuation .*hospital_d"):
            Roster.from_cards([a, d])
    ok = SiteCard("hospital_d", "1" * 32, 10, 8, enc, ["dress", "shirt"])
    assert Roster.from_cards([a, ok]).class_names == ["dress", "shirt", "tshirt"]
    # two clashing pairs: both named with their sites (a probe saw only the first pair's)
    two = SiteCard("hospital_d", "1" * 32, 10, 8, enc, ["Dress", "T-shirt"])
    with pytest.raises(ValidationError) as e:
        Roster.from_cards([a, two])
    assert "'Dress': ['hospital_d']" in str(e.value) and "'T-shirt': ['hospital_d']" in str(e.value)


def test_class_folders_that_differ_in_case_spaces_or_punctuation_are_refused(tmp_path):
    """The same near-duplicate names inside one image tree (two domains) are refused too, naming the folders."""
    for dom, cls in (("a", "T-shirt "), ("a", "dress"), ("b", "tshirt"), ("b", "dress")):
        (tmp_path / "t" / dom / cls).mkdir(parents=True)
        Image.fromarray(digit(0), "L").save(tmp_path / "t" / dom / cls / "x.png")
    with pytest.raises(ValidationError, match=r"class folders \['a/T-shirt ', 'b/tshirt'\] .* differ only in case"):
        scan_image_folder(tmp_path / "t", layout="domain/class")
    (tmp_path / "t" / "b" / "tshirt").rename(tmp_path / "t" / "b" / "T-shirt ")
    assert scan_image_folder(tmp_path / "t", layout="domain/class").class_names == ["T-shirt ", "dress"]


def test_sibling_class_folders_in_two_unicode_spellings_are_refused(tmp_path):
    """Two folders of one site whose names differ only in Unicode form (NFD "über" holding c0 images beside NFC
    "über" holding c1) were read as one class of 2× the images (a probe); across domains (macOS and Linux sites)
    the two spellings are one class, as before."""
    import unicodedata

    nfc, nfd = unicodedata.normalize("NFC", "über"), unicodedata.normalize("NFD", "über")
    for name, label in ((nfd, 0), (nfc, 1)):
        (tmp_path / "one" / name).mkdir(parents=True)
        Image.fromarray(digit(label), "L").save(tmp_path / "one" / name / "a.png")
    with pytest.raises(ValidationError, match=r"have the same name in two Unicode spellings.*merge them, or rename one"):
        scan_image_folder(tmp_path / "one", layout="class")
    for dom, name in (("mac", nfd), ("linux", nfc)):
        (tmp_path / "two" / dom / name).mkdir(parents=True)
        Image.fromarray(digit(0), "L").save(tmp_path / "two" / dom / name / "a.png")
    assert scan_image_folder(tmp_path / "two", layout="domain/class").class_names == [nfc]


def test_a_link_to_a_device_is_named_as_such_not_as_an_empty_file(tmp_path):
    """A helper's symbolic link to /dev/zero was skipped as "an empty file (0 bytes): an interrupted copy or
    download?"; it is not a regular file, and the reason says so (an empty regular file keeps its reason)."""
    import os

    from fedhype.data.images import EMPTY_FILE, check_image_file

    os.symlink("/dev/zero", tmp_path / "zero.png")
    assert check_image_file(tmp_path / "zero.png") == ("not a regular file (a device, pipe or socket, through a "
                                                        "symbolic link)")
    os.mkfifo(tmp_path / "pipe.png")
    assert check_image_file(tmp_path / "pipe.png") == "not a regular file (a device, pipe or socket)"
    (tmp_path / "empty.png").write_bytes(b"")
    assert check_image_file(tmp_path / "empty.png") == EMPTY_FILE
