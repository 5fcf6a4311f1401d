"""``layout=`` for image folders: ImageFolder semantics, domain trees, split folders and the refusals,
on real digits (sklearn load_digits) written as PNG files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fedhype.data.images import scan_image_folder
from fedhype.errors import ValidationError
from image_trees import DIGITS as _D  # tests/image_trees.py
from image_trees import digit_rows as _rows
from image_trees import patient_tree, split_tree
from image_trees import save_digit as _save

def test_class_layout_keeps_nested_patients_in_their_class(tmp_path):
    root = patient_tree(tmp_path / "clinic")
    src = scan_image_folder(root, layout="class")
    assert src.class_names == ["benign", "malignant", "normal"] and src.domain_names == ["clinic"]
    assert Counter(src.class_names[r.label] for r in src.records) == {"benign": 4, "malignant": 4, "normal": 4}
    assert all(r.sample_id.split("/")[0] == src.class_names[r.label] for r in src.records)
    assert src.source["layout"] == "class" and src.source["layout_asked"] == "class"
    # the pixels are the digit written there
    r = next(r for r in src.records if r.sample_id.startswith("malignant/"))
    i = int(Path(r.sample_id).stem)
    assert _D.target[i] == 1 and np.asarray(r.load())[0::4, 0::4, 0].tolist() == \
        np.round(_D.images[i] * 255 / 16).astype(np.uint8).tolist()


def test_auto_refuses_a_two_level_tree_naming_both_readings(tmp_path):
    root = patient_tree(tmp_path / "clinic")
    with pytest.raises(ValidationError) as exc:
        scan_image_folder(root)
    msg = str(exc.value)
    assert "ambiguous layout" in msg and str(root) in msg
    assert "--layout class (classes benign, malignant, normal" in msg
    assert "--layout domain/class (domains benign, malignant, normal; classes patient_00, patient_01" in msg
    assert "data.layout" in msg and "layout=" in msg
    assert "most likely" not in msg  # each class holds other patients: no reading is likelier
    # sites holding the same classes: still refused, with the likelier reading said (a probe's own sites' tree)
    for site in ("site_a", "site_b"):
        for label in (0, 1):
            for i in _rows(label, 2):
                _save(tmp_path / "sites", f"{site}/c{label}/{i}.png", i)
    with pytest.raises(ValidationError) as exc:
        scan_image_folder(tmp_path / "sites")
    assert "every folder holds the same sub-folders (c0, c1), as domains of the same classes do: most likely " \
        "--layout domain/class, unless they are patients" in str(exc.value)
    # patients numbered alike in every class read the same way: the refusal says what domain/class would make of
    # them (a new user followed the hint and put patient ids on a public card as class names)
    assert "then --layout class keeps them inside their class (read as domain/class, their names become class " \
        "names, which a site's public card lists). Choose one" in str(exc.value)
    # read as a domain tree on request: the patients become classes (what the old guess did silently)
    src = scan_image_folder(root, layout="domain/class")
    assert src.domain_names == ["benign", "malignant", "normal"] and len(src.class_names) == 6


def test_domain_class_layout(tmp_path):
    for d, labels in (("hospital_a", (0, 1)), ("hospital_b", (1, 2))):
        for label in labels:
            for i in _rows(label, 3):
                _save(tmp_path, f"{d}/{label}/nested/{i}.png", i)  # a folder below the class stays in it
    src = scan_image_folder(tmp_path, layout="domain/class")
    assert src.domain_names == ["hospital_a", "hospital_b"] and src.class_names == ["0", "1", "2"]
    got = Counter((src.domain_names[r.domain], src.class_names[r.label]) for r in src.records)
    assert got == {("hospital_a", "0"): 3, ("hospital_a", "1"): 3, ("hospital_b", "1"): 3, ("hospital_b", "2"): 3}
    assert all(_D.target[int(Path(r.sample_id).stem)] == int(src.class_names[r.label]) for r in src.records)


def test_top_split_folders_are_splits_not_domains(tmp_path):
    root = split_tree(tmp_path / "digits")
    src = scan_image_folder(root)
    assert src.source["layout"] == "class" and src.domain_names == ["digits"] and src.class_names == ["0", "1", "2"]
    assert src.source["splits"] == {"component": 0, "folders": {"test": "test", "train": "train"}}
    assert src.source["split_counts"] == {"train": 12, "test": 6}
    assert all(r.split == r.sample_id.split("/")[0] for r in src.records)
    assert Counter((r.split, src.class_names[r.label]) for r in src.records) == {
        (s, c): n for c in "012" for s, n in (("train", 4), ("test", 2))}


def test_validation_folder_and_splits_under_each_domain(tmp_path):
    split_tree(tmp_path, labels=(3, 4), train=3, test=1, domains=("site_a", "site_b"))
    for d in ("site_a", "site_b"):
        for i in _rows(3, 1, skip=5):
            _save(tmp_path, f"{d}/Validation/3/{i}.png", i)
    src = scan_image_folder(tmp_path)  # <domain>/<split>/<class>: a class has no train/test folders
    assert src.source["layout"] == "domain/class" and src.domain_names == ["site_a", "site_b"]
    assert src.class_names == ["3", "4"]
    assert src.source["splits"] == {"component": 1, "folders": {"Validation": "val", "test": "test", "train": "train"}}
    assert src.source["split_counts"] == {"train": 12, "val": 2, "test": 4}
    assert {r.sample_id: r.split for r in src.records if "Validation" in r.sample_id} == {
        f"{d}/Validation/3/{_rows(3, 1, skip=5)[0]}.png": "val" for d in ("site_a", "site_b")}


def test_limit_keeps_every_split(tmp_path):
    root = split_tree(tmp_path / "digits", train=6, test=3)
    sub = scan_image_folder(root, limit=6, seed=0)
    assert len(sub) == 6 and Counter((r.split, r.label) for r in sub.records) == {
        (s, c): 1 for s in ("train", "test") for c in range(3)}


def test_split_folders_beside_other_folders_are_refused_under_auto(tmp_path):
    split_tree(tmp_path, labels=(0,))
    for i in _rows(5, 2):
        _save(tmp_path, f"extra/5/{i}.png", i)
    with pytest.raises(ValidationError, match=r"split folder\(s\) \['test', 'train'\] sit beside other folders \['extra'\]"):
        scan_image_folder(tmp_path)
    # an explicit layout reads them as ordinary names: three classes, no splits
    src = scan_image_folder(tmp_path, layout="class")
    assert src.class_names == ["extra", "test", "train"] and "splits" not in src.source


def test_mixed_depth_is_refused_and_class_reads_it(tmp_path):
    for i in _rows(7, 2):
        _save(tmp_path, f"7/{i}.png", i)
        _save(tmp_path, f"8/scanner_b/{i}.png", i)
    with pytest.raises(ValidationError, match="mixed layout.*--layout class"):
        scan_image_folder(tmp_path)
    src = scan_image_folder(tmp_path, layout="class")
    assert Counter(src.class_names[r.label] for r in src.records) == {"7": 2, "8": 2}
    for i in _rows(7, 2):  # a folder holding images and sub-folders is named once, as holding both (a probe)
        _save(tmp_path, f"7/extra/{i}.png", i)
    # and the nested folder is named, grammatically (a probe: "sneaker hold both (e.g. sneaker/)")
    with pytest.raises(ValidationError, match=r"mixed layout: folder 8 holds sub-folders \(e\.g\. 8/scanner_b/\), while 7 "
                                              r"holds both images and sub-folders \(e\.g\. 7/extra/\)\. Use"):
        scan_image_folder(tmp_path)
    for i in _rows(9, 2):
        _save(tmp_path, f"9/{i}.png", i)
        _save(tmp_path, f"6/{i}.png", i)
    with pytest.raises(ValidationError, match=r"folder 8 holds sub-folders \(e\.g\. 8/scanner_b/\), while 6, 9 hold images "
                                              r"directly, while 7 holds both"):
        scan_image_folder(tmp_path)


def test_bad_layout_value_and_domain_without_class_folders(tmp_path):
    split_tree(tmp_path / "t", labels=(0,))
    with pytest.raises(ValidationError, match="layout must be one of auto, class, domain/class, got 'flat'"):
        scan_image_folder(tmp_path / "t", layout="flat")
    for i in _rows(2, 2):
        _save(tmp_path / "d", f"site/{i}.png", i)
    with pytest.raises(ValidationError, match=r"domain folder .*site holds no class folder"):
        scan_image_folder(tmp_path / "d", layout="domain/class")


def test_two_folders_giving_one_split_are_refused(tmp_path):
    from fedhype.data.layout import read_layout

    for split in ("train", "val", "validation"):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            (tmp_path / split / cls / "x.png").write_bytes(b"")
    with pytest.raises(ValidationError, match=r"'val' and 'validation' both give the 'val' split"):
        read_layout(tmp_path, "auto")


def test_layout_messages_count_a_name_in_two_unicode_spellings_once():
    """The ambiguous-layout message listed 'über' twice where a macOS (NFD) and a Linux (NFC) site both held it."""
    import unicodedata
    from pathlib import Path

    from fedhype.data.layout import _names

    nfc, nfd = unicodedata.normalize("NFC", "über"), unicodedata.normalize("NFD", "über")
    assert _names([Path("mac") / nfd, Path("linux") / nfc, Path("linux") / "zebra"]) == f"zebra, {nfc}"
