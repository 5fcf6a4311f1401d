"""How many synthetic embeddings to draw: validation-split TSTR against the synthetic set's size.

Sampling from a trained generator is post-processing (free in ε), so the size of the synthetic set is
a utility choice only. For each dataset (the bundled digits job, ``configs/fashion-mnist.toml`` and the
realistic-scale ``configs/fashion-mnist-full.toml``), method (``dp-gaussian``: the release alone,
neutral code; ``fedhypevae``: ours, the job's mixture code), target ε and seed, one training run
(``fedhype.federated.engine.train``, the job's defaults) is sampled at every size in ``--per-class``
(the same sampling seed; each set is drawn on its own) and a linear probe
(:class:`fedhype.eval.utility.Probe`, the benchmark's TSTR probe) trained on it is scored on the
**validation** split of every client (the test split is not read). The real training set subsampled
to the same sizes is the reference row.

Each finished training run's figures are appended to ``runs/bench-synthetic-size/rows.jsonl``; a rerun
skips those already there. Writes ``benchmarks/results/synthetic_size.{json,md}``.

    .venv/bin/python benchmarks/synthetic_size.py                       # 3 seeds, all three datasets
    .venv/bin/python benchmarks/synthetic_size.py --datasets digits --seeds 0
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics as st
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from release_defaults import CONFIGS, data  # noqa: E402  (the same jobs and partitions as the release grid)

METHODS = (("dp-gaussian", "neutral"), ("fedhypevae", "mixture"))
EPS = ("1", "4", "8", "none")


def probe_accuracy(x, y, val, n_classes: int) -> float:
    import numpy as np

    from fedhype.eval.inputs import as_matrix
    from fedhype.eval.utility import Probe

    probe = Probe(n_classes).fit(x, y)
    return float(np.mean(probe.predict(as_matrix(val).numpy()) == val.labels.numpy()))


def one_run(store, part, name: str, method: str, code: str, eps: str, seed: int, sizes: list[int]) -> dict:
    """Train once, then TSTR-val of a synthetic set of every size (the same sampling seed)."""
    from fedhype.eval.inputs import as_matrix
    from fedhype.federated.engine import train
    from fedhype.pipeline.config import resolve, train_config
    from fedhype.synthesis import synthesize

    sets = [f"train.seed={seed}", f'train.method="{method}"', "train.dp_sgd_min_records=0"] + \
        (["train.epsilon=none", "train.no_dp=true"] if eps == "none" else [f"train.epsilon={float(eps)}"])
    cfg = train_config(resolve(CONFIGS[name], sets))
    val = part.split_store(store, "val")
    acc = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        train(store, part, cfg, Path(tmp) / "run", diagnostics=False)
        train_s = time.perf_counter() - t
        for n in sizes:
            syn = synthesize(Path(tmp) / "run", code, per_class=n, seed=seed)
            acc[str(n)] = probe_accuracy(as_matrix(syn).numpy(), syn.labels.numpy(), val, store.n_classes)
    return {"train_s": train_s, "val_tstr": acc}


def real_row(store, part, sizes: list[int], seed: int) -> dict:
    """The real training records subsampled to ``n`` per class (all of a class when it has fewer)."""
    import numpy as np

    from fedhype.eval.inputs import as_matrix

    tr = part.split_store(store, "train")
    x, y = as_matrix(tr).numpy(), tr.labels.numpy()
    val = part.split_store(store, "val")
    rng = np.random.default_rng(seed)
    acc = {}
    for n in sizes:
        idx = np.concatenate([rng.permutation(np.flatnonzero(y == k))[:n] for k in range(store.n_classes)])
        acc[str(n)] = probe_accuracy(x[idx], y[idx], val, store.n_classes)
    return {"val_tstr": acc}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--eps", nargs="+", default=list(EPS), choices=list(EPS))
    ap.add_argument("--per-class", nargs="+", type=int, default=[300, 1000, 3000])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    sizes = sorted(set(a.per_class))
    log = ROOT / "runs" / "bench-synthetic-size" / "rows.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    done = {r["key"]: r for r in map(json.loads, log.read_text().splitlines() if log.exists() else [])}
    t0, ran, rows = time.perf_counter(), 0, []
    for name in a.datasets:
        store, parts = None, None
        for seed in a.seeds:
            part = None
            jobs = [("real", "", "none")] + [(m, c, e) for e in a.eps for m, c in METHODS]
            for method, code, eps in jobs:
                key = json.dumps([name, method, eps, seed, sizes])
                if key not in done:
                    if store is None:
                        store, parts = data(name)
                    part = part or parts(seed)
                    r = real_row(store, part, sizes, seed) if method == "real" else \
                        one_run(store, part, name, method, code, eps, seed, sizes)
                    done[key] = {"key": key, "dataset": name, "method": method, "eps": eps, "seed": seed, **r}
                    with log.open("a") as f:
                        f.write(json.dumps(done[key]) + "\n")
                    ran += 1
                    print(f"{name} {method} ε={eps} seed {seed}: " + " ".join(
                        f"{n}: {v:.3f}" for n, v in done[key]["val_tstr"].items()), flush=True)
                rows.append(done[key])
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["method"], r["eps"]), []).append(r)
    head = " | ".join(f"{n} per class" for n in sizes)
    lines = [f"_{datetime.date.today()}, {platform.machine()} CPU, one process × 1 thread; `benchmarks/synthetic_size.py` "
             f"({ran} runs by this call in {time.perf_counter() - t0:.0f} s, the others recorded in "
             f"{log.relative_to(ROOT)}); seeds {a.seeds}; TSTR on the **validation** split (the test split is not "
             "read); `real`: the real training records subsampled to the same size_", "",
             f"| dataset | method | target ε | {head} |", "|---|---|---|" + "---|" * len(sizes)]
    for (name, method, eps), rs in groups.items():
        cells = []
        for n in sizes:
            v = [r["val_tstr"][str(n)] for r in rs]
            cells.append(f"{st.fmean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}")
        lines.append(f"| {name} | {method} | {'—' if method == 'real' else ('no DP' if eps == 'none' else eps)} | "
                     + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "synthetic_size.json").write_text(json.dumps({"rows": rows}, indent=1))
    (out / "synthetic_size.md").write_text("# How many synthetic embeddings to draw (validation split)\n\n" + md)
    print(md)


if __name__ == "__main__":
    main()
