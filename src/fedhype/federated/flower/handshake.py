"""Who is who: a SuperNode's node config and the identity handshake (no torch import here: cheap; a site node's
plan check at the handshake imports the accountant, :mod:`fedhype.federated.flower.node_budget`).

At the start of every Flower run the server sends each SuperNode a ``query`` message
(``query`` ConfigRecord ``{want: "identity", run}``, ``run``: the key of the run a resume continues, "" for a new
run); the node answers with its public client id:
``identity`` ConfigRecord ``{client, seeded, federation, fedhype-version}`` (``federation``: the digest of
the node's own federation file, :func:`federation_digest`, or "" for a node of a pooled partition). Flower's node ids are random per
SuperNode start, so this is how the server learns which node holds which partition client. A site
node refuses there, before any node releases anything, a federation file it already served for another
run and a plan that would pass its site's lifetime ε cap (:func:`node_identity`).

A SuperNode is started with a node config naming its own files (they are never sent anywhere).
A site of a consortium (its own store and split, :mod:`fedhype.data.sites`)::

    flower-supernode ... --node-config 'site="/data/site" federation="/data/federation.json"
                                       state-dir="/data/fedhype-state"'

* ``site`` — the site folder written by ``fedhype site`` (its private ``site.json`` names its store);
* ``federation`` — the public ``federation.json`` the coordinator wrote from the sites' cards (the
  node reads the federation's class names and its own place in the roster from it);

or, to simulate a federation on one data holder's pooled store and partition::

    flower-supernode ... --node-config 'client="0" embeddings="/data/store.safetensors"
                                       partition="/data/partition.json" state-dir="/data/fedhype-state"'

* ``client`` — the partition client this node holds (its id, e.g. ``"0"``, or its name);
* ``embeddings`` — an embeddings store holding (at least) that client's records;
* ``partition`` — the partition file (private to the data holder: it lists record ids);

and in both cases:

* ``state-dir`` — a private folder for the client's local encoder ψ_i, optimiser and generator
  states (``<state-dir>/<run key>/client-<id>/state-r<R>.safetensors``);
* ``seed`` (optional, tests only) — reproducible noise; never set it in a real deployment;
* ``min-noise-multiplier`` (optional, default 0) — the node refuses a task whose σ is below it;
* ``allow-no-dp`` (optional, default false) — the node refuses a non-private (``--no-dp``) task
  unless this is true: an institution opts in to releasing un-noised updates;
* ``secure-aggregation`` (optional, default true) — false: the node does not take part in secure
  aggregation (:mod:`fedhype.federated.flower.secagg`: its share would carry only σ²/(m − t) of the
  noise, relying on the other clients' noise and the protocol); a run with secure aggregation then
  stops before anything is released.

Flower (1.42) reads a node config only when a run reaches the node: ``flower-supernode`` keeps it as a mapping and
starts, and the ClientApp — its lifespan included — first runs for a message. A path that is not there therefore
shows at the identity handshake, the first message of every run (:func:`check_node_paths`: every key named at once,
as a refusal the coordinator sees; the paths in the node's own log). Check a node config before starting the
SuperNode with ``python -m fedhype.federated.flower.check --node-config '...'`` (:mod:`fedhype.federated.flower.check`).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from logging import ERROR
from pathlib import Path
from typing import Any, Mapping

from flwr.app import ConfigRecord, RecordDict
from flwr.common.logger import log

from fedhype import __version__
from fedhype.errors import ArtifactError, FedhypeError, ValidationError, listed
from fedhype.io import json_digest

QUERY_TYPE, QUERY, IDENTITY = "query", "query", "identity"
#: the run key the server sends (grid_transport.run_key_of: the run folder's name, ≤ 60 characters, "-", 12 hex
#: digits): it names a folder under the node's state-dir, so "." / ".." or a path separator is refused
_RUN_KEY = re.compile(r"^[A-Za-z0-9._-]{0,60}-[0-9a-f]{12}$")


class Refusal:
    """Marks a node's error whose text names only what the server sent, the node's public policy or
    public roster facts (client ids, site keys), never a local path, size or class name: it goes back to
    the server as it is. Every other error a node raises reaches the server only as its type and a
    reference into the node's own log (:func:`for_the_server`)."""


