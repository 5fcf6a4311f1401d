"""Sites: one institution's own store and its local train/val/test split; what it tells the coordinator.

A real consortium has no pooled store: each site embeds its own images (``fedhype embed``) into its
own store and splits its own records locally (``fedhype site``). The site folder it writes holds

* ``site.json`` — **private to the site** (format :data:`SITE_FORMAT`): its name, a random site key,
  the path and digest of its store and its split (a one-client
  :class:`~fedhype.data.partition.Partition` of its store: record ids per split);
* ``card.json`` — **public** (format :data:`CARD_FORMAT`, :class:`SiteCard`): the site name, the site
  key, the number of training records n_train (the accountant needs it: q = B/n_train), the
  embedding dimension, the encoder, preprocessing and precision, and the site's class names: the names of its
  class folders, i.e. which classes it holds — or, with ``fedhype site --classes``, the consortium's
  agreed class list (a superset), so that the card does not say which classes the site holds.

The coordinator builds the federation from the cards only (:meth:`fedhype.data.roster.Roster.from_cards`):
no record id, no label, no digest of the records reaches it. The site key is drawn from the OS
entropy (``secrets.token_hex``), so it says nothing about the records; the coordinator sends it back
with every task and the site refuses a task for another key (another split, or another site).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fedhype import __version__
from fedhype.data.partition import SPLITS, Partition, make_partition
from fedhype.data.store import EmbeddingStore
from fedhype.errors import ArtifactError, MinRecordsError, ValidationError
from fedhype.io import atomic_write_json, read_json

SITE_FORMAT = "fedhype-site/1"
CARD_FORMAT = "fedhype-site-card/1"
SITE_FILE, CARD_FILE = "site.json", "card.json"
#: the site's ledger across runs (:mod:`fedhype.privacy.site_ledger`), private to the site like ``site.json``
SITE_LEDGER_FILE = "site-ledger.json"
#: store metadata that must agree across the sites of one federation (same encoder, same preprocessing)
ENCODER_KEYS = ("encoder", "weights_hash", "pooling", "preprocess", "dim")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")


def encoder_of(store: EmbeddingStore) -> dict[str, Any]:
    """The public description of how ``store`` was embedded (encoder, weights hash, pooling, preprocessing, D).

    A local encoder folder (``hf:/path/to/model``, ``hf:data/study/model``, ``hf:C:/Users/…/model``) is named by its
    last component only (``hf:<local>/model``): the site's directory layout is not public, the weights hash identifies
    the weights. Local means: absolute, relative with ``.`` or ``~``, a Windows path, or more than one ``/`` (a hub id
    is ``name`` or ``owner/name``; a privacy auditor's probe found ``hf:data/hospA_ct_finetune/vit`` published whole).
    """
    meta = store.meta or {}
    out = {k: meta.get(k) for k in ENCODER_KEYS if k != "dim"} | {"dim": store.dim}
    name = out.get("encoder")
    if isinstance(name, str) and ":" in name:
        scheme, _, rest = name.partition(":")
        if rest.startswith(("/", ".", "~")) or "\\" in rest or _WINDOWS_DRIVE.match(rest) or rest.count("/") > 1:
            out["encoder"] = f"{scheme}:<local>/{Path(rest.replace(chr(92), '/').rstrip('/')).name}"
    return out


@dataclass(frozen=True)
class SiteCard:
    """What a site tells the coordinator (public; see the module docstring).

    Attributes:
        name: the site's name (letters, digits, ``.``, ``_``, ``-``).
        key: the site key (32 hex digits, random).
        n_train: its number of training records.
        dim: embedding dimension D.
        encoder: :func:`encoder_of` its store.
        class_names: the names of the classes the site's store knows.
        dtype: the precision its encoder ran in (``"float32"``, ``"bfloat16-autocast"``: the store's ``dtype``),
            or None on a card written before cards stated it.
    """

    name: str
    key: str
    n_train: int
    dim: int
    encoder: dict[str, Any]
    class_names: list[str]
    dtype: str | None = None

    def save(self, path: str | os.PathLike) -> Path:
        """Write the card atomically as JSON."""
        return atomic_write_json(path, {"format": CARD_FORMAT, "public": "this card may be sent to the coordinator",
                                        "fedhype_version": __version__, **asdict(self)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SiteCard":
        """Read a card (``card.json``, or a site folder holding one).

        Raises:
            ArtifactError: missing file, another format, a missing or bad field.
        """
        path, raw = _read(path, CARD_FILE, CARD_FORMAT, "site card")
        for field, ok, want in (("n_train", _whole(raw.get("n_train")), "a whole number"),
                                ("dim", _whole(raw.get("dim")), "a whole number"),
                                ("class_names", isinstance(raw.get("class_names"), list) and len(raw["class_names"]) >= 1
                                 and all(isinstance(k, str) and k for k in raw["class_names"]), "a list of class names"),
                                ("name", isinstance(raw.get("name"), str), "a string"),
                                ("key", isinstance(raw.get("key"), str), "a string"),
                                ("encoder", isinstance(raw.get("encoder"), dict), "an object")):
            if not ok:  # int(true) = 1, int(54.7) = 54, int("54") = 54 and [] were read as valid (a new user's probe)
                raise ArtifactError(f"site card {path}: {field} must be {want}, got {raw.get(field)!r}; write it again "
                                    "with `fedhype site`")
        try:
            card = cls(str(raw["name"]), str(raw["key"]), int(raw["n_train"]), int(raw["dim"]), dict(raw["encoder"]),
                       [str(k) for k in raw["class_names"]],
                       raw["dtype"] if isinstance(raw.get("dtype"), str) else None)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"site card {path}: missing or bad field ({exc!r}); write it again with `fedhype site`") from None
        if not _NAME.match(card.name) or not re.fullmatch(r"[0-9a-f]{32}", card.key) or card.n_train < 1:
            raise ArtifactError(f"site card {path}: bad name, key or n_train; write it again with `fedhype site`")
        return card


def _whole(v) -> bool:
    """A JSON whole number (not a bool, a float or a string)."""
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class Site:
    """One site's private description: its name, key, store and split (see the module docstring).

    Attributes:
        name: the site name.
        key: the random site key (also on its public card).
        store_path: its embeddings store (absolute path on the site's machine).
        partition: its split, a one-client :class:`Partition` of the store (scheme ``"site"``).
    """

    name: str
    key: str
    store_path: Path
    partition: Partition
    #: the site folder it was loaded from (None for a site made in memory)
    folder: Path | None = None
    #: the class list its card announces: the consortium's agreed list (``fedhype site --classes``), or None
    #: for the store's own class names
    classes: list[str] | None = None
    #: whether ``fedhype site`` started the site's ledger across runs (``site.json``'s ``"site_ledger"``): then a
    #: missing ``site-ledger.json`` is an error, not a fresh start (a site folder of an earlier version: False)
    ledger: bool = False
    #: the file it was loaded from (``site.json``, or an archived ``site.<key>.json``; None when made in memory)
    file: Path | None = None

    def public_card(self, store: EmbeddingStore | None = None) -> SiteCard:
        """The card the coordinator receives: ``card.json`` of the site folder, checked against the site.

        Raises:
            ArtifactError: a missing or unreadable card, or one that differs from what the site's split
                and store give (edited, or written for another split).
        """
        mine = self.card(store)
        if self.folder is None:
            return mine
        path = self.folder / CARD_FILE
        if not path.is_file():
            raise ArtifactError(f"site {self.name!r}: {path} is missing; the coordinator is given that card: write the "
                                f"site folder again with `fedhype site --overwrite` (a new split and key)")
        card = SiteCard.load(path)
        if card.dtype is None:  # a card written before cards stated the precision
            from dataclasses import replace

            mine = replace(mine, dtype=None)
        if card != mine:
            diff = [k for k in ("name", "key", "n_train", "dim", "encoder", "class_names", "dtype")
                    if getattr(card, k) != getattr(mine, k)]
            raise ArtifactError(f"site {self.name!r}: {path} differs from its site.json and store in {diff}: the card "
                                "was edited or belongs to another split; write the site folder again with "
                                "`fedhype site --overwrite`")
        return card

    @property
    def split(self):
        """The site's :class:`~fedhype.data.partition.ClientSplit` (its record ids per split)."""
        return self.partition.clients[0]

    def card(self, store: EmbeddingStore | None = None) -> SiteCard:
        """The site's public card."""
        store = self.store() if store is None else store
        dtype = (store.meta or {}).get("dtype")
        return SiteCard(self.name, self.key, len(self.split.train), store.dim, encoder_of(store),
                        list(self.classes) if self.classes is not None else list(self.partition.class_names),
                        dtype if isinstance(dtype, str) else None)

    def store(self) -> EmbeddingStore:
        """The site's store, checked against its split.

        Raises:
            ArtifactError: a missing or corrupt store, or one that is not the store the split was made from.
        """
        where = (f"{self.file}" if self.file is not None else f"{self.folder / SITE_FILE}" if self.folder is not None
                 else "its site.json")
        archived = self.file is not None and self.file.name != SITE_FILE
        if not self.store_path.is_file():
            raise ArtifactError(f"site {self.name!r}: its store {self.store_path} (named in {where}, key \"store\") is "
                                "not there; if the store was moved, put the new path in that key (the store is "
                                "checked against the split's digest), else embed it again with `fedhype embed`")
        store = EmbeddingStore.load(self.store_path)
        try:
            self.partition.check_store(store)
        except ArtifactError:
            raise ArtifactError(f"site {self.name!r}: {self.store_path} (named in {where}) is not the store the site's "
                                f"split was made from ({len(store)} records here, {self.partition.store_n} then); "
                                + ("this archived split evaluates the runs trained on it only with the store it was "
                                   "made from: point its \"store\" key to a copy of that store (splitting again "
                                   "cannot help these runs)" if archived else
                                   "point that key to the site's store, or, if the images changed, embed them and "
                                   "split again with `fedhype site --overwrite --same-records` (it keeps the site's "
                                   "ledger for the records the stores share; a new site key: runs trained on the old "
                                   "split no longer accept it)")) from None
        return store

    def records(self, split: str, class_names: list[str] | None = None,
                store: EmbeddingStore | None = None) -> EmbeddingStore:
        """The site's rows of ``split``, labels renumbered to ``class_names`` (the federation's classes).

        Args:
            split: ``"train"``, ``"val"`` or ``"test"``.
            class_names: the federation's class names (default: the site's own).
            store: the site's store, if already loaded.

        Raises:
            ValidationError: a site class missing from ``class_names``.
        """
        store = self.store() if store is None else store
        sub = self.partition.client_store(store, 0, split)
        return relabel(sub, class_names) if class_names is not None else sub

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``site.json`` (private) and ``card.json`` (public) into ``folder``; returns the folder.

        Raises:
            ValidationError: ``folder`` is inside a release folder (:func:`fedhype.io.enclosing_release`).
        """
        from fedhype.io import refuse_inside_release

        folder = Path(folder)
        refuse_inside_release(folder / SITE_FILE, "the site folder's site.json (private: it lists record ids)")
        folder.mkdir(parents=True, exist_ok=True)
        card = self.card()
        atomic_write_json(folder / SITE_FILE, {
            "format": SITE_FORMAT, "private": "PRIVATE to this site: lists its record ids per split; never send it",
            "name": self.name, "key": self.key, "store": str(self.store_path), "classes": self.classes,
            **({"site_ledger": SITE_LEDGER_FILE} if self.ledger else {}), "partition": _partition_dict(self.partition)})
        card.save(folder / CARD_FILE)
        return folder

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Site":
        """Read ``site.json`` (or a site folder holding one).

        Raises:
            ValidationError: no such path, or a folder without ``site.json`` (a wrong argument, as ``budget --site``
                says; ``evaluate --site`` exited 4, "artifact", for a release folder given as a site).
            ArtifactError: an unreadable file, another format, a missing or bad field.
        """
        where = Path(path)
        if not where.exists() or (where.is_dir() and not (where / SITE_FILE).is_file()):
            raise ValidationError(f"{where}: {'no such path' if not where.exists() else f'no {SITE_FILE} there'}; give "
                                  "a site folder written by `fedhype site` (or a site.json / archived site.<key>.json)")
        path, raw = _read(path, SITE_FILE, SITE_FORMAT, "site file")
        try:
            part = Partition.from_dict(raw["partition"], where=str(path))
            classes = raw.get("classes")
            store = Path(str(raw["store"]))
            if not store.is_absolute() and ((path.parent / store).exists() or not store.exists()):
                store = path.parent / store  # a relative path edited in by hand: the site folder's, not the cwd's
            site = cls(str(raw["name"]), str(raw["key"]), store, part, path.parent,
                       None if classes is None else [str(k) for k in classes], ledger=bool(raw.get("site_ledger")),
                       file=path)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"site file {path}: missing or bad field ({exc!r}); write it again with `fedhype site`") from None
        if len(part.clients) != 1:
            raise ArtifactError(f"site file {path}: its split must hold exactly one client")
        return site


def _read(path: str | os.PathLike, name: str, fmt: str, what: str) -> tuple[Path, dict[str, Any]]:
    """``(path, JSON object)`` of a site folder's ``name`` file (or the file itself), checked for format ``fmt``.

    Raises:
        ArtifactError: missing or unreadable file, or another format.
    """
    path = Path(path)
    if path.is_dir():
        path = path / name
    raw = read_json(path, what)
    if not isinstance(raw, dict) or raw.get("format") != fmt:
        raise ArtifactError(f"{path}: not a fedhype {what} (format {fmt!r}); write it with `fedhype site`")
    return path, raw


def _partition_dict(p: Partition) -> dict[str, Any]:
    return p.to_dict()


def relabel(store: EmbeddingStore, class_names: list[str]) -> EmbeddingStore:
    """``store`` with its labels renumbered to ``class_names`` by name (a site may hold fewer classes).

    Raises:
        ValidationError: a class of ``store`` missing from ``class_names``.
    """
    if list(store.class_names) == list(class_names):
        return store
    index = {k: i for i, k in enumerate(class_names)}
    missing = [k for k in store.class_names if k not in index]
    if missing:
        raise ValidationError(f"class(es) {missing} of the site's store are not among the federation's classes "
                              f"{list(class_names)}")
    lut = torch.tensor([index[k] for k in store.class_names], dtype=torch.int64)
    return EmbeddingStore(store.embeddings, lut[store.labels] if len(store) else store.labels, store.domains,
                          list(store.sample_ids), list(class_names), list(store.domain_names), dict(store.meta))


def make_site(store: EmbeddingStore, store_path: str | os.PathLike, name: str, *,
              splits: tuple[float, float, float] = (0.6, 0.2, 0.2), seed: int = 0, min_train: int = 20,
              use_given_splits: bool = True, classes: list[str] | None = None) -> Site:
    """Split one site's records into train/val/test (per class, or as its image folders give them).

    Args:
        store: the site's embeddings store (from ``fedhype embed``).
        store_path: where that store lies (recorded in the private ``site.json``).
        name: the site's name (letters, digits, ``.``, ``_``, ``-``; at most 64 characters).
        splits, seed, use_given_splits: as for :func:`~fedhype.data.partition.make_partition`.
        classes: the consortium's agreed class list for the card (must hold every class of the store;
            None: the store's own class names, which tell which classes the site holds).
        min_train: refuse a split with fewer training records.

    Raises:
        ValidationError: a bad name, bad fractions; MinRecordsError: too few training records.
    """
    if not _NAME.match(name) or name.isdigit():
        raise ValidationError(f"site name {name!r}: use 1-64 ASCII letters, digits, '.', '_' or '-' (starting with a "
                              "letter or digit, not a number alone: a run numbers its clients 0, 1, …); it names the "
                              "site in every report")
    if classes is not None:
        if len(set(classes)) != len(classes) or any(not str(k).strip() for k in classes):
            raise ValidationError(f"--classes {list(classes)}: give distinct, non-empty class names")
        missing = [k for k in store.class_names if k not in classes]
        if missing:
            raise ValidationError(f"the store's class(es) {missing} are not in --classes {list(classes)}: the agreed "
                                  "list must hold every class of the site")
    if store.kind != "real":
        raise ArtifactError(f"a site splits its real records; this store is marked kind={store.kind!r} (a synthetic "
                            "store is drawn from a run, it is not a site's data): give the store `fedhype embed` wrote")
    try:
        part = make_partition(store, scheme="iid", n_clients=1, splits=splits, min_train_per_client=min_train,
                              seed=seed, use_given_splits=use_given_splits)
    except MinRecordsError as exc:
        n = exc.clients[0][1] if exc.clients else 0
        raise MinRecordsError(f"site {name!r} would have {n} training records ({len(store)} records in all), fewer than "
                              f"--min-records {exc.minimum}; lower --min-records (the training minimum, `fedhype train "
                              f"--min-records`, must then be as low), or give the site more records",
                              stage="partition", minimum=exc.minimum, clients=[(name, *exc.clients[0][1:])],
                              n_clients=1) from None
    part.scheme = "site"
    part.clients[0].name = name
    return Site(name, secrets.token_hex(16), Path(store_path).resolve(), part, None,
                None if classes is None else list(classes))


def site_splits(site: Site) -> dict[str, int]:
    """Record counts per split (private to the site)."""
    return {k: len(site.split.ids(k)) for k in SPLITS}


def split_file(folder: str | os.PathLike, key: str) -> Path | None:
    """The file of site folder ``folder`` that holds the split whose site key is ``key``: ``site.json`` where that is
    the current split, else ``site.<first 8 hex digits of key>.json`` (``fedhype site --overwrite`` keeps the previous
    split under that name) where it is there and carries ``key``; None where neither does (for the message that
    names the split a run used: a file that is not there must not be suggested).
    """
    folder = Path(folder)
    for path in (folder / SITE_FILE, folder / f"site.{str(key)[:8]}.json"):
        try:
            if path.is_file() and str(json.loads(path.read_text(encoding="utf-8")).get("key")) == str(key):
                return path
        except (OSError, ValueError, AttributeError):
            continue
    return None
