"""The release's outputs as the server received them, saved the moment they arrive
(``ckpt/release-outputs.safetensors``): the clients' updates, or under secure aggregation only their sums. A run
interrupted after them resumes from them instead of releasing — and being charged — again
(:func:`fedhype.federated.class_stats.run_class_stats_stage`). Public DP outputs, atomic safetensors.

A step that failed for some clients after others' updates arrived (a Flower node killed during it, or one
in-process client's release raising) is saved *partial*: the updates that arrived, each under its client's index and
marked ``partial``, with the number of clients; a resume releases — and is charged for — only the missing clients'.
That holds for the centre step as for the statistics step (a centre step partly saved has no statistics yet).
"""

from __future__ import annotations

from pathlib import Path

from fedhype.privacy.dp_step import PrivatizedUpdate


def saved_steps(path: Path) -> str:
    """What a saved release-outputs file holds, read from its public metadata alone: ``"complete"`` (the statistics
    step of every client, or its secure sum), ``"partial"`` (some clients' statistics: the step failed for the
    others), ``"centre"`` (the centre step only) or ``"partial centre"`` (some clients' centres: the centre step
    failed for the others); an unreadable file counts as complete (its loader then says what is wrong, naming the
    file)."""
    import json

    from fedhype.io import tensor_metadata

    try:
        meta = json.loads(tensor_metadata(path).get("fedhype_release_outputs", "[]"))
    except Exception:  # noqa: BLE001 — reported by the loader, with the file's name
        return "complete"
    stats = [m for m in meta if m.get("kind") == "stats" or m.get("part") == "stats"]
    if any(m.get("partial") for m in stats):
        return "partial"
    if stats:
        return "complete"
    return "partial centre" if any(m.get("partial") for m in meta if m.get("kind") == "centre") else "centre"


def is_partial(saved) -> bool:
    """Whether loaded statistics or centres (the ``updates`` or ``centres`` of :func:`load_release_outputs`) miss
    some client's (a hole); a secure-aggregation sum (:func:`load_secure_outputs`) never does."""
    return isinstance(saved, list) and any(u is None for u in saved)


def _has_centre(saved) -> bool:
    """Whether saved release outputs hold a centre: a list with some client's centre update, or a centre's sum."""
    return saved is not None and (not isinstance(saved, list) or any(u is not None for u in saved))


def save_release_outputs(path: Path, centres: "list[PrivatizedUpdate | None]",
                         updates: "list[PrivatizedUpdate | None]") -> None:
    """Write the clients' released updates (their tensors and public metadata; atomic safetensors).

    ``updates``: one per client in client order ([] before the statistics step); None where a client's statistics
    did not arrive (a statistics step that failed for some clients): the file is then *partial* — each saved update
    keeps its client's index and is marked ``"partial": true`` with the number of clients, and
    :func:`load_release_outputs` gives None in the holes. ``centres`` likewise ([] for an uncentred release; None
    where a client's centre did not arrive: a centre step that failed for some clients, saved before any statistics).
    """
    import json

    from fedhype.io import atomic_save_tensors

    tensors, meta = {}, []
    for kind, us in (("centre", centres), ("stats", updates)):
        partial = any(u is None for u in us)
        for i, u in enumerate(us):
            if u is None:
                continue
            tensors.update({f"{kind}.{i}.{k}": v for k, v in u.tensors.items()})
            meta.append({"kind": kind, "index": i, "client": u.client, "steps": u.steps,
                         "noise_multiplier": u.noise_multiplier, "clip_norm": u.clip_norm,
                         "sample_rate": u.sample_rate, "private": u.private,
                         **({"partial": True, "n_clients": len(us)} if partial else {})})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_tensors(path, tensors, {"fedhype_release_outputs": json.dumps(meta)})