class NodeRefusal(Refusal, ValidationError):
    """The node refuses what the server asked: its own policy (σ, non-private tasks, secure aggregation)."""


class NodeMismatch(Refusal, ArtifactError):
    """The server's request does not fit this node: another version, client, split, run key or protocol step."""


class NodeError(FedhypeError):
    """What the server learns of any other error on a node: its type and a reference into the node's log."""


class NodeConfigError(Refusal, ValidationError):
    """A SuperNode's ``--node-config`` names a file or folder that is not there, or a ``state-dir`` it cannot write
    (:func:`check_node_paths`).

    Flower gives an app no hook at SuperNode start: ``flower-supernode`` keeps ``--node-config`` as a plain mapping and
    the ClientApp (with its lifespan) first runs when a run's first message reaches the node. So this is raised at the
    identity handshake, the first message of every run. Its text (sent to the server) names the keys and what to do,
    never a local path; :attr:`detail` (the node's own log, under :attr:`reference`) names the keys and their paths.

    Attributes:
        problems: ``[(key, path, what is wrong and what to do), ...]``.
        detail: the text with the paths, for the node's own log and ``python -m fedhype.federated.flower.check``.
        reference: the random reference that the server's text and the node's log line share.
    """

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = list(problems)
        self.reference = secrets.token_hex(4)
        keys = ", ".join(f"{k}=" for k, _, _ in self.problems)
        self.detail = ("SuperNode --node-config: "
                       + "; ".join(f'{k}="{path}": {what}' for k, path, what in self.problems)
                       + ". Fix the node config and restart the SuperNode")
        super().__init__(
            "this SuperNode's --node-config names what is not there or cannot be written: "
            + "; ".join(f"{k}= — {what}" for k, _, what in self.problems)
            + f". The path{'s are' if len(self.problems) > 1 else ' is'} in that SuperNode's log (reference "
            f"{self.reference}); the node's operator fixes {keys} and restarts the SuperNode. Flower hands a "
            "SuperNode its node config only with a run's first message, so a wrong path shows only when the "
            "coordinator runs: check a node config before starting the SuperNode with `python -m "
            "fedhype.federated.flower.check --node-config '...'`")


def for_the_server(exc: BaseException) -> BaseException:
    """The exception a node's ClientApp raises to Flower (whose reply carries its type and text to the server).

    A :class:`Refusal` goes as it is. Any other error can name local paths, the site's training-set size
    or its class names (private facts of the institution), so its text is written to the node's own log
    (Flower's logger, on the SuperNode's side only) under a random reference, and the server gets a
    :class:`NodeError` naming the type and that reference.
    """
    if isinstance(exc, NodeConfigError):  # its paths go to the node's own log, under the reference its text names
        log(ERROR, "fedhype: node config error %s: %s", exc.reference, exc.detail)
    if isinstance(exc, Refusal):
        return exc
    ref = secrets.token_hex(4)
    log(ERROR, "fedhype: node error %s (its text is not sent to the server): %s: %s", ref, type(exc).__name__, exc)
    return NodeError(f"{type(exc).__name__} on the node; its text stays in that SuperNode's log (reference {ref}), "
                     "since it can name local paths, the site's size or its classes: ask the site's operator")


#: Flower's text of an error a ClientApp raised: ``<class 'module.Type'>:<'text'>``
_FLOWER_REASON = re.compile(r"^<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>$", re.DOTALL)
#: a node's refusals (:class:`~fedhype.federated.flower.handshake.Refusal`): their text is meant for the server
_REFUSALS = ("NodeRefusal", "NodeMismatch", "NodeConfigError")


