"""The release folder: what a site may share, apart from everything that stays private.

Layout::

    release/
      model.safetensors       the DP generator (Φ and the DP client codes): synthesize from it (a no_dp run's
                              generator is not private: its README then says the folder must not leave the site)
      ledger.json             every mechanism event, hash-chained: ε is recomputed from it
      config.json             the run's public settings (hyperparameters, privacy plan, public sizes; the
                              store digest left out: it is a function of the real embeddings; a run over
                              sites keeps its run key, the name its sites' ledgers give it)
      checkpoint.json         how many rounds the model holds (the audit truncates the ledger there)
      synthetic.safetensors   synthetic embeddings (post-processing of the model; a job's release only)
      privacy.json            ε per client and worst, δ, accountant, mechanisms (recomputed here)
      README.md               what the folder holds and what it does not

Nothing else of a run or job is copied: the real embeddings, the partition (record ids), the
clients' private states, the per-round held-out diagnostics (``metrics.json``: not DP), the
evaluation and report (their figures are computed on real records outside the DP path) and the
plots (they show real records). A recipient checks the claim with ``fedhype audit --run release/
--synthetic release/synthetic.safetensors`` and samples more with ``fedhype synthesize --run release/``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fedhype.errors import ArtifactError, ValidationError
from fedhype.io import RELEASE_FORMAT, atomic_write_json, enclosing_release, read_json, sealed

#: files copied from the run directory (model first: a folder without it is no release)
RUN_FILES = ("model.safetensors", "ledger.json", "config.json", "checkpoint.json")
FORMAT = RELEASE_FORMAT
#: the keys of privacy.json that :func:`check_release` compares with :func:`privacy_summary` recomputed as they are
#: (ε and ε per client are compared within a tolerance; ``files`` are digests; ``model_epsilon_note`` is the model's)
RECOMPUTED_KEYS = ("format", "private", "delta", "noise_seeded", "warning", "accountant", "mechanisms", "method",
                   "rounds", "seeded_clients")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def privacy_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    """ε per client and worst, recomputed from ``run_dir``'s ledger by the accountant (never read from a claim).

    Returns a JSON-able dict: ``private``, ``epsilon`` (worst client; None without DP), ``delta``,
    ``accountant``, ``epsilon_per_client`` (client name → ε), ``mechanisms``, ``method``,
    ``rounds``, ``noise_seeded`` and, when the guarantee does not hold as a release, ``warning``.

    Raises:
        ArtifactError: no model, or a missing or tampered ledger for a private run.
    """
    from fedhype.federated.rundir import load_model
    from fedhype.privacy.accountant import REPORTED
    from fedhype.privacy.ledger import PrivacyLedger

    root = Path(run_dir)
    _, _, meta = load_model(root)
    private = bool(meta.get("private"))
    names = dict(zip([str(c) for c in meta["clients"]], [str(n) for n in (meta.get("client_names") or meta["clients"])]))
    out: dict[str, Any] = {"format": FORMAT, "private": private, "epsilon": None, "delta": meta.get("delta"),
                           "accountant": REPORTED, "epsilon_per_client": {}, "mechanisms": [],
                           "method": meta.get("method"), "rounds": meta.get("rounds_done"),
                           "noise_seeded": meta.get("seed") is not None}
    if private:
        if not (root / "ledger.json").is_file():
            raise ArtifactError(f"{root / 'ledger.json'}: the run's privacy ledger is missing; ε cannot be recomputed")
        ledger = PrivacyLedger.load(root / "ledger.json")
        eps = ledger.epsilons()
        out.update(epsilon=max(eps.values()) if eps else 0.0, delta=ledger.delta,
                   epsilon_per_client={names.get(c, c): e for c, e in eps.items()},
                   mechanisms=list(dict.fromkeys(e.mechanism for e in ledger.events)))
        # a Flower node started with seed= draws reproducible noise although the server's train.seed is unset
        seeded_nodes = [names.get(c, c) for c in dict.fromkeys(e.client for e in ledger.events if e.seeded)]
        if seeded_nodes and not out["noise_seeded"]:
            out.update(noise_seeded=True, seeded_clients=seeded_nodes)
    if not private:
        out["warning"] = "NON-PRIVATE: trained with no_dp; nothing here is differentially private"
    elif out.get("seeded_clients"):
        out["warning"] = (f"the noise of client(s) {', '.join(out['seeded_clients'])} was seeded (their SuperNode's seed= "
                          "node config): whoever knows the seed can regenerate and remove it, so this run must not be "
                          "shared as private; run those nodes without seed= and train again")
    elif out["noise_seeded"]:
        out["warning"] = ("the noise was seeded (--seed / train.seed): whoever knows the seed can regenerate and remove "
                          "it, so this run is reproducible but must not be shared as private; train again without a seed")
    return out


def _readme(summary: dict[str, Any], files: list[str]) -> str:
    private = bool(summary["private"])
    if private:
        claim = (f"(ε = {summary['epsilon']:.4g}, δ = {summary['delta']:g})-differential privacy per training record "
                 f"(worst client; accountant: the smaller of Opacus's PRV and RDP bounds, recomputed from ledger.json)")
        if summary.get("noise_seeded"):  # a probe: "may leave the site" beside "must not be shared as private"
            lines = ["# fedhype release (seeded noise: not to be shared as private)", "",
                     f"This folder is the output of DP mechanisms and their public bookkeeping, with {claim} — but its "
                     "noise was drawn from a seed (the warning below): whoever holds the seed can regenerate and remove "
                     "it, so nothing here may leave the site as private data. Train again without a seed for a "
                     "release.", ""]
        else:
            lines = ["# fedhype release", "",
                     f"Everything in this folder may leave the site: it is the output of DP mechanisms and their public "
                     f"bookkeeping, with {claim}.", ""]
    else:  # a probe's no_dp release said "may leave the site: it is the output of DP mechanisms"
        lines = ["# fedhype release (NOT private)", "",
                 "This folder is NOT private: the model was trained without differential privacy (no_dp), so the "
                 "generator and its synthetic embeddings may reveal training records. Nothing here may leave the "
                 "site as private data; it stays with the data holder like the training data itself.", ""]
    if summary.get("warning"):
        lines += [f"**Warning: {summary['warning']}.**", ""]
    if summary.get("model_epsilon_note"):
        lines += [f"Note: {summary['model_epsilon_note']}.", ""]
    what = {"model.safetensors": "the DP generator (hypernetwork Φ and the DP client codes)" if private else
                                 "the generator (hypernetwork Φ and the client codes), trained without DP",
            "ledger.json": "every mechanism event (σ, q, steps per client), hash-chained",
            "config.json": "the run's settings: hyperparameters, privacy plan, public client sizes" if private else
                           "the run's settings: hyperparameters, client sizes",
            "checkpoint.json": "how many rounds the model holds (the audit reads it)",
            "synthetic.safetensors": "synthetic embeddings sampled from the model (post-processing: no further cost)"
                                     if private else "synthetic embeddings sampled from the model (not private)",
            "privacy.json": "ε per client and worst, δ, mechanisms (recomputed from the ledger)" if private else
                            "private = false and the warning above (no ε: there is no guarantee)"}
    lines += [f"- `{f}`: {what.get(f, '')}" for f in files]
    lines += ["", ("Not here (private to the data holder): " if private else "Not here either: ")
              + "the real embeddings, the partition, the clients' private states, the per-round held-out diagnostics "
                "and the evaluation report (computed on real records outside the DP path).", "",
              ("Check the claim: " if private else "Check the files: ") + "`fedhype audit --run <this folder>"
              + (" --synthetic <this folder>/synthetic.safetensors" if "synthetic.safetensors" in files else "")
              + "`. Sample more: `fedhype synthesize --run <this folder> --code mixture --per-class 300 --out syn.safetensors`.",
              ""]
    return "\n".join(lines)


def _manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The release ``privacy.json`` of ``folder`` (this module's format), or None (absent, unreadable or another)."""
    manifest = Path(folder) / "privacy.json"
    if not manifest.is_file():
        return None
    try:
        claimed = read_json(manifest, "release privacy.json")
    except ArtifactError:
        return None
    return claimed if isinstance(claimed, dict) and claimed.get("format") == FORMAT else None


