"""SecAgg+ between the SuperNodes, built from Flower's secure-aggregation primitives, for the release before round 0.

The protocol is SecAgg+ as Flower implements it (``flwr.client.mod.secaggplus_mod`` and
``flwr.server.workflow.SecAggPlusWorkflow``; Bell, Bonawitz, Gascón, Lepoint & Raykova 2020, "Secure
Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS, on the complete graph), four
message exchanges of type ``train.secagg``, with Flower's primitives: ECDH key pairs
(``flwr.supercore.primitives.asymmetric``, NIST P-384), HKDF-derived shared keys and Fernet
encryption (``flwr.common.secure_aggregation.crypto.symmetric_encryption``), Shamir secret sharing
(``…crypto.shamir``) and the share plaintext format (``…secaggplus_utils``). Flower's workflow itself
is not used: it is written for its ``fit`` strategies and quantises float parameters with its own
(not DP) stochastic rounding; here each node masks the integer vector of the DP release
(:mod:`fedhype.privacy.skellam`), and the server refuses to unmask fewer than m − t contributions.

Stages (participant ids: partition index + 1; threshold m − t; 2t < m):

1. ``setup`` — every node makes two key pairs (pk1: masks, pk2: encryption) and sends the public keys.
2. ``share_keys`` — the server sends the public keys of the nodes that answered; each node draws a
   32-byte seed b, Shamir-shares b and its first secret key sk1 (threshold m − t) and sends every
   other node its two shares, encrypted with their shared pk2 key. No record has been touched yet:
   if fewer than m − t nodes are left, the release stops here with nothing charged.
3. ``collect`` — the server forwards each node the ciphertexts addressed to it and the release
   request; the node computes its integer share X (:meth:`fedhype.federated.client.Client.release_integer`)
   and sends ``y = X + PRG(b) + Σ_v ±PRG(s_uv) mod 2⁶⁴`` (s_uv: ECDH of its sk1 with v's pk1; + if
   u > v, − otherwise, so the pairwise masks cancel in the sum). Only this masked vector crosses the wire.
4. ``unmask`` — the server names the nodes whose vectors arrived (active) and those that shared keys
   but sent none (dead); each node returns its shares of b for the active and of sk1 for the dead,
   never both for one node. From ≥ m − t of each, the server rebuilds the seeds, removes the masks
   and decodes the sum (:func:`fedhype.privacy.skellam.aggregate_from_sum`).

The masks are expanded from the 32-byte keys with AES-256 in counter mode (``cryptography``), not
with Flower's ``pseudo_rand_gen``, which seeds NumPy's MT19937 with 32 bits of the key. Secrets (sk1,
sk2, b and the shares received) stay in the node's Flower context state, on its own machine.

Trust assumption: the server follows the protocol (honest but curious) and at most t clients drop
out or collude with it. A server that lies about who dropped out (telling some nodes a node is
active and others that it is dead) could rebuild both b and sk1 of that node and unmask its vector,
which carries only its share σ²/(m − t) of the noise; Flower's SecAgg+ has no defence against that
(Bell et al. 2020 add signatures and a consistency check), and neither does this deployment.

Dropouts: a node that does not answer a stage (or whose SuperNode Flower reports unavailable) is
left out of the later stages; one that answers ``setup`` with an error does not speak (or refuses)
the protocol and stops the release before anything is charged (:class:`ProtocolRefused`).
"""

from __future__ import annotations

import base64
import json
import secrets
from logging import INFO, WARNING
from typing import Any, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from fedhype import __version__
from fedhype.errors import ArtifactError, ValidationError
from fedhype.federated.flower.handshake import NodeMismatch, NodeRefusal, node_reason
from fedhype.privacy.secure_agg import DistributedNoise, SecureAggregationError

PROTOCOL = "fedhype-secagg+/1"
SECAGG_TYPE = "train.secagg"
#: ConfigRecord of every SecAgg+ request and reply; ArrayRecord of the masked vector (collect reply)
RECORD, MASKED, VECTOR = "secagg", "masked", "vector"
STAGES = ("setup", "share_keys", "collect", "unmask")
_STATE = "fedhype-secagg"


