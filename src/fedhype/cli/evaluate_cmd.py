"""``fedhype evaluate``: fidelity (MMD², FD, PRDC) and utility (TSTR/TRTR) of a synthetic store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from fedhype.cli.choices import SPACES, SPLITS, choice
from fedhype.cli.common import JsonOpt, console, existing, renamed_option, run_command, seed_value, warn
from fedhype.errors import ArtifactError, ValidationError

_FIDELITY = (("MMD²", "mmd2"), ("MMD² p-value", "mmd2_p_value"), ("MMD² multi-bandwidth", "mmd2_multi"),
             ("MMD² multi p-value", "mmd2_multi_p_value"), ("RBF bandwidth σ", "mmd2_bandwidth"),
             ("Fréchet distance", "fd"), ("precision", "precision"), ("recall", "recall"),
             ("density", "density"), ("coverage", "coverage"))
_UTILITY = ("accuracy", "balanced_accuracy", "macro_f1")


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _render(r: dict[str, Any]) -> None:
    out = Console()
    fid = Table(title="fidelity", show_header=False)
    fid.add_column("metric", style="bold")
    fid.add_column("value", justify="right")
    fid.add_row("space", r["space"])
    fid.add_row("n real / synthetic", f"{r['n_real']}/{r['n_synthetic']}")
    for label, key in _FIDELITY:
        fid.add_row(label, _fmt(r.get(key)))
    fid.add_row("MMD² samples (real/synthetic)", f"{r['mmd2_n_real']}/{r['mmd2_n_synthetic']}")
    fid.add_row(f"PRDC samples (k={r['prdc_k']})", f"{r['prdc_n_real']}/{r['prdc_n_synthetic']}")
    out.print(fid)
    util = Table(title="utility (tested on held-out real)")
    for col in ("metric", "TSTR", "TRTR"):
        util.add_column(col, justify="left" if col == "metric" else "right", style="bold" if col == "metric" else None)
    for m in _UTILITY:
        util.add_row(m, _fmt(r.get(f"tstr_{m}")), _fmt(r.get(f"trtr_{m}")))
    out.print(util)
    per = r.get("per_domain") or {}
    if per:
        dom = Table(title="utility per domain / client of the real test set")
        for col in ("domain", "n", "TSTR acc", "TRTR acc", "TSTR bal. acc", "TRTR bal. acc"):
            dom.add_column(col, justify="left" if col == "domain" else "right")
        for name, row in per.items():
            dom.add_row(name, str(row["n"]), *[_fmt(row.get(f"{p}_{m}")) for m in ("accuracy", "balanced_accuracy")
                                               for p in ("tstr", "trtr")])
        out.print(dom)
    cd = r.get("code_domain")
    if cd:
        t = Table(title="code × domain: MMD² ↓ / TSTR ↑ (● own domain closest)")
        t.add_column("code")
        for d in cd["domains"]:
            t.add_column(d, justify="right")
        for code, mrow, trow in zip(cd["codes"], cd["mmd2"], cd["tstr"]):
            t.add_row(code, *[f"{a:.3f} / {b:.3f}" for a, b in zip(mrow, trow)])
        Console().print(t)
    lam = r.get("interpolation")
    if lam:
        t = Table(title=f"λ-interpolation protocol (λ chosen on validation {lam['select_by']})")
        for col in ("client", "λ", *_UTILITY):
            t.add_column(col, justify="left" if col == "client" else "right")
        for name, c in lam["clients"].items():
            t.add_row(name, _fmt(c["lambda"]), *[_fmt(c[m]) for m in _UTILITY])
        t.add_row("mean", _fmt(lam["mean_lambda"]), *[_fmt(lam[f"mean_{m}"]) for m in _UTILITY])
        out.print(t)
    dd = r.get("downstream")
    if dd:
        t = Table(title="downstream accuracy per client (own test / union test)")
        t.add_column("client")
        for row in dd["rows"]:
            t.add_column({"local_synthetic": "local+syn", "synthetic_only": "synthetic", "local_only": "local",
                          "interpolation": "λ-interp."}.get(row, row), justify="right")
        t.add_column("r", justify="right")
        for name, c in dd["clients"].items():
            t.add_row(name, *[f"{c['own'][row]['accuracy']:.3f} / {c['union'][row]['accuracy']:.3f}" for row in dd["rows"]],
                      "unweighted" if c["real_share"] is None else f"{c['real_share']:g}")
        m = dd["mean"]
        t.add_row("mean", *[f"{m['own'][row]['accuracy']:.3f} / {m['union'][row]['accuracy']:.3f}" for row in dd["rows"]], "")
        out.print(t)


def _by_client(part: Any, store: Any, split: str) -> Any:
    """``split`` rows of ``store`` with domains replaced by the partition's client ids (per-client metrics)."""
    from fedhype.data.store import EmbeddingStore

    sub = part.split_store(store, split)
    return EmbeddingStore(sub.embeddings, sub.labels, part.client_ids(split), sub.sample_ids, sub.class_names,
                          [c.name for c in part.clients], dict(sub.meta))


