"""Downstream value per client (issue #16): does the shared DP synthetic store help each client's own classifier?

One command, both datasets: the bundled digits job (4 natural-domain clients, the main job's defaults)
and ``configs/fashion-mnist.toml`` (10,000 images, 10 Dirichlet α = 0.3 clients, which lack classes),
at ε = 1, 4, 8 and without DP, 3 seeds (partition seed = train seed = synthesis seed = seed). Each
(dataset, ε, seed) trains once with the job defaults (method ``fedhypevae``, synthesis code
``mixture``; 300 synthetic per class at every ε, :data:`PER_CLASS`, where the job draws 3,000 without DP) through the library (:func:`fedhype.federated.engine.train` and
:func:`fedhype.synthesis.synthesize`; embeddings float32 from the cache), then runs every
downstream row on that synthetic store:

* linear probes (:func:`fedhype.eval.client_downstream.client_downstream`): local-only,
  synthetic-only, local + synthetic (sample weights chosen per client on its validation split), the
  predecessor's λ-interpolation;
* the client's own adapter network with anchors from the synthetic store
  (:func:`fedhype.prototypes.anchored.anchored_downstream`): alone, synthetic-initialised,
  hyper-prototype anchors (FedHPro objective), gradient-matched hyper-prototypes, FedProto class
  means, and the ``+synthetic`` variants that also train on the synthetic store;
* the DP-SGD FedAvg linear classifier on the clients' real records
  (:func:`fedhype.prototypes.dp_linear.dp_linear_downstream`, the job's settings; its own ε, a
  separate release: the same model for every client).

Every row is scored on the client's own test split and on the union of all clients' test splits
(mean over clients, then mean ± std over seeds); the choices (real share r, λ, and the default
anchors of :func:`fedhype.prototypes.anchored.anchored_classifier`) are made on validation splits,
shown in their own table. Figures on held-out real records are for the data holder: not DP.

Each finished (dataset, ε, seed) is appended to ``runs/bench-downstream/rows.jsonl``; a rerun skips
the rows already there (``--fresh`` ignores them). Writes ``benchmarks/results/downstream.{json,md}``
and prints the tables; ``--readme`` replaces the block between the ``downstream`` markers in README.md.

    .venv/bin/python benchmarks/downstream.py --readme            # both datasets, full grid (~1.5 h on 2 cores)
    .venv/bin/python benchmarks/downstream.py --datasets digits --epsilons 4 --seeds 0   # a slice (results under runs/)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics as st
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATASETS = {"digits": None, "fashion": ROOT / "configs" / "fashion-mnist.toml"}
DESCRIPTION = {"digits": "bundled digits domains, 4 natural-domain clients",
               "fashion": "configs/fashion-mnist.toml, 10,000 images, 10 Dirichlet α = 0.3 clients"}
EPSILONS = ("1", "4", "8", "none")
SEEDS = (0, 1, 2)
#: synthetic embeddings per class in the store each client receives, at every ε: the DP job default (the no-DP
#: default, 3,000 from the full-rank model, would make each no-DP row's networks train on 10× the records:
#: over 20 min a row on this machine)
PER_CLASS = 300
PROBE_ROWS = {"local_only": "local-only", "synthetic_only": "synthetic-only", "local_synthetic": "local + synthetic",
              "interpolation": "λ-interpolation"}


def missing_label(dataset: str, eps: str) -> str:
    """How the header names a (dataset, ε) cell left out of the tables (``--recorded-only``)."""
    return f"{dataset} {'no DP' if eps == 'none' else f'ε = {eps}'}"


def key(dataset: str, eps: str, seed: int) -> str:
    return json.dumps([dataset, eps, seed])


def load_data(dataset: str):
    """The dataset's real store (float32 embeddings from the cache) and resolved job configuration."""
    from fedhype.encoders.cache import cached_embed
    from fedhype.pipeline.config import resolve

    conf = resolve(DATASETS[dataset], [])
    d = conf["data"]
    # dtype None: float32 on CPU, the embeddings every benchmark of the project was measured on
    store = cached_embed(d["dataset"], d["encoder"], limit=d["limit"] or None, seed=d["seed"],
                         image_size=d["image_size"] or None, progress=False)
    return store, conf


