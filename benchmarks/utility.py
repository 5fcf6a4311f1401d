"""Utility and fidelity of the main job for several privacy levels, methods and seeds.

Runs ``fedhype run`` (in-process) for each (method, ε, seed) on the bundled digits domains
(or ``--config``), reusing the cached embeddings, and writes
``benchmarks/results/utility.json`` and ``utility.md`` (mean ± std over seeds); with
``--readme`` it also replaces the table between the ``utility`` markers in README.md.

    .venv/bin/python benchmarks/utility.py                       # ε ∈ {1, 4, no DP}, ours, seed 0
    .venv/bin/python benchmarks/utility.py --methods fedhypevae dp-cvae no-mmd --seeds 0 1 2 --epsilons 1 4 8 none
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import time
from pathlib import Path

import torch

KEYS = ("epsilon", "mmd2", "fd", "precision", "recall", "coverage", "tstr_accuracy", "trtr_accuracy",
        "interpolation_mean_accuracy")


def run_one(config: str | None, method: str, eps: str, seed: int, root: Path, extra: list[str]) -> dict:
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import run_job

    sets = [f"train.method=\"{method}\"", f"train.seed={seed}", f"partition.seed={seed}", f"synthesis.seed={seed}",
            "evaluate.prototypes=false", *extra]
    sets += ["train.no_dp=true"] if eps == "none" else [f"train.epsilon={float(eps)}"]
    conf = resolve(config, sets)
    out = root / f"{method}-eps{eps}-s{seed}"
    t = time.perf_counter()
    rep = run_job(conf, out, log=lambda s: None)
    return {"method": method, "eps_target": eps, "seed": seed, "wall_s": time.perf_counter() - t,
            **{k: rep.get(k) for k in KEYS}}


def table(rows: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["eps_target"]), []).append(r)
    lines = ["| method | target ε | accountant ε | MMD² ↓ | FD ↓ | precision | recall | coverage | TSTR acc | TRTR acc | λ-protocol acc | seeds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (m, e), rs in groups.items():
        def cell(k):
            vals = [r[k] for r in rs if r[k] is not None]
            if not vals:
                return "–"
            mu = statistics.fmean(vals)
            return f"{mu:.3f} ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else f"{mu:.3f}"
        lines.append(f"| {m} | {'no DP' if e == 'none' else e} | " + " | ".join(cell(k) for k in KEYS) + f" | {len(rs)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None)
    ap.add_argument("--methods", nargs="+", default=["fedhypevae"])
    ap.add_argument("--epsilons", nargs="+", default=["1", "4", "none"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--set", nargs="*", default=[], dest="extra")
    ap.add_argument("--out", default="runs/bench-utility")
    ap.add_argument("--readme", action="store_true", help="update the README table")
    a = ap.parse_args()
    rows = []
    for m in a.methods:
        for e in a.epsilons:
            for s in a.seeds:
                rows.append(run_one(a.config, m, e, s, Path(a.out), a.extra))
                print(json.dumps(rows[-1]), flush=True)
    head = (f"_{time.strftime('%Y-%m-%d')}, {platform.machine()} CPU, {torch.get_num_threads()} threads, "
            f"config: {a.config or 'built-in default (digits-domains, dinov2-vits14 @112 px, 4 domain clients)'}_")
    md = head + "\n\n" + table(rows) + "\n"
    res = Path(__file__).parent / "results"
    res.mkdir(exist_ok=True)
    (res / "utility.json").write_text(json.dumps({"rows": rows, "header": head}, indent=2) + "\n")
    (res / "utility.md").write_text(md)
    print(md)
    if a.readme:
        readme = Path(__file__).parents[1] / "README.md"
        text = readme.read_text()
        new = re.sub(r"(<!-- utility:start -->\n).*?(<!-- utility:end -->)", lambda m_: m_.group(1) + md + m_.group(2), text,
                     flags=re.S)
        readme.write_text(new)


if __name__ == "__main__":
    main()
