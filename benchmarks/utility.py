"""Utility and fidelity of every method at several privacy levels and seeds: one command per dataset.

Runs the main job (``fedhype run``, in-process) for each (method, ε, seed) of the grid on the
bundled digits domains (4 natural-domain clients) or, with ``--dataset fashion``, on
``configs/fashion-mnist.toml`` (10,000 images, 10 Dirichlet α = 0.3 clients), reusing the cached
embeddings. It writes ``benchmarks/results/utility[-fashion].json`` (every row) and ``.md`` (mean ±
std over seeds: TSTR and MMD² per method and ε, the references, every figure, per-client
accuracy); with ``--readme`` it replaces the block between the ``utility`` (or
``utility-fashion``) markers in README.md with the first three.

Methods (``--methods all``, the default): ours (``fedhypevae``), its ablations (``no-class-stats``,
``no-mmd``, ``no-lipschitz``, ``fixed-prior``, ``shared-decoder``, ``no-second-moment``,
``no-client-stats``, ``no-dp-sgd`` — ours without its DP-SGD stage), the statistics floor
``dp-gaussian``, the predecessor ``dp-cvae`` and the baselines without federation ``local-cvae``
(synthesised with ``--code mixture``: it has no shared code space) and ``central-cvae`` (pooled
records). References per (ε, seed), independent of the method: TRTR (a probe trained on the real
training records; no privacy) and the DP-SGD FedAvg linear classifier trained on the real
embeddings (``[evaluate] dp_linear``; its own ε, a separate release). ``fedhypevae+secagg`` and
``dp-gaussian+secagg`` are those methods with the statistics release under secure aggregation
(``train.secure_aggregation = true``, dropout tolerance 0: distributed noise, the server sees only
the sum; :mod:`fedhype.privacy.secure_agg`).

Each finished job is appended to ``<out>/rows.jsonl``; a rerun with the same ``--out`` skips the
jobs already there (an interrupted job resumes from its last committed round), so an interrupted
benchmark continues where it stopped. ``--fresh`` ignores the recorded rows. ``--reuse-results``
counts the committed rows (``benchmarks/results/utility[-dataset].json``) as measured, so that a
method added since runs alone and the tables are regenerated with every row; the header then gives
the number of rows measured on each date (use it only while no default changed since). To measure
a cell again after a default changed, drop its rows from ``rows.jsonl``: its job folder then holds
a run of other settings, which ``fedhype run`` refuses to resume, so it is moved aside
(``<job>.stale``) and the job starts fresh. A default that changes what a method runs without changing its job
settings (the DP-SGD stage rule of docs/method.md decision 22: the same job, another run) is measured again with
``--rerun METHOD`` (or ``METHOD:EPS``): its rows are dropped and its job folders moved aside before the jobs run.

    .venv/bin/python benchmarks/utility.py --jobs 2 --readme                 # digits, full grid (~30 min, 2 cores)
    .venv/bin/python benchmarks/utility.py --dataset fashion --jobs 2 --readme  # (~65 min, 2 cores)
    .venv/bin/python benchmarks/utility.py --dataset fashion-full --methods scale --jobs 2 --readme  # 70,000 images
    .venv/bin/python benchmarks/utility.py --dataset fashion-full-100 --methods scale --jobs 2 --readme   # 100 clients
    .venv/bin/python benchmarks/utility.py --methods fedhypevae dp-cvae --epsilons 1 --seeds 0   # a slice
    .venv/bin/python benchmarks/utility.py --dataset fashion --methods core --reuse-results --jobs 2 --readme
        # the committed rows kept, only the cells of a method added since run
    .venv/bin/python benchmarks/utility.py --dataset fashion --methods core --resynthesize fedhypevae --readme
        # ours' recorded jobs synthesized and evaluated again from their trained models (a synthesis change)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("epsilon", "mmd2", "fd", "precision", "recall", "density", "coverage", "tstr_accuracy", "trtr_accuracy",
        "interpolation_mean_accuracy", "dp_fedavg_linear_accuracy", "dp_fedavg_linear_epsilon")
DATASETS = {"digits": None, "fashion": str(ROOT / "configs" / "fashion-mnist.toml"),
            "fashion-full": str(ROOT / "configs" / "fashion-mnist-full.toml"),
            "fashion-full-100": str(ROOT / "configs" / "fashion-mnist-full-100.toml")}
#: the grids whose committed rows were measured on float32 embeddings (before the bfloat16 default): pinned
FLOAT32 = ("digits", "fashion")
DESCRIPTION = {"digits": "bundled digits domains (DINOv2-S/14 at 112 px, 4 natural-domain clients)",
               "fashion": "configs/fashion-mnist.toml (10,000 images, DINOv2-S/14 at 112 px, 10 Dirichlet α = 0.3 clients)",
               "fashion-full": "configs/fashion-mnist-full.toml (all 70,000 images, about 42,000 training records, "
                               "DINOv2-S/14 at 112 px, dtype auto, 10 Dirichlet α = 0.3 clients)",
               "fashion-full-100": "configs/fashion-mnist-full-100.toml (all 70,000 images, DINOv2-S/14 at 112 px, "
                                   "dtype auto, 100 Dirichlet α = 0.3 clients)"}
#: ``--methods core``: ours, the statistics floor, ours without its DP-SGD stage, the baselines and the ablation of
#: the second-order release
CORE = ("fedhypevae", "dp-gaussian", "no-dp-sgd", "no-client-stats", "no-second-moment", "dp-cvae", "local-cvae",
        "central-cvae", "fedhypevae+secagg", "dp-gaussian+secagg")
#: ``--methods scale`` (the realistic-scale grids): ours, the statistics floor, ours without its DP-SGD stage, the
#: strongest baseline without federation, and the first two with secure aggregation (one noise draw for the pooled releases instead of
#: one per client); the DP-SGD linear reference is in every row's references
SCALE = ("fedhypevae", "dp-gaussian", "no-dp-sgd", "local-cvae", "fedhypevae+secagg", "dp-gaussian+secagg")
#: the scale set with 100 clients: ours, the statistics floor and ours without its DP-SGD stage (``local-cvae`` would be 100 separate models
#: of about 420 records each)
SCALE_MANY = ("fedhypevae", "dp-gaussian", "no-dp-sgd", "fedhypevae+secagg", "dp-gaussian+secagg")


def scale_set(dataset: str | None) -> tuple[str, ...]:
    """The methods of ``--methods scale`` for ``dataset``."""
    return SCALE_MANY if dataset == "fashion-full-100" else SCALE
#: a method name with this suffix runs the method with ``train.secure_aggregation = true`` (t = 0)
SECAGG = "+secagg"


#: a row's cost figures, which ``--resynthesize`` keeps from the run that trained the model
COST_KEYS = ("wall_s", "peak_rss_mb", "train_s", "machine")


def code_for(method: str) -> str:
    """The synthesis code of a method's rows: ``mixture`` for a model whose codes carry the clients' own
    statistics (ours and its ablations with client-statistics heads) and for ``local-cvae`` (no shared
    code space), else ``neutral`` (one pooled model: the baselines, dp-gaussian, secure aggregation)."""
    from fedhype.federated.baselines import is_local
    from fedhype.federated.config import TrainConfig

    base, secagg = (method[: -len(SECAGG)], True) if method.endswith(SECAGG) else (method, False)
    heads = TrainConfig(method=base, secure_aggregation=secagg).model_config(1, 2).client_heads
    return "mixture" if is_local(base) or heads else "neutral"


def all_methods() -> list[str]:
    from fedhype.federated.config import METHODS

    return list(METHODS) + [m + SECAGG for m in ("fedhypevae", "dp-gaussian")]


def job_key(method: str, eps: str, seed: int, extra: list[str]) -> str:
    return json.dumps([method, eps, seed, list(extra)])


def run_folder(method: str, eps: str, seed: int, extra: list[str]) -> str:
    """The name of one job's folder under the grid's ``--out``."""
    tag = "" if not extra else "-" + hashlib.sha1(json.dumps(list(extra)).encode()).hexdigest()[:8]
    return f"{method}-eps{eps}-s{seed}{tag}"


def run_one(config: str | None, method: str, eps: str, seed: int, root: Path, extra: list[str]) -> dict:
    """One main job; returns its row (the report's figures, per-client accuracy, wall time, peak RSS of the process)."""
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import run_job

    base, secagg = (method[: -len(SECAGG)], True) if method.endswith(SECAGG) else (method, False)
    sets = [f"train.method=\"{base}\"", *(["train.secure_aggregation=true"] if secagg else []), f"train.seed={seed}", f"partition.seed={seed}", f"synthesis.seed={seed}",
            *(['data.dtype="float32"'] if config in (DATASETS[d] for d in FLOAT32) else []),  # those grids' embeddings
            "evaluate.prototypes=false", "evaluate.code_domain=false", "evaluate.downstream=false",  # (benchmarks/downstream.py)
            "evaluate.permutations=20"]  # the p-value is not in the tables
    sets.append(f"synthesis.code=\"{code_for(method)}\"")
    sets += [*extra, "train.epsilon=none", "train.no_dp=true"] if eps == "none" else [*extra, f"train.epsilon={float(eps)}"]
    conf = resolve(config, sets)
    out = root / run_folder(method, eps, seed, extra)
    t = time.perf_counter()
    row = {"method": method, "eps_target": eps, "seed": seed, "extra": list(extra), "key": job_key(method, eps, seed, extra),
           "measured": time.strftime("%Y-%m-%d")}
    try:
        try:
            rep = run_job(conf, out, log=lambda s: None)
        except Exception as e:
            if "the configuration differs" not in str(e):
                raise
            # a folder left by a run of other settings (a default changed since): the row is to be measured again
            # with today's, so that run is moved aside (<job>.stale, replacing an older one) and this one starts fresh
            stale = out.with_name(out.name + ".stale")
            shutil.rmtree(stale, ignore_errors=True)
            out.rename(stale)
            rep = run_job(conf, out, log=lambda s: None)
    except Exception:
        return {**row, "error": traceback.format_exc()[-3000:]}
    ev = json.loads((out / "evaluation.json").read_text())
    per_client = {name: {"tstr": c["synthetic_only"]["accuracy"], "interpolation": c["accuracy"]}
                  for name, c in (ev.get("interpolation") or {}).get("clients", {}).items()}
    for name, acc in (rep.get("dp_fedavg_linear_per_client_accuracy") or {}).items():
        per_client.setdefault(name, {})["dp_linear"] = acc
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB (Linux: KiB); one process per job with --jobs > 1
    return {**row, "machine": machine(), "wall_s": time.perf_counter() - t, "peak_rss_mb": peak, "train_s": rep.get("timings_s", {}).get("train_s"),
            "embedding_dtype": embedding_dtype(out / "embeddings.safetensors"),
            **{k: rep.get(k) for k in KEYS}, "per_client": per_client}


def embedding_dtype(path: Path) -> str | None:
    """The compute dtype the job's embeddings were made with (``data.dtype = "auto"`` gives bfloat16 only on a CPU
    with bfloat16 instructions: rows measured on different machines may differ in it); None where not recorded."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return json.loads(f.metadata()["fedhype"])["meta"].get("dtype")
    except (OSError, KeyError, ValueError):
        return None


def _groups(rows: list[dict], key) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return out


def _cell(rs: list[dict], get, digits: int = 3) -> str:
    vals = [v for v in map(get, rs) if v is not None]
    if not vals:
        return "–"
    mu = statistics.fmean(vals)
    return f"{mu:.{digits}f} ± {statistics.stdev(vals):.{digits}f}" if len(vals) > 1 else f"{mu:.{digits}f}"


def _eps_label(e: str) -> str:
    return "no DP" if e == "none" else e


def _eps_order(e: str) -> float:
    return float("inf") if e == "none" else float(e)


def table(rows: list[dict], methods: list[str]) -> str:
    """Main table: one row per (ε, method), mean ± std over seeds; the best TSTR per ε in bold."""
    groups = _groups(rows, lambda r: (r["eps_target"], r["method"]))
    lines = ["| target ε | method | accountant ε | MMD² ↓ | FD ↓ | precision | recall | density | coverage "
             "| **TSTR acc** | λ-protocol acc | seeds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in sorted({r["eps_target"] for r in rows}, key=_eps_order):
        best = max((statistics.fmean(v) for m in methods if (e, m) in groups
                    for v in [[r["tstr_accuracy"] for r in groups[(e, m)] if r.get("tstr_accuracy") is not None]] if v),
                   default=None)
        for m in methods:
            rs = groups.get((e, m))
            if not rs:
                continue
            cells = [_cell(rs, lambda r, k=k: r.get(k)) for k in
                     ("epsilon", "mmd2", "fd", "precision", "recall", "density", "coverage")]
            tstr = _cell(rs, lambda r: r.get("tstr_accuracy"))
            vals = [r["tstr_accuracy"] for r in rs if r.get("tstr_accuracy") is not None]
            if vals and best is not None and statistics.fmean(vals) == best:
                tstr = f"**{tstr}**"
            cells += [tstr, _cell(rs, lambda r: r.get("interpolation_mean_accuracy"))]
            lines.append(f"| {_eps_label(e)} | {m} | " + " | ".join(cells) + f" | {len(rs)} |")
    return "\n".join(lines)


def matrix(rows: list[dict], methods: list[str], key: str, higher_is_better: bool) -> str:
    """Compact view: one row per method, one column per ε (mean ± std over seeds); best per column in bold."""
    eps = sorted({r["eps_target"] for r in rows}, key=_eps_order)
    groups = _groups(rows, lambda r: (r["method"], r["eps_target"]))

    def mean(m: str, e: str) -> float | None:
        vals = [r[key] for r in groups.get((m, e), []) if r.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    best = {}
    for e in eps:
        vals = [v for m in methods if (v := mean(m, e)) is not None]
        best[e] = (max if higher_is_better else min)(vals) if vals else None
    lines = ["| method | " + " | ".join(f"ε = {e}" if e != "none" else "no DP" for e in eps) + " |",
             "|---|" + "---|" * len(eps)]
    for m in methods:
        if not any((m, e) in groups for e in eps):
            continue
        cells = []
        for e in eps:
            c = _cell(groups.get((m, e), []), lambda r: r.get(key))
            cells.append(f"**{c}**" if best[e] is not None and mean(m, e) == best[e] else c)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reference_table(rows: list[dict]) -> str:
    """References per ε (they depend on the data, ε and seed, not on the method)."""
    per_seed = _groups(rows, lambda r: (r["eps_target"], r["seed"]))
    lines = ["| target ε | TRTR acc (real train, no privacy) | DP-SGD FedAvg linear acc (real train) | its ε | seeds |",
             "|---|---|---|---|---|"]
    for e in sorted({r["eps_target"] for r in rows}, key=_eps_order):
        rs = [v[0] for (ee, _), v in per_seed.items() if ee == e]
        lines.append(f"| {_eps_label(e)} | " + " | ".join(_cell(rs, lambda r, k=k: r.get(k)) for k in
                     ("trtr_accuracy", "dp_fedavg_linear_accuracy", "dp_fedavg_linear_epsilon")) + f" | {len(rs)} |")
    return "\n".join(lines)


def cost_table(rows: list[dict], methods: list[str]) -> str:
    """Wall time and peak resident memory of each job (mean ± std over seeds; rows that recorded them)."""
    groups = _groups([r for r in rows if r.get("peak_rss_mb") is not None], lambda r: (r["eps_target"], r["method"]))
    if not groups:
        return ""
    lines = ["Cost per job (the whole `fedhype run`: release, training, synthesis, evaluation and the DP linear "
             "reference; one process per job):", "", "| target ε | method | wall time (s) | peak RSS (MB) | seeds |",
             "|---|---|---|---|---|"]
    for e in sorted({e for e, _ in groups}, key=_eps_order):
        for m in methods:
            rs = groups.get((e, m))
            if rs:
                lines.append(f"| {_eps_label(e)} | {m} | {_cell(rs, lambda r: r['wall_s'], 0)} | "
                             f"{_cell(rs, lambda r: r['peak_rss_mb'], 0)} | {len(rs)} |")
    return "\n".join(lines)


def client_table(rows: list[dict], methods: list[str]) -> str:
    """Per-client test accuracy: TSTR (synthetic-only probe) / λ-protocol / DP-linear, mean over seeds."""
    names = list(dict.fromkeys(n for r in rows for n in r.get("per_client", {})))
    if not names:
        return ""
    groups = _groups(rows, lambda r: (r["eps_target"], r["method"]))
    lines = ["Per-client test accuracy, TSTR / λ-protocol / DP-linear (real), mean over seeds:", "",
             "| target ε | method | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for e in sorted({r["eps_target"] for r in rows}, key=_eps_order):
        for m in methods:
            rs = groups.get((e, m))
            if not rs:
                continue
            cells = [" / ".join(_cell(rs, lambda r, k=k, n=n: r.get("per_client", {}).get(n, {}).get(k), 2)
                                for k in ("tstr", "interpolation", "dp_linear")) for n in names]
            lines.append(f"| {_eps_label(e)} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine(jobs: int | None = None) -> str:
    """Where a row ran: architecture, cores and (``jobs``) the parallel processes, e.g. ``x86_64 CPU, 2 cores``."""
    return f"{platform.machine()} CPU, {os.cpu_count()} cores" + (f", {jobs} processes × 1 thread" if jobs else "")


#: the machine of the rows recorded before rows named theirs (every one ran on the 2-core machine)
LEGACY_MACHINE = "x86_64 CPU, 2 cores"


def machines_note(rows: list[dict], threads: str) -> str:
    """The header's machine: this one and ``threads`` where every row ran on this kind of machine, else each
    machine with the number of rows measured on it (their wall times and peak RSS are not comparable)."""
    counts: dict[str, int] = {}
    for r in rows:
        m = r.get("machine", LEGACY_MACHINE)
        counts[m] = counts.get(m, 0) + 1
    if set(counts) <= {machine()}:
        return f"{machine()}, {threads}"
    return "rows from " + "; ".join(f"{n} on {m}" for m, n in counts.items())


def _one_thread() -> None:
    """One thread per worker process: torch's, and the BLAS / OpenMP pools numpy and scikit-learn already
    started (threadpoolctl). Setting ``OMP_NUM_THREADS`` in a forked worker is too late for those: on a
    16-core machine 16 workers then ran 16 BLAS threads each, and a 30 s job took 450 s."""
    from threadpoolctl import threadpool_limits

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    threadpool_limits(1)


def _run_star(args: tuple) -> dict:
    return run_one(*args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=sorted(DATASETS), default=None,
                    help="digits (built-in default job) or fashion (configs/fashion-mnist.toml)")
    ap.add_argument("--config", default=None, help="any job config instead of --dataset")
    ap.add_argument("--methods", nargs="+", default=["all"],
                    help="methods of fedhype train --method, or all, or core (CORE: ours, dp-gaussian, no-second-moment "
                         "and the baselines), or scale (ours, dp-gaussian, local-cvae and the first two +secagg; with --dataset fashion-full-100 "
                         "ours and dp-gaussian)")
    ap.add_argument("--epsilons", nargs="+", default=["1", "4", "8", "none"], help="target ε values; none = no DP")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--set", nargs="*", default=[], dest="extra", help="extra job settings (key=value), as fedhype run --set")
    ap.add_argument("--out", default=None, help="job folder (default runs/bench-utility[-dataset])")
    ap.add_argument("--fresh", action="store_true", help="ignore the rows recorded in <out>/rows.jsonl")
    ap.add_argument("--resynthesize", nargs="*", default=[], metavar="METHOD",
                    help="rerun these methods' recorded jobs from their trained models (the job resumes with nothing "
                         "left to train: synthesis and evaluation again, e.g. after a synthesis default changed); the "
                         "rows keep the training run's cost figures (wall time, peak RSS, machine)")
    ap.add_argument("--reuse-results", action="store_true",
                    help="count the rows of the committed results (benchmarks/results/utility[-dataset].json) as "
                         "measured, so only the grid's missing cells run (a method added since); only while no "
                         "default changed since those rows were measured — the header says how many rows are from when")
    ap.add_argument("--rerun", nargs="*", default=[], metavar="METHOD",
                    help="measure these methods' rows again from scratch (a default of theirs changed): their recorded "
                         "rows are dropped and their job folders moved aside to <job>.stale before the jobs run; "
                         "METHOD:EPS for one target ε only (e.g. fedhypevae:1)")
    ap.add_argument("--readme", action="store_true", help="update the README tables")
    ap.add_argument("--jobs", type=int, default=1, help="parallel processes (one torch thread each); 1 = in this process")
    ap.add_argument("--results", default=None,
                    help="folder for utility[-dataset].json / .md (default: benchmarks/results for the full grid, "
                         "<out>/results for a slice)")
    a = ap.parse_args()
    if a.dataset and a.config:
        ap.error("give --dataset or --config, not both")
    dataset = a.dataset or ("digits" if a.config is None else None)
    config = DATASETS[dataset] if dataset else a.config
    known = all_methods()
    methods = known if a.methods == ["all"] else (list(CORE) if a.methods == ["core"] else
                                                  list(scale_set(dataset)) if a.methods == ["scale"] else a.methods)
    bad = [m for m in methods if m not in known]
    if bad:
        ap.error(f"unknown --methods {bad}; choose from {known} or all")
    for e in a.epsilons:
        if e != "none":
            try:
                ok = 0 < float(e) < float("inf")
            except ValueError:
                ok = False
            if not ok:
                ap.error(f"--epsilons {e!r}: give finite positive numbers or none")
    if a.jobs < 1:
        ap.error(f"--jobs must be ≥ 1, got {a.jobs}")
    full = (a.methods in (["all"], ["core"], ["scale"]) and a.epsilons == ["1", "4", "8", "none"] and sorted(a.seeds) == [0, 1, 2]
            and not a.extra and a.config is None)
    if not full and a.readme:
        ap.error("--readme needs the full grid (--methods all or core, default --epsilons/--seeds, no --set or "
                 "--config): the README shows every method of the set")
    if not full and a.results is None:
        a.results = str(Path(a.out or "runs/bench-utility-slice") / "results")  # a slice never overwrites the committed tables
    out = Path(a.out or f"runs/bench-utility{'' if dataset in (None, 'digits') else '-' + dataset}")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "rows.jsonl"
    name = "utility" if dataset in (None, "digits") else f"utility-{dataset}"
    done: dict[str, dict] = {}
    if log.exists() and not a.fresh:
        for line in log.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if "error" not in r:
                    done[r["key"]] = r
    if a.reuse_results:
        committed = ROOT / "benchmarks" / "results" / f"{name}.json"
        if not committed.exists():
            ap.error(f"--reuse-results: {committed} does not exist")
        recorded = json.loads(committed.read_text())
        when = re.match(r"_(\d{4}-\d{2}-\d{2})", recorded["header"])
        for r in recorded["rows"]:
            if "error" not in r and r["key"] not in done:
                done[r["key"]] = {"measured": when.group(1) if when else "an earlier run", **r}
    # secure aggregation splits the noise of a private release: without DP there is none (train refuses
    # the pair), so the +secagg rows have no "no DP" cell
    grid = [(config, m, e, s, out, a.extra) for e in a.epsilons for m in methods for s in a.seeds
            if not (e == "none" and m.endswith(SECAGG))]
    trained: dict[str, dict] = {}  # --resynthesize: the recorded rows whose jobs run again from their models
    today = time.strftime("%Y-%m-%d")
    for g in grid:
        key = job_key(*g[1:4], g[5])
        r = done.get(key)
        if g[1] in a.resynthesize and r is not None and r.get("resynthesized") != today:
            trained[key] = done.pop(key)
        if (g[1] in a.rerun or f"{g[1]}:{g[2]}" in a.rerun) and r is not None and r.get("measured") != today:
            done.pop(key)  # measured again: a default of this method changed since that row
            job = out / Path(run_folder(*g[1:4], g[5])).name
            if job.exists():  # the job would resume its finished run (the same job settings): moved aside
                stale = job.with_name(job.name + ".stale")
                shutil.rmtree(stale, ignore_errors=True)
                job.rename(stale)
    todo = [g for g in grid if job_key(*g[1:4], g[5]) not in done]
    print(f"{len(grid)} jobs, {len(grid) - len(todo)} already in {log}"
          + (" or the committed results" if a.reuse_results else "") + f", {len(todo)} to run", flush=True)
    t0 = time.perf_counter()
    errors = []

    def record(r: dict) -> None:
        if r["key"] in trained and "error" not in r:  # the training run's cost, today's synthesis and evaluation
            r = {**r, **{k: trained[r["key"]].get(k) for k in COST_KEYS}, "resynthesized": today}
        with log.open("a") as f:
            f.write(json.dumps(r) + "\n")
        if "error" in r:
            errors.append(r)
            print(f"FAILED {r['method']} ε={r['eps_target']} seed {r['seed']}:\n{r['error']}", file=sys.stderr, flush=True)
        else:
            done[r["key"]] = r
            print(f"[{len(done)}/{len(grid)} {time.perf_counter() - t0:.0f} s] {r['method']} ε={r['eps_target']} "
                  f"seed {r['seed']}: TSTR {r['tstr_accuracy']:.3f}, MMD² {r['mmd2']:.3f}, "
                  f"{r['wall_s']:.0f} s", flush=True)

    if a.jobs > 1 and todo:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(a.jobs, initializer=_one_thread, max_tasks_per_child=1) as ex:  # peak RSS per job
            for fut in as_completed([ex.submit(_run_star, g) for g in todo]):
                record(fut.result())
    else:
        for g in todo:
            record(run_one(*g))
    rows = [done[job_key(*g[1:4], g[5])] for g in grid if job_key(*g[1:4], g[5]) in done]
    threads = f"{a.jobs} processes × 1 thread" if a.jobs > 1 else f"{torch.get_num_threads()} threads"
    # the grid, not the flags that only say where to write: rerunning with --readme keeps the header
    cmd = "benchmarks/utility.py" + (f" --dataset {dataset}" if dataset not in (None, "digits") else "") + (
        f" --methods {a.methods[0]}" if a.methods in (["core"], ["scale"]) else "") + ("" if full else " " + " ".join(sys.argv[1:]))
    where = machines_note(rows, threads)
    dates: dict[str, int] = {}
    for r in rows:
        dates[r.get("measured", today)] = dates.get(r.get("measured", today), 0) + 1
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r.get("embedding_dtype") or "not recorded"] = kinds.get(r.get("embedding_dtype") or "not recorded", 0) + 1
    if len(kinds) > 1:
        where += "; embeddings computed in " + ", ".join(f"{d} ({n} rows)" for d, n in sorted(kinds.items()))
    if set(dates) != {today}:
        where += "; rows measured " + ", ".join(f"{d} ({n})" for d, n in sorted(dates.items())) + (
            " (`--reuse-results`: the committed rows, the missing cells run)" if a.reuse_results else "")
    again = sorted({r["method"] for r in rows if r.get("resynthesized")})
    if again:
        where += (f"; the rows of {', '.join(again)} synthesized and evaluated again on "
                  f"{max(r['resynthesized'] for r in rows if r.get('resynthesized'))} from their trained models "
                  "(`--resynthesize`: cost columns from the training run)")
    head = (f"_{time.strftime('%Y-%m-%d')}, {where}; "
            f"{DESCRIPTION.get(dataset, f'config {config}')}; `{cmd}`; {len(rows)} jobs; "
            + (f"methods: the core set ({', '.join(CORE)}; the other ablations are in the digits grid); "
               if a.methods == ["core"] else "")
            + (f"methods: the scale set ({', '.join(scale_set(dataset))}); " if a.methods == ["scale"] else "") +
            f"synthetic = the job's `synthesis.per_class = auto` (300 per class from a DP model of L = 64, 3,000 from a larger "
            f"one) with `model.latent = auto` (under DP L = 64 below 500 training records per class, L = 128 from 500; L = D "
            f"without DP); code `mixture` for {', '.join(m for m in methods if code_for(m) == 'mixture')}; "
            f"`neutral` for the others), tested on the held-out real test split_")
    md = (head + "\n\nTSTR accuracy (a classifier trained on the synthetic embeddings only, tested on real ones; "
          "higher is better):\n\n" + matrix(rows, methods, "tstr_accuracy", True)
          + "\n\nMMD² to the real test embeddings (lower is better):\n\n" + matrix(rows, methods, "mmd2", False)
          + "\n\nReferences (same data, ε and seeds; they do not depend on the method):\n\n"
          + reference_table(rows) + "\n")
    full = "\nEvery figure (mean ± std over seeds):\n\n" + table(rows, methods) + "\n"
    res = Path(a.results or ROOT / "benchmarks" / "results")
    print(f"results → {res}", flush=True)
    res.mkdir(parents=True, exist_ok=True)
    (res / f"{name}.json").write_text(json.dumps({"header": head, "rows": rows}, indent=1) + "\n")
    extra = [t for t in (cost_table(rows, methods), client_table(rows, methods)) if t]
    (res / f"{name}.md").write_text(md + full + "".join("\n" + t + "\n" for t in extra))
    print(md)
    if a.readme and dataset:
        readme = ROOT / "README.md"
        text = readme.read_text()
        tag = "utility" if dataset == "digits" else f"utility-{dataset}"
        new, n = re.subn(rf"(<!-- {tag}:start -->\n).*?(<!-- {tag}:end -->)", lambda m_: m_.group(1) + md + m_.group(2),
                         text, flags=re.S)
        if n != 1:
            sys.exit(f"README.md has no <!-- {tag}:start --> … <!-- {tag}:end --> block")
        readme.write_text(new)
    if errors:
        sys.exit(f"{len(errors)} jobs failed (see above); rerun the same command to retry them")


if __name__ == "__main__":
    main()