def evaluate(
    real: Path | None = renamed_option(None, "--store", "--real", help="Real store: held-out test set (the full store with "
                                       "--partition).", callback=existing("embeddings store", "create it with `fedhype embed`")),
    sites: list[Path] | None = typer.Option(None, "--site", help="A site folder (from `fedhype site`; or a site.json, "
                                            "e.g. the previous split an --overwrite kept) instead of --store: its "
                                            "store's --split (default test) is the held-out set and its train split "
                                            "the TRTR set, labels matched to the synthetic store's classes by name. "
                                            "One site per command.",
                                            callback=existing("site folder", "write it with `fedhype site`", kind="any")),
    synthetic: Path = typer.Option(..., "--synthetic", help="Synthetic embeddings store (from `fedhype synthesize`).",
                                  callback=existing("synthetic embeddings store", "create it with `fedhype synthesize`")),
    real_train: Path | None = typer.Option(None, "--real-train", help="Real training store for the TRTR classifier.",
                                           callback=existing("embeddings store", "create it with `fedhype embed`")),
    partition: Path | None = typer.Option(None, "--partition", help="Partition JSON; --store is split by it.",
                                          callback=existing("partition file", "create it with `fedhype partition`")),
    real_split: str | None = renamed_option(None, "--split", "--real-split", help="With --partition: the held-out split "
                                            "of --store to compare with (train, val or test; default test).", click_type=choice(SPLITS)),
    interpolation: bool = typer.Option(False, "--interpolation", help="With --partition: per-client λ protocol."),
    downstream: bool = typer.Option(False, "--downstream",
                                    help="With --partition: the per-client downstream table (local-only, synthetic-only, "
                                         "local + synthetic, λ protocol) on each client's test split and their union "
                                         "([evaluate] downstream in `fedhype run`)."),
    space: str = typer.Option("l2", "--space", help="Evaluation space: l2 (unit-norm rows) or raw.", click_type=choice(SPACES)),
    permutations: int = typer.Option(200, "--permutations", help="MMD² permutation-test permutations (0: no p-value)."),
    max_samples: int = typer.Option(2000, "--max-samples", help="MMD² subsamples each set to at most this many rows."),
    k: int = typer.Option(5, "--k", help="PRDC neighbourhood size k."),
    seed: int = typer.Option(0, "--seed", callback=seed_value, help="Seed of subsampling, permutations and classifiers."),
    code_domain: Path | None = typer.Option(None, "--code-domain",
                                            help="With --partition: the training run (folder) whose code × domain "
                                                 "matrix to add — MMD² and TSTR of every client code, neutral and "
                                                 "mixture against each client's held-out split.",
                                            callback=existing("run directory", "give the --out of `fedhype train`",
                                                              kind="any")),
    json_mode: bool = JsonOpt,
) -> None:
    """Compare a synthetic store with held-out real embeddings: MMD², FD, PRDC, TSTR/TRTR."""

    def body() -> dict[str, Any]:
        from fedhype.data.store import EmbeddingStore
        from fedhype.eval import evaluate as run_eval
        from fedhype.eval.inputs import check_compatible, check_provenance, check_space, one_class_warning
        from fedhype.eval.interpolation import ClientSplits, interpolation_protocol

        check_space(space)
        if sites and len(sites) > 1:
            raise ValidationError(f"--site given {len(sites)} times: evaluate one site per command (each on its own "
                                  "test split)")
        site = sites[0] if sites else None
        if real is not None and site is not None:  # a probe was told to give one of them after giving both
            raise ValidationError("give the real held-out data once: --store (with --partition to split it) or --site "
                                  "(a site folder from `fedhype site`), not both")
        if real is None and site is None:
            raise ValidationError("give the real held-out data: --store (with --partition to split it), or --site "
                                  "(a site folder from `fedhype site`)")
        if site is not None and (partition is not None or interpolation or downstream or code_domain is not None):
            raise ValidationError("--site evaluates against one site's own splits; --partition, --interpolation, "
                                  "--downstream and --code-domain need a pooled --store and its --partition")
        if site is not None:
            return _evaluate_site(site, synthetic, real_train, real_split or "test", space, permutations, max_samples,
                                  k, seed)
        if partition is None and (real_split is not None or interpolation or downstream or code_domain is not None):
            raise ValidationError("--split, --interpolation, --downstream and --code-domain need --partition")
        split = real_split or "test"
        if split not in ("train", "val", "test"):
            raise ValidationError(f"--split must be train, val or test, got {split!r}")
        real_store = EmbeddingStore.load(real)
        syn_store = EmbeddingStore.load(synthetic)
        check_compatible(real_store, syn_store, f"real store {real}", f"synthetic store {synthetic}")
        check_provenance(real_store, syn_store, f"real store {real}", f"synthetic store {synthetic}")
        train_store = None
        if real_train is not None:
            train_store = _real_train_store(real_train, syn_store, synthetic)
        part = None
        if partition is not None:
            from fedhype.data.partition import Partition

            part = Partition.load(partition)
            if real_store.kind != "real":  # a probe read a digest mismatch: a partition splits the real store only
                raise ArtifactError(f"--store {real} is a {real_store.kind!r} store; with --partition it must be the "
                                    "real embeddings store the partition was made from (`fedhype embed`), and "
                                    "the synthetic one goes to --synthetic")
            part.check_store(real_store)
            check_provenance(real_store, syn_store, f"real store {real}", f"synthetic store {synthetic}",
                             partition=part)
            test_store = _by_client(part, real_store, split)
            if len(test_store) == 0:  # said "MMD² needs at least 2 samples, got 0" without naming the split (a probe)
                raise ValidationError(f"the partition {partition} has no {split} records (its train/val/test fractions: "
                                      f"{part.params.get('fractions', part.params.get('splits', '?'))}): evaluation needs "
                                      f"held-out real records; give another --split or a partition with a {split} "
                                      "share (`fedhype partition --fractions`)")
            if train_store is None and split != "train":
                train_store = _by_client(part, real_store, "train")
        from fedhype.eval.inputs import check_not_test_records

        check_not_test_records(test_store if partition is not None else real_store, syn_store,
                               f"{real}" + (f" (its {split} split)" if partition is not None else ""),
                               f"--synthetic {synthetic}")
        warnings: list[str] = []
        if real_store.kind != "real":  # the reference must be real records; a synthetic one scores model against model
            warnings.append(f"--store {real} is marked kind={real_store.kind!r}: the reference is not real data, so the "
                            "figures compare two synthetic sets (give the real store `fedhype embed` wrote)")
        if partition is None:
            test_store = real_store
            warnings.append(f"no --partition: all {len(real_store)} records of {real} are the real reference; if the "
                            "model was trained on some of them, TSTR and MMD² overstate what it does on unseen data "
                            "(give --partition with --split test, or a store of held-out records)")
        if partition is not None and split == "train":  # a helper's --split train scored without a word
            warnings.append(f"--split train: the real reference is the partition's training records, which a "
                            "generator trained on this partition has seen; TSTR and MMD² then measure how closely it "
                            "reproduces them, not held-out quality (use --split test, the default, for that)")
        one = one_class_warning(test_store)
        if one:
            warnings.append(one)
        from fedhype.eval.inputs import shared_records_warning

        if shared := shared_records_warning(test_store, train_store):
            warnings.append(shared)
        for w in warnings:
            warn(w)
        kind_warning = _kind_warning(synthetic, syn_store)
        if kind_warning:
            warnings.append(kind_warning)
        console.print(f"evaluating {len(syn_store)} synthetic against {len(test_store)} real embeddings …",
                      highlight=False)
        result = run_eval(test_store, syn_store, real_train=train_store, space=space, n_permutations=permutations,
                          max_samples=max_samples, k=k, seed=seed)
        _print_metric_warnings(result)
        clients = ({c.name: ClientSplits(*(part.client_store(real_store, c.id, s) for s in ("train", "val", "test")))
                    for c in part.clients} if interpolation or downstream else {})
        if downstream:
            from fedhype.eval.client_downstream import client_downstream

            result["downstream"] = client_downstream(clients, syn_store, space=space, seed=seed)
            lam = result["downstream"].pop("interpolation")  # the λ protocol ran inside it
            if interpolation:
                result["interpolation"] = lam
        elif interpolation:
            result["interpolation"] = interpolation_protocol(clients, syn_store, space=space, seed=seed)
        if code_domain is not None:
            from types import SimpleNamespace

            from fedhype.eval.domains import code_domain_matrix
            from fedhype.federated.rundir import load_model

            # the run's codes are scored on this partition's held-out split: as for --synthetic, the run must
            # have trained on this partition (its data keys) and on data embedded as --store was
            _, _, run_meta = load_model(code_domain)
            check_provenance(real_store, SimpleNamespace(meta=run_meta), f"real store {real}", f"--code-domain {code_domain}",
                             partition=part)
            result["code_domain"] = code_domain_matrix(
                code_domain, {c.name: part.client_store(real_store, c.id, split) for c in part.clients}, seed=seed)
        result.update(real=str(real), synthetic=str(synthetic),
                      real_train=str(real_train) if real_train is not None else
                      f"{partition}: its train split" if train_store is not None else None,
                      partition=None if partition is None else str(partition),
                      real_split=split if partition is not None else None, synthetic_kind=syn_store.kind,
                      warnings=warnings)
        return result

    run_command(body, json_mode, _render)


