"""Utility and fidelity of the main job for several privacy levels, methods and seeds.

Runs ``fedhype run`` (in-process) for each (method, ε, seed) on the bundled digits domains
(or ``--dataset fashion``: ``configs/fashion-mnist.toml``, or any ``--config``), reusing the cached
embeddings, and writes ``benchmarks/results/utility.json`` and ``utility.md`` (mean ± std over
seeds; a second table gives per-client accuracy); with ``--readme`` it also replaces the table
between the ``utility`` markers in README.md. Methods: every ``--method`` of ``fedhype train``,
including the baselines without federation ``local-cvae`` (synthesised with ``--code mixture``:
it has no shared code space) and ``central-cvae`` (pooled records). Each row also carries the
DP-SGD FedAvg linear classifier trained on the real embeddings (``[evaluate] dp_linear``, its own
ε: a separate release), which depends on the data, ε and seed only, not on the method.

    .venv/bin/python benchmarks/utility.py                       # ε ∈ {1, 4, no DP}, ours, seed 0
    .venv/bin/python benchmarks/utility.py --methods fedhypevae dp-cvae local-cvae central-cvae --seeds 0 1 2 --epsilons 1 4 8 none
    .venv/bin/python benchmarks/utility.py --dataset fashion --methods fedhypevae local-cvae --epsilons 1
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
        "interpolation_mean_accuracy", "dp_fedavg_linear_accuracy", "dp_fedavg_linear_epsilon")
DATASETS = {"digits": None, "fashion": str(Path(__file__).parents[1] / "configs" / "fashion-mnist.toml")}
#: synthesis code per method (default: the neutral meta-code)
CODES = {"local-cvae": "mixture"}


def run_one(config: str | None, method: str, eps: str, seed: int, root: Path, extra: list[str]) -> dict:
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import run_job

    sets = [f"train.method=\"{method}\"", f"train.seed={seed}", f"partition.seed={seed}", f"synthesis.seed={seed}",
            "evaluate.prototypes=false"]
    if method in CODES:
        sets.append(f"synthesis.code=\"{CODES[method]}\"")
    sets += [*extra, "train.no_dp=true"] if eps == "none" else [*extra, f"train.epsilon={float(eps)}"]
    conf = resolve(config, sets)
    out = root / f"{method}-eps{eps}-s{seed}"
    t = time.perf_counter()
    rep = run_job(conf, out, log=lambda s: None)
    ev = json.loads((out / "evaluation.json").read_text())
    per_client = {name: {"tstr": c["synthetic_only"]["accuracy"], "interpolation": c["accuracy"]}
                  for name, c in (ev.get("interpolation") or {}).get("clients", {}).items()}
    for name, acc in (rep.get("dp_fedavg_linear_per_client_accuracy") or {}).items():
        per_client.setdefault(name, {})["dp_linear"] = acc
    return {"method": method, "eps_target": eps, "seed": seed, "wall_s": time.perf_counter() - t,
            **{k: rep.get(k) for k in KEYS}, "per_client": per_client}


def table(rows: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["eps_target"]), []).append(r)
    lines = ["| method | target ε | accountant ε | MMD² ↓ | FD ↓ | precision | recall | coverage | TSTR acc | TRTR acc "
             "| λ-protocol acc | DP-linear acc (real) | DP-linear ε | seeds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (m, e), rs in groups.items():
        lines.append(f"| {m} | {'no DP' if e == 'none' else e} | " + " | ".join(_cell(rs, lambda r, k=k: r.get(k))
                                                                           for k in KEYS) + f" | {len(rs)} |")
    return "\n".join(lines)


def _cell(rs: list[dict], get) -> str:
    vals = [v for v in map(get, rs) if v is not None]
    if not vals:
        return "–"
    mu = statistics.fmean(vals)
    return f"{mu:.3f} ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else f"{mu:.3f}"


def client_table(rows: list[dict]) -> str:
    """Per-client test accuracy: TSTR (synthetic-only probe) / λ-protocol / DP-linear, mean over seeds."""
    names = list(dict.fromkeys(n for r in rows for n in r.get("per_client", {})))
    if not names:
        return ""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["eps_target"]), []).append(r)
    lines = ["Per-client test accuracy, TSTR / λ-protocol / DP-linear (real):", "",
             "| method | target ε | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for (m, e), rs in groups.items():
        cells = []
        for n in names:
            parts = [_cell(rs, lambda r, k=k: r.get("per_client", {}).get(n, {}).get(k))
                     for k in ("tstr", "interpolation", "dp_linear")]
            cells.append(" / ".join(parts))
        lines.append(f"| {m} | {'no DP' if e == 'none' else e} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _one_thread() -> None:
    torch.set_num_threads(1)


def _run_star(args: tuple) -> dict:
    return run_one(*args)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None)
    ap.add_argument("--dataset", choices=sorted(DATASETS), default=None,
                    help="digits (built-in default job) or fashion (configs/fashion-mnist.toml)")
    ap.add_argument("--methods", nargs="+", default=["fedhypevae"])
    ap.add_argument("--epsilons", nargs="+", default=["1", "4", "none"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--set", nargs="*", default=[], dest="extra")
    ap.add_argument("--out", default="runs/bench-utility")
    ap.add_argument("--readme", action="store_true", help="update the README table")
    ap.add_argument("--jobs", type=int, default=1,
                    help="parallel processes (one torch thread each); 1 = in this process")
    ap.add_argument("--results", default=str(Path(__file__).parent / "results"),
                    help="folder for utility.json / utility.md (default benchmarks/results)")
    a = ap.parse_args()
    if a.dataset and a.config:
        ap.error("give --dataset or --config, not both")
    if a.dataset:
        a.config = DATASETS[a.dataset]
        a.out = f"{a.out}-{a.dataset}" if a.out == "runs/bench-utility" else a.out
    grid = [(a.config, m, e, s, Path(a.out), a.extra) for m in a.methods for e in a.epsilons for s in a.seeds]
    if a.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(a.jobs, initializer=_one_thread) as ex:
            rows = list(ex.map(_run_star, grid))
        for r in rows:
            print(json.dumps(r), flush=True)
    else:
        rows = []
        for g in grid:
            rows.append(run_one(*g))
            print(json.dumps(rows[-1]), flush=True)
    threads = f"{a.jobs} processes × 1 thread" if a.jobs > 1 else f"{torch.get_num_threads()} threads"
    head = (f"_{time.strftime('%Y-%m-%d')}, {platform.machine()} CPU, {threads}, "
            f"config: {a.config or 'built-in default (digits-domains, dinov2-vits14 @112 px, 4 domain clients)'}_")
    md = head + "\n\n" + table(rows) + "\n"
    if client_table(rows):
        md += "\n" + client_table(rows) + "\n"
    res = Path(a.results)
    res.mkdir(parents=True, exist_ok=True)
    name = f"utility-{a.dataset}" if a.dataset else "utility"
    (res / f"{name}.json").write_text(json.dumps({"rows": rows, "header": head}, indent=2) + "\n")
    (res / f"{name}.md").write_text(md)
    print(md)
    if a.readme:
        readme = Path(__file__).parents[1] / "README.md"
        text = readme.read_text()
        tag = f"utility-{a.dataset}" if a.dataset and a.dataset != "digits" else "utility"
        new = re.sub(rf"(<!-- {tag}:start -->\n).*?(<!-- {tag}:end -->)", lambda m_: m_.group(1) + md + m_.group(2), text,
                     flags=re.S)
        readme.write_text(new)


if __name__ == "__main__":
    main()
