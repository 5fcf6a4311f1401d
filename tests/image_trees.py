"""Image folders of real digits for the layout and image-folder CLI tests: UCI optdigits
(sklearn ``load_digits``, 0–16 scaled to 0–255, 4× nearest upscaling) written as PNG files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

_D = load_digits()
#: the digits themselves (``images`` [1797, 8, 8] in 0–16, ``target`` [1797])
DIGITS = _D


def save_digit(root: Path, rel: str, i: int) -> None:
    """Real optdigits image ``i`` at ``root/rel`` (folders created)."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    px = np.kron(np.round(_D.images[i] * 255 / 16), np.ones((4, 4))).astype(np.uint8)
    Image.fromarray(px, "L").save(path)


def digit_rows(label: int, k: int, skip: int = 0) -> list[int]:
    """Indices of ``k`` images of digit ``label``, after skipping the first ``skip``."""
    return np.flatnonzero(_D.target == label)[skip:skip + k].tolist()


def patient_tree(root: Path) -> Path:
    """``<class>/patient_XX/<i>.png``: three classes (digits 0, 1, 2 standing for benign, malignant,
    normal), two patients each, two images per patient; 12 images."""
    for label, cls in enumerate(("benign", "malignant", "normal")):
        for p in range(2):
            for i in digit_rows(label, 2, skip=2 * p):
                save_digit(root, f"{cls}/patient_{label}{p}/{i}.png", i)
    return root


def split_tree(root: Path, labels=(0, 1, 2), train: int = 4, test: int = 2, domains=(None,)) -> Path:
    """``[<domain>/]<split>/<label>/<i>.png`` (or ``<split>/<label>/...`` without a domain)."""
    for d in domains:
        for label in labels:
            for split, rows in (("train", digit_rows(label, train)), ("test", digit_rows(label, test, skip=train))):
                for i in rows:
                    save_digit(root, f"{d + '/' if d else ''}{split}/{label}/{i}.png", i)
    return root
