"""Image sources: labelled images (from a folder tree or a built-in dataset) before encoding.

An :class:`ImageSource` is a plain list of :class:`ImageRecord` plus class and domain names.
Each record loads its image lazily, so DataLoader workers decode in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from PIL import Image


@dataclass(frozen=True)
class ImageRecord:
    """One labelled image.

    Attributes:
        sample_id: stable unique id (e.g. ``"mnist/00042"`` or a relative file path).
        label: class index into :attr:`ImageSource.class_names`.
        domain: domain index into :attr:`ImageSource.domain_names`.
        load: returns the image as a PIL image in RGB mode (EXIF orientation applied).
        split: the split its folder gives (``"train"``, ``"val"`` or ``"test"``; see
            :mod:`fedhype.data.layout`), or None when the source gives no splits.
    """

    sample_id: str
    label: int
    domain: int
    load: Callable[[], Image.Image]
    split: str | None = None


@dataclass
class ImageSource:
    """A list of records with their class/domain names and provenance.

    Attributes:
        records: the images, in a fixed order.
        class_names: class names, index = label.
        domain_names: domain names, index = domain id.
        source: JSON-able provenance (dataset name, path, construction of derived domains...).
        skipped: ``[{"file": ..., "reason": ...}]`` for inputs that were not usable.
        duplicates: groups of record ids whose files are byte-identical (filled when the files are
            hashed, :func:`fedhype.encoders.cache.image_files_key`): each copy is a separate record.
        linked_outside: record ids whose file lies outside the scanned folder, reached through a symbolic link
            (followed, as torchvision's ImageFolder does; said, since it may pull in another site's images).
    """

    records: list[ImageRecord]
    class_names: list[str]
    domain_names: list[str]
    source: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    duplicates: list[list[str]] = field(default_factory=list)
    linked_outside: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)