def _evaluate_site(site_dir: Path, synthetic: Path, real_train: Path | None, split: str, space: str,
                   permutations: int, max_samples: int, k: int, seed: int) -> dict[str, Any]:
    """``fedhype evaluate --site``: the synthetic store against one site's own held-out split."""
    from fedhype.cli.common import open_site, site_records
    from fedhype.data.store import EmbeddingStore
    from fedhype.eval import evaluate as run_eval
    from fedhype.eval.inputs import check_compatible, one_class_warning

    syn_store = EmbeddingStore.load(synthetic)
    against = f"synthetic store {synthetic}"
    s, own, outsider = open_site(site_dir, syn_store, against, str(synthetic))
    where = f"site {s.name!r} ({site_dir})"
    test_store = site_records(s, own, split, syn_store.class_names, site_dir, against)
    if real_train is None:
        train_store = site_records(s, own, "train", syn_store.class_names, site_dir, against,
                                   instead="give the TRTR reference's records with --real-train")
        check_compatible(train_store, syn_store, f"real train store of {where}", f"synthetic store {synthetic}")
    else:
        train_store = _real_train_store(real_train, syn_store, synthetic)
    from fedhype.eval.inputs import check_not_test_records

    check_not_test_records(test_store, syn_store, f"{where} (its {split} split)", f"--synthetic {synthetic}")
    kind_warning = _kind_warning(synthetic, syn_store)
    one = one_class_warning(test_store)
    if one:
        warn(one)
    console.print(f"evaluating {len(syn_store)} synthetic against {len(test_store)} real embeddings of {where} …",
                  highlight=False)
    result = run_eval(test_store, syn_store, real_train=train_store, space=space, n_permutations=permutations,
                      max_samples=max_samples, k=k, seed=seed)
    _print_metric_warnings(result)
    result.update(real=str(s.store_path), site=s.name, synthetic=str(synthetic),
                  real_train=f"{site_dir}: its train split" if real_train is None else str(real_train), partition=None,
                  real_split=split,
                  synthetic_kind=syn_store.kind, warnings=[w for w in (outsider, one, kind_warning) if w])
    return result


