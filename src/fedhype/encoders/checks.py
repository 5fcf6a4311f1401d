"""What an embedded image folder or dataset should be warned about: the one source of these warnings for
``fedhype embed`` (printed as ``warning:`` lines), :func:`fedhype.embed` (raised as
:class:`~fedhype.errors.FedhypeWarning`) and ``fedhype run`` (logged by its embed stage).

- image files reached through a symbolic link from outside the folder (read as its records);
- byte-identical image files: each copy is its own record, so one image stored k times is protected only as a
  group of k (ε grows about k-fold: group privacy, Dwork & Roth 2014, Th. 2.2);
- copies under different classes, whose labels conflict (:func:`label_conflicts`);
- files that could not be read and were skipped;
- classes the store lists without a record (:func:`empty_classes`);
- images far smaller than the encoder's input (:func:`fedhype.encoders.embed.small_images_warning`).
"""

from __future__ import annotations

from typing import Any


def label_conflicts(source) -> list[dict[str, list[str]]]:
    """The groups of byte-identical files (``source.duplicates``) that lie under more than one class:
    ``[{"files": [...], "classes": [...]}]`` (the class of each file, in the group's order)."""
    cls = {r.sample_id: source.class_names[r.label] for r in source.records}
    out = []
    for group in getattr(source, "duplicates", None) or []:
        classes = [cls.get(f, "?") for f in group]
        if len(set(classes)) > 1:
            out.append({"files": list(group), "classes": classes})
    return out


def empty_classes(store) -> list[str]:
    """The classes the store lists without a record."""
    return [c for c, n in zip(store.class_names, store.class_counts()) if n == 0]


def duplicate_warnings(source, *, listed: bool = False) -> list[str]:
    """The warnings about ``source.duplicates`` (byte-identical files; :func:`fedhype.encoders.cache.image_files_key`
    finds them): their count, and the copies that lie under different classes. ``listed``: add where
    ``fedhype embed --json`` lists them. First, the files reached through a symbolic link from outside the folder
    (``source.linked_outside``: a helper's link pulled another site's images into a class without a word)."""
    outside = getattr(source, "linked_outside", None) or []
    root = (getattr(source, "source", None) or {}).get("root", "the folder")
    links = [f"{len(outside)} image file(s) lie outside {root}, reached through a symbolic link (e.g. {outside[0]}); "
             "they are read as this folder's records: check that they belong to this site"] if outside else []
    dups = getattr(source, "duplicates", None) or []
    if not dups:
        return links
    extra = sum(len(g) - 1 for g in dups)
    ex = dups[0]
    out = links + [f"{extra} image file(s) are byte-identical copies of others (e.g. {ex[0]} = {ex[1]}): each copy is a "
           "separate record, so an image stored k times is protected only as a group of k; remove the copies before "
           "embedding" + (" (--json lists them)" if listed else "")]
    conflicts = label_conflicts(source)
    if conflicts:  # a probe's image in two class folders was reported only as a duplicate
        c = conflicts[0]
        ex_ = " = ".join(f"{f} (class {k})" for f, k in zip(c["files"], c["classes"]))
        out.append(f"{len(conflicts)} image(s) are stored byte-identical under different classes, so their labels "
                   f"conflict (e.g. {ex_}): one image cannot be of two classes; keep it in its right class folder and "
                   "remove the other copies" + (" (--json lists them under label_conflicts)" if listed else ""))
    return out


def store_warnings(store, *, where: str, limit: int | None = None, limit_name: str = "--limit",
                   images: bool = True, skipped: bool = False) -> list[str]:
    """The warnings about an embedded store: classes it lists without a record (a class with no record cannot be
    trained on; a small ``limit`` keeps only some classes), (``images``: the user's own folder) images far smaller
    than the encoder's input, and (``skipped``) the files that could not be read (``meta["skipped"]``; ``fedhype
    embed`` prints those one by one instead).

    Args:
        store: the :class:`~fedhype.data.store.EmbeddingStore` written or returned.
        where: how the texts name it (``"out.safetensors"``, ``"the store"``).
        limit, limit_name: the subset size asked for and its option's name (``--limit``, ``limit=``, ``data.limit``).
    """
    out: list[str] = []
    empty = empty_classes(store)
    if empty:  # a probe's --limit 3 on 5 class folders wrote a store listing 2 classes without records
        names, k = ", ".join(empty), len(store.class_names)
        if limit is not None:
            why = (f"{limit_name} {limit} keeps {len(store)} image(s) of {k} classes; give a larger {limit_name} "
                   "(every class keeps an image once it is at least the number of (domain, class) folders, split "
                   "folders counted)")
        else:
            why = "every image of it failed to decode (see skipped): fix or replace them"
        out.append(f"class{'es' if len(empty) > 1 else ''} {names} {'have' if len(empty) > 1 else 'has'} no record "
                   f"in {where}: a class with no record cannot be trained on ({why})")
    bad: list[dict[str, Any]] = store.meta.get("skipped") or []
    if skipped and bad:
        first = bad[0]
        out.append(f"{len(bad)} image file(s) could not be read and were skipped (e.g. {first.get('file')}: "
                   f"{first.get('reason')}): fix or remove them")
    small = store.meta.get("small_images")
    if images and small:
        from fedhype.encoders.embed import small_images_warning

        out.append(small_images_warning(small))
    return out