def is_release(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a release's ``privacy.json`` (this module's format)."""
    return _manifest(folder) is not None


def release_holding(path: str | os.PathLike) -> Path | None:
    """The release folder whose ``privacy.json`` lists ``path`` among its hashed files, or None.

    Replacing such a file breaks the release (:func:`check_release` then reports it as changed), so
    the commands that write an ``--out`` file refuse it (``fedhype.cli.common.check_out_file``).
    """
    path = Path(path)
    files = (_manifest(path.parent) or {}).get("files")
    return path.parent if isinstance(files, dict) and path.name in files else None


def check_release(folder: str | os.PathLike, tol: float = 1e-6) -> list[dict[str, Any]] | None:
    """Check a release folder's own files against what :func:`write_release` wrote and the ledger says.

    ``privacy.json`` lists the SHA-256 of every file it was written with: each must still match (an edited
    ``config.json`` or a swapped model fails here, unless the digests were rewritten too); its ε and per-client ε
    (within ``tol``) and every other key (:data:`RECOMPUTED_KEYS`: δ, ``private``, ``noise_seeded``, ``warning``,
    accountant, mechanisms, method, rounds) must equal :func:`privacy_summary` recomputed from the folder's model and
    ledger, a ``model_epsilon_note`` must be the released model's own, and a key the release does not write fails;
    its ``README.md`` must be the text the release writes (a deleted seeded-noise warning fails).

    Returns:
        None when ``folder`` is no release (no ``privacy.json``), else the checked rows (one failing row for a
        ``privacy.json`` of another format: a replaced one must not turn the release checks off)
        ``{"name", "claimed", "recomputed", "difference", "ok"[, "reason"]}`` (the rows of
        :func:`fedhype.eval.audit_ledger.audit_run`).
    """
    root = Path(folder)
    path = root / "privacy.json"
    if not path.is_file():
        return None
    try:
        claimed = read_json(path, "release privacy.json")
    except ArtifactError as exc:
        return [{"name": "privacy.json", "claimed": None, "recomputed": None, "difference": None, "ok": False,
                 "reason": str(exc)}]
    if not isinstance(claimed, dict) or claimed.get("format") != FORMAT:
        # a probe replaced privacy.json with {} and the folder was audited as a run folder: its README and extra
        # files unchecked, exit 0. A privacy.json that is not a release's fails as a removed one does.
        found = claimed.get("format") if isinstance(claimed, dict) else type(claimed).__name__
        return [{"name": "privacy.json: format", "claimed": found, "recomputed": FORMAT, "difference": None, "ok": False,
                 "reason": f"{path} is not a release's privacy.json (format {found!r}, not {FORMAT!r}): replaced or "
                           "edited, so the folder cannot be checked for what else it holds; ask for the folder as it "
                           "was released"}]
    rows: list[dict[str, Any]] = []

    def row(name, c, r, ok, reason=None):
        d = abs(c - r) if isinstance(c, (int, float)) and isinstance(r, (int, float)) and not isinstance(c, bool) else None
        rows.append({"name": name, "claimed": c, "recomputed": r, "difference": d, "ok": bool(ok),
                     **({"reason": reason} if reason and not ok else {})})

    files = claimed.get("files") if isinstance(claimed.get("files"), dict) else {}
    if not files:
        row("privacy.json: files", None, None, False, "no file digests: not written by fedhype, or edited")
    for f, digest in files.items():
        if not (root / f).is_file():
            row(f"privacy.json: files[{f}] sha256", digest, None, False,
                f"{root / f} is missing: the folder differs from what was released")
        else:
            got = _sha256(root / f)
            row(f"privacy.json: files[{f}] sha256", digest, got, got == digest,
                f"{root / f} changed after the release was written: the folder differs from what was released")
    try:
        fresh = privacy_summary(root)
    except ArtifactError as exc:
        row("privacy.json: recomputed from the model and ledger", None, None, False, str(exc))
        return rows
    for key in RECOMPUTED_KEYS:  # every key privacy_summary writes, recomputed (a probe set rounds, mechanisms, method)
        row(f"privacy.json: {key}", claimed.get(key), fresh.get(key), claimed.get(key) == fresh.get(key))
    if "model_epsilon_note" in claimed:  # written only with a model restamped by _copy_model, which carries it too
        from fedhype.federated.rundir import load_model

        stamped = load_model(root)[2].get("epsilon_note")
        row("privacy.json: model_epsilon_note", claimed["model_epsilon_note"], stamped,
            isinstance(stamped, str) and claimed["model_epsilon_note"] == stamped,
            "the note is not the one the released model carries (only a model the release restamped has one)")
    for key in sorted(set(claimed) - set(fresh) - {"files", "model_epsilon_note", "epsilon", "epsilon_per_client"}):
        row(f"privacy.json: {key}", claimed[key], None, False,
            "a key the release does not write (a claim nobody recomputes): remove it, or write the release again")
    ce, fe = claimed.get("epsilon"), fresh.get("epsilon")
    row("privacy.json: epsilon", ce, fe, (ce is None and fe is None)
        or (isinstance(ce, (int, float)) and fe is not None and abs(ce - fe) <= tol))
    cpc = claimed.get("epsilon_per_client") if isinstance(claimed.get("epsilon_per_client"), dict) else {}
    for c in sorted(set(cpc) | set(fresh["epsilon_per_client"])):
        a, b = cpc.get(c), fresh["epsilon_per_client"].get(c)
        row(f"privacy.json: epsilon_per_client[{c}]", a, b,
            isinstance(a, (int, float)) and b is not None and abs(a - b) <= tol)
    # the folder is what leaves the site: a file its privacy.json does not list (a real store copied in, a
    # site's private split file) is outside the claim, whatever it holds
    listed = {*files, "privacy.json", "README.md"}
    for extra in sorted(q for q in root.rglob("*") if q.is_file() and q.relative_to(root).as_posix() not in listed):
        row(f"release folder: {extra.relative_to(root).as_posix()}", "present", "not in privacy.json", False,
            f"{extra} is not one of the files the release lists, and no privacy claim covers it: the folder differs "
            "from what was released; remove it if you added it (a copy of the release is shared as written), "
            "otherwise ask the sender for the folder as released")
    if files:
        # the note on a model released with its ledger's ε is text, not a claim (the figures are checked above)
        note = {"model_epsilon_note": claimed["model_epsilon_note"]} if isinstance(claimed.get("model_epsilon_note"), str) else {}
        want = _readme({**fresh, **note, "files": files}, [*files, "privacy.json"])
        readme = root / "README.md"
        have = readme.read_text(encoding="utf-8") if readme.is_file() else None
        row("README.md", "as written" if have == want else ("missing" if have is None else "edited"), "as written",
            have == want, f"{readme} is not the text the release wrote (its claim or warning was edited or removed)")
    return rows


def public_config(conf: dict[str, Any], run_key: str | None = None) -> dict[str, Any]:
    """The run's configuration as a release holds it: without the store digest (a deterministic function of
    the real embeddings, outside the DP path) and without the store's size ``n`` (every record it holds,
    validation and test records included, which no mechanism touched); settings, the privacy plan with the
    clients' training-set sizes (public: they set each client's q) and provenance stay.

    ``run_key``: a run over sites (``train --site``, Flower) names itself in the sites' own ledgers by this key
    (:meth:`fedhype.federated.rundir.RunDir.run_key`: the run folder's name and a random token, nothing of the
    records); the release keeps it as ``run_key`` so that each site, which receives the release and never the
    coordinator's run folder, can check it against its own ledger (``fedhype audit --run RELEASE --site DIR``)."""
    conf = dict(conf)
    if run_key is not None:
        conf["run_key"] = run_key
    if isinstance(conf.get("store"), dict) and ({"digest", "n"} & set(conf["store"])):
        conf["store"] = {k: v for k, v in conf["store"].items() if k not in ("digest", "n")}
        conf["store"]["digest_note"] = ("left out of the release: a digest of the real embeddings and the store's "
                                        "size (its validation and test records included)")
    return conf


