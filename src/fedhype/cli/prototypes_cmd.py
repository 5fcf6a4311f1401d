"""``fedhype prototypes``: train and evaluate hyper-prototype (FedHPro) classifiers on embeddings."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from fedhype.cli.choices import HEADS, MATCHINGS, SPLITS, choice
from fedhype.cli.common import (
    JsonOpt, check_out_kind, class_list, console, existing, kv_table, renamed_option, run_command, seed_value, seeded_note, warn)
from fedhype.errors import ArtifactError, ValidationError, counted

sub = typer.Typer(help="Hyper-prototype (FedHPro) classifiers on embeddings: train, evaluate.", no_args_is_help=True)

_METRICS = ("accuracy", "balanced_accuracy", "macro_f1")


@sub.callback(invoke_without_command=True)
def _group(ctx: typer.Context, json_mode: bool = JsonOpt) -> None:
    """The ``prototypes`` group; --json may also come before the subcommand (``prototypes --json train``)."""
    ctx.obj = {**(ctx.obj or {}), "json": json_mode}
    if ctx.invoked_subcommand is None:
        def missing() -> dict[str, Any]:
            raise ValidationError("give a subcommand: train, evaluate or dp-linear (see `fedhype prototypes --help`)")

        run_command(missing, json_mode)


def _json(ctx: typer.Context, json_mode: bool) -> bool:
    """``--json`` given to the subcommand or to the ``prototypes`` group."""
    return json_mode or bool((ctx.obj or {}).get("json"))


def _fmt(v: Any) -> str:
    return "—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def _check_split(split: str) -> str:
    if split not in ("train", "val", "test"):
        raise ValidationError(f"--split must be train, val or test, got {split!r}")
    return split


def _training_store(synthetic: Path | None, data: Path | None) -> Path:
    """The training store of ``prototypes train``: ``--synthetic``, or ``--data`` (its old name, hidden, kept so that
    scripts written for it still run); both at once, or neither, is a usage error."""
    if synthetic is not None and data is not None:
        raise ValidationError(f"--synthetic {synthetic} and --data {data} both name the training store (--data is the "
                              "old name of --synthetic): give only --synthetic")
    if synthetic is None and data is None:
        raise ValidationError("give the training store: --synthetic (from `fedhype synthesize`; a real store from "
                              "`fedhype embed` trains a non-private model)")
    if data is not None:  # as renamed_option's old names say it (a probe: --data alone worked without a word)
        typer.echo("warning: --data is deprecated and will be removed in the next release; use --synthetic", err=True)
    return synthetic if synthetic is not None else data


def _embedding_of(store: Any) -> dict[str, Any] | None:
    """How the data of ``store`` was embedded (:func:`fedhype.eval.inputs.check_provenance` reads it): a synthetic
    store's run's (``meta["embedding"]``), a real store's own (:func:`fedhype.data.sites.encoder_of`)."""
    if store.kind == "synthetic":
        emb = store.meta.get("embedding")
        return dict(emb) if isinstance(emb, dict) else None
    from fedhype.data.sites import encoder_of

    return encoder_of(store)