def run_row(dataset: str, store, eps: str, seed: int) -> dict:
    """Train one model, synthesise, and run every downstream row on it."""
    from fedhype.data.partition import make_partition
    from fedhype.eval.client_downstream import client_downstream
    from fedhype.eval.interpolation import ClientSplits
    from fedhype.federated.engine import train
    from fedhype.pipeline.config import resolve, train_config
    from fedhype.pipeline.job import dp_linear_config
    from fedhype.prototypes.anchored import anchored_downstream
    from fedhype.prototypes.dp_linear import dp_linear_downstream
    from fedhype.synthesis import synthesize

    t0 = time.perf_counter()
    sets = [f"train.seed={seed}", f"partition.seed={seed}", f"synthesis.seed={seed}"] + (
        ["train.epsilon=none", "train.no_dp=true"] if eps == "none" else [f"train.epsilon={float(eps)}"])
    conf = resolve(DATASETS[dataset], sets)
    p, s = conf["partition"], conf["synthesis"]
    part = make_partition(store, scheme=p["scheme"], n_clients=p["clients"] or None, alpha=p["alpha"],
                          splits=tuple(p["fractions"]), min_train_per_client=p["min_records"], seed=p["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        trained = train(store, part, train_config(conf), Path(tmp) / "run", diagnostics=False)
        syn = synthesize(Path(tmp) / "run", s["code"], per_class=PER_CLASS, seed=s["seed"],
                         temperature=s["temperature"])
    t_train = time.perf_counter() - t0
    clients = {c.name: ClientSplits(*(part.client_store(store, c.id, sp) for sp in ("train", "val", "test")))
               for c in part.clients}
    t = time.perf_counter()
    probe = client_downstream(clients, syn, seed=seed)
    probe.pop("interpolation")  # its per-client results are in probe["clients"]
    t_probe = time.perf_counter() - t
    t = time.perf_counter()
    anchored = anchored_downstream(clients, syn, seed=seed)
    t_anchored = time.perf_counter() - t
    dpl = dp_linear_downstream(store, part, dp_linear_config(conf))
    metrics = ("accuracy", "balanced_accuracy", "macro_f1")
    return {"key": key(dataset, eps, seed), "dataset": dataset, "eps": eps, "seed": seed,
            "generator_epsilon": trained["epsilon"], "code": s["code"], "n_synthetic": len(syn),
            "probe": probe, "anchored": anchored,
            "dp_linear": {"epsilon": dpl["epsilon"], "union": {m: dpl[m] for m in metrics},
                          "own": {n: {m: r[m] for m in metrics} for n, r in dpl["per_client"].items()}},
            "seconds": {"train": t_train, "probe": t_probe, "anchored": t_anchored,
                        "total": time.perf_counter() - t0}}


# ---------------------------------------------------------------------------- tables
def seed_means(r: dict) -> dict[str, dict[str, float | None]]:
    """One full (dataset, ε, seed) row → {row name: {"own", "union"[, "val", "union_val"]}}: accuracy, mean over clients."""
    out: dict[str, dict] = {}
    pm = r["probe"]["mean"]
    for row in PROBE_ROWS:
        out[row] = {"own": pm["own"][row]["accuracy"], "union": pm["union"][row]["accuracy"]}
    for v, m in r["anchored"]["mean"].items():
        out[v] = {w: m[w]["accuracy"] for w in ("own", "union", "val", "union_val")}
    own = r["dp_linear"]["own"]
    out["dp_linear"] = {"own": st.fmean(c["accuracy"] for c in own.values()), "union": r["dp_linear"]["union"]["accuracy"]}
    return out


def compact(r: dict) -> dict:
    """What ``downstream.json`` keeps of a full row, all the tables need: the client means, and per client the
    accuracy of every row on its own test split and on the union, its chosen r and λ, and the classes it lacks."""
    per = {}
    for n, c in r["probe"]["clients"].items():
        a = r["anchored"]["clients"][n]
        per[n] = {"n_train": c["n_train"], "missing_classes": c["missing_classes"], "real_share": c["real_share"],
                  "lambda": c["lambda"],
                  **{w: {**{row: c[w][row]["accuracy"] for row in PROBE_ROWS}, **{v: a[v][w]["accuracy"] for v in a},
                         "dp_linear": r["dp_linear"]["union"]["accuracy"] if w == "union" else
                         r["dp_linear"]["own"].get(n, {}).get("accuracy")} for w in ("own", "union")}}
    return {k: r[k] for k in ("dataset", "eps", "seed", "generator_epsilon", "seconds")} | {
        "dp_linear_epsilon": r["dp_linear"]["epsilon"], "variants": list(r["anchored"]["variants"]),
        "means": seed_means(r), "clients": per}


def _cell(vals: list[float], digits: int = 3, sign: str = "") -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "–"
    mu = f"{st.fmean(vals):{sign}.{digits}f}"
    return f"{mu} ± {st.stdev(vals):.{digits}f}" if len(vals) > 1 else mu


def _eps_label(e: str) -> str:
    return "no DP" if e == "none" else e


def _sorted_eps(rows: list[dict]) -> list[str]:
    return sorted({r["eps"] for r in rows}, key=lambda e: float("inf") if e == "none" else float(e))


def gain(r: dict, where: str) -> float:
    """Mean over the clients of a (compact) row of local + synthetic − local-only accuracy on ``where``."""
    return st.fmean(c[where]["local_synthetic"] - c[where]["local_only"] for c in r["clients"].values())


def _table(rows: list[dict], names: dict[str, str], where: tuple[str, str], extra_dp: bool = False) -> list[str]:
    """One line per ε: mean ± std over seeds of the clients' mean accuracy, ``where[0]`` / ``where[1]`` per cell."""
    head = "| ε (generator's) | " + " | ".join(names.values()) + (" | DP-SGD linear (its own ε) |" if extra_dp else " |")
    lines = [head, "|---|" + "---|" * (len(names) + extra_dp)]
    for e in _sorted_eps(rows):
        rs = [r for r in rows if r["eps"] == e]
        cells = [" / ".join(_cell([r["means"][n].get(w) for r in rs]) for w in where) for n in names]
        if extra_dp:
            de = [r["dp_linear_epsilon"] for r in rs if r["dp_linear_epsilon"] is not None]
            cells.append(" / ".join(_cell([r["means"]["dp_linear"][w] for r in rs]) for w in where)
                         + (f" (ε = {st.fmean(de):.2f})" if de else " (no DP)"))
        gen = [r["generator_epsilon"] for r in rs if r["generator_epsilon"] is not None]
        label = _eps_label(e) + (f" ({st.fmean(gen):.2f})" if gen else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _gain_lines(rows: list[dict]) -> list[str]:
    lines = ["| ε | union: local + synthetic − local-only | clients gaining (all seeds) | own test: local + synthetic − "
             "local-only | r chosen (unweighted / 0.5 / 0.75 / 0.9) |", "|---|---|---|---|---|"]
    for e in _sorted_eps(rows):
        rs = [r for r in rows if r["eps"] == e]
        cl = [c for r in rs for c in r["clients"].values()]
        up = sum(c["union"]["local_synthetic"] > c["union"]["local_only"] for c in cl)
        shares = [c["real_share"] for c in cl]
        counts = " / ".join(str(shares.count(x)) for x in (None, 0.5, 0.75, 0.9))
        lines.append(f"| {_eps_label(e)} | {_cell([gain(r, 'union') for r in rs], sign='+')} | {up} of {len(cl)} | "
                     f"{_cell([gain(r, 'own') for r in rs], sign='+')} | {counts} |")
    return lines


def _client_lines(rows: list[dict]) -> list[str]:
    """Per client (mean over seeds): union accuracy local-only → local + synthetic, and its own test split."""
    names = list(dict.fromkeys(n for r in rows for n in r["clients"]))
    lines = ["| ε | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for e in _sorted_eps(rows):
        rs = [r for r in rows if r["eps"] == e]
        cells = []
        for n in names:
            cs = [r["clients"][n] for r in rs if n in r["clients"]]
            f = {(w, row): st.fmean(c[w][row] for c in cs) for w in ("union", "own") for row in ("local_only", "local_synthetic")}
            cells.append(f"{f['union', 'local_only']:.2f} → {f['union', 'local_synthetic']:.2f} "
                         f"({f['own', 'local_only']:.2f} → {f['own', 'local_synthetic']:.2f})")
        lines.append(f"| {_eps_label(e)} | " + " | ".join(cells) + " |")
    return lines


def verdicts(rows: list[dict]) -> list[str]:
    """The targets of issue #16 item 2, as measured (mean over seeds of the average client's union gain)."""
    out = []
    for dataset, eps_set, what in (("fashion", ("1",), "Fashion-MNIST"), ("digits", ("4", "8"), "digits")):
        for e in eps_set:
            rs = [r for r in rows if r["dataset"] == dataset and r["eps"] == e]
            if not rs:
                continue
            g, go = st.fmean(gain(r, "union") for r in rs), st.fmean(gain(r, "own") for r in rs)
            out.append(f"- {what} at ε = {e} ({len(rs)} seed{'s' if len(rs) > 1 else ''}): local + synthetic against local-only on the union test "
                       f"set {g:+.3f} for the average client ({'target met' if g > 0 else 'target NOT met'}); on the "
                       f"clients' own test splits {go:+.3f}.")
    return out


def anchored_names(rows: list[dict]) -> dict[str, str]:
    variants = list(dict.fromkeys(v for r in rows for v in r["variants"]))
    return {v: v.replace("_", " ") for v in variants}


def best_anchored(rows: list[dict], where: str) -> str | None:
    """The anchored variant with the best mean accuracy on ``where`` (a validation key) over ``rows``."""
    names = anchored_names(rows)
    if not names or not rows:
        return None
    return max(names, key=lambda v: st.fmean(r["means"][v][where] for r in rows))


def markdown(rows: list[dict], header: str) -> str:
    """The results markdown (compact rows); it starts with the README block, which ends at the ``## Details`` line."""
    head, details = [header, ""], ["## Details", ""]
    for dataset in [d for d in DATASETS if any(r["dataset"] == d for r in rows)]:
        rs = [r for r in rows if r["dataset"] == dataset]
        names = anchored_names(rs)
        best = {w: best_anchored(rs, w) for w in ("val", "union_val")}
        shown = {v: names[v] for v in dict.fromkeys(["alone", best["val"], best["union_val"]]) if v in names}
        head += [f"**{DESCRIPTION[dataset]}** — linear probes, accuracy on the client's own test split / on the union "
                 "of all clients' test splits (mean over clients; mean ± std over seeds):", "",
                 *_table(rs, PROBE_ROWS, ("own", "union"), extra_dp=True), "",
                 f"The client's own adapter network with anchors from the synthetic store (`fedhype.prototypes.anchored`; "
                 f"test own / union; the client alone, and the variants best on the validation splits: "
                 f"{names.get(best['val'])} on the clients' own, {names.get(best['union_val'])} on their union; every "
                 "variant under Details):", "",
                 *_table(rs, shown, ("own", "union")), ""]
        details += [f"### {dataset}", "", "Local + synthetic against local-only, and the real share r each client chose "
                    "on its validation split (all seeds):", "", *_gain_lines(rs), "",
                    "Per client, union test accuracy local-only → local + synthetic (own test split in brackets), mean "
                    "over seeds:", "", *_client_lines(rs), "",
                    "Every anchored variant, test accuracy own / union:", "", *_table(rs, names, ("own", "union")), "",
                    "The same on the **validation** splits (own / union of the clients' validation splits), the table "
                    "the defaults follow:", "", *_table(rs, names, ("val", "union_val")), ""]
    v = verdicts(rows)
    if v:
        head += ["Targets of issue #16 (item 2):", "", *v, ""]
    return "\n".join(head + details)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    ap.add_argument("--epsilons", nargs="+", default=list(EPSILONS), help="target ε values, or none (no DP)")
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-downstream"), help="folder of rows.jsonl")
    ap.add_argument("--fresh", action="store_true", help="ignore the rows recorded in <out>/rows.jsonl")
    ap.add_argument("--recorded-only", action="store_true", help="train nothing: tabulate the rows already in "
                    "<out>/rows.jsonl (a missing cell is left out of the tables, and the header says how many rows)")
    ap.add_argument("--readme", action="store_true", help="replace the downstream block of README.md (full grid only)")
    ap.add_argument("--results", default=None, help="folder for downstream.json / .md (default benchmarks/results for "
                    "the full grid, <out>/results for a slice)")
    a = ap.parse_args()
    for e in a.epsilons:
        try:
            ok = e == "none" or 0 < float(e) < float("inf")
        except ValueError:
            ok = False
        if not ok:
            ap.error(f"--epsilons {e!r}: give finite positive numbers or none")
    full = sorted(a.datasets) == sorted(DATASETS) and a.epsilons == list(EPSILONS) and sorted(a.seeds) == list(SEEDS)
    if a.readme and not full:
        ap.error("--readme needs the full grid (both datasets, ε = 1 4 8 none, seeds 0 1 2)")
    results = Path(a.results or (ROOT / "benchmarks" / "results" if full else Path(a.out) / "results"))

    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    log = Path(a.out) / "rows.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if log.exists() and not a.fresh:
        for line in log.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[r["key"]] = r
    t0, ran = time.perf_counter(), 0
    for dataset in a.datasets:
        todo = [(e, s) for e in a.epsilons for s in a.seeds if key(dataset, e, s) not in done]
        if not todo or a.recorded_only:
            continue
        store, _ = load_data(dataset)
        for e, s in todo:
            r = run_row(dataset, store, e, s)
            with log.open("a") as f:
                f.write(json.dumps(r) + "\n")
            done[r["key"]] = r
            ran += 1
            m = seed_means(r)
            print(f"[{time.perf_counter() - t0:.0f} s] {dataset} ε={e} seed {s}: union local-only "
                  f"{m['local_only']['union']:.3f} → local + synthetic {m['local_synthetic']['union']:.3f}; own "
                  f"{m['local_only']['own']:.3f} → {m['local_synthetic']['own']:.3f} ({r['seconds']['total']:.0f} s)",
                  flush=True)
    rows = [compact(done[key(d, e, s)]) for d in a.datasets for e in a.epsilons for s in a.seeds if key(d, e, s) in done]
    missing = [missing_label(d, e) for d in a.datasets for e in a.epsilons
               if not all(key(d, e, s) in done for s in a.seeds)]
    header = (f"_{time.strftime('%Y-%m-%d')}, {platform.machine()} CPU ({os.cpu_count()} cores, 1 thread); "
              f"`benchmarks/downstream.py`{'' if full else ' ' + ' '.join(sys.argv[1:])}; {len(rows)} trained models, "
              f"{sum(r['seconds']['total'] for r in rows) / 60:.0f} min for them in all (training and every row; "
              f"recorded in {log.relative_to(ROOT) if log.is_relative_to(ROOT) else log}); job defaults (fedhypevae, code mixture, "
              "300 synthetic per class at every ε, the no-DP model full rank); partition seed = train seed = seed; choices on validation splits, figures on "
              "held-out test splits (not DP: for the data holder)"
              + (f"; **not in these tables** (not run since the method last changed): {', '.join(missing)}" if missing else "")
              + "_")
    md = markdown(rows, header)
    results.mkdir(parents=True, exist_ok=True)
    (results / "downstream.json").write_text(json.dumps({"header": header, "rows": rows}) + "\n")
    (results / "downstream.md").write_text(md)
    print(md)
    if a.readme:
        readme = ROOT / "README.md"
        text = readme.read_text()
        block = md[: md.index("## Details")]
        new, n = re.subn(r"(<!-- downstream:start -->\n).*?(<!-- downstream:end -->)",
                         lambda m_: m_.group(1) + block + m_.group(2), text, flags=re.S)
        if n != 1:
            sys.exit("README.md has no <!-- downstream:start --> … <!-- downstream:end --> block")
        readme.write_text(new)


if __name__ == "__main__":
    main()