def _parse_reason(reason: str) -> tuple[str, str]:
    """``(type name, text)`` of Flower's error ``reason`` (``("", reason)`` where it names no type)."""
    m = _FLOWER_REASON.match(str(reason))
    if m:
        return m.group(1), m.group(2)
    name, sep, text = str(reason).partition(": ")
    return (name, text) if sep and re.fullmatch(r"\w+", name) else ("", str(reason))


def node_refused(reason: str) -> bool:
    """Whether Flower's error ``reason`` is a node's refusal (its policy, its ledger, a request that does not fit)."""
    return _parse_reason(reason)[0] in _REFUSALS


def node_reason(reason: str) -> str:
    """Flower's error ``reason`` (``<class 'module.Type'>:<'text'>``) as plain text: "node refused: …" for a node's
    refusal, "node error: …" for any other error of a node (:class:`NodeError`: a type and a reference into the
    node's log), "error on its node: <Type>: …" otherwise."""
    name, text = _parse_reason(reason)
    if not name:
        return f"error on its node: {text}"
    if name in _REFUSALS:
        return f"node refused: {text}"
    if name == "NodeError":
        return f"node error: {text}"
    return f"error on its node: {name}: {text}"


IDENTITY_KEYS = {"client", "seeded", "federation", "fedhype-version"}
NODE_KEYS = ("client", "embeddings", "partition", "state-dir")
SITE_KEYS = ("site", "federation", "state-dir")
#: the node's own settings, optional in either form (see NodeSettings)
OPTIONAL_KEYS = ("seed", "min-noise-multiplier", "allow-no-dp", "secure-aggregation")


def unknown_keys(nc: Mapping[str, Any]) -> dict[str, str | None]:
    """``{unknown key: the closest known key, or None}`` of a node config (:func:`difflib.get_close_matches`, case
    folded: ``Site`` → ``site``, ``federaton`` → ``federation``, ``state_dir`` → ``state-dir``)."""
    import difflib

    known = list(dict.fromkeys((*SITE_KEYS, *NODE_KEYS, *OPTIONAL_KEYS)))
    out: dict[str, str | None] = {}
    for k in map(str, nc):
        if k in known:
            continue
        folded = k.lower().replace("_", "-")
        close = [folded] if folded in known else difflib.get_close_matches(folded, known, n=1, cutoff=0.6)
        out[k] = close[0] if close else None
    return out