def _clients(part: Any, store: Any, split: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Partition client id (as the FedHypeVAE engine names them: ``str(id)``) → ``(X, y)`` of ``split``."""
    out = {}
    for c in part.clients:
        s = part.client_store(store, c.id, split)
        if len(s):
            out[str(c.id)] = (s.embeddings, s.labels.numpy())
    return out


@sub.command("train")
def train(
    ctx: typer.Context,
    synthetic: Path | None = typer.Option(None, "--synthetic", help="Training store: the synthetic store of "
                                          "`fedhype synthesize` (the private workflow), or a real one (`fedhype embed`: "
                                          "NOT differentially private). Required.",
                                          callback=existing("training embeddings store",
                                                            "from `fedhype synthesize` or `fedhype embed`")),
    data_old: Path | None = typer.Option(None, "--data", hidden=True, help="The old name of --synthetic (kept working).",
                                     callback=existing("training embeddings store",
                                                       "from `fedhype synthesize` or `fedhype embed`")),
    partition: Path | None = typer.Option(None, "--partition", help="Partition JSON of the real store (a real "
                                          "--synthetic store, --federated, or --matching dp).",
                                          callback=existing("partition file", "create it with `fedhype partition`")),
    federated: bool = typer.Option(False, "--federated", help="FedHPro rounds over the partition's clients of the "
                                   "--synthetic store, which must be real (the result is NOT differentially private)."),
    split: str = typer.Option("train", "--split", help="Partition split the clients train on.", click_type=choice(SPLITS)),
    real: Path | None = renamed_option(None, "--store", "--real", help="Real store of the partition, for --matching dp "
                                       "(the clients' records; default: the --synthetic store when it is real).",
                                       callback=existing("embeddings store", "create it with `fedhype embed`")),
    head: str = typer.Option("both", "--head", help="prototype | linear | both (prediction head).", click_type=choice(HEADS)),
    matching: str = typer.Option("none", "--matching", help="none (default: measured best, see benchmarks/prototypes.py) | "
                                 "synthetic (free on a synthetic store) | dp.", click_type=choice(MATCHINGS)),
    epochs: int = typer.Option(30, "--epochs", help="Alternation epochs (federated: rounds)."),
    local_epochs: int = typer.Option(1, "--local-epochs", help="--federated: client epochs per round."),
    noise_multiplier: float = typer.Option(1.0, "--noise-multiplier", help="--matching dp: σ."),
    clip_norm: float = typer.Option(1.0, "--clip-norm", help="--matching dp: clipping norm C."),
    delta: float | None = typer.Option(None, "--delta", help="--matching dp: δ (default: the --ledger's, else 1e-4, as every command)."),
    max_epsilon: float | None = typer.Option(None, "--max-epsilon", help="--matching dp: refuse (exit 3) above this ε."),
    ledger: Path | None = typer.Option(None, "--ledger", help="--matching dp: the run's ledger.json; the matching events "
                                       "are added to a copy in --out, so the reported ε composes both (the original "
                                       "file is not changed).",
                                       callback=existing("privacy ledger", "the ledger.json of a `fedhype train` run")),
    seed: Optional[int] = typer.Option(None, "--seed", callback=seed_value, help="Seed of initialisation, shuffling and (not secure) DP "
                                       "noise. Default: 0, except with --matching dp: OS entropy (secure noise)."),
    out: Path = typer.Option(..., "--out", help="Model directory to write."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a model already in --out."),
    json_mode: bool = JsonOpt,
) -> None:
    """Train a hyper-prototype classifier (adapter + head + K×L prototypes) and save it to --out."""

    def body() -> dict[str, Any]:
        from fedhype.data.partition import Partition
        from fedhype.data.store import EmbeddingStore
        from fedhype.privacy.ledger import PrivacyLedger
        from fedhype.prototypes import HyperPrototypeClassifier, fit_federated

        _check_split(split)
        data = _training_store(synthetic, data_old)
        if check_out_kind(out, "prototypes train", ("prototypes",)) == "prototypes" and not overwrite:
            raise ValidationError(f"{out} already holds a hyper-prototype model; choose another --out or pass --overwrite")
        if federated and partition is None:
            raise ValidationError("--federated needs --partition (the clients)")
        if matching == "dp" and partition is None:
            raise ValidationError("--matching dp needs --partition (the clients whose records give DP gradients)")
        if matching != "dp" and (real is not None or ledger is not None):
            raise ValidationError("--store and --ledger are only used with --matching dp")
        t0 = time.perf_counter()
        store = EmbeddingStore.load(data)
        part = Partition.load(partition) if partition is not None else None
        run_ledger = PrivacyLedger.load(ledger) if ledger is not None else None
        if run_ledger is not None and delta is not None and run_ledger.delta != delta:
            raise ValidationError(f"--delta {delta:g} differs from the ledger's δ = {run_ledger.delta:g}")
        dlt = delta if delta is not None else (run_ledger.delta if run_ledger is not None else 1e-4)
        clf = HyperPrototypeClassifier(head=head, matching=matching, epochs=epochs, noise_multiplier=noise_multiplier,
                                       clip_norm=clip_norm, delta=dlt, max_epsilon=max_epsilon,
                                       seed=seed if seed is not None else (None if matching == "dp" else 0))
        classes = np.arange(store.n_classes)
        if federated:
            if store.kind == "synthetic":
                raise ArtifactError(f"--federated trains on the clients' real records; --synthetic {data} is a "
                                    "synthetic store: give the real store (`fedhype embed`) and its --partition")
            part.check_store(store)
            clients = _clients(part, store, split)
            console.print(f"FedHPro: {counted(epochs, 'round')} over {counted(len(clients), 'client')} …", highlight=False)
            fit_federated(clf, clients, classes=classes, local_epochs=local_epochs, ledger=run_ledger)
            x_tr = np.concatenate([x.numpy() for x, _ in clients.values()])
            y_tr = np.concatenate([y for _, y in clients.values()])
        else:
            train_store = store
            if part is not None and store.kind != "synthetic":
                part.check_store(store)
                train_store = part.split_store(store, split)
            dp_clients = None
            if matching == "dp":
                real_store = EmbeddingStore.load(real) if real is not None else store
                if real_store.kind == "synthetic":
                    if real is None:
                        raise ValidationError("--matching dp needs the clients' real store: pass --store")
                    raise ArtifactError(f"--store {real} is a synthetic store; --matching dp needs the clients' real "
                                        "store (`fedhype embed`)")
                part.check_store(real_store)
                if real_store.dim != store.dim or real_store.class_names != store.class_names:
                    raise ValidationError(f"--store {real} and --synthetic {data} differ in dimension or class names")
                dp_clients = _clients(part, real_store, split)
            console.print(f"training on {len(train_store)} embeddings ({store.kind}) …", highlight=False)
            x_tr, y_tr = train_store.embeddings.numpy(), train_store.labels.numpy()
            clf.fit(x_tr, y_tr, classes=classes, dp_clients=dp_clients, ledger=run_ledger)
        private = (not federated and store.kind == "synthetic" and bool(store.meta.get("private", False)))
        # which real records trained it (the store's digest and the partition split, or all of it): evaluate
        # warns when it scores the model on any of them
        trained_on = None if store.kind != "real" else {
            "store_digest": store.digest(), "records": "all" if part is None else split}
        meta = {"class_names": store.class_names, "data": str(data), "data_kind": store.kind, "trained_on": trained_on,
                "data_epsilon": store.meta.get("epsilon"), "data_private": store.meta.get("private"),
                "encoder": store.meta.get("encoder"), "partition": None if partition is None else str(partition),
                "split": split, "federated": federated, "private": private,
                # a synthetic store's run's partition keys: evaluate refuses another partition's held-out split
                "data_keys": list(store.meta.get("data_keys") or []) if store.kind == "synthetic" else [],
                # how its data was embedded and which clients (sites) its run had: `evaluate --site` checks a site
                # against them (check_provenance, as `fedhype evaluate --site` checks a synthetic store)
                "embedding": _embedding_of(store),
                "client_names": list(store.meta.get("client_names") or []) if store.kind == "synthetic" else []}
        clf.save(out, meta)
        composed = ledger is not None and matching == "dp"
        # the model's ε: the DP matching's (composed with the run's ledger or alone); without it the data's —
        # a DP synthetic store's ε, and none (null: no DP guarantee) for real records or a non-private store
        eps = None if not private else clf.privacy_.get("epsilon") if matching == "dp" else store.meta.get("epsilon")
        if not private:
            warn("this classifier was trained on real records (or a non-private store): it is NOT differentially "
                 "private", "note")
        return {"model": str(out), "n_train": int(len(y_tr)), "n_clients": len(part.clients) if part else None,
                "federated": federated, "matching": matching, "head": head, "epochs": epochs,
                "classes": store.class_names, "private": private, "data_epsilon": store.meta.get("epsilon"),
                "epsilon": eps, "epsilon_composed_with_run": composed, "epsilon_scope": (
                    "none: trained on real records or a non-private store, NOT differentially private" if not private else
                    "the training run's ledger and the DP matching, composed by the accountant" if composed else
                    "the DP matching alone (add --ledger to compose it with the run that made the data)"
                    if matching == "dp" else "no client records touched here; the data's own ε (data_epsilon)"),
                # δ beside ε: the DP matching's, else the synthetic store's own (its metadata); None where unknown
                "delta": clf.privacy_.get("delta") if matching == "dp" else
                store.meta.get("delta") if private else None, "privacy": clf.privacy_,
                "train_accuracy": float((clf.predict(x_tr) == y_tr).mean()), "seconds": time.perf_counter() - t0}

    run_command(body, _json(ctx, json_mode), lambda r: Console().print(kv_table("hyper-prototype classifier", {
        k: v for k, v in r.items() if not isinstance(v, (dict, list)) and not (k == "delta" and v is None)})))


def _metrics_by(groups: np.ndarray, names: list[str], y: np.ndarray, pred: np.ndarray) -> dict[str, dict]:
    from fedhype.eval.utility import classification_metrics

    return {names[g]: {"n": int((groups == g).sum()), **classification_metrics(y[groups == g], pred[groups == g])}
            for g in sorted(set(groups.tolist()))}


def _render_eval(r: dict[str, Any]) -> None:
    out = Console()
    where = f" of site {r['site']!r} ({r['split']} split)" if r.get("site") else ""
    t = Table(title=f"hyper-prototype classifier on {r['n']} real embeddings{where} (head {r['head']})")
    for col in ("", *_METRICS):
        t.add_column(col, justify="left" if col == "" else "right")
    t.add_row("pooled" if not r.get("site") else f"site {r['site']}", *[_fmt(r[m]) for m in _METRICS])
    for title in ("per_client", "per_domain"):
        for name, row in (r.get(title) or {}).items():
            if title == "per_client" and name == r.get("site"):
                continue  # the site's own row is the pooled one
            t.add_row(f"{title[4:]} {name} (n={row['n']})", *[_fmt(row[m]) for m in _METRICS])
    out.print(t)
    out.print("accuracy by head: " + ", ".join(f"{h} {_fmt(a)}" for h, a in r["heads"].items()))


@sub.command("evaluate")
def evaluate(
    ctx: typer.Context,
    model: Path = typer.Option(..., "--model", help="Model directory from `fedhype prototypes train`.",
                               callback=existing("hyper-prototype model directory",
                                                 "train one with `fedhype prototypes train`", kind="dir")),
    real: Path | None = renamed_option(None, "--store", "--real", help="Real store (held-out test set; the full store "
                                       "with --partition).",
                                       callback=existing("embeddings store", "create it with `fedhype embed`")),
    sites: list[Path] | None = typer.Option(None, "--site", help="A site folder (from `fedhype site`; or a site.json, "
                                            "e.g. the previous split an --overwrite kept) instead of --store and "
                                            "--partition: the model is scored on the site's own --split (default "
                                            "test), labels matched to the model's classes by name. One site per "
                                            "command.",
                                            callback=existing("site folder", "write it with `fedhype site`", kind="any")),
    partition: Path | None = typer.Option(None, "--partition", help="Partition JSON; --store is split by it.",
                                          callback=existing("partition file", "create it with `fedhype partition`")),
    split: str = typer.Option("test", "--split", help="With --partition or --site: the split to evaluate on.",
                              click_type=choice(SPLITS)),
    json_mode: bool = JsonOpt,
) -> None:
    """Accuracy, balanced accuracy and macro-F1 on real embeddings, pooled and per client / domain.

    The real held-out data: --store (with --partition, its --split), or --site (one site's own split).
    """

    def body() -> dict[str, Any]:
        from types import SimpleNamespace

        from fedhype.data.partition import Partition
        from fedhype.data.store import EmbeddingStore
        from fedhype.eval.inputs import check_provenance
        from fedhype.eval.utility import classification_metrics
        from fedhype.prototypes import HyperPrototypeClassifier
        from fedhype.prototypes.persistence import CONFIG

        _check_split(split)
        if sites and len(sites) > 1:
            raise ValidationError(f"--site given {len(sites)} times: evaluate one site per command (each on its own "
                                  "held-out split)")
        site = sites[0] if sites else None
        if site is not None and (real is not None or partition is not None):
            raise ValidationError("--site scores the model on one site's own splits; --store and --partition score a "
                                  "pooled store: give --site, or --store (with --partition)")
        if site is None and real is None:
            raise ValidationError("give the real held-out data: --store (with --partition to split it), or --site "
                                  "(a site folder from `fedhype site`)")
        if not (model / CONFIG).exists():
            raise ValidationError(f"--model {model} holds no {CONFIG}: not a `fedhype prototypes train` model directory")
        clf = HyperPrototypeClassifier.load(model)
        names = clf.meta_.get("class_names")
        # the model as `check_provenance` / `check_compatible` read a synthetic store: its run's data keys, client
        # names and embedding, its dimension and classes
        against = SimpleNamespace(meta=dict(clf.meta_ or {}), dim=clf.n_features_in_, class_names=names)
        per_client, part, outsider, s = None, None, None, None
        if site is not None:
            from fedhype.cli.common import open_site, site_records

            what = f"--model {model}"
            s, store, outsider = open_site(site, against, what, f"the synthetic store that trained {what}")
            test = site_records(s, store, split, list(names) if names is not None else store.class_names, site, what,
                                minimum=1)  # accuracy needs one record
            if names is None and test.n_classes > len(clf.classes_):
                raise ValidationError(f"site {s.name!r} ({site}) has {test.n_classes} classes, the model "
                                      f"{len(clf.classes_)}")
        else:
            store = EmbeddingStore.load(real)
            if store.dim != clf.n_features_in_:
                raise ValidationError(f"--store {real} has D={store.dim}, the model was trained on D={clf.n_features_in_} "
                                      "(use embeddings from the same encoder)")
            if names is not None and list(names) != store.class_names:
                raise ValidationError(f"--store {real} has classes {store.class_names}, the model {names}")
            check_provenance(store, against, f"--store {real}", f"--model {model}")  # the embedding (keys: below)
            if partition is not None:
                part = Partition.load(partition)
                part.check_store(store)
                keys = (clf.meta_ or {}).get("data_keys") or []
                why = part.key_mismatch(keys)  # as `fedhype evaluate` (a probe: it scored silently)
                if why:
                    raise ArtifactError(f"{why} (the run whose synthetic store trained --model {model}): its {split} "
                                        "split may hold that run's training records; pass the partition the run "
                                        "trained on")
                test = part.split_store(store, split)
            else:
                test = store
        warnings = [outsider] if outsider else []
        seen = (clf.meta_ or {}).get("trained_on")
        if isinstance(seen, dict) and seen.get("store_digest") == store.digest():
            desc = "all of them" if seen.get("records") == "all" else f"its {seen.get('records')} split"
            if s is not None:  # the site's split is not the partition the model trained on: they may overlap
                desc = "all of them" if seen.get("records") == "all" else f"the {seen.get('records')} split of a partition"
                warnings.append(f"the model was trained on real records of site {s.name!r}'s store ({desc}) and the "
                                f"site's {split} split may include them: these figures may not be held-out accuracy")
                warn(warnings[-1])
            elif seen.get("records") == "all" or partition is None or seen.get("records") == split:
                warnings.append(f"the model was trained on real records of this store ({desc}) and the records "
                                "evaluated here include them: these figures are not held-out accuracy")
                warn(warnings[-1])
        x, y = test.embeddings, test.labels.numpy()
        probs = {h: clf.predict_proba(x, head=h) for h in ("linear", "prototype", "both")}
        preds = {h: clf.classes_[p.argmax(1)] for h, p in probs.items()}
        pred = preds[clf.head]
        if part is not None:
            per_client = _metrics_by(part.client_ids(split), [c.name for c in part.clients], y, pred)
        elif s is not None:
            per_client = {s.name: {"n": len(test), **classification_metrics(y, pred)}}
        return {"model": str(model), "store": str(real) if s is None else str(s.store_path),
                "site": None if s is None else s.name, "site_dir": None if s is None else str(site),
                "partition": None if partition is None else str(partition),
                "split": split if part is not None or s is not None else None, "n": len(test), "head": clf.head,
                **classification_metrics(y, pred), "heads": {h: float((p == y).mean()) for h, p in preds.items()},
                "per_domain": _metrics_by(test.domains.numpy(), test.domain_names, y, pred),
                "per_client": per_client, "privacy": clf.privacy_, "model_meta": clf.meta_, "warnings": warnings}

    run_command(body, _json(ctx, json_mode), _render_eval)


@sub.command("dp-linear")
def dp_linear(
    ctx: typer.Context,
    real: Optional[Path] = renamed_option(None, "--store", "--real", help="Real embeddings store of the partition "
                                          "(with --partition).",
                                          callback=existing("embeddings store", "create it with `fedhype embed`")),
    partition: Optional[Path] = typer.Option(None, "--partition", help="Partition JSON: clients train on their train "
                                             "split, the test split is the held-out evaluation set.",
                                             callback=existing("partition file", "create it with `fedhype partition`")),
    site: Optional[list[Path]] = typer.Option(None, "--site", help="A site folder (from `fedhype site`), once per "
                                              "site, instead of --store/--partition: each site is one client "
                                              "training on its own train split, the sites' test splits are the "
                                              "held-out set, and each site's ledger across runs (site-ledger.json) "
                                              "is charged the run's ε on its records; a site whose cap the plan "
                                              "would pass, or a seeded run on a capped site, is refused (exit 3) "
                                              "before anything runs.",
                                              callback=existing("site folder", "write it with `fedhype site`", kind="dir")),
    classes: Optional[str] = typer.Option(None, "--classes", help="With --site: the federation's class names, "
                                          "comma-separated, in label order (default: the sorted union of the sites' "
                                          "classes)."),
    epsilon: Optional[float] = typer.Option(1.0, "--epsilon", help="Target ε (σ calibrated for the whole plan)."),
    delta: float = typer.Option(1e-4, "--delta", help="δ (must be < 1/n for every client)."),
    noise_multiplier: Optional[float] = typer.Option(None, "--noise-multiplier", help="Set σ directly (overrides --epsilon)."),
    no_dp: bool = typer.Option(False, "--no-dp", help="Explicitly NON-PRIVATE (no clipping, no noise)."),
    rounds: int = typer.Option(10, "--rounds", help="FedAvg rounds."),
    local_epochs: float = typer.Option(1.0, "--local-epochs", help="Local epochs per round (K_i = ceil(E·n_i/B))."),
    batch_size: int = typer.Option(64, "--batch-size", help="Expected Poisson batch size B (q_i = B/n_i)."),
    lr: float = renamed_option(1.0, "--lr-local", "--lr", help="Local SGD learning rate (the clients' step size, "
                               "as `fedhype train --lr-local`)."),
    clip_norm: float = typer.Option(1.0, "--clip-norm", help="Per-example clipping norm C."),
    max_epsilon: Optional[float] = typer.Option(None, "--max-epsilon", help="Refuse (exit 3) a plan above this ε."),
    seed: Optional[int] = typer.Option(None, "--seed", callback=seed_value, help="Reproducible sampling and noise (not secure; with --site "
                                       "ε = ∞ in each site's ledger, refused on a capped site)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for the model and its ledger.json."),
    json_mode: bool = JsonOpt,
) -> None:
    """DP-SGD FedAvg logistic regression on the clients' REAL embeddings: the downstream reference.

    A separate DP release (its own ε, in its own ledger), evaluated on the held-out real test split.

    Clients: a partition of a pooled store (--store, --partition), or sites (--site, once per site).
    """

    def body() -> dict[str, Any]:
        from fedhype.cli.train_cmd import _sites
        from fedhype.data.partition import Partition
        from fedhype.data.store import EmbeddingStore
        from fedhype.prototypes.dp_linear import DPLinearConfig, dp_linear_downstream

        if out is not None and (out / "model.safetensors").exists():
            raise ValidationError(f"{out} already holds a model; choose another --out")
        sites = _sites(real, partition, site, classes)  # one of --site and --store/--partition (exit 2)
        if sites is not None and out is not None:  # the sites are charged before the model is written: check now
            check_out_kind(out, "prototypes dp-linear", ())
            _check_writable_parent(out)
        elif out is not None:  # a helper's model (its own ε, not in the release's privacy.json) went into a release
            from fedhype.cli.common import refuse_inside_release

            refuse_inside_release(out, "--out")
        cfg = DPLinearConfig(rounds=rounds, local_epochs=local_epochs, batch_size=batch_size, lr=lr, clip_norm=clip_norm,
                             epsilon=None if (noise_multiplier is not None or no_dp) else epsilon, delta=delta,
                             noise_multiplier=noise_multiplier, no_dp=no_dp, max_epsilon=max_epsilon, seed=seed)
        if sites is not None:
            from fedhype.prototypes.dp_linear_sites import dp_linear_sites

            vocab = class_list(classes)
            # said once every site accepted the plan (a refused plan prints only its refusal)
            r = dp_linear_sites(sites, cfg, out=out, classes=vocab, on_accepted=lambda: console.print(
                f"DP FedAvg linear classifier: {counted(rounds, 'round')} over {len(sites)} site{'s' if len(sites) != 1 else ''} "
                "(the plan fits every site's ledger) …", highlight=False))
        else:
            store = EmbeddingStore.load(real)
            if store.kind == "synthetic":
                raise ArtifactError(f"--store {real} is a synthetic store; this reference trains on real records")
            console.print(f"DP FedAvg linear classifier: planning {counted(rounds, 'round')} …", highlight=False)
            r = dp_linear_downstream(store, Partition.load(partition), cfg, out=out)
        r["seeded"] = seed is not None
        if seed is not None and not no_dp:
            warn(seeded_note(sites is not None), "note")
        return r

    def render(r: dict[str, Any]) -> None:
        where = f" of sites {', '.join(r['sites'])}" if r.get("sites") else ""
        t = Table(title=f"DP FedAvg linear classifier on {r['n_test']} held-out real embeddings{where}")
        for col in ("", *_METRICS):
            t.add_column(col, justify="left" if col == "" else "right")
        t.add_row("pooled", *[_fmt(r[m]) for m in _METRICS])
        for title in ("per_client", "per_domain"):
            for name, row in r[title].items():
                t.add_row(f"{'site' if r.get('sites') and title == 'per_client' else title[4:]} {name} "
                          f"(n={row['n']})", *[_fmt(row[m]) for m in _METRICS])
        Console().print(t)
        console.print(f"ε = {_fmt(r['epsilon'])} at δ = {r['delta']} (PRV, worst client"
                      + ("; seeded noise: only while the seed stays secret, see the note above)" if r.get("seeded")
                         else ")") if r["private"] else "[bold yellow]NON-PRIVATE (--no-dp)[/]", highlight=False)
        for name, led in (r.get("site_ledgers") or {}).items():
            eps = "∞" if led["epsilon_infinite"] else _fmt(led["epsilon"])
            cap = "no cap" if led["max_epsilon"] is None else f"cap {_fmt(led['max_epsilon'])}"
            console.print(f"site {name}: ε = {eps} at δ = {led['delta']:g} over all its runs ({cap}; {led['ledger']})",
                          highlight=False)

    run_command(body, _json(ctx, json_mode), render)


def _check_writable_parent(out: Path) -> None:
    """Refuse an ``--out`` folder that cannot be written (checked in its nearest existing folder; nothing is made)."""
    from fedhype.cli.common import refuse_inside_release
    from fedhype.io import check_writable_folder

    check_writable_folder(out, "nothing was run or charged")
    refuse_inside_release(out, "--out")


def register(app: typer.Typer) -> None:
    app.add_typer(sub, name="prototypes")
