"""``model.client_shrinkage = "subspace"`` against ``"client"`` (the default) and the release alone: the clients'
class-mean deviations shrunk per block of the pooled DP covariance's eigenbasis (validation split).

Each run trains the job's default model (``fedhypevae``; on the bundled digits job its clients are below
``train.dp_sgd_min_records``, so the model is the statistics release with the client codes) at a target ε and seed,
draws 300 per class from the mixture of client codes, and scores TSTR, MMD², precision and coverage on the
**validation** split (the test split is not read). ``--ranks`` sets the leading block's size r
(:data:`fedhype.federated.client_shrinkage.SUBSPACE_RANK`) for the runs of this script only; ``dp-gaussian`` (the
release alone, neutral code) is the floor. Rows go to ``runs/bench-client-subspace[-dataset]/rows.jsonl`` (a rerun
runs only the missing ones; without it, the committed json's rows count as run) and the table to
``benchmarks/results/client_subspace[-dataset].{md,json}``.

    .venv/bin/python benchmarks/client_subspace.py                       # digits, ε 1 / 4 / 8, seeds 0-2 (~6 min alone)
    .venv/bin/python benchmarks/client_subspace.py --dataset fashion     # configs/fashion-mnist.toml (~20 min)
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
CONFIGS = {"digits": None, "fashion": ROOT / "configs" / "fashion-mnist.toml"}
METRICS = ("tstr_accuracy", "mmd2", "precision", "coverage")


def run_one(store, part, variant: str, eps: str, seed: int, config) -> dict:
    """Train one model (``variant``: ``client``, ``subspace-<r>`` or ``dp-gaussian``) and score it on validation."""
    import fedhype.federated.client_shrinkage as cs
    from fedhype.eval import evaluate
    from fedhype.federated.engine import train
    from fedhype.pipeline.config import resolve, train_config
    from fedhype.synthesis import synthesize

    method, code, shrink = "fedhypevae", "mixture", "client"
    if variant == "dp-gaussian":
        method, code = "dp-gaussian", "neutral"
    elif variant.startswith("subspace-"):
        shrink, cs.SUBSPACE_RANK = "subspace", int(variant.split("-")[1])
    cfg = train_config(resolve(config, [f"train.seed={seed}", f"train.epsilon={float(eps)}", f'train.method="{method}"',
                                        f'model.client_shrinkage="{shrink}"']))
    with tempfile.TemporaryDirectory() as tmp:
        train(store, part, cfg, Path(tmp) / "run", diagnostics=False)
        syn = synthesize(Path(tmp) / "run", code, per_class=300, seed=seed)
    m = evaluate(part.split_store(store, "val"), syn, real_train=part.split_store(store, "train"), n_permutations=0,
                 seed=seed)
    return {"variant": variant, "eps": eps, "seed": seed, **{k: float(m[k]) for k in METRICS}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", choices=sorted(CONFIGS), default="digits")
    ap.add_argument("--ranks", nargs="+", type=int, default=[16, 32, 64])
    ap.add_argument("--epsilons", nargs="+", default=["1", "4", "8"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    a = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from fedhype.data.partition import make_partition
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import embed_store

    config = CONFIGS[a.dataset]
    conf = resolve(config, [])
    store = embed_store(conf["data"], progress=False)
    p = conf["partition"]
    tag = "" if a.dataset == "digits" else f"-{a.dataset}"
    log = ROOT / "runs" / f"bench-client-subspace{tag}" / "rows.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(x) for x in (log.read_text().splitlines() if log.exists() else []) if x.strip()]
    saved = ROOT / "benchmarks" / "results" / f"client_subspace{tag}.json"
    if not rows and saved.exists():  # a fresh checkout: the committed rows count as run
        rows = json.loads(saved.read_text())["rows"]
    variants = ["client", *[f"subspace-{r}" for r in a.ranks], "dp-gaussian"]
    t0, ran = time.perf_counter(), 0
    for seed in a.seeds:
        part = make_partition(store, scheme=p["scheme"], n_clients=p["clients"] or None, alpha=p["alpha"],
                              splits=tuple(p["fractions"]), min_train_per_client=p["min_records"], seed=seed)
        for eps in a.epsilons:
            for v in variants:
                if any((r["variant"], r["eps"], r["seed"]) == (v, eps, seed) for r in rows):
                    continue
                row = run_one(store, part, v, eps, seed, config)
                ran += 1
                with log.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                rows.append(row)
                print(f"{v} ε={eps} seed {seed}: " + " ".join(f"{k} {row[k]:.4f}" for k in METRICS), flush=True)
    rows = [r for r in rows if r["seed"] in a.seeds and r["eps"] in a.epsilons and r["variant"] in variants]
    what = "bundled digits job" if config is None else f"{Path(config).relative_to(ROOT)} job"
    lines = [f"_{datetime.date.today()}, {platform.machine()} CPU, one thread; `benchmarks/client_subspace.py` ({ran} runs "
             f"by this call in {time.perf_counter() - t0:.0f} s, the others recorded in {log.relative_to(ROOT)}); {what}, "
             f"every default of the job but `model.client_shrinkage`; mixture code (`dp-gaussian`: the release alone, "
             f"neutral code); 300 per class; seeds {a.seeds}; scored on the **validation** split (the test split is not "
             "read); PRDC with k = 5_", "",
             "| variant | target ε | TSTR | MMD² | precision | coverage | seeds |", "|---|---|---|---|---|---|---|"]
    for eps in a.epsilons:
        for v in variants:
            got = [r for r in rows if (r["variant"], r["eps"]) == (v, eps)]
            if not got:
                continue
            cells = []
            for k in METRICS:
                vals = [r[k] for r in got]
                f = ".4f" if k == "mmd2" else ".3f"
                cells.append(f"{st.fmean(vals):{f}} ± {st.stdev(vals):{f}}" if len(vals) > 1 else f"{vals[0]:{f}}")
            name = ('`"client"` (the default)' if v == "client" else "`dp-gaussian` (the release alone)"
                    if v == "dp-gaussian" else f'`"subspace"`, r = {v.split("-")[1]}')
            lines.append(f"| {name} | {eps} | " + " | ".join(cells) + f" | {len(got)} |")
    md = "\n".join(lines) + "\n"
    out = ROOT / "benchmarks" / "results"
    (out / f"client_subspace{tag}.json").write_text(json.dumps({"rows": rows}, indent=1))
    (out / f"client_subspace{tag}.md").write_text(
        "# Client offsets shrunk per block of the pooled covariance's eigenbasis (validation split)\n\n" + md)
    print(md)


if __name__ == "__main__":
    main()
