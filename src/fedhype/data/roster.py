"""The public roster of a federation: the clients, their public training-set sizes, the label set.

The coordinator of a federation (the in-process server, or the Flower ServerApp) needs only this:
who the clients are, how many training records each holds (n_i: the sampling rate q_i = B/n_i
of the accountant), the class names K labels mean, and for each client a *data key* the client
checks before it trains (the same data as planned). It never needs a record id or a label.

A roster comes either from a pooled :class:`~fedhype.data.partition.Partition` of one store
(simulations and benchmarks: :meth:`Roster.from_partition`, the data key is the partition's random key) or
from the public cards of independent sites (:meth:`Roster.from_cards`, see :mod:`fedhype.data.sites`:
each site's key is a random token it drew when it split its records, so nothing in the roster is
a function of a site's records except its training-set size).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from fedhype.errors import ArtifactError, ValidationError

FORMAT = "fedhype-roster/1"


@dataclass(frozen=True)
class RosterClient:
    """One client of a roster (public).

    Attributes:
        id: its index 0..m−1 (its code row on the server).
        name: its name (a site name, or ``client-j`` / a domain name of a pooled partition).
        n_train: its training-set size n_i (public: the accountant's q_i = B/n_i needs it).
        key: its data key (the pooled store's digest, or the site's random key).
    """

    id: int
    name: str
    n_train: int
    key: str

    @property
    def n_records(self) -> int:
        """What the roster knows of the client's size: its training records."""
        return self.n_train


@dataclass(frozen=True)
class Roster:
    """Clients → public sizes and data keys, plus the federation's class names (see the module docstring).

    Attributes:
        scheme: the partition scheme (``"site"`` for a federation of independent sites).
        class_names: the K class names, in label order.
        clients: one :class:`RosterClient` per client, ids 0..m−1 in order.
        encoder: the encoder the clients' embeddings come from (public description), or None.
        dim: the embedding dimension D, or None when unknown.
    """

    scheme: str
    class_names: list[str]
    clients: list[RosterClient] = field(default_factory=list)
    encoder: Any = None
    dim: int | None = None

    @property
    def key(self) -> str:
        """One digest of every client's data key (what a run records as its data)."""
        return hashlib.sha256("\n".join(c.key for c in self.clients).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (format :data:`FORMAT`)."""
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, raw: Any, where: str = "roster") -> "Roster":
        """Read :meth:`to_dict`'s form.

        Raises:
            ArtifactError: another format, a missing or bad field, duplicate names, ids not 0..m−1.
        """
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ArtifactError(f"{where}: not a fedhype roster (format {FORMAT!r})")
        try:
            clients = [RosterClient(int(c["id"]), str(c["name"]), int(c["n_train"]), str(c["key"]))
                       for c in raw["clients"]]
            out = cls(str(raw["scheme"]), [str(k) for k in raw["class_names"]], clients, raw.get("encoder"),
                      None if raw.get("dim") is None else int(raw["dim"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: missing or bad field ({exc!r}); write it again") from None
        out.check(where)
        return out

    def check(self, where: str = "roster") -> None:
        """Raises ArtifactError: no clients, ids not 0..m−1, duplicate names, a size < 1."""
        if not self.clients:
            raise ArtifactError(f"{where}: no clients")
        if [c.id for c in self.clients] != list(range(len(self.clients))):
            raise ArtifactError(f"{where}: client ids must be 0..{len(self.clients) - 1} in order")
        names = [c.name for c in self.clients]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ArtifactError(f"{where}: client name(s) {dup} are used twice; every client needs its own name")
        if min(c.n_train for c in self.clients) < 1:
            raise ArtifactError(f"{where}: a client has no training record")

    @classmethod
    def from_partition(cls, partition, dim: int | None = None, encoder: Any = None) -> "Roster":
        """The public roster of a pooled :class:`~fedhype.data.partition.Partition` (data key: its random key)."""
        return cls(partition.scheme, list(partition.class_names),
                   [RosterClient(c.id, c.name, len(c.train), partition.data_key) for c in partition.clients],
                   encoder, dim)

    @classmethod
    def from_cards(cls, cards: Sequence[Any], classes: Sequence[str] | None = None,
                   classes_flag: str = "--classes") -> "Roster":
        """The roster of a federation of sites, from their public cards (:class:`fedhype.data.sites.SiteCard`).

        Args:
            cards: one card per site; client ids follow their order.
            classes: the federation's class names (label order). Default: the sorted union of the
                cards' class names. Every card's classes must be among them.
            classes_flag: how errors name ``classes`` (the CLI's ``--classes``, or a Python argument).

        Raises:
            ValidationError: no card, two sites with one name or one key, or a site class missing from ``classes``.
            ArtifactError: cards of different embedding dimensions or encoders (mismatched artifacts, exit 4).
        """
        if not cards:
            raise ValidationError("a federation needs at least one site card (--site)")
        names = [c.name for c in cards]
        dup = sorted({n for n in names if names.count(n) > 1})
        same = sorted({c.name for c in cards if sum((d.name, d.key) == (c.name, c.key) for d in cards) > 1})
        if same:  # one site given twice (e.g. "site" and "site/"), not two sites sharing a name
            raise ValidationError(f"site(s) {same} given more than once (the same name and site key); give each "
                                  "site once")
        if dup:
            raise ValidationError(f"site name(s) {dup} are used by two sites; give each site its own name "
                                  "(`fedhype site --name`)")
        if len({c.key for c in cards}) != len(cards):
            raise ValidationError("two site cards carry the same site key: the same site was given twice")
        dims = sorted({c.dim for c in cards})
        if len(dims) != 1:
            raise ArtifactError(f"the sites' embeddings differ in dimension ({', '.join(f'{c.name}: D={c.dim}' for c in cards)}); "
                                  "every site must embed with the same encoder")
        first = cards[0]
        for c in cards[1:]:
            same_weights = first.encoder.get("weights_hash") is not None and \
                first.encoder.get("weights_hash") == c.encoder.get("weights_hash")
            for k in sorted(set(first.encoder) | set(c.encoder)):
                if k == "encoder" and same_weights:
                    continue  # the same weights under another local name (e.g. hf:/path/at/each/site)
                if first.encoder.get(k) != c.encoder.get(k):
                    raise ArtifactError(f"the sites embedded differently: {k} = {first.encoder.get(k)!r} at site "
                                          f"{first.name!r}, {c.encoder.get(k)!r} at site {c.name!r}; every site must "
                                          "embed with the same encoder weights and `fedhype embed` settings")
        dtypes = {c.name: c.dtype for c in cards if getattr(c, "dtype", None)}
        if len(set(dtypes.values())) > 1:  # sites on different CPUs pick different `--dtype auto` precisions
            import warnings

            from fedhype.errors import FedhypeWarning

            warnings.warn(f"the sites embedded in different precisions ({', '.join(f'{n}: {d}' for n, d in dtypes.items())}):"
                          " the same image's two embeddings differ slightly (minimum cosine 0.9996 in "
                          "benchmarks/results/embed_dtype.md), so the classes mix sites' small offsets; for identical "
                          "embeddings every site runs `fedhype embed --dtype` with one value", FedhypeWarning,
                          stacklevel=2)
        union = sorted({k for c in cards for k in c.class_names})
        import unicodedata

        forms: dict[str, list[str]] = {}
        for k in union:
            forms.setdefault(unicodedata.normalize("NFC", k), []).append(k)
        alike = [v for v in forms.values() if len(v) > 1]
        if alike:  # e.g. "Pneumonie_ü" from a Linux folder (NFC) and from a macOS one (NFD)
            held = {k: [c.name for c in cards if k in c.class_names] for v in alike for k in v}
            raise ValidationError(f"class names {[ascii(k) for k in alike[0]]} look the same but are spelled with different "
                                  f"Unicode forms (sites {[held[k] for k in alike[0]]}); they would be separate classes. "
                                  "Embed the sites' images again with this fedhype version (it reads folder names in "
                                  "NFC form), or rename the folders to one spelling")
        vocab = list(classes) if classes is not None else union
        if len(set(vocab)) != len(vocab):
            raise ValidationError(f"the federation's class names {vocab} repeat a name")
        if any(not str(k).strip() for k in vocab):
            raise ValidationError(f"the federation's class names {vocab} include an empty name (a stray comma in "
                                  "--classes?)")
        unheld = [k for k in vocab if k not in union]
        if unheld:
            raise ValidationError(f"class(es) {unheld} of {classes_flag} are held by no site (sites' classes: {union}); "
                                  "their synthetic embeddings would be DP noise alone: drop them")
        clash = look_alike_names(vocab)  # "T-shirt " at one site and "tshirt" at another were two classes (a probe)
        if clash:
            held = {k: [c.name for c in cards if k in c.class_names] for group in clash for k in group}  # every group
            raise ValidationError(f"class names {clash} differ only in case, spaces or punctuation (held by sites "
                                  f"{held}): the sites name the same class differently; rename the class folders "
                                  "(and embed again) so that every site uses one name")
        for c in cards:
            extra = [k for k in c.class_names if k not in vocab]
            if extra:
                raise ValidationError(f"site {c.name!r} announces class(es) {extra} on its card (classes it holds, or "
                                      "announced with no records by `fedhype site --classes`) that are not among the "
                                      f"federation's classes {vocab}; add them to {classes_flag}")
        clients = [RosterClient(i, c.name, c.n_train, c.key) for i, c in enumerate(cards)]
        return cls("site", vocab, clients, cards[0].encoder, dims[0])


def look_alike_names(names: Sequence[str]) -> list[list[str]]:
    """Groups of ``names`` that differ only in case, whitespace, ``-``, ``_`` or ``.`` (e.g. ``"T-shirt "`` and
    ``"tshirt"``): the same class spelled two ways, which would train as two classes. Each group in input order."""
    folded: dict[str, list[str]] = {}
    for k in names:
        folded.setdefault(re.sub(r"[\s\-_.]+", "", k.casefold()), []).append(k)
    return [v for v in folded.values() if len(v) > 1]


def as_roster(clients: Any) -> Roster:
    """``clients`` as a :class:`Roster`: a roster as is, a :class:`~fedhype.data.partition.Partition` through
    :meth:`Roster.from_partition` (what the coordinator keeps of it: no record id)."""
    return clients if isinstance(clients, Roster) else Roster.from_partition(clients)