def _copy_model(src: Path, dest: Path, private: bool) -> str | None:
    """Copy the run's model file into the release; where its metadata understates ε, with the ledger's figure.

    The model's metadata ``epsilon`` is written with the model (:func:`fedhype.federated.engine._write_model`): the
    run's ledger ε over its committed rounds. The file's content digest covers only its tensors, so that figure
    alone is no evidence. The ledger beside it (hash-chained, recomputed by the accountant) gives two honest figures:
    over the committed rounds (``checkpoint.json``; :func:`fedhype.eval.audit_ledger.committed_ledger`) and in full
    (an interrupted run's next round charged write-ahead too). A model saying either is copied unchanged (an
    interrupted run's model says the first). One saying less than the committed figure (an edited model) is
    released with the full ledger's figure in its metadata (tensors and digest unchanged) and a note.

    Returns:
        the note, or None where the model was copied unchanged.

    Raises:
        ArtifactError: the model's metadata ε exceeds the full ledger's (an older or edited ledger: the release
            would understate what the records cost; ``fedhype audit --run`` on the run says which).
    """
    import json
    import math

    from fedhype.eval.audit_ledger import committed_ledger
    from fedhype.federated.rundir import RunDir
    from fedhype.io import DIGEST_KEY, atomic_save_tensors, load_tensors, tensor_metadata
    from fedhype.privacy.ledger import PrivacyLedger
    from fedhype.synthesis.spent import REL_TOL

    raw = tensor_metadata(src)
    meta = json.loads(raw.get("fedhype") or "{}")
    model_eps = meta.get("epsilon")
    if not private or model_eps is None:
        shutil.copy2(src, dest)
        return None
    full = PrivacyLedger.load(src.parent / "ledger.json")
    figures = (committed_ledger(full, RunDir(src.parent).committed_round()).worst()[1], full.worst()[1])
    m = float(model_eps)
    if any(math.isclose(m, f, rel_tol=REL_TOL, abs_tol=1e-12) for f in figures):
        shutil.copy2(src, dest)
        return None
    if m > figures[1]:
        raise ArtifactError(f"{src}: the model's metadata says ε = {m:.6g}, more than its run's ledger records "
                            f"({figures[1]:.6g}): the ledger lacks charges the model was trained under (an older or "
                            "edited ledger.json), so a release would understate what the records cost; run `fedhype "
                            "audit --run` on the run and release from the run folder whose ledger is whole")
    note = (f"the run's model file said ε = {m:.6g}, not what its ledger records ({figures[0]:.6g} over the committed "
            f"rounds, {figures[1]:.6g} in all: an edited model); the released model's metadata says {figures[1]:.6g}")
    meta.update(epsilon=figures[1], epsilon_note=note)
    extra = {k: v for k, v in raw.items() if k not in (DIGEST_KEY, "fedhype")}
    atomic_save_tensors(dest, load_tensors(src, what="model"), {**extra, "fedhype": json.dumps(meta)})
    return note