def _print_metric_warnings(result: dict[str, Any]) -> None:
    """The metrics' own warnings (FD on fewer records than dimensions, classes absent from the synthetic store),
    printed in every mode; the JSON keeps them as ``fd_warning`` and ``synthetic_missing_classes``."""
    if result.get("fd_warning"):
        warn(f"FD: {result['fd_warning']}")
    if result.get("synthetic_missing_classes"):
        warn(f"classes absent from the synthetic store: {result['synthetic_missing_classes']}")


def _real_train_store(path: Path, syn_store, synthetic: Path):
    """The --real-train store, refused where it cannot be TRTR's reference: a store that is not real (a probe's
    synthetic store was scored as "train on real"), other classes or dimension, or another embedding than the run's
    (a mean-pooled store against a CLS run scored 1.0).

    Raises:
        ValidationError: not comparable in shape. ArtifactError: not a real store, or another embedding (exit 4).
    """
    from fedhype.data.store import EmbeddingStore
    from fedhype.eval.inputs import check_compatible, check_provenance

    store = EmbeddingStore.load(path)
    if store.kind != "real":
        raise ArtifactError(f"--real-train {path} is a {store.kind!r} store; TRTR trains on real embeddings: give the "
                            "real training records (`fedhype embed`, or leave --real-train out: with --partition "
                            "or --site its train split is used)")
    check_compatible(store, syn_store, f"real train store {path}", f"synthetic store {synthetic}")
    check_provenance(store, syn_store, f"real train store {path}", f"synthetic store {synthetic}")
    return store


def _kind_warning(path, store) -> str | None:
    """The warning (printed, and kept in the result's ``warnings``) for a --synthetic store that is not
    marked synthetic: real records scored as synthetic give perfect-looking, meaningless figures."""
    if store.kind == "synthetic":
        return None
    msg = (f"{path} is marked kind={store.kind!r}, not 'synthetic': its figures score real records as if they were "
           "synthetic (a real store is the reference, --store)")
    warn(msg)
    return msg


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