@dataclass(frozen=True)
class NodeSettings:
    """A SuperNode's ``--node-config`` (see the module docstring)."""

    client: str
    embeddings: Path | None
    partition: Path | None
    state_dir: Path
    seed: int | None = None
    min_noise_multiplier: float = 0.0
    allow_no_dp: bool = False
    secure_aggregation: bool = True
    site: Path | None = None
    federation: Path | None = None

    @classmethod
    def from_node_config(cls, nc: Mapping[str, Any]) -> "NodeSettings":
        """Raises ValidationError naming a missing or bad key: an unknown key (each named, with the closest known
        key, :func:`unknown_keys`) or a missing one as a :class:`NodeRefusal` (its text names only keys, never a
        path or a value, so the server sees it at the handshake)."""
        unknown = unknown_keys(nc)
        if unknown:  # before the missing keys: a misspelt key (federaton=, Site=) is the cause of a "missing" one
            # a misspelt safety setting (min-noise-multiplier, allow-no-dp) must not be dropped silently
            raise NodeRefusal(f"SuperNode --node-config has unknown key(s) {sorted(unknown)} ("
                              + "; ".join(f"{k!r}: did you mean {v!r}?" if v else f"{k!r}: no key is close"
                                          for k, v in sorted(unknown.items()))
                              + "); the keys are " + ", ".join(SITE_KEYS) + " (a site) or " + ", ".join(NODE_KEYS)
                              + " (a pooled store's partition), and optionally " + ", ".join(OPTIONAL_KEYS))
        site_mode = "site" in nc
        keys = SITE_KEYS if site_mode else NODE_KEYS
        missing = [k for k in keys if k not in nc or str(nc[k]) == ""]
        if missing:
            raise NodeRefusal(f"SuperNode --node-config lacks {missing}; give "
                              + " ".join(f'{k}="..."' for k in SITE_KEYS) + " (a site), or "
                              + " ".join(f'{k}="..."' for k in NODE_KEYS) + " (a pooled store's partition)")
        mixed = [k for k in ("client", "embeddings", "partition") if site_mode and k in nc]
        if mixed:
            raise ValidationError(f"SuperNode --node-config gives site= and {mixed}: a site node reads its store and "
                                  "split from its site folder; drop " + ", ".join(mixed))
        seed = nc.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValidationError(f"SuperNode --node-config seed must be an integer, got {seed!r}")
        floor, allow = nc.get("min-noise-multiplier", 0.0), nc.get("allow-no-dp", False)
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not floor >= 0:
            raise ValidationError(f"SuperNode --node-config min-noise-multiplier must be a number ≥ 0, got {floor!r}")
        if not isinstance(allow, bool):
            raise ValidationError(f"SuperNode --node-config allow-no-dp must be true or false, got {allow!r}")
        secure = nc.get("secure-aggregation", True)
        if not isinstance(secure, bool):
            raise ValidationError(f"SuperNode --node-config secure-aggregation must be true or false, got {secure!r}")
        if site_mode:
            return cls("", None, None, Path(str(nc["state-dir"])), seed, float(floor), allow, secure,
                       Path(str(nc["site"])), Path(str(nc["federation"])))
        return cls(str(nc["client"]), Path(str(nc["embeddings"])), Path(str(nc["partition"])),
                   Path(str(nc["state-dir"])), seed, float(floor), allow, secure)

    def check_mechanism(self, enabled: bool, noise_multiplier: float | None) -> None:
        """Refuse a task whose mechanism this institution did not agree to (its own policy).

        Raises:
            NodeRefusal: a non-private task without ``allow-no-dp=true``, a private one with σ ≤ 0 (clipped,
                un-noised updates under a DP label: refused whatever ``allow-no-dp`` says), or σ below
                ``min-noise-multiplier``.
        """
        if not enabled and not self.allow_no_dp:
            raise NodeRefusal("this SuperNode refuses non-private (--no-dp) training; set allow-no-dp=true in its "
                                  "--node-config to allow releasing un-noised updates")
        if enabled and not (noise_multiplier is not None and float(noise_multiplier) > 0):
            # "private" with σ = 0 would release clipped but un-noised updates (exact statistics) under a DP label
            raise NodeRefusal(f"this SuperNode refuses a private task with σ = {noise_multiplier!r}: a DP release "
                                  "needs noise (σ > 0)" + ("" if self.allow_no_dp else "; non-private training is not "
                                                            "allowed either (allow-no-dp=false)"))
        if enabled and float(noise_multiplier) < self.min_noise_multiplier:
            raise NodeRefusal(f"this SuperNode refuses σ = {noise_multiplier:g} < its min-noise-multiplier "
                                  f"{self.min_noise_multiplier:g}")

    def client_index(self, clients: list[tuple[str, str]]) -> int:
        """Index of this node's client among ``[(id, name), ...]`` (by id, else by name)."""
        for key in (0, 1):
            for i, c in enumerate(clients):
                if c[key] == self.client:
                    return i
        raise ValidationError(f"SuperNode --node-config client={self.client!r} is not a client of {self.partition} "
                              f"(its {len(clients)} clients by id (name): {listed(f'{i} ({n})' for i, n in clients)})")


