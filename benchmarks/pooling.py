"""How the server pools the clients' class sums: the plain sum against inverse-variance weights (``model.pooling``).

Without secure aggregation each client's release carries its own noise, so the pooled class sum of class k carries
m × one release's noise variance whatever share of the class a client holds. Under label skew most clients hold few
records of a class: their class means are mostly noise. Weighting client i's class sum by its DP count n_ik (over its
clip radius², ∝ the inverse noise variance of its class mean; Cochran 1954, the inverse-variance weighted mean) and
rescaling to the pooled count gives the same class means with σ²·Σ_i w_ik²R_i² of noise instead of σ²·Σ_i R_i² — by
Cauchy–Schwarz never more, about m·Σ_i p_ik² times less (p_ik = client i's share of class k: 1.6–2.6× with 5
Dirichlet α = 0.3 clients, ``tests/federated/test_pooling.py``). Post-processing of the released counts and sums
(no ε). On clients from one population (label skew) it targets the same class means; on distinct domains it
weights each class toward the clients that hold most of it.

Each (dataset, method, ε, seed, pooling) job is the utility grid's job (``benchmarks/utility.py``: its config,
partition, training and synthesis seed = seed, ``synthesis.per_class = "auto"``, the grid's code) with
``model.pooling`` set; each trained model is scored on **both** held-out splits: the validation split chooses the
default (``val`` rows), the test split reports it (``test`` rows, never read for the choice). Rows are appended to
``runs/bench-pooling/rows.jsonl``; a rerun skips the jobs there.

    .venv/bin/python benchmarks/pooling.py --datasets fashion-full --epsilons 1     # ~6 min a seed (both poolings)
    .venv/bin/python benchmarks/pooling.py --datasets digits                        # ε = 1 / 4 / 8, ~1 min a seed

Writes ``benchmarks/results/pooling.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "runs" / "bench-pooling"
from fedhype.models.config import POOLINGS  # noqa: E402  ("sum", "inverse-variance", "random-effects")
KEYS = ("tstr", "mmd2", "precision", "coverage", "recall", "class_mean_gap")


def rows_for(dataset: str, method: str, eps: str, seed: int, pooling: str, store) -> list[dict]:
    """Train one grid job with ``model.pooling = pooling``; score its synthetic store on the val and test splits."""
    import shutil

    from fedhype.data.partition import make_partition
    from fedhype.federated.engine import train
    from fedhype.pipeline.config import train_config
    from fedhype.synthesis import synthesize

    from class_anchor import job_conf, scores
    from utility import code_for

    t0 = time.perf_counter()
    conf = job_conf(dataset, method, eps, seed)
    conf["model"]["pooling"] = pooling
    p = conf["partition"]
    part = make_partition(store, scheme=p["scheme"], n_clients=p["clients"] or None, alpha=p["alpha"],
                          splits=tuple(p["fractions"]), min_train_per_client=p["min_records"], seed=seed)
    out = OUT / dataset / f"{method}-eps{eps}-s{seed}-{pooling}"
    shutil.rmtree(out, ignore_errors=True)
    train(store, part, train_config(conf), out, diagnostics=False)
    release = json.loads((out / "release.json").read_text()) if (out / "release.json").exists() else {}
    syn = synthesize(out, code_for(method), per_class="auto", seed=seed)
    rows = []
    for split in ("val", "test"):
        r = {"dataset": dataset, "split": split, "method": method, "eps": eps, "seed": seed, "pooling": pooling,
             "class_mean_snr": release.get("class_mean_snr"), "located_share": release.get("located_share"),
             "n_synthetic": len(syn), **scores(syn, part.split_store(store, split))}
        rows.append(r)
    shutil.rmtree(out, ignore_errors=True)  # ~10–30 MB a model; the rows are what is kept
    for r in rows:
        r["seconds"] = time.perf_counter() - t0
        print(f"{dataset} ({r['split']}) {method} ε={eps} seed {seed} {pooling:16}: "
              + ", ".join(f"{k} {r[k]:.4f}" for k in ("tstr", "mmd2", "precision", "coverage")), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """One line per (split, dataset, method, ε, pooling): mean ± sd over seeds, and the per-seed TSTR change."""
    from class_anchor import _cell

    out = ["| split | dataset | method | ε | pooling | TSTR | per seed (vs sum) | MMD² | precision | coverage | recall "
           "| class-mean gap | F | seeds |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {"1": 1, "4": 4, "8": 8, "none": 99}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.get("split"), r["dataset"], r["method"], r["eps"], r["pooling"]), []).append(r)
    for g in sorted(groups, key=lambda g: (g[0] != "val", g[1], g[2], order[g[3]], POOLINGS.index(g[4]))):
        rs = sorted(groups[g], key=lambda r: r["seed"])
        base = {r["seed"]: r["tstr"] for r in groups.get((*g[:4], "sum"), [])}
        delta = " / ".join(f"{r['tstr'] - base[r['seed']]:+.3f}" for r in rs if r["seed"] in base) \
            if g[4] != "sum" else "–"
        cells = [_cell([r[k] for r in rs], 4 if k == "mmd2" else 3) for k in KEYS]
        snr = [r["class_mean_snr"] for r in rs if r.get("class_mean_snr") is not None]
        out.append(f"| {g[0]} | {g[1]} | {g[2]} | {'no DP' if g[3] == 'none' else g[3]} | {g[4]} | {cells[0]} | {delta} | "
                   + " | ".join(cells[1:]) + f" | {_cell(snr)} | {len(rs)} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["fashion-full", "digits"])
    ap.add_argument("--methods", nargs="+", default=["fedhypevae", "dp-gaussian"])
    ap.add_argument("--epsilons", nargs="+", default=["1", "4", "8"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()

    import torch

    from release_defaults import data

    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / "rows.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    done = {(r["dataset"], r["method"], r["eps"], r["seed"], r["pooling"]) for r in rows}
    for dataset in a.datasets:
        store, _ = data(dataset)
        for eps in a.epsilons:
            for seed in a.seeds:
                for method in a.methods:
                    for pooling in POOLINGS:
                        if (dataset, method, eps, seed, pooling) in done:
                            continue
                        new = rows_for(dataset, method, eps, seed, pooling, store)
                        with log.open("a") as fh:
                            fh.writelines(json.dumps(r) + "\n" for r in new)
                        rows += new
    # every row recorded, also those another instance appended meanwhile (two processes share the 2 cores)
    rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else rows
    res = Path(a.results)
    stamp = (f"_{datetime.date.today()}, {platform.machine()} CPU, 1 thread per process; `benchmarks/pooling.py`; each "
             "job is the utility grid's (its config, seeds, code and `synthesis.per_class = \"auto\"`) with "
             "`model.pooling` set; every model is scored on the validation split (`val`: what chooses) and the test "
             "split (`test`: reported, not read for the choice)_")
    md = (f"# Pooling the clients' class sums: plain sum against inverse-variance weights\n\n{stamp}\n\n"
          "TSTR: linear probe trained on the synthetic store. MMD²: the evaluation's RBF kernel, median bandwidth, mean "
          "over 3 subsamples of 2,000. Precision, recall, coverage: PRDC, k = 5. Class-mean gap: mean over classes of the "
          "L2 distance between synthetic and real class means (unit-sphere units). F: the James–Stein factor of the "
          "pooled class means the release reports (`release.json` `class_mean_snr`).\n\n" + table(rows) + "\n")
    (res / "pooling.md").write_text(md)
    (res / "pooling.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(md)


if __name__ == "__main__":
    main()