def load_release_outputs(path: Path, clients) -> "tuple[list[PrivatizedUpdate], list[PrivatizedUpdate | None] | None] | None":
    """The ``(centres, updates)`` :func:`save_release_outputs` wrote, or None when there is no such file or it is
    not these clients' (then the release runs again). ``updates`` is None when only the centres were saved, and holds
    None for each client whose statistics are missing from a partial file (one entry per client, in client order);
    ``centres`` holds None for each client whose centre is missing from a partial centre step.
    Each update is re-typed with
    :meth:`~fedhype.privacy.dp_step.PrivatizedUpdate.from_wire` (names, shapes, finiteness and metadata checked).

    Raises:
        ArtifactError: the file exists but is unreadable or was modified after it was written.
    """
    import json

    from fedhype.io import load_tensors, tensor_metadata

    if path is None or not Path(path).exists():
        return None
    t = load_tensors(path, what="released statistics (the clients' updates)")
    meta = json.loads(tensor_metadata(path).get("fedhype_release_outputs", "[]"))
    out: dict[str, list] = {"centre": [], "stats": []}
    if any(m.get("kind") not in out for m in meta):  # a secure-aggregation sum (save_secure_outputs), not updates
        return None
    ids = [str(c.id) for c in clients]
    partial = {kind for kind in out if any(m.get("partial") for m in meta if m["kind"] == kind)}
    for kind in partial:  # the updates of a subset of the clients, each at its client's index
        if any(m.get("n_clients") != len(ids) or not 0 <= int(m["index"]) < len(ids) for m in meta
               if m["kind"] == kind):
            return None
        out[kind] = [None] * len(ids)
    if "centre" in partial and any(m["kind"] == "stats" for m in meta):  # statistics need every centre
        return None
    for m in sorted(meta, key=lambda m: (m["kind"], m["index"])):
        p = f"{m['kind']}.{m['index']}."
        tensors = {k[len(p):]: v for k, v in t.items() if k.startswith(p)}
        u = PrivatizedUpdate.from_wire(
            client=m["client"], tensors=tensors, like=tensors, steps=m["steps"], noise_multiplier=m["noise_multiplier"],
            clip_norm=m["clip_norm"], sample_rate=m["sample_rate"], private=m["private"])
        if m["kind"] in partial:
            out[m["kind"]][int(m["index"])] = u
        else:
            out[m["kind"]].append(u)
    if out["centre"] and [None if u is None else u.client for u in out["centre"]] != [
            None if u is None else i for u, i in zip(out["centre"], ids)]:
        return None
    if not any(u is not None for u in out["stats"]):  # saved between the steps: the centres alone (None if nothing)
        return (out["centre"], None) if _has_centre(out["centre"]) else None
    if [None if u is None else u.client for u in out["stats"]] != [None if u is None else i
                                                                   for u, i in zip(out["stats"], ids)]:
        return None
    return out["centre"], out["stats"]


def save_secure_outputs(path: Path, centre_sum, stats_sum) -> None:
    """Write the sums a secure-aggregation release gave the server (``centre_sum`` None for an uncentred release):
    their tensors and public metadata (contributors, the noise plan, σ₀), atomic safetensors. The server holds
    only these sums (public DP outputs), never a client's own update."""
    import json

    from fedhype.io import atomic_save_tensors

    tensors, meta = {}, []
    for part, agg in (("centre", centre_sum), ("stats", stats_sum)):
        if agg is None:
            continue
        tensors.update({f"{part}.sum.{k}": v for k, v in agg.tensors.items()})
        meta.append({"kind": "secure", "part": part, "contributors": list(agg.contributors),
                     "clients": agg.noise.clients, "dropout_tolerance": agg.noise.dropout_tolerance,
                     "noise_multiplier": agg.noise_multiplier, "private": agg.private})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_tensors(path, tensors, {"fedhype_release_outputs": json.dumps(meta)})


def load_secure_outputs(path: Path, clients, noise) -> "tuple[object, object] | None":
    """The ``(centre_sum, stats_sum)`` :func:`save_secure_outputs` wrote (``centre_sum`` None if uncentred), rebuilt
    by :func:`fedhype.privacy.secure_agg.restore_sum`; None when there is no such file or it is not a sum of these
    clients under this noise plan ``noise`` (then the release runs again).

    Raises:
        ArtifactError: the file exists but is unreadable or was modified after it was written.
        SecureAggregationError: the saved sum is damaged (too few contributors, non-finite entries).
    """
    import json

    from fedhype.io import load_tensors, tensor_metadata
    from fedhype.privacy.secure_agg import restore_sum

    if path is None or not Path(path).exists():
        return None
    t = load_tensors(path, what="released statistics (the secure-aggregation sums)")
    meta = json.loads(tensor_metadata(path).get("fedhype_release_outputs", "[]"))
    ids = {str(c.id) for c in clients}
    out: dict = {}
    for m in meta:
        if (m.get("kind") != "secure" or (m["clients"], m["dropout_tolerance"]) != (noise.clients, noise.dropout_tolerance)
                or not set(m["contributors"]) <= ids):
            return None
        p = f"{m['part']}.sum."
        out[m["part"]] = restore_sum({k[len(p):]: v for k, v in t.items() if k.startswith(p)}, m["contributors"],
                                     noise, m["noise_multiplier"], m["private"])
    if "stats" not in out:  # saved between the steps: the centre's sum alone
        return (out["centre"], None) if "centre" in out else None
    return out.get("centre"), out["stats"]
