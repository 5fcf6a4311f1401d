"""Client partitions: which records each client holds, split into train / val / test.

A :class:`Partition` holds no embedding, but it is **private to the holder of the store**: it lists
every record's id per client and split. The ids are opaque (:func:`~fedhype.data.store.opaque_id`,
BLAKE2b-80 of the store's sample ids: no file path, no class folder), and a federation's server is
given only the partition's public :meth:`Partition.roster` (client names and sizes). A real
consortium has no pooled store: each site splits its own records (:mod:`fedhype.data.sites`). It is made once
from an :class:`~fedhype.data.store.EmbeddingStore` by :func:`make_partition` and saved as JSON
(format tag ``"fedhype-partition/1"``); later stages select a client's rows with
:meth:`Partition.client_store`. Because it holds ids, the same partition applies to any store of
the same images (e.g. another encoder); :meth:`Partition.check_store` tests for the exact store.

Schemes:

* ``domain`` — one client per domain id; with more clients than domains, each domain is split
  into several clients (clients are handed to the domain with the largest records-per-client,
  D'Hondt apportionment, so client sizes are as even as possible; labels dealt stratified).
* ``dirichlet`` — label skew: for each class, client shares ~ Dirichlet(α·1_K) (Hsu, Qi & Brown
  2019, Sec. 3), with the NIID-Bench / FedLab ``hetero_dir_partition`` balancing (a client
  already above N/K gets no more) and redraws (at most ``DIRICHLET_MAX_DRAWS``) until every
  client can meet ``min_train_per_client``.
* ``iid`` — every class dealt over clients with equal shares, or with client shares
  ~ Dirichlet(quantity_skew·1_K) for quantity skew (Li et al., NIID-Bench, ICDE 2022, Sec. 4.2).

Each client's records are then split per class into train/val/test (largest-remainder rounding
that keeps every class and the client's totals within one record of the fractions) — unless the
store records *given* splits (image folders with ``train/``, ``val/``, ``test/`` folders, see
:mod:`fedhype.data.layout` and :func:`given_splits`): then each record keeps its given split, and
only a split the folders do not give (e.g. ``val`` beside ``train/`` + ``test/``) is drawn from
the client's given training records with the fractions.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedhype.data.store import EmbeddingStore, opaque_id
from fedhype.errors import ArtifactError, MinRecordsError, ValidationError, counted
from fedhype.errors import listed as listed_items
from fedhype.io import atomic_write_json, read_json

if TYPE_CHECKING:
    from fedhype.data.roster import Roster

FORMAT = "fedhype-partition/1"
SCHEMES = ("domain", "dirichlet", "iid")
SPLITS = ("train", "val", "test")
DIRICHLET_MAX_DRAWS = 100
UNKEYED = "unkeyed"
PRIVATE_NOTE = ("PRIVATE to the holder of the store: lists which records each client holds in each split (opaque "
                "ids: BLAKE2b of the sample ids). A federation's server needs only its roster (names and sizes).")


@dataclass
class ClientSplit:
    """One client's sample ids per split."""

    id: int
    name: str
    train: list[str]
    val: list[str]
    test: list[str]

    @property
    def n_train(self) -> int:
        """Its number of training records (public: the accountant's n_i)."""
        return len(self.train)

    @property
    def n_records(self) -> int:
        """Its number of records over the three splits."""
        return len(self.train) + len(self.val) + len(self.test)

    def __repr__(self) -> str:
        """One line: its id, name and split sizes (not every sample id)."""
        return (f"ClientSplit(id={self.id}, name={self.name!r}, train={len(self.train)}, val={len(self.val)}, "
                f"test={len(self.test)})")

    def ids(self, split: str) -> list[str]:
        """Sample ids of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
        if split not in SPLITS:
            raise ValidationError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        return getattr(self, split)


@dataclass
class Partition:
    """Clients → train/val/test sample ids, with the parameters and store it was made from."""

    scheme: str
    params: dict[str, Any]
    seed: int
    store_digest: str
    store_n: int
    class_names: list[str]
    clients: list[ClientSplit] = field(default_factory=list)
    #: a random token drawn when the partition was made (``secrets.token_hex``): the partition's data key
    key: str = ""

    def __repr__(self) -> str:
        """A short summary: scheme, parameters, the store's size and each client's split sizes (five listed); the
        dataclass's own repr printed every sample id (a new user's ``print(clients)``)."""
        from fedhype.errors import listed

        shown = [f"{c.name} {len(c.train)}/{len(c.val)}/{len(c.test)}" for c in self.clients]
        return (f"Partition(scheme={self.scheme!r}, params={self.params!r}, seed={self.seed}, store_n={self.store_n}, "
                f"{counted(len(self.clients), 'client')} (train/val/test): {listed(shown)})")

    @property
    def data_key(self) -> str:
        """What a run and its synthetic stores record of this partition: its random key (it says nothing
        about the records), or ``"unkeyed"`` for a partition written before keys existed."""
        return self.key or UNKEYED

    def key_mismatch(self, keys) -> str | None:
        """Why this partition is not among a run's data ``keys`` (its ``data_keys``), or ``None`` when it is.

        A run that recorded no keys is not checked. A partition without a key (written before keys existed, or
        with its ``key`` field removed) matches only a run that was itself trained on unkeyed partitions: against
        a keyed run it would disable the check that the held-out split is not another partition's training
        data (a probe deleted the field and `evaluate` scored silently).
        """
        keys = [str(k) for k in (keys or [])]
        if not keys or self.data_key in keys:
            return None
        shown = ", ".join(sorted({k[:8] + "…" for k in keys}))
        if not self.key:
            return (f"the partition has no key (its `key` field is missing: written before keys existed, or "
                    f"edited), the run's data keys are {shown}")
        return f"the partition's key ({self.key[:8]}…) is not among the run's data keys ({shown})"

    # ------------------------------------------------------------------ persistence
    def seal(self) -> str:
        """SHA-256 of the partition's key and content (clients' record ids per split, store digest, class names): written
        beside them, so that a file edited afterwards — a client's train and test lists swapped, or another partition's
        key copied in — no longer loads (a probe's swapped lists kept the key, and `evaluate` scored on training
        records). Private like the file: it is never published (the runs record the key only)."""
        body = {"key": self.key, "scheme": self.scheme, "params": self.params, "seed": self.seed,
                "store_digest": self.store_digest, "store_n": self.store_n, "class_names": list(self.class_names),
                "clients": [[c.id, c.name, list(c.train), list(c.val), list(c.test)] for c in self.clients]}
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form :meth:`save` writes (and a site's ``site.json`` embeds), with its :meth:`seal`."""
        return {"format": FORMAT, **asdict(self), "seal": self.seal()}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the partition atomically as JSON (format ``"fedhype-partition/1"``), with a header saying
        it is private to the data holder (it lists every record's opaque id per client and split).

        Raises:
            ValidationError: ``path`` is inside a release folder (:func:`fedhype.io.enclosing_release`).
        """
        from fedhype.io import refuse_inside_release

        refuse_inside_release(path, "the partition (private: it lists record ids)")
        return atomic_write_json(path, {"private": PRIVATE_NOTE, **self.to_dict()})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Partition":
        """Read a partition file.

        Raises:
            ArtifactError: missing file, invalid JSON, wrong format tag, missing fields, no clients,
                two clients with the same name, or a sample id listed twice.
        """
        return cls.from_dict(read_json(path, "partition file"), where=str(path))

    @classmethod
    def from_dict(cls, raw: Any, where: str = "partition") -> "Partition":
        """A partition from its JSON form (:meth:`save`'s content); raises as :meth:`load`."""
        path = where
        if isinstance(raw, dict) and str(raw.get("format", "")).startswith(("fedhype-site/", "fedhype-site-card/")):
            # a sound file given where it does not belong: say what it is and what takes it (exit 4, as for every file
            # of another kind than the option asks: the README's exit codes)
            raise ArtifactError(f"{path} is a site's file (`fedhype site`), not a partition: give the site folder "
                                  "as --site where the command takes one (train, evaluate, budget --card for its "
                                  "card); `audit --mia` needs the pooled partition a run trained on (membership "
                                  "inference on a site's own split is not built)")
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
            raise ArtifactError(f"{path}: format {got!r}, expected {FORMAT!r} (make it with `fedhype partition`)")
        try:
            clients = [
                ClientSplit(int(c["id"]), str(c["name"]), *[[str(s) for s in c[k]] for k in SPLITS])
                for c in raw["clients"]
            ]
            part = cls(str(raw["scheme"]), dict(raw["params"]), int(raw["seed"]), str(raw["store_digest"]),
                       int(raw["store_n"]), [str(c) for c in raw["class_names"]], clients, str(raw.get("key", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"partition file {path} is missing or has a bad field ({exc!r}); re-create it") from None
        if not clients:
            raise ArtifactError(f"partition file {path} lists no clients; re-create it with `fedhype partition`")
        names = [c.name for c in clients]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ArtifactError(f"partition file {path}: client name(s) {dup} are used by more than one client; every "
                                "client needs its own name (it labels the client's code and rows in every report)")
        all_ids = [s for c in clients for k in SPLITS for s in c.ids(k)]
        if len(set(all_ids)) != len(all_ids):
            raise ArtifactError(f"partition file {path}: a sample id is listed twice; re-create it")
        if [c.id for c in clients] != list(range(len(clients))):
            raise ArtifactError(f"partition file {path}: client ids must be 0..{len(clients) - 1} in order")
        if raw.get("seal") is not None and raw.get("seal") != part.seal():  # none: written before seals (not checked)
            raise ArtifactError(f"partition file {path} was edited after it was written (its record lists, key or "
                                "store no longer match its seal): a run bound to it could be scored on its own "
                                "training records; restore the file the run trained on, or make a new partition "
                                "(and train again)")
        return part

    def roster(self, dim: int | None = None, encoder: Any = None) -> "Roster":
        """The public :class:`~fedhype.data.roster.Roster` of this partition: names, training-set sizes,
        class names, the store digest as data key — no record id (what the coordinator is given)."""
        from fedhype.data.roster import Roster

        return Roster.from_partition(self, dim, encoder)

    # ------------------------------------------------------------------ use with a store
    def check_store(self, store: EmbeddingStore) -> None:
        """Raise :class:`ArtifactError` unless ``store`` is the store this partition was made from."""
        if len(store) != self.store_n or store.digest() != self.store_digest:
            raise ArtifactError(
                f"partition was made from another store ({self.store_n} records, digest {self.store_digest[:12]}…), "
                f"not this one ({len(store)} records, digest {store.digest()[:12]}…); re-run `fedhype partition`"
            )
        if list(self.class_names) != list(store.class_names):
            raise ArtifactError(f"the partition's class names {list(self.class_names)} differ from the store's "
                                f"{list(store.class_names)}: the partition file was edited or made from another store; "
                                "re-run `fedhype partition`")

    def client_store(self, store: EmbeddingStore, client_id: int, split: str) -> EmbeddingStore:
        """The rows of ``store`` that client ``client_id`` holds in ``split``.

        Raises:
            ValidationError: unknown client or split.
            ArtifactError: an id of the partition is not in ``store``.
        """
        if not 0 <= client_id < len(self.clients):
            raise ValidationError(f"client {client_id} does not exist; the partition has {counted(len(self.clients), 'client')}")
        return store.subset(store.positions(self.clients[client_id].ids(split)))

    def split_store(self, store: EmbeddingStore, split: str) -> EmbeddingStore:
        """All clients' rows of ``split``, client after client; domains stay the store's domain ids.

        Row ``i`` belongs to client ``client_ids(split)[i]``.
        """
        return store.subset(store.positions([s for c in self.clients for s in c.ids(split)]))

    def client_ids(self, split: str) -> np.ndarray:
        """int64 ``[n_split]``: the client index of each row of :meth:`split_store`."""
        return np.concatenate([np.full(len(c.ids(split)), c.id, dtype=np.int64) for c in self.clients])

    def sizes(self) -> list[dict[str, Any]]:
        """Per client ``{"client", "name", "train", "val", "test"}`` record counts (public counts)."""
        return [{"client": c.id, "name": c.name, **{k: len(c.ids(k)) for k in SPLITS}} for c in self.clients]

    def summary(self) -> dict[str, Any]:
        """Small JSON-able description: scheme, params, seed, store size, per-client counts."""
        sizes = self.sizes()
        return {"scheme": self.scheme, "params": self.params, "seed": self.seed, "n_clients": len(self.clients),
                "store_n": self.store_n, "totals": {k: sum(s[k] for s in sizes) for k in SPLITS}, "clients": sizes}


# ---------------------------------------------------------------------------- given splits
def given_splits(store: EmbeddingStore) -> np.ndarray | None:
    """The split (``"train"``, ``"val"`` or ``"test"``) each record's image folder gives, or None.

    Read from ``store.meta["source"]["splits"]`` (written by
    :func:`fedhype.data.images.scan_image_folder`): the split folder is path component
    ``component`` of a record's sample id, and ``folders`` maps its name to the split.

    Returns:
        ``numpy`` str array ``[N]`` in row order, or None when the store records no splits.

    Raises:
        ArtifactError: a sample id without one of the recorded split folders (an edited store).
    """
    spec = (store.meta.get("source") or {}).get("splits") if isinstance(store.meta.get("source"), dict) else None
    if not spec:
        return None
    comp, folders = int(spec["component"]), dict(spec["folders"])
    out = []
    for sid in store.sample_ids:
        parts = sid.split("/")
        name = parts[comp] if len(parts) > comp else None
        if name not in folders:
            raise ArtifactError(f"sample id {sid!r} is not under one of the split folders {sorted(folders)} the store "
                                "records (meta.source.splits); re-create the store with `fedhype embed`")
        out.append(folders[name])
    return np.asarray(out, dtype=object)


def _given_split(idx: np.ndarray, given: np.ndarray, labels: np.ndarray, drawn: dict[str, float],
                 rng: np.random.Generator) -> list[np.ndarray]:
    """Rows ``idx`` by their given split; the splits in ``drawn`` (absent from the store) are drawn from
    the given train rows with those fractions (stratified by label, as :func:`_apportion`)."""
    parts = {k: np.sort(idx[given[idx] == k]) for k in SPLITS}
    if drawn:
        names = ["train", *drawn]
        shares = np.array([1.0 - sum(drawn.values()), *drawn.values()])
        for k, piece in zip(names, _apportion(parts["train"], labels, shares, rng)):
            parts[k] = piece
    return [parts[k] for k in SPLITS]


def given_splits_line(given: dict[str, Any], how: str = "") -> str:
    """One line saying that a partition keeps the image folders' splits (its ``params["given_splits"]``)."""
    drawn = given.get("drawn_from_train") or {}
    return (f"partition: using the splits the image folders give ({', '.join(given['given'])}) instead of drawing them "
            "from the fractions" + ("" if not drawn else "; " + ", ".join(
                f"{k} drawn from each client's given train records ({v:.0%})" for k, v in drawn.items()))
            + (f" ({how})" if how else ""))


# ---------------------------------------------------------------------------- construction
def _apportion(idx: np.ndarray, labels: np.ndarray, shares: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Split rows ``idx`` into ``len(shares)`` parts, stratified by label.

    Each class's shuffled members are cut by largest-remainder rounding of ``m · shares``, the
    remainders going to the parts furthest below their running target, so every class and every
    part's total stays within one record of its share. Used both to deal records over clients
    (``iid``, ``domain``) and to split a client train/val/test.
    """
    k = len(shares)
    out: list[list[np.ndarray]] = [[] for _ in range(k)]
    assigned, target = np.zeros(k), np.zeros(k)
    for c in np.unique(labels[idx]):
        members = rng.permutation(idx[labels[idx] == c])
        m = len(members)
        target += m * shares
        cnt = np.floor(m * shares).astype(np.int64)
        for j in np.argsort(-(target - assigned - cnt), kind="stable")[: m - int(cnt.sum())]:
            cnt[j] += 1
        assigned += cnt
        for j, piece in enumerate(np.split(members, np.cumsum(cnt)[:-1])):
            out[j].append(piece)
    return [np.sort(np.concatenate(p)) if p else np.empty(0, np.int64) for p in out]


def _dirichlet(labels: np.ndarray, k: int, alpha: float, need: int, rng: np.random.Generator) -> tuple[list[np.ndarray], int]:
    """Label-skew split: per class, shares ~ Dirichlet(α·1_k) (Hsu et al. 2019), with FedLab's
    ``hetero_dir_partition`` balancing (a client at ≥ n/k records gets no further share) and
    redraws until every client holds ``need`` records. Returns (parts, number of draws)."""
    n = len(labels)
    max_draws = DIRICHLET_MAX_DRAWS if n >= need * k else 1  # no redraw can help then
    for draw in range(1, max_draws + 1):
        parts: list[list[int]] = [[] for _ in range(k)]
        for c in range(int(labels.max()) + 1):
            members = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(k, alpha))
            p = p * np.array([len(q) < n / k for q in parts])
            p = p / p.sum() if p.sum() > 0 else np.full(k, 1.0 / k)
            for j, piece in enumerate(np.split(members, (np.cumsum(p)[:-1] * len(members)).astype(int))):
                parts[j].extend(piece.tolist())
        if min(len(q) for q in parts) >= need:
            break
    return [np.asarray(q, dtype=np.int64) for q in parts], draw


def _domain_clients(domains: np.ndarray, names: list[str], n_clients: int | None) -> tuple[list[int], list[str]]:
    """Clients per present domain by D'Hondt apportionment; returns (count per domain, client names)."""
    present = [int(d) for d in np.unique(domains)]
    k = len(present) if n_clients is None else n_clients
    if k < len(present) or k > len(domains):
        raise ValidationError(
            f"scheme 'domain' needs between {len(present)} (one per domain) and {len(domains)} clients, got {k}"
        )
    sizes = np.array([(domains == d).sum() for d in present], dtype=np.float64)
    count = np.ones(len(present), dtype=np.int64)
    for _ in range(k - len(present)):
        count[int(np.argmax(sizes / count))] += 1
    cnames = [names[d] if m == 1 else f"{names[d]}-{j}" for d, m in zip(present, count) for j in range(m)]
    return count.tolist(), cnames


def check_partition_args(scheme: str, n_clients, alpha, quantity_skew, splits, min_train) -> np.ndarray:
    """Check a partition's settings, loading nothing; returns the train/val/test fractions [3] float64, normalised.

    ``fedhype run`` calls it before it embeds (a bad ``partition.*`` setting was refused only after the embedding).

    Raises:
        ValidationError: an unknown scheme, fewer than one client, α ≤ 0, a bad quantity skew, fractions that are
            not three numbers ≥ 0 summing to 1 with train > 0, or a negative minimum training set.
    """
    if scheme not in SCHEMES:
        raise ValidationError(f"unknown scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    if scheme != "domain" and (n_clients is None or n_clients < 1):
        raise ValidationError(f"scheme {scheme!r} needs the number of clients (--clients N, N ≥ 1), got {n_clients}")
    if n_clients is not None and n_clients < 1:
        raise ValidationError(f"the number of clients must be ≥ 1, got {n_clients}")
    if scheme == "dirichlet" and not (math.isfinite(alpha) and alpha > 0):
        raise ValidationError(f"alpha (Dirichlet concentration) must be a positive number, got {alpha}")
    if quantity_skew is not None:
        if scheme != "iid":
            raise ValidationError("quantity skew (--quantity-skew) applies to the 'iid' scheme only")
        if not (math.isfinite(quantity_skew) and quantity_skew > 0):
            raise ValidationError(f"quantity skew must be a positive number, got {quantity_skew}")
    s = np.asarray(splits, dtype=np.float64)
    if s.shape != (3,) or not np.all(np.isfinite(s)) or s.min() < 0 or s[0] <= 0 or abs(s.sum() - 1) > 1e-6:
        raise ValidationError(f"the train,val,test fractions (--fractions, partition.fractions in a job, fractions= in "
                              f"Python) must be three numbers ≥ 0 summing to 1 with train > 0, got {list(splits)}")
    if min_train < 0:
        raise ValidationError(f"the minimum training set (--min-records, min_records=) must be ≥ 0, got {min_train}")
    return s / s.sum()


def make_partition(
    store: EmbeddingStore,
    *,
    scheme: str,
    n_clients: int | None = None,
    alpha: float = 0.3,
    quantity_skew: float | None = None,
    splits: tuple[float, float, float] = (0.6, 0.2, 0.2),
    min_train_per_client: int = 20,
    seed: int = 0,
    use_given_splits: bool = True,
) -> Partition:
    """Partition ``store``'s records over clients, then split each client train/val/test.

    Args:
        store: the embeddings store (only its labels, domains and sample ids are used).
        scheme: ``"domain"``, ``"dirichlet"`` or ``"iid"`` (see the module docstring).
        n_clients: number of clients (required for ``dirichlet``/``iid``; for ``domain`` default
            one per domain, more splits domains).
        alpha: Dirichlet concentration α for ``dirichlet`` (smaller = more label skew).
        quantity_skew: for ``iid``, client sizes ~ Dirichlet(quantity_skew); ``None`` = equal.
        splits: train/val/test fractions per client (with given splits: only for a split the
            store does not give, drawn from the given train records).
        min_train_per_client: refuse a partition where a client has fewer train records.
        seed: seed of the numpy Generator drawing everything.
        use_given_splits: keep the splits the store's image folders give (:func:`given_splits`;
            recorded in ``params["given_splits"]``); False draws every split with ``splits``.

    Raises:
        ValidationError: bad arguments, given splits without a train split, or empty clients.
        MinRecordsError: clients below ``min_train_per_client`` (a ValidationError; every one of them in
            its ``clients`` field, the first five in the message with their sizes and a suggested fix).
    """
    s = check_partition_args(scheme, n_clients, alpha, quantity_skew, splits, min_train_per_client)
    rng = np.random.default_rng(seed)
    labels, domains = store.labels.numpy(), store.domains.numpy()
    n = len(store)
    if n == 0:
        raise ValidationError("the embeddings store is empty; nothing to partition")
    params: dict[str, Any] = {"splits": s.tolist(), "min_train_per_client": int(min_train_per_client)}
    given = given_splits(store) if use_given_splits else None
    drawn: dict[str, float] = {}
    if given is not None:
        present = [k for k in SPLITS if (given == k).any()]
        if "train" not in present:
            raise ValidationError(f"the store's image folders give the split(s) {present} but no train split: add a "
                                  "train/ folder, or draw every split from the fractions (--draw-splits, "
                                  "use_given_splits=False)")
        missing = [k for k in SPLITS if k not in present]
        total = s[0] + sum(s[SPLITS.index(k)] for k in missing)
        drawn = {k: float(s[SPLITS.index(k)] / total) for k in missing}
        params["given_splits"] = {"given": present, "drawn_from_train": drawn}
    if scheme == "domain":
        counts, names = _domain_clients(domains, store.domain_names, n_clients)
        parts = []
        for d, m in zip(np.unique(domains), counts):
            parts += _apportion(np.flatnonzero(domains == d), labels, np.full(m, 1.0 / m), rng)
        params["n_clients"] = len(parts)
    elif scheme == "dirichlet":
        need = max(1, math.ceil(min_train_per_client / s[0]))
        parts, draws = _dirichlet(labels, n_clients, alpha, need, rng)
        names = [f"client-{j}" for j in range(n_clients)]
        params.update(n_clients=n_clients, alpha=float(alpha), dirichlet_draws=draws)
    else:
        shares = np.full(n_clients, 1.0 / n_clients)
        if quantity_skew is not None:
            shares = rng.dirichlet(np.full(n_clients, quantity_skew))
            params["quantity_skew"] = float(quantity_skew)
        parts = _apportion(np.arange(n), labels, shares, rng)
        names = [f"client-{j}" for j in range(n_clients)]
        params["n_clients"] = n_clients
    clash = [(j, name) for j, name in enumerate(names) if name.isdigit() and int(name) != j and int(name) < len(names)]
    if clash:  # a client named "1" that is not client 1: --code client:1 could name neither (a probe, after training)
        listed = ", ".join(f"{name!r} (client {j})" for j, name in clash)
        raise ValidationError(f"domain names {listed} are the ids of other clients, so `--code client:<id or name>` "
                              "could not tell them apart after training: rename those domain folders (e.g. "
                              "'site-1') and embed again")
    clients = []
    for j, (name, idx) in enumerate(zip(names, parts)):
        tr, va, te = _apportion(idx, labels, s, rng) if given is None else _given_split(idx, given, labels, drawn, rng)
        clients.append(ClientSplit(j, name, *[[opaque_id(store.sample_ids[i]) for i in p] for p in (tr, va, te)]))
    floor = max(1, min_train_per_client)
    bad = [c for c in clients if len(c.train) < floor]
    if bad:
        listed = listed_items([f"{c.name} ({len(c.train)} train / {len(c.train) + len(c.val) + len(c.test)} records)"
                               for c in bad])
        hint = {"dirichlet": "use fewer clients (--clients; partition.clients in a job) or a larger --alpha "
                             "(partition.alpha)",
                "iid": "use fewer clients (--clients; partition.clients in a job) or a larger / no --quantity-skew",
                "domain": "use fewer clients (--clients; partition.clients in a job)"}[scheme]
        raise MinRecordsError(
            f"{len(bad)} of {len(clients)} clients have fewer than {floor} train records: {listed}; "
            f"{hint}, or lower the minimum (--min-records, min_records= in Python, partition.min_records in a job)",
            stage="partition", minimum=floor, clients=[(c.name, len(c.train), len(c.train) + len(c.val) + len(c.test)) for c in bad],
            n_clients=len(clients))
    return Partition(scheme, params, int(seed), store.digest(), n, list(store.class_names), clients, secrets.token_hex(16))