def write_release(run_dir: str | os.PathLike, dest: str | os.PathLike, *, synthetic: str | os.PathLike | None = None,
                  overwrite: bool = False) -> Path:
    """Write the release folder ``dest`` of the run ``run_dir`` (see the module docstring).

    The folder appears complete or not at all: it is written beside ``dest`` and renamed into place
    (with ``overwrite``, an existing release is replaced the same way).

    Args:
        run_dir: a run directory (``fedhype train --out`` or a job's ``run/``).
        dest: the folder to write. synthetic: a synthetic store drawn from this run, copied too.
        overwrite: replace an existing ``dest`` (only a fedhype release).

    Returns:
        ``dest``.

    Raises:
        ValidationError: ``dest`` exists (without ``overwrite``, or it is not a release).
        ArtifactError: no model in ``run_dir``, another run's model (its data keys, clients or rounds are not the run's:
            :func:`fedhype.federated.rundir.check_model_belongs`), a tampered ledger, a synthetic store of another run, a model whose
            metadata says more ε than the run's ledger records (:func:`_copy_model`; where it says less than the
            committed rounds cost, the released model's metadata says the ledger's figure and ``privacy.json`` a
            ``model_epsilon_note``).
    """
    src, dest = Path(run_dir), Path(dest)
    if not (src / "model.safetensors").is_file():
        raise ArtifactError(f"{src}: no model.safetensors (training did not finish)")
    if dest.exists():
        is_release = (dest / "privacy.json").is_file() and read_json(dest / "privacy.json", "release").get("format") == FORMAT
        if not overwrite or not is_release:
            raise ValidationError(f"{dest} exists; a release is written into a new folder"
                                  + ("" if is_release else " (and this one is not a fedhype release)"))
    from fedhype.federated.rundir import check_model_belongs

    check_model_belongs(src)  # another run's model copied in would be released under this ledger (a probe)
    from fedhype.federated.rundir import RunDir

    run_key = RunDir(src).run_key()  # a run over sites: its name in their ledgers, so each site can audit the release
    summary = privacy_summary(src)
    if synthetic is not None:
        from fedhype.data.store import EmbeddingStore
        from fedhype.federated.rundir import load_model

        syn = EmbeddingStore.load(synthetic)
        run_id = load_model(src)[2].get("run_id")
        if syn.kind != "synthetic" or syn.meta.get("run_id") != run_id:
            raise ArtifactError(f"{synthetic} is not a synthetic store drawn from {src} "
                                f"(kind {syn.kind!r}, run_id {syn.meta.get('run_id')!r} vs {run_id!r})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        files = []
        for name in RUN_FILES:
            if name == "model.safetensors":
                note = _copy_model(src / name, tmp / name, summary["private"])
                if note:
                    summary["model_epsilon_note"] = note
                files.append(name)
            elif name == "config.json" and (src / name).is_file():
                atomic_write_json(tmp / name, sealed(public_config(read_json(src / name, "run config"), run_key)))
                files.append(name)
            elif (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
                files.append(name)
        if synthetic is not None:
            shutil.copy2(synthetic, tmp / "synthetic.safetensors")
            files.append("synthetic.safetensors")
        summary["files"] = {f: _sha256(tmp / f) for f in files}
        atomic_write_json(tmp / "privacy.json", summary)
        files.append("privacy.json")
        (tmp / "README.md").write_text(_readme(summary, files), encoding="utf-8")
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
            os.replace(dest, old / "release")
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