def check_version(c: Mapping[str, Any], where: str) -> None:
    """Refuse a message written by another fedhype version."""
    if c.get("fedhype-version") != __version__:
        raise NodeMismatch(f"{where}: sent by fedhype {c.get('fedhype-version')}, this side runs {__version__}; "
                            "install the same fedhype version on every machine")


def encode_query(run_key: str = "") -> RecordDict:
    """The server's ``query``: ``run`` is the key of the run it resumes ("" for a new run, which has none yet)."""
    return RecordDict({QUERY: ConfigRecord({"want": "identity", "run": str(run_key)})})


def query_run(content: RecordDict | None) -> str:
    """The run key of a server's ``query`` ("" for a new run or a query without one)."""
    try:
        return str(content[QUERY].get("run", "")) if content is not None and QUERY in content else ""
    except (AttributeError, TypeError):
        return ""


def federation_digest(raw: Mapping[str, Any]) -> str:
    """sha256 (hex) of a federation file's content as canonical JSON: the same plan whatever its whitespace or
    key order. The server sends it with every task and a site's node compares it with its own file's."""
    return json_digest(raw)


def own_federation(node: "NodeSettings") -> str:
    """:func:`federation_digest` of a site node's own federation file; "" for a node of a pooled partition.

    Raises:
        ArtifactError: the file is unreadable.
    """
    if node.federation is None:
        return ""
    try:
        return federation_digest(json.loads(node.federation.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"SuperNode federation file {node.federation} is unreadable ({exc})") from None


def check_federation(node: "NodeSettings", server_digest: str) -> None:
    """Refuse a task of a server that runs another federation file than this site's own: its plan (ε, δ,
    rounds, batch size, the release's shares) is not the one the site agreed to.

    Raises:
        NodeMismatch: the digests differ (a site node only; a pooled-partition node has no file of its own).
    """
    mine = own_federation(node)
    if mine and server_digest != mine:
        raise NodeMismatch("the server runs another federation file than this site's own (its plan — ε, δ, rounds, "
                           "batch size — may differ from the one the site agreed to); the coordinator and every site "
                           "must hold the same federation.json")


def node_identity(nc: Mapping[str, Any], query: RecordDict | None = None) -> RecordDict:
    """This node's reply to ``query``: its public client id and whether its noise is seeded.

    A pooled-partition node reads only the public partition file (JSON): no torch import. A site node
    also refuses, before anything is released anywhere, a federation file already bound to another run
    (:func:`~fedhype.federated.flower.node_budget.check_run`; ``query``'s ``run``: the run the server resumes,
    "" for a new one) and a plan that would pass its site's lifetime ε cap
    (:func:`~fedhype.federated.flower.node_budget.refuse_site_plan`, which imports the accountant).

    Raises:
        NodeRefusal / NodeMismatch: as above, and as :func:`site_place`.
        NodeConfigError: a path of the node config is not there (:func:`check_node_paths`).
    """
    node = NodeSettings.from_node_config(nc)
    check_node_paths(node)  # the first message of every run: a wrong path is named here, before anything else
    if node.site is not None:
        client = str(site_place(node)[0])
        run = query_run(query)
        if run and not _RUN_KEY.match(run):
            raise NodeMismatch(f"bad run key {run!r} from the server")
        from fedhype.federated.flower.node_budget import check_run, refuse_site_plan

        check_run(node, run)
        refuse_site_plan(node, client, run)
    else:
        try:
            raw = json.loads(node.partition.read_text(encoding="utf-8"))
            clients = [(str(c["id"]), str(c["name"])) for c in raw["clients"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArtifactError(f"SuperNode partition file {node.partition} is unreadable ({exc})") from None
        client = clients[node.client_index(clients)][0]
    return RecordDict({IDENTITY: ConfigRecord({"client": client, "seeded": node.seed is not None,
                                               "federation": own_federation(node), "fedhype-version": __version__})})


def check_node_paths(node: NodeSettings) -> None:
    """Check that the files and folders a node config names are there: ``site`` (a folder holding the ``site.json``
    that ``fedhype site`` writes, or that file), ``federation`` (a JSON file), ``embeddings`` and ``partition`` (files),
    and that ``state-dir`` is a folder this process can write, or can create (its nearest existing parent is a
    writable folder). JSON only: no torch import. Every problem is named at once.

    Raises:
        NodeConfigError: naming each key with what is wrong and what to do (its paths in ``detail`` only).
    """
    from fedhype.data.sites import SITE_FILE

    problems: list[tuple[str, str, str]] = []

    def json_file(key: str, path: Path, what: str, fix: str) -> None:
        if not path.exists():
            problems.append((key, str(path), f"no {what} there; {fix}"))
        elif not path.is_file():
            problems.append((key, str(path), f"a folder, not the {what}; {fix}"))
        else:
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                problems.append((key, str(path), f"the {what} is unreadable ({type(exc).__name__}); {fix}"))

    if node.site is not None:
        site_fix = "give the site folder that `fedhype site` wrote, which holds site.json"
        if not node.site.exists():
            problems.append(("site", str(node.site), f"no site folder there; {site_fix}"))
        elif node.site.is_dir() and not (node.site / SITE_FILE).exists():
            problems.append(("site", str(node.site), f"a folder without {SITE_FILE}, not a site folder; {site_fix}"))
        else:
            json_file("site", node.site / SITE_FILE if node.site.is_dir() else node.site, "site file",
                      "write the site again with `fedhype site`")
    if node.federation is not None:
        json_file("federation", node.federation, "federation file", "give the federation.json the coordinator sent")
    for key, path, what in (("embeddings", node.embeddings, "embeddings store"), ("partition", node.partition,
                                                                                  "partition file")):
        if path is not None and not path.is_file():
            problems.append((key, str(path), f"no {what} there" if not path.exists() else f"a folder, not the {what}"))
    state = Path(node.state_dir)
    if state.exists() and not state.is_dir():
        problems.append(("state-dir", str(state), "a file, not a folder; give a folder for the node's private state"))
    elif state.is_dir() and not _can_write(state):
        problems.append(("state-dir", str(state), "a folder this SuperNode's user cannot write; give it write access "
                                                  "or name another folder"))
    elif not state.exists():
        parent = next((p for p in state.absolute().parents if p.exists()), None)
        if parent is None or not parent.is_dir() or not _can_write(parent):
            problems.append(("state-dir", str(state), f"missing, and it cannot be created ({parent} is not a writable "
                                                      "folder); create it or name another folder"))
    if problems:
        raise NodeConfigError(problems)


def site_place(node: NodeSettings) -> tuple[int, str, dict[str, Any]]:
    """A site node's ``(client id, site key, roster)`` in the federation: its place by its site name,
    after checking that the coordinator's roster carries this site's key (JSON only: no torch import).

    Raises:
        ArtifactError: an unreadable site or federation file.
        NodeMismatch: the site missing from the roster, another key for it (the federation was written
            from another split of the site), another training-set size or a class the federation lacks
            (a refusal: its text, without local paths, reaches the server).
    """
    from fedhype.data.sites import SITE_FILE

    site = node.site / SITE_FILE if node.site.is_dir() else node.site
    try:
        own = json.loads(site.read_text(encoding="utf-8"))
        name, key = str(own["name"]), str(own["key"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"SuperNode site file {site} is unreadable ({exc}); write it with `fedhype site`") from None
    try:
        raw = json.loads(node.federation.read_text(encoding="utf-8"))
        not_federation(raw, node.federation)
        roster = raw["roster"]
        clients = [(int(c["id"]), str(c["name"]), str(c["key"])) for c in roster["clients"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(f"SuperNode federation file {node.federation} is unreadable ({exc})") from None
    # refusals, whose texts reach the server (no local path in them): checked at the identity handshake, so a
    # federation that does not fit this site stops before any site releases anything
    for cid, cname, ckey in clients:
        if cname == name:
            if ckey != key:
                raise NodeMismatch(f"the federation lists site {name!r} with another site key than this site's own: "
                                   "it was written from an older card; send the coordinator this site's current "
                                   "card.json (nothing was released)")
            _check_site_fits(name, own, roster["clients"][[c[0] for c in clients].index(cid)], roster)
            return cid, key, roster
    raise NodeMismatch(f"site {name!r} is not in the server's federation (sites: {[c[1] for c in clients]}); send the "
                       "coordinator this site's card.json (nothing was released)")


def not_federation(raw: Any, path: Path) -> None:
    """Refuse a JSON file given as ``federation=`` that is a site's card or site file rather than the
    ``federation.json`` the coordinator writes from the sites' cards.

    Raises:
        ArtifactError: naming what the file looks like and what to give instead (the node's own log and the checker).
    """
    from fedhype.data.sites import CARD_FORMAT, SITE_FORMAT

    if not isinstance(raw, dict) or "roster" in raw:
        return
    what = {CARD_FORMAT: "a site card (card.json)", SITE_FORMAT: "a site file (site.json, PRIVATE to the site)"}.get(
        raw.get("format"), "")
    if what:
        raise ArtifactError(f"SuperNode federation file {path} is not a federation file: it looks like {what}. The "
                            "coordinator writes federation.json from the sites' cards (write_site_federation) and sends "
                            "it to every site; give that file as federation=")


def _check_site_fits(name: str, own: dict[str, Any], entry: dict[str, Any], roster: dict[str, Any]) -> None:
    """Refuse a federation whose roster entry does not describe this site's own split: another number of
    training records (a card edited by hand, or a stale one) or a class the federation does not have.

    Raises:
        NodeMismatch: naming the public figures (the card's size and class names are public).
    """
    try:
        part = own["partition"]
        n_own = sum(len(c["train"]) for c in part["clients"])
        classes = [str(k) for k in (own.get("classes") or part["class_names"])]
        n_planned = int(entry["n_train"])
    except (KeyError, TypeError, ValueError):
        return  # an older site file: the task's own check of n (node._site_client) still runs
    if n_own != n_planned:
        raise NodeMismatch(f"the federation plans site {name!r} with {n_planned} training records, but the site holds "
                           f"{n_own}: the coordinator's copy of its card was edited or is from another split; send "
                           "the coordinator this site's current card.json (nothing was released)")
    missing = [k for k in classes if k not in [str(c) for c in roster.get("class_names") or []]]
    if missing:
        raise NodeMismatch(f"site {name!r} holds class(es) {missing}, which are not among the federation's classes: "
                           "the coordinator's copy of its card lacks them; send the current card.json (nothing was "
                           "released)")


def decode_identity(content: RecordDict, where: str) -> dict[str, Any]:
    """``{"client", "seeded", "federation"}`` of a node's identity reply (server side).

    Raises:
        ArtifactError: other records or keys, or another fedhype version on the node.
    """
    if set(content) != {IDENTITY} or not isinstance(content[IDENTITY], ConfigRecord) \
            or set(content[IDENTITY]) != IDENTITY_KEYS:
        raise ArtifactError(f"{where}: expected exactly a {IDENTITY!r} record with keys {sorted(IDENTITY_KEYS)}; refused")
    c = dict(content[IDENTITY])
    check_version(c, where)
    return {"client": str(c["client"]), "seeded": bool(c["seeded"]), "federation": str(c["federation"])}


def _can_write(folder: Path) -> bool:
    """Whether a file can be created in ``folder``: tried (created and removed), since permission bits do not stop
    root while a read-only mount or /proc does (a helper's ``state-dir="/proc/x"`` was reported writable)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".fedhype-write-check-"):
            return True
    except OSError:
        return False
