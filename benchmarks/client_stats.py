"""Does a code carry its client's statistics? Validation-split TSTR of the neutral model vs the mixture.

On the bundled digits job (the main job's data, encoder, partition scheme and ``[train]``/``[model]``
defaults; partition seed = seed), each row trains a method with ``fedhype.federated.engine.train``
and scores a linear probe trained on 300 synthetic embeddings per class on the **validation** split
of every client (the test split is not read), for the synthesis codes ``neutral`` (the pooled
statistics, no client offsets) and ``mixture`` (each client's code, which carries its own DP
Gaussian: :func:`fedhype.federated.class_stats.apply_client_stats`; per class in proportion to the
clients' DP class counts). ``dp-gaussian`` (the pooled release alone) is the reference. This table
chose ``synthesis.code = "mixture"`` as the job default. ``--dataset fashion`` runs the same on
``configs/fashion-mnist.toml`` (10 small label-skewed Dirichlet clients); a method name with the suffix
``+shrink`` trains it with ``model.client_shrinkage = "class"`` (each client's statistics shrunk toward the
pooled ones class by class, :func:`fedhype.federated.client_shrinkage.shrink_toward`), ``+client-shrink`` with
``"client"`` (per class, from each client's signal variance, :func:`~fedhype.federated.client_shrinkage.shrink_client`).
``--dataset fashion-full`` / ``fashion-full-100`` run the realistic-scale configs (all 70,000 images, 10 or
100 clients; their bf16 store, through the job's own ``embed_store``).

Each finished row is appended to ``runs/bench-client-stats/rows.jsonl``; a rerun skips the rows
already there. Writes ``benchmarks/results/client_stats.{json,md}`` and prints the table.

    .venv/bin/python benchmarks/client_stats.py            # 3 seeds (~12 min on 2 cores)
    .venv/bin/python benchmarks/client_stats.py --dataset fashion --methods fedhypevae fedhypevae+shrink dp-gaussian \
        --epsilons 1 4 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics as st
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("fedhypevae", "no-client-stats", "dp-gaussian")
EPSILONS = ("1", "4", "8", "none")
CONFIGS = {"digits": None, "fashion": ROOT / "configs" / "fashion-mnist.toml",
           "fashion-full": ROOT / "configs" / "fashion-mnist-full.toml",
           "fashion-full-100": ROOT / "configs" / "fashion-mnist-full-100.toml"}
#: method suffix → model.client_shrinkage (fedhype.federated.client_shrinkage.SHRINKAGE)
SHRINK = {"+shrink": "class", "+client-shrink": "client"}


def rows_for(store, part, method: str, eps: str, seed: int, config=None) -> list[dict]:
    """Train one run; validation TSTR for each synthesis code."""
    import numpy as np

    from fedhype.eval.inputs import as_matrix
    from fedhype.eval.utility import Probe
    from fedhype.federated.engine import train
    from fedhype.pipeline.config import resolve, train_config
    from fedhype.synthesis import synthesize

    suffix = next((x for x in SHRINK if method.endswith(x)), "")
    base = method.removesuffix(suffix) if suffix else method
    sets = [f"train.seed={seed}", f'train.method="{base}"', "train.dp_sgd_min_records=0"] + (
        ["train.epsilon=none", "train.no_dp=true"] if eps == "none" else [f"train.epsilon={float(eps)}"]) + (
        [f'model.client_shrinkage="{SHRINK[suffix]}"'] if suffix else [])
    cfg = train_config(resolve(config, sets))
    val = part.split_store(store, "val")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        train(store, part, cfg, Path(tmp) / "run", diagnostics=False)
        for code in ("neutral", "mixture"):
            syn = synthesize(Path(tmp) / "run", code, per_class=300, seed=seed)
            probe = Probe(store.n_classes).fit(as_matrix(syn).numpy(), syn.labels.numpy())
            acc = float(np.mean(probe.predict(as_matrix(val).numpy()) == val.labels.numpy()))
            out.append({"seed": seed, "eps": eps, "m": method, "code": code, "acc": acc})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--dataset", choices=sorted(CONFIGS), default="digits")
    ap.add_argument("--methods", nargs="+", default=list(METHODS),
                    help=f"methods of the engine, each optionally with a suffix {sorted(SHRINK)}")
    ap.add_argument("--epsilons", nargs="+", default=list(EPSILONS), help="target ε values, or none (no DP)")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from fedhype.data.partition import make_partition
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import embed_store

    config = CONFIGS[a.dataset]
    conf = resolve(config, [])
    d, p = conf["data"], conf["partition"]
    store = embed_store(d, progress=False)  # the job's own store (its dtype: bf16 for the full sets)
    tag = "" if a.dataset == "digits" else f"-{a.dataset}"
    log = ROOT / "runs" / f"bench-client-stats{tag}" / "rows.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(x) for x in (log.read_text().splitlines() if log.exists() else []) if x.strip()]
    have = {(r["m"], r["eps"], r["seed"]) for r in rows}
    t0, ran = time.perf_counter(), 0
    for seed in a.seeds:
        part = make_partition(store, scheme=p["scheme"], n_clients=p["clients"] or None, alpha=p["alpha"],
                              splits=tuple(p["fractions"]), min_train_per_client=p["min_records"], seed=seed)
        for eps in a.epsilons:
            for m in a.methods:
                if (m, eps, seed) in have:
                    continue
                new = rows_for(store, part, m, eps, seed, config)
                ran += 1
                with log.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in new)
                rows += new
                print(" ".join(f"{r['m']} ε={r['eps']} seed {r['seed']} {r['code']}: {r['acc']:.3f}" for r in new), flush=True)
    rows = [r for r in rows if r["seed"] in a.seeds and r["m"] in a.methods and r["eps"] in a.epsilons]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["m"], r["code"], r["eps"]), []).append(r["acc"])
    what = "bundled digits job" if config is None else f"{Path(config).relative_to(ROOT)} job"
    lines = [f"_{datetime.date.today()}, {platform.machine()} CPU; `benchmarks/client_stats.py` ({ran} runs by this call in "
             f"{time.perf_counter() - t0:.0f} s, the others recorded in {log.relative_to(ROOT)}); {what}, "
             f"seeds {a.seeds}; TSTR on the **validation** split (the test split is not read)_", "",
             "| method | code | " + " | ".join("no DP" if e == "none" else f"ε = {e}" for e in a.epsilons) + " |",
             "|---|---|" + "---|" * len(a.epsilons)]
    for m in a.methods:
        for code in ("neutral", "mixture"):
            cells = []
            for e in a.epsilons:
                v = groups.get((m, code, e), [])
                cells.append(f"{st.fmean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else (f"{v[0]:.3f}" if v else "—"))
            lines.append(f"| {m} | {code} | " + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"client_stats{tag}.json").write_text(json.dumps({"rows": rows}, indent=1))
    (out / f"client_stats{tag}.md").write_text("# Client statistics: neutral vs mixture (validation split)\n\n" + md)
    print(md)


if __name__ == "__main__":
    main()
