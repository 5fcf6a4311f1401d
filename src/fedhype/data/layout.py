"""Which folder of an image tree is a class, a domain or a split (``--layout``).

Layouts (``LAYOUTS``):

* ``class`` — torchvision ``ImageFolder`` semantics: ``root/<class>/...``; every image below a
  class folder, however deeply nested (``benign/patient_01/scan.png``), is in that class. One
  domain, named after ``root``.
* ``domain/class`` — ``root/<domain>/<class>/...``; nested folders below a class stay in it.
* ``auto`` (the default) — detected only where one reading is possible, refused otherwise:

  - every folder under ``root`` holds only files → ``class``;
  - every folder under ``root`` holds only split folders (``<domain>/train/<class>/...``) →
    ``domain/class`` with per-domain splits;
  - every folder holds only sub-folders (``a/b/image``) → refused: ``a`` may be a class
    (``b`` a patient, a session...) or a domain (``b`` a class); the message names both readings;
  - some folders hold files and others sub-folders → refused as a mixed layout.

Split folders (``SPLIT_FOLDERS``: ``train``, ``val``, ``validation``, ``test``; any case) are
recognised as given splits, never as classes or domains, when *every* folder at one level is a
split folder: at the top (``root/train/...``, ``root/test/...``, the layout applying inside
each) or directly under each domain (``root/<domain>/train/<class>/...``). A level that mixes
split folders with other folders is refused by ``auto`` (with an explicit layout the split
names are then ordinary class or domain names).
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from fedhype.errors import ValidationError

LAYOUTS = ("auto", "class", "domain/class")
#: folder name (lower case) → the split it gives
SPLIT_FOLDERS = {"train": "train", "val": "val", "validation": "val", "test": "test"}
#: how to choose a layout in each interface (named in every refusal)
HOW = "--layout for `fedhype embed`, data.layout in a job, layout= in Python"


@dataclass(frozen=True)
class ClassFolder:
    """One class folder of the tree: every file below ``path`` is an image of ``class_name``."""

    path: Path
    class_name: str
    domain_name: str
    split: str | None


@dataclass(frozen=True)
class Layout:
    """The reading of a tree: its class folders, the layout used and where splits sit.

    Attributes:
        layout: ``"class"`` or ``"domain/class"`` (never ``"auto"``).
        asked: the layout asked for (``"auto"``, ``"class"`` or ``"domain/class"``).
        folders: every class folder, in sorted path order.
        split_component: index of the split folder in a record's relative path (0: at the top,
            1: under each domain), or None when the tree gives no splits.
        split_folders: the split folder names found → the split each gives.
        stray: files outside any class folder (not images of any class).
    """

    layout: str
    asked: str
    folders: list[ClassFolder]
    split_component: int | None
    split_folders: dict[str, str]
    stray: list[Path]


def check_layout(layout: str, flag: str = "--layout") -> str:
    """Return ``layout`` if it is one of :data:`LAYOUTS`.

    Raises:
        ValidationError: any other value, naming ``flag`` and the values allowed.
    """
    if layout not in LAYOUTS:
        raise ValidationError(f"{flag} must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return layout


def _entries(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as it:
        return sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)


def _dirs(folder: Path) -> list[Path]:
    return [Path(e.path) for e in _entries(folder) if e.is_dir()]


def _splits_of(folder: Path, strict_names: bool) -> list[Path] | None:
    """The sub-folders of ``folder`` if every one is a split folder (at least one), else None.

    With ``strict_names`` (``auto``), a level mixing split folders with other folders is refused.
    """
    subs = _dirs(folder)
    split = [d for d in subs if d.name.lower() in SPLIT_FOLDERS]
    if split and len(split) == len(subs):
        seen: dict[str, str] = {}
        for d in subs:  # val/ beside validation/ (or Train/ beside train/): one split from two folders
            other = seen.setdefault(SPLIT_FOLDERS[d.name.lower()], d.name)
            if other != d.name:
                raise ValidationError(f"{folder}: the folders {other!r} and {d.name!r} both give the "
                                      f"{SPLIT_FOLDERS[d.name.lower()]!r} split; merge them into one or rename one")
        return subs
    if split and strict_names:
        other = [d.name for d in subs if d not in split]
        raise ValidationError(
            f"{folder}: split folder(s) {[d.name for d in split]} sit beside other folders {other[:5]}; put every class "
            f"(or domain) folder inside a split folder ({folder}/train/<class>/...), or choose a layout explicitly "
            f"({HOW}) to read {split[0].name!r} as an ordinary folder name")
    return None


def _names(paths: list[Path], k: int = 5) -> str:
    # in NFC, as classes are read: a macOS (NFD) and a Linux (NFC) site's "über" is one name, counted once
    names = sorted({unicodedata.normalize("NFC", p.name) for p in paths})
    return ", ".join(names[:k]) + (f", … ({len(names)} in all)" if len(names) > k else "")


def read_layout(root: Path, layout: str = "auto") -> Layout:
    """Read the tree under ``root`` as ``layout`` (see the module docstring).

    Raises:
        ValidationError: an unknown layout; ``auto`` on an ambiguous or mixed tree (the message
            names the readings and the flag to pass); a domain folder that is empty or holds no
            class folder; domains of which only some have split folders.
    """
    check_layout(layout, "layout")
    auto = layout == "auto"
    top_splits = _splits_of(root, auto)
    bases = [(SPLIT_FOLDERS[d.name.lower()], d) for d in top_splits] if top_splits else [(None, root)]
    stray = [Path(e.path) for b in ([root] + [d for _, d in bases if d is not root]) for e in _entries(b) if e.is_file()]
    level = [(split, d) for split, base in bases for d in _dirs(base)]  # classes or domains
    split_folders = {d.name: SPLIT_FOLDERS[d.name.lower()] for d in top_splits or []}
    if auto:
        layout = _detect(root, [d for _, d in level])
    folders: list[ClassFolder] = []
    split_component = 0 if top_splits else None
    if layout == "class":
        domain = root.resolve().name or "images"
        folders = [ClassFolder(d, d.name, domain, split) for split, d in level]
    else:
        with_splits = {}
        for split, ddir in level:
            if not _entries(ddir):
                raise ValidationError(f"domain folder {ddir} is empty: add <class>/<image> folders to it or remove it")
            inner = None if top_splits else _splits_of(ddir, auto)
            with_splits[ddir] = inner is not None
            for f in _entries(ddir):
                if f.is_file():
                    stray.append(Path(f.path))
            if inner is not None:
                for s in inner:
                    split_folders[s.name] = SPLIT_FOLDERS[s.name.lower()]
                    stray.extend(Path(e.path) for e in _entries(s) if e.is_file())
                    folders += [ClassFolder(c, c.name, ddir.name, SPLIT_FOLDERS[s.name.lower()]) for c in _dirs(s)]
            else:
                classes = _dirs(ddir)
                if not classes:
                    raise ValidationError(f"domain folder {ddir} holds no class folder: put its images in "
                                          f"{ddir}/<class>/, or read the tree with --layout class")
                folders += [ClassFolder(c, c.name, ddir.name, split) for c in classes]
        if any(with_splits.values()) and not all(with_splits.values()):
            have = [d.name for d, v in with_splits.items() if v]
            lack = [d.name for d, v in with_splits.items() if not v]
            raise ValidationError(f"{root}: domain(s) {have[:5]} hold split folders (train/, test/...) but {lack[:5]} do "
                                  "not; give every domain the same split folders, or none")
        if any(with_splits.values()):
            split_component = 1
    folders.sort(key=lambda f: f.path)
    return Layout(layout, "auto" if auto else layout, folders, split_component, split_folders, sorted(stray))


def _detect(root: Path, level: list[Path]) -> str:
    """The one layout that fits ``level`` (the folders directly under the root or its split folders)."""
    content = {d: _entries(d) for d in level}
    full = {d: c for d, c in content.items() if c}
    holds_files = [d for d, c in full.items() if any(e.is_file() for e in c)]
    holds_dirs = [d for d, c in full.items() if any(e.is_dir() for e in c)]
    if not holds_dirs:
        return "class"  # every folder holds only files (or is empty: reported as an empty class folder)
    if holds_files:
        return _refuse_mixed(root, holds_files, holds_dirs)
    subs = {d: [Path(e.path) for e in c] for d, c in full.items()}
    if all(_splits_of(d, True) is not None for d in full):
        return "domain/class"  # <domain>/<split>/<class>/...: a class has no train/test folders
    inner = [p for d in full for p in subs[d]]
    d0 = next(iter(full))
    ex = subs[d0][0]
    # the same sub-folder names under every folder read like sites holding the same classes (a probe: every two-level
    # tree was called ambiguous, its own sites' too): still refused — a class's nested folders may repeat names —
    # but the likelier reading is said
    same = len(full) >= 2 and len({frozenset(p.name for p in subs[d]) for d in full}) == 1
    # ... but patients numbered alike in every class look the same (a new user's class/patient_00/ tree was pointed at
    # domain/class, which made patient ids class names on the site's public card): both cases are said
    hint = (f"; every folder holds the same sub-folders ({_names(subs[d0])}), as domains of the same classes do: "
            "most likely --layout domain/class, unless they are patients, sessions or other groups numbered alike "
            "within each class: then --layout class keeps them inside their class (read as domain/class, their names "
            "become class names, which a site's public card lists)" if same else "")
    raise ValidationError(
        f"{root}: ambiguous layout: every folder under it holds only sub-folders (e.g. {ex.relative_to(root)}/), so it "
        f"reads two ways: as --layout class (classes {_names(list(full))}; the sub-folders below a class, e.g. "
        f"{ex.name}, stay in that class, as in torchvision's ImageFolder) or as --layout domain/class (domains "
        f"{_names(list(full))}; classes {_names(inner)}){hint}. Choose one ({HOW})")


def _refuse_mixed(root: Path, holds_files: list[Path], holds_dirs: list[Path]) -> str:
    both = [d for d in holds_files if d in holds_dirs]  # each folder named once (a probe read 'square' on both sides)
    dirs, files = [d for d in holds_dirs if d not in both], [d for d in holds_files if d not in both]

    def hold(paths: list[Path], noun: bool = False) -> str:  # "sneaker holds", "bag, tshirt hold" (a probe: "sneaker hold")
        one = len({p.name for p in paths}) == 1
        return f"{('folder ' if one else 'folders ') if noun else ''}{_names(paths)} {'holds' if one else 'hold'}"

    def nested(d: Path) -> str:  # the sub-folder itself, e.g. sneaker/loop/ (a probe was shown "e.g. sneaker/")
        sub = next((Path(e.path) for e in _entries(d) if e.is_dir()), d)
        return f"{sub.relative_to(root).as_posix()}/"

    parts = ([f"{hold(dirs, noun=True)} sub-folders (e.g. {nested(dirs[0])})"] if dirs else []) \
        + ([f"{hold(files)} images directly"] if files else []) \
        + ([f"{hold(both)} both images and sub-folders (e.g. {nested(both[0])})"] if both else [])
    raise ValidationError(
        f"{root}: mixed layout: {', while '.join(parts)}. Use <class>/<image> or <domain>/<class>/<image> for every "
        f"folder, or pass --layout class to read each top folder as one class with everything below it ({HOW})")