class ProtocolRefused(SecureAggregationError):
    """A SuperNode answered the SecAgg+ setup with an error: it does not speak (or refuses) the protocol."""


# ---------------------------------------------------------------------------- shared helpers
def prg(key: bytes, length: int) -> np.ndarray:
    """``length`` uint64 words of AES-256-CTR keystream under the 32-byte ``key`` (a pseudo-random mask)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if len(key) != 32:
        raise ValueError(f"a mask key has 32 bytes, got {len(key)}")
    enc = Cipher(algorithms.AES(key), modes.CTR(b"\0" * 16)).encryptor()
    return np.frombuffer(enc.update(b"\0" * (8 * int(length))) + enc.finalize(), dtype="<u8").astype(np.uint64)


def pair_key(sk1: bytes, pk1: bytes) -> bytes:
    """The 32-byte mask key s_uv of two nodes (ECDH of one's sk1 with the other's pk1, HKDF: Flower's)."""
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    return base64.urlsafe_b64decode(generate_shared_key(bytes_to_private_key(sk1), bytes_to_public_key(pk1)))


def pair_mask(u: int, v: int, key: bytes, length: int) -> np.ndarray:
    """What node u adds for its pair with v: +PRG(s_uv) if u > v, −PRG(s_uv) otherwise (mod 2⁶⁴)."""
    m = prg(key, length)
    return m if u > v else (np.uint64(0) - m)


def _header(stage: str, session: str, participant: int) -> dict[str, Any]:
    return {"protocol": PROTOCOL, "fedhype-version": __version__, "stage": stage, "session": session,
            "participant": int(participant)}


def _config(content: RecordDict, where: str, stage: str | None = None) -> dict[str, Any]:
    if RECORD not in content or not isinstance(content[RECORD], ConfigRecord):
        raise NodeMismatch(f"{where}: no {RECORD!r} ConfigRecord; refused")
    c = dict(content[RECORD])
    if c.get("protocol") != PROTOCOL:
        raise NodeMismatch(f"{where}: protocol {c.get('protocol')!r}, this side speaks {PROTOCOL!r}")
    if c.get("fedhype-version") != __version__:
        raise NodeMismatch(f"{where}: sent by fedhype {c.get('fedhype-version')}, this side runs {__version__}; "
                            "install the same fedhype version on every machine")
    if stage is not None and c.get("stage") != stage:
        raise NodeMismatch(f"{where}: stage {c.get('stage')!r}, expected {stage!r}")
    return c


def plan_to_config(plan) -> dict[str, Any]:
    return {"sigma": float(plan.noise_multiplier), "scale": int(plan.scale), "record-dim": int(plan.record_dim),
            "length": int(plan.length), "kind": plan.kind, "m": int(plan.noise.clients),
            "t": int(plan.noise.dropout_tolerance)}


def plan_from_config(c: Mapping[str, Any]):
    from fedhype.privacy.skellam import SkellamPlan

    try:
        return SkellamPlan(DistributedNoise(int(c["m"]), int(c["t"])), float(c["sigma"]), int(c["scale"]),
                           int(c["record-dim"]), int(c["length"]), str(c["kind"]))
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise NodeMismatch(f"SecAgg+ collect: bad release plan ({exc}); refused") from None


# ---------------------------------------------------------------------------- node side
def node_message(nc: Mapping[str, Any], state: RecordDict, content: RecordDict) -> RecordDict:
    """A SuperNode's ``train.secagg`` handler (:data:`fedhype.federated.flower.apps.client_app`): :func:`handle` with
    the node's settings; the client stack (torch, the node's own records) is imported for ``collect`` only, so the
    key-exchange stages start fast in the fresh process Flower runs each message in."""
    from fedhype.federated.flower.handshake import NodeSettings

    node = NodeSettings.from_node_config(nc)

    def client(extra, client_id):
        from fedhype.federated.flower.node import _client

        return _client(node, extra, client_id)

    return handle(content, state, node, client_factory=client)


def handle(content: RecordDict, state: RecordDict, node, *, client_factory) -> RecordDict:
    """A SuperNode's answer to one SecAgg+ message (``train.secagg``).

    Args:
        content: the message content. state: the node's Flower context state (holds this node's
            secrets for the session; never sent). node: its :class:`~fedhype.federated.flower.handshake.NodeSettings`.
        client_factory: ``(extra, client_id) -> Client`` (the node's own client, checked against the request).

    Raises:
        NodeRefusal: this node does not take part in secure aggregation (node config
            ``secure-aggregation=false``), or refuses the plan (its ``min-noise-multiplier``).
        NodeMismatch: a malformed message, another protocol or version, stages out of order, too few
            participants, or an inconsistent unmask request (both shares of one node asked for).
    """
    if not node.secure_aggregation:
        raise NodeRefusal("this SuperNode does not take part in secure aggregation (its --node-config has "
                          "secure-aggregation=false)")
    c = _config(content, "SecAgg+ message")
    stage, session = c.get("stage"), str(c.get("session", ""))
    if stage not in STAGES or not session:
        raise NodeMismatch(f"SecAgg+ message: unknown stage {stage!r} or no session; refused")
    me = int(c["participant"])
    if stage == "setup":
        return _setup(c, state, me, session)
    s = _load(state, session)
    if s.get("participant") != me:
        raise NodeMismatch(f"SecAgg+ {stage}: addressed to participant {me}, this node is {s.get('participant')}")
    expected = STAGES[STAGES.index(str(s["stage"])) + 1] if s["stage"] != "unmask" else None
    if stage != expected:
        raise NodeMismatch(f"SecAgg+ session {session}: stage {stage!r} after {s['stage']!r}; refused")
    if stage == "share_keys":
        return _share_keys(c, state, s, session)
    if stage == "collect":
        return _collect(c, content, state, s, session, node, client_factory)
    return _unmask(c, state, s, session)


def _load(state: RecordDict, session: str) -> dict[str, Any]:
    rec = state.config_records.get(_STATE) if hasattr(state, "config_records") else None
    if rec is None or rec.get("session") != session:
        raise NodeMismatch(f"SecAgg+: this node holds no session {session!r} (restarted since the setup?); refused")
    return json.loads(str(rec["json"]), object_hook=_unhex)


def _save(state: RecordDict, session: str, s: dict[str, Any]) -> None:
    state.config_records[_STATE] = ConfigRecord({"session": session, "json": json.dumps(s, default=_hex)})


def _hex(o):
    if isinstance(o, bytes):
        return {"__bytes__": o.hex()}
    raise TypeError(type(o).__name__)


def _unhex(d):
    return bytes.fromhex(d["__bytes__"]) if set(d) == {"__bytes__"} else d


def _setup(c: dict, state: RecordDict, me: int, session: str) -> RecordDict:
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, private_key_to_bytes, public_key_to_bytes

    from fedhype.privacy.skellam import check_deployment

    try:
        noise = DistributedNoise(int(c["m"]), int(c["t"]))
        check_deployment(noise)
        threshold = int(c["threshold"])
    except (KeyError, TypeError, ValueError) as exc:
        raise NodeMismatch(f"SecAgg+ setup: bad parameters ({exc}); refused") from None
    if threshold != noise.min_contributions or not 1 <= me <= noise.clients:
        raise NodeMismatch(f"SecAgg+ setup: threshold {threshold} for m = {noise.clients}, t = {noise.dropout_tolerance} "
                            f"(must be m − t), participant {me}; refused")
    sk1, pk1 = generate_key_pairs()
    sk2, pk2 = generate_key_pairs()
    s = {"stage": "setup", "participant": me, "m": noise.clients, "t": noise.dropout_tolerance, "threshold": threshold,
         "sk1": private_key_to_bytes(sk1), "pk1": public_key_to_bytes(pk1), "sk2": private_key_to_bytes(sk2),
         "pk2": public_key_to_bytes(pk2)}
    _save(state, session, s)
    return RecordDict({RECORD: ConfigRecord({**_header("setup", session, me), "pk1": s["pk1"], "pk2": s["pk2"]})})


def _share_keys(c: dict, state: RecordDict, s: dict, session: str) -> RecordDict:
    from flwr.common.secure_aggregation.crypto.shamir import create_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import encrypt, generate_shared_key
    from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    me = s["participant"]
    try:
        ids, pk1s, pk2s = [int(i) for i in c["ids"]], list(c["pk1s"]), list(c["pk2s"])
    except (KeyError, TypeError, ValueError):
        raise NodeMismatch("SecAgg+ share_keys: bad key list; refused") from None
    if not (len(ids) == len(pk1s) == len(pk2s)) or len(set(ids)) != len(ids) or ids != sorted(ids) \
            or not all(1 <= i <= s["m"] for i in ids):
        raise NodeMismatch("SecAgg+ share_keys: participant ids must be distinct, sorted, in [1, m]; refused")
    if len(ids) < s["threshold"]:
        raise NodeMismatch(f"SecAgg+ share_keys: {len(ids)} participants, fewer than the threshold m − t = "
                            f"{s['threshold']}; refused")
    if me not in ids or pk1s[ids.index(me)] != s["pk1"] or pk2s[ids.index(me)] != s["pk2"]:
        raise NodeMismatch("SecAgg+ share_keys: this node's own public keys are missing or altered; refused")
    if len(set(pk1s) | set(pk2s)) != 2 * len(ids):
        raise NodeMismatch("SecAgg+ share_keys: some public keys are identical; refused")
    b = secrets.token_bytes(32)
    b_shares = create_shares(b, s["threshold"], len(ids))
    sk_shares = create_shares(s["sk1"], s["threshold"], len(ids))
    dsts, ctxts = [], []
    own: dict[str, Any] = {}
    for k, (nid, pk2) in enumerate(zip(ids, pk2s)):
        if nid == me:
            own = {"b": b_shares[k], "sk1": sk_shares[k]}
            continue
        key = generate_shared_key(bytes_to_private_key(s["sk2"]), bytes_to_public_key(pk2))
        dsts.append(nid)
        ctxts.append(encrypt(key, share_keys_plaintext_concat(me, nid, b_shares[k], sk_shares[k])))
    s.update(stage="share_keys", b=b, ids=ids, pk1s=pk1s, pk2s=pk2s,
             shares={str(me): own})
    _save(state, session, s)
    return RecordDict({RECORD: ConfigRecord({**_header("share_keys", session, me), "dsts": dsts, "ctxts": ctxts})})


def _collect(c: dict, content: RecordDict, state: RecordDict, s: dict, session: str, node, client_factory) -> RecordDict:
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, generate_shared_key
    from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_separate
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    from fedhype.federated.flower import wire

    me = s["participant"]
    try:
        srcs, ctxts = [int(i) for i in c["srcs"]], list(c["ctxts"])
    except (KeyError, TypeError, ValueError):
        raise NodeMismatch("SecAgg+ collect: bad ciphertext list; refused") from None
    if len(srcs) != len(ctxts) or len(set(srcs)) != len(srcs) or me in srcs or not set(srcs) <= set(s["ids"]):
        raise NodeMismatch("SecAgg+ collect: the sources must be distinct other participants of the key exchange; refused")
    if len(srcs) + 1 < s["threshold"]:
        raise NodeMismatch(f"SecAgg+ collect: {len(srcs) + 1} participants left, fewer than m − t = {s['threshold']}; "
                            "refused (nothing computed)")
    plan = plan_from_config(c)
    if (plan.noise.clients, plan.noise.dropout_tolerance) != (s["m"], s["t"]):
        raise NodeMismatch("SecAgg+ collect: the release plan's (m, t) differ from the setup's; refused")
    if plan.noise_multiplier <= 0:
        raise NodeMismatch("SecAgg+ collect: a release plan without noise; refused")
    node.check_mechanism(True, plan.noise_multiplier)
    shares = dict(s["shares"])
    for src, ct in zip(srcs, ctxts):
        pk2 = s["pk2s"][s["ids"].index(src)]
        key = generate_shared_key(bytes_to_private_key(s["sk2"]), bytes_to_public_key(pk2))
        try:
            got_src, dst, b_share, sk_share = share_keys_plaintext_separate(decrypt(key, ct))
        except Exception:  # noqa: BLE001 - cryptography's InvalidToken and friends: a forged or altered share
            raise NodeMismatch(f"SecAgg+ collect: the shares from participant {src} do not decrypt; refused") from None
        if got_src != src or dst != me:
            raise NodeMismatch(f"SecAgg+ collect: a share claims to come from {got_src} for {dst}; refused")
        shares[str(src)] = {"b": b_share, "sk1": sk_share}
    req, extra = wire.decode_stats_request(RecordDict({wire.STATS_TASK: content[wire.STATS_TASK]})) \
        if wire.STATS_TASK in content else (None, None)
    if req is None or req["stage"] != plan.kind:
        raise NodeMismatch(f"SecAgg+ collect: no release request for the {plan.kind}; refused")
    client = client_factory(extra, req["client"])
    from fedhype.federated.flower.node_budget import charge_request, request_digest
    from fedhype.privacy.events import RELEASE, RELEASE_CENTRE, skellam_release_events

    # a site node charges its own ledger first (node_budget), or refuses; the digest covers the plan and the
    # request, not the per-session keys and shares
    charge_request(node, client.state_dir,
                   skellam_release_events([req["client"]], plan, RELEASE_CENTRE if plan.kind == "centre" else RELEASE),
                   request_digest(RecordDict({"plan": ConfigRecord({k: v for k, v in plan_to_config(plan).items()}),
                                              wire.STATS_TASK: content[wire.STATS_TASK]})))
    share = client.release_integer(plan.kind, plan, n_classes=req["n-classes"], weights=req["weights"],
                                   centring=req["centring"])
    mask = prg(s["b"], plan.length)
    for v in srcs:
        mask = mask + pair_mask(me, v, pair_key(s["sk1"], s["pk1s"][s["ids"].index(v)]), plan.length)
    y = share.masked(mask)
    s.update(stage="collect", shares=shares, srcs=srcs)
    _save(state, session, s)
    return RecordDict({RECORD: ConfigRecord({**_header("collect", session, me), "client": share.client,
                                             "length": int(plan.length)}),
                       MASKED: ArrayRecord({VECTOR: Array(y)})})


def _unmask(c: dict, state: RecordDict, s: dict, session: str) -> RecordDict:
    me = s["participant"]
    try:
        active, dead = [int(i) for i in c["active"]], [int(i) for i in c["dead"]]
    except (KeyError, TypeError, ValueError):
        raise NodeMismatch("SecAgg+ unmask: bad node lists; refused") from None
    known = set(s["srcs"]) | {me}
    if set(active) & set(dead) or not (set(active) | set(dead)) <= known or me not in active \
            or len(set(active)) != len(active) or len(set(dead)) != len(dead):
        raise NodeMismatch("SecAgg+ unmask: the active and dropped nodes must be disjoint participants of this "
                            "session, this node active; refused (no share sent)")
    if len(active) < s["threshold"]:
        raise NodeMismatch(f"SecAgg+ unmask: {len(active)} active nodes, fewer than m − t = {s['threshold']}; refused "
                            "(the sum would carry too little noise)")
    shares = s["shares"]
    out = {**_header("unmask", session, me), "b-ids": active, "b-shares": [shares[str(i)]["b"] for i in active],
           "sk-ids": dead, "sk-shares": [shares[str(i)]["sk1"] for i in dead]}
    s.update(stage="unmask", shares={})  # one unmask per session: the shares are spent
    _save(state, session, s)
    return RecordDict({RECORD: ConfigRecord(out)})


# ---------------------------------------------------------------------------- server side
class FlowerSecureSession:
    """The server's side of SecAgg+ for one run (:class:`~fedhype.federated.secure_release.SecureSession`).

    Args:
        transport: the run's :class:`~fedhype.federated.flower.grid_transport.FlowerTransport`.
        noise: (m, t). delta: δ. tails: every client's planned DP-SGD history (the Skellam calibration).
    """

    def __init__(self, transport, noise: DistributedNoise, delta: float, tails):
        from fedhype.privacy.skellam import check_deployment

        check_deployment(noise)
        if noise.clients != len(transport.clients):
            raise ValidationError(f"secure aggregation planned for {noise.clients} clients, the federation has "
                                  f"{len(transport.clients)}")
        self.transport, self.noise, self.delta, self.tails = transport, noise, float(delta), list(tails)
        self.threshold = noise.min_contributions
        self._count = 0
        self._open: dict[str, Any] | None = None

    # -- plumbing
    def _ask(self, stage: str, contents: dict[int, RecordDict]) -> tuple[dict[int, RecordDict], dict[int, str]]:
        """Send ``contents[i]`` to client i's node; ``(answers, failures)`` by client index (failures: why)."""
        t = self.transport
        labels = sorted(contents)
        msgs = [Message(contents[i], dst_node_id=t.nodes[i], message_type=SECAGG_TYPE, ttl=t.round_timeout + 60)
                for i in labels]
        replies = t._exchange(labels, msgs, f"{SECAGG_TYPE}/{stage}", -1)
        ok, failed = {}, {}
        for i in labels:
            rep = replies.get(i)
            if rep is None:
                failed[i] = "no answer in time"
            elif rep.has_error():
                if stage == "setup" and rep.error.code != ErrorCode.NODE_UNAVAILABLE:
                    c = t.clients[i]
                    raise ProtocolRefused(
                        f"SecAgg+ setup: client {c.id} ({c.name}, SuperNode {t.nodes[i]}) does not take part in "
                        f"fedhype's secure-aggregation protocol {PROTOCOL}: its node answered — "
                        f"{node_reason(rep.error.reason)}. Nothing was released or charged; start that SuperNode with a fedhype "
                        "that speaks it (secure-aggregation not set to false), or run without secure aggregation")
                failed[i] = node_reason(rep.error.reason)
            else:
                ok[i] = rep.content
        for i, why in failed.items():
            c = t.clients[i]
            log(WARNING, "fedhype: SecAgg+ %s: client %s (%s) dropped out (%s)", stage, c.id, c.name, why)
        return ok, failed

    def _too_few(self, stage: str, left: list[int], failed: dict[int, str], after: str) -> SecureAggregationError:
        t = self.transport
        gone = "; ".join(f"client {t.clients[i].id} ({t.clients[i].name}): {why}" for i, why in sorted(failed.items()))
        return SecureAggregationError(
            f"secure aggregation ({stage}): {len(left)} of {self.noise.clients} clients left, fewer than m − t = "
            f"{self.threshold} (--dropout-tolerance {self.noise.dropout_tolerance}); dropped: {gone or 'none'}. {after} "
            "No round was trained (completed rounds: 0); restart the SuperNode(s), then run again with resume=true")

    # -- the session
    def open(self, stage: str) -> list[int]:
        """Stages ``setup`` and ``share_keys`` (no record touched); the client indices that go on."""
        self._count += 1
        session = f"{stage}-{self._count}-{secrets.token_hex(6)}"
        m, t = self.noise.clients, self.noise.dropout_tolerance
        everyone = list(range(len(self.transport.clients)))
        setup = {i: RecordDict({RECORD: ConfigRecord({**_header("setup", session, i + 1), "m": m, "t": t,
                                                      "threshold": self.threshold})}) for i in everyone}
        ok, failed = self._ask("setup", setup)
        keys: dict[int, tuple[bytes, bytes]] = {}
        for i, content in ok.items():
            c = _config(content, f"SecAgg+ setup answer of client {self.transport.clients[i].id}", "setup")
            if c.get("session") != session or int(c.get("participant", -1)) != i + 1:
                raise ArtifactError(f"SecAgg+ setup: client {self.transport.clients[i].id} answered for another session")
            keys[i] = (bytes(c["pk1"]), bytes(c["pk2"]))
        s1 = sorted(keys)
        after = f"Nothing of the {stage} was released or charged."
        if len(s1) < self.threshold:
            raise self._too_few(f"{stage}, setup", s1, failed, after)
        ids = [i + 1 for i in s1]
        share = {i: RecordDict({RECORD: ConfigRecord({**_header("share_keys", session, i + 1), "ids": ids,
                                                      "pk1s": [keys[j][0] for j in s1],
                                                      "pk2s": [keys[j][1] for j in s1]})}) for i in s1}
        ok2, failed2 = self._ask("share_keys", share)
        failed.update(failed2)
        ctxts: dict[tuple[int, int], bytes] = {}
        for i, content in ok2.items():
            c = _config(content, f"SecAgg+ share_keys answer of client {self.transport.clients[i].id}", "share_keys")
            dsts, cts = [int(d) for d in c.get("dsts", [])], list(c.get("ctxts", []))
            if c.get("session") != session or sorted(dsts) != [j for j in ids if j != i + 1] or len(cts) != len(dsts):
                raise ArtifactError(f"SecAgg+ share_keys: client {self.transport.clients[i].id} sent shares for "
                                    f"{sorted(dsts)}, expected every other participant")
            for d, ct in zip(dsts, cts):
                ctxts[(i + 1, d)] = bytes(ct)
        s2 = sorted(ok2)
        if len(s2) < self.threshold:
            raise self._too_few(f"{stage}, share_keys", s2, failed, after)
        self._open = {"stage": stage, "session": session, "s2": s2, "pk1": {i: keys[i][0] for i in s2},
                      "ctxts": ctxts, "failed": failed}
        log(INFO, "fedhype: SecAgg+ %s: %d of %d clients exchanged keys", stage, len(s2), m)
        return s2

    def release(self, stage: str, plan, *, n_classes: int, weights, centring):
        """Stages ``collect`` and ``unmask``; the :class:`~fedhype.privacy.secure_agg.PrivatizedAggregate`."""
        from flwr.common.secure_aggregation.crypto.shamir import combine_shares

        from fedhype.federated.flower import wire
        from fedhype.privacy.dp_step import RELEASE_SENSITIVITY, DPConfig
        from fedhype.privacy.skellam import Layout, aggregate_from_sum

        o, self._open = self._open, None
        if o is None or o["stage"] != stage:
            raise RuntimeError(f"SecAgg+ release of the {stage} without its key exchange")
        t, session, s2 = self.transport, o["session"], o["s2"]
        layout = Layout.centre(t.dim) if stage == "centre" else Layout.statistics(n_classes, t.dim, weights)
        if (layout.length, layout.record_dim) != (plan.length, plan.record_dim):
            raise ValidationError(f"SecAgg+ {stage}: the plan does not fit the release layout")
        dp = DPConfig(plan.noise_multiplier, RELEASE_SENSITIVITY, enabled=True)
        collect = {}
        for i in s2:
            srcs = [j + 1 for j in s2 if j != i]
            req = wire.encode_stats_request(t.clients[i].id, n_classes, dp, weights or _legacy(), run_key=t._key(),
                                            n_train=t.clients[i].n, data_key=t.roster.clients[i].key,
                                            stage=stage, centring=centring, federation=t.federation)
            collect[i] = RecordDict({RECORD: ConfigRecord({**_header("collect", session, i + 1), "srcs": srcs,
                                                           "ctxts": [o["ctxts"][(j, i + 1)] for j in srcs],
                                                           **plan_to_config(plan)}),
                                     wire.STATS_TASK: req[wire.STATS_TASK]})
        ok, failed = self._ask("collect", collect)
        vectors: dict[int, np.ndarray] = {}
        for i, content in ok.items():
            c = _config(content, f"SecAgg+ collect answer of client {t.clients[i].id}", "collect")
            rec = content[MASKED] if MASKED in content else None
            if c.get("session") != session or c.get("client") != t.clients[i].id or not isinstance(rec, ArrayRecord) \
                    or set(rec) != {VECTOR} or set(content) != {RECORD, MASKED}:
                raise ArtifactError(f"SecAgg+ collect: client {t.clients[i].id} answered with other records; refused")
            arr = rec[VECTOR]
            if arr.dtype != "uint64" or tuple(arr.shape) != (plan.length,):
                raise ArtifactError(f"SecAgg+ collect: client {t.clients[i].id} sent {arr.dtype} {tuple(arr.shape)}, "
                                    f"expected uint64 ({plan.length},); refused")
            vectors[i] = arr.numpy().astype(np.uint64)
        failed = {**o["failed"], **failed}
        s3 = sorted(vectors)
        charged = ("The nodes had computed their shares, so this step's write-ahead ledger charge stays; the server "
                   "unmasked nothing.")
        if len(s3) < self.threshold:
            raise self._too_few(f"{stage}, collect", s3, failed, charged)
        dead = [i for i in s2 if i not in vectors]
        active_ids, dead_ids = [i + 1 for i in s3], [i + 1 for i in dead]
        unmask = {i: RecordDict({RECORD: ConfigRecord({**_header("unmask", session, i + 1), "active": active_ids,
                                                       "dead": dead_ids})}) for i in s3}
        ok4, failed4 = self._ask("unmask", unmask)
        b_sh: dict[int, list[bytes]] = {i: [] for i in active_ids}
        sk_sh: dict[int, list[bytes]] = {i: [] for i in dead_ids}
        for i, content in ok4.items():
            c = _config(content, f"SecAgg+ unmask answer of client {t.clients[i].id}", "unmask")
            if c.get("session") != session or [int(x) for x in c.get("b-ids", [])] != active_ids \
                    or [int(x) for x in c.get("sk-ids", [])] != dead_ids:
                raise ArtifactError(f"SecAgg+ unmask: client {t.clients[i].id} answered for other nodes; refused")
            for j, sh in zip(active_ids, c.get("b-shares", [])):
                b_sh[j].append(bytes(sh))
            for j, sh in zip(dead_ids, c.get("sk-shares", [])):
                sk_sh[j].append(bytes(sh))
        if len(ok4) < self.threshold:
            raise self._too_few(f"{stage}, unmask", sorted(ok4), {**failed, **failed4}, charged)
        total = np.zeros(plan.length, dtype=np.uint64)
        for i in s3:
            total = total + vectors[i]
        for j in active_ids:  # remove each active node's own mask
            total = total - prg(combine_shares(b_sh[j]), plan.length)
        for v in dead_ids:  # remove the pair masks the active nodes added for a node that dropped after the key exchange
            sk1 = combine_shares(sk_sh[v])
            for u in active_ids:
                total = total - pair_mask(u, v, pair_key(sk1, o["pk1"][u - 1]), plan.length)
        from fedhype.privacy.skellam import decode_sum

        if np.abs(decode_sum(total)).max(initial=0) >= 2 ** 62:
            raise SecureAggregationError(f"SecAgg+ {stage}: the unmasked sum is out of range (inconsistent shares?); "
                                         "nothing was released")
        log(INFO, "fedhype: SecAgg+ %s: summed %d of %d clients (not summed: %s)", stage, len(s3), self.noise.clients,
            [c.id for i, c in enumerate(t.clients) if i not in vectors] or "none")
        return aggregate_from_sum(total, plan, layout, [t.clients[i].id for i in s3])


def _legacy():
    from fedhype.privacy.dp_step import LEGACY_WEIGHTS

    return LEGACY_WEIGHTS
