"""The release's settings at realistic scale: validation-split TSTR, never the test split.

The defaults of the one-shot release were chosen on the bundled digits job (about 4,100 training
records; ``benchmarks/results/release_defaults.md``). On all 70,000 Fashion-MNIST images
(``configs/fashion-mnist-full.toml``, about 42,000 training records, ~4,200 per class) the class means
come from ten times the records, and what limits the release alone at ε = 1 is the noise on the second
moment (``benchmarks/results/class_covariance.md``); under secure aggregation that noise is √m smaller
again. Two grids, each row training with ``fedhype.federated.engine.train`` (the dataset's job defaults
plus the row's overrides) and scoring a linear probe trained on the synthetic embeddings on the
**validation** split:

* ``c2`` — ``train.second_moment_share`` (c² of :class:`fedhype.privacy.dp_step.ReleaseWeights`, the
  share of the release's unit L2 sensitivity given to the second moment; the class sums get
  1 − c² − 0.04) ∈ {0.3 (default), 0.5, 0.7}, for ``dp-gaussian`` (the release alone), per-client
  releases and ``--secure-aggregation``, ε = 1 / 4, on ``fashion-full`` and ``digits``; 300 synthetic
  per class;
* ``residual`` — at L = 128 and 3,000 per class, ``model.residual`` ∈ {auto, latent, located}
  (:func:`fedhype.federated.covariance.covariance_estimate`), the same ε and releases;
* ``small`` — that setting (L = 128, 3,000 per class, latent residual) against the defaults on ``digits`` and
  ``fashion`` (10,000 images), ε = 1 / 4 / 8, both releases;
* ``ours`` — the same two settings for ``fedhypevae`` (the job's ``mixture`` code) on ``digits`` and ``fashion``,
  ε = 1 / 4 / 8, per-client releases;
* ``rank`` — the model's latent size L (``model.latent``: the directions of the DP covariance the
  model keeps; 64 under DP by default) × the synthetic records per class (``synthesis.per_class``: 300
  under DP by default) for ``dp-gaussian`` on ``fashion-full``, ε = 1 / 4 / 8, both releases. Without
  DP, L = D and 3,000 per class lift the same Gaussian from 0.799 to 0.826
  (``class_covariance.md``); does any of it survive the noise of a pooled release?
* ``share`` — ``train.class_stats_share`` ∈ {0.95 (default), 0.85, 0.7} for ours (mixture code) at the scale
  rule's setting on ``fashion-full``, ε = 1 / 4 / 8: at L = 128 the DP-SGD stage adds something (test split,
  +0.005 to +0.014 over the release alone); would a larger share of ε add more? (seed 0 so far: no at
  ε = 1 / 4, +0.003 at ε = 8, within a seed's noise; the default stays)
* ``radius`` — the clip radius κ of the centred release (``train.release_radius``) ∈ {0.6, 0.8 (default), 1.0,
  1.2} for ``dp-gaussian`` at the scale rule's setting on ``fashion-full``, ε = 1 / 4 / 8 (κ was chosen on digits;
  seeds 0 and 1: 0.8 is best at ε = 1 / 4, κ = 1.0 gains +0.006 at ε = 8 only; the default stays, one radius for
  every ε);

Each finished row is appended to ``runs/bench-release-scale/rows.jsonl``; a rerun skips the rows
already there. Writes ``benchmarks/results/release_scale.{json,md}`` (mean ± std over seeds).

    .venv/bin/python benchmarks/release_scale.py                     # both grids, 3 seeds
    .venv/bin/python benchmarks/release_scale.py --grids rank --seeds 0
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics as st
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]

SHARES = (0.3, 0.5, 0.7)
RANKS = ((64, 300), (64, 3000), (128, 300), (128, 3000), (192, 3000))
RESIDUALS = ("auto", "latent", "located")
SHARES_SGD = (0.95, 0.85, 0.7)
RADII = (0.6, 0.8, 1.0, 1.2)
_SA = ({}, {"secure_aggregation": True})
GRIDS: dict[str, list[tuple[str, str, dict]]] = {
    "c2": [(d, e, {"method": "dp-gaussian", "second_moment_share": s, **sa})
           for d in ("fashion-full", "digits") for e in ("1", "4") for sa in _SA for s in SHARES],
    "rank": [("fashion-full", e, {"method": "dp-gaussian", "latent": lat, "per_class": pc, **sa})
             for e in ("1", "4", "8") for sa in _SA for lat, pc in RANKS],
    # where L = 128 and 3,000 per class lost (secure aggregation, ε ≥ 4), model.residual = "auto" had put the
    # unlocated variance on the located directions (the release resolves more than half of L there)
    "residual": [("fashion-full", e, {"method": "dp-gaussian", "latent": 128, "per_class": 3000, "residual": r, **sa})
                 for e in ("1", "4", "8") for sa in _SA for r in RESIDUALS],
    # the same setting on the smaller datasets (digits ~4,100, Fashion-MNIST 10,000 ~6,000 training records),
    # where the release resolves 3–13 directions: does a rule keyed on scale need to leave them alone?
    "small": [(d, e, {"method": "dp-gaussian", **st_, **sa}) for d in ("digits", "fashion") for e in ("1", "4", "8")
              for sa in _SA for st_ in ({}, {"latent": 128, "per_class": 3000, "residual": "latent"})],
    # 100 clients of ~420 training records each (configs/fashion-mnist-full-100.toml): the same 4,200 records per
    # class as 10 clients, so the scale rule of model.latent = "auto" (docs/method.md, decision 17) gives them
    # L = 128 too, but each per-client release adds its own noise: does L = 128 still pay?
    "clients": [("fashion-full-100", e, {"method": "dp-gaussian", **st_, **sa}) for e in ("1", "4", "8")
                for sa in _SA for st_ in ({}, {"latent": 128, "per_class": 3000, "residual": "latent"})],
    # and for ours (fedhypevae with the job's mixture code: DP-SGD trains a model of twice the latent size)
    "ours": [(d, e, {"code": "mixture", **st_}) for d in ("digits", "fashion") for e in ("1", "4", "8")
             for st_ in ({}, {"latent": 128, "per_class": 3000, "residual": "latent"})],
    # the DP-SGD stage's share of ε at scale: train.class_stats_share = 0.95 was chosen on digits and Fashion-MNIST
    # 10,000 at L = 64, where DP-SGD added nothing measurable; at L = 128 on 42,000 records it adds +0.005 to +0.014
    # (test split): would it add more with more of ε?
    # the clip radius κ of the centred release (train.release_radius, docs/method.md decision 12) was chosen on digits
    # (~410 records per class): with ten times the records per class the noise is smaller against the signal, so
    # less clipping (a larger κ) may pay at scale
    "radius": [("fashion-full", e, {"method": "dp-gaussian", "latent": 128, "per_class": 3000, "residual": "latent",
                                    "release_radius": k}) for e in ("1", "4", "8") for k in RADII],
    "share": [("fashion-full", e, {"code": "mixture", "latent": 128, "per_class": 3000, "residual": "latent",
                                   "class_stats_share": s}) for e in ("1", "4", "8") for s in SHARES_SGD],
}


def _cell(v: list[float]) -> str:
    return f"{st.mean(v):.3f} ± {st.stdev(v) if len(v) > 1 else 0.0:.3f}" + ("" if len(v) == 3 else f" ({len(v)})")


def table(rows: list[dict], grid: str, seeds: list[int]) -> list[str]:
    rows = [r for r in rows if r["grid"] == grid and r["seed"] in seeds]
    if grid == "c2":
        cols, keys = [f"c² = {s}" + (" (default)" if s == 0.3 else "") for s in SHARES], list(SHARES)
    elif grid == "rank":
        cols = [f"L = {lat}, {pc:,}/class" + (" (default)" if (lat, pc) == (64, 300) else "") for lat, pc in RANKS]
        keys = [f"{lat}/{pc}" for lat, pc in RANKS]
    elif grid == "radius":
        cols, keys = [f"κ = {v}" + (" (default)" if v == 0.8 else "") for v in RADII], list(RADII)
    elif grid == "share":
        cols = [f"class_stats_share = {v}" + (" (default)" if v == 0.95 else "") for v in SHARES_SGD]
        keys = list(SHARES_SGD)
    elif grid == "residual":
        cols, keys = [f"residual {r}" + (" (default)" if r == "auto" else "") for r in RESIDUALS], list(RESIDUALS)
    else:  # "small", "ours", "clients"
        cols, keys = ["defaults (L = 64, 300/class, residual auto)", "L = 128, 3,000/class, residual latent"], \
            ["default", "l128"]
    groups: dict = {}
    for r in rows:
        o = r["overrides"]
        k = o["second_moment_share"] if grid == "c2" else o["class_stats_share"] if grid == "share" else o["release_radius"] if grid == "radius" else o["residual"] if grid == "residual" else \
            ("l128" if "latent" in o else "default") if grid in ("small", "ours", "clients") else f"{o['latent']}/{o['per_class']}"
        groups.setdefault((r["dataset"], int(r["eps"]), bool(o.get("secure_aggregation"))), {}).setdefault(k, []).append(r["val_tstr"])
    out = ["| dataset | ε | release | " + " | ".join(cols) + " |", "|---|---|---|" + "---|" * len(cols)]
    for (name, eps, sa), by in sorted(groups.items()):
        best = max(by, key=lambda k: st.mean(by[k]))
        cells = [(f"**{_cell(by[k])}**" if k == best else _cell(by[k])) if k in by else "–" for k in keys]
        out.append(f"| {name} | {eps} | {'secure aggregation' if sa else 'per client'} | " + " | ".join(cells) + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--grids", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()

    import torch

    from release_defaults import CONFIGS, data, val_tstr  # benchmarks/release_defaults.py (one TSTR-val rule)

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    log = ROOT / "runs" / "bench-release-scale" / "rows.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    done = {json.dumps([r["grid"], r["dataset"], r["eps"], r["overrides"], r["seed"]]) for r in rows}
    loaded: dict = {}
    ran = 0
    for seed in a.seeds:
        parts: dict = {}
        for grid in a.grids:
            for name, eps, ov in GRIDS[grid]:
                key = json.dumps([grid, name, eps, ov, seed])
                if key in done:
                    continue
                if name not in loaded:
                    loaded[name] = data(name)
                if name not in parts:
                    parts[name] = loaded[name][1](seed)
                t = time.perf_counter()
                acc = val_tstr(loaded[name][0], parts[name], ov, eps, seed, CONFIGS[name])
                ran += 1
                row = {"grid": grid, "dataset": name, "eps": eps, "overrides": ov, "seed": seed, "val_tstr": acc,
                       "seconds": round(time.perf_counter() - t, 1)}
                rows.append(row)
                done.add(key)
                with log.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{grid} {name} ε={eps} {ov} seed {seed}: TSTR-val {acc:.3f} ({row['seconds']} s)", flush=True)
    lines = ["# The release's settings at realistic scale (validation split)", "",
             f"_{datetime.date.today()}, {platform.machine()} CPU, one thread; `benchmarks/release_scale.py` "
             f"({ran} rows run now, {time.perf_counter() - t0:.0f} s); seeds {a.seeds} (partition seed = noise seed); "
             "`dp-gaussian` (the release alone, neutral code, every other default of the dataset's job, L = 64 unless a "
             "column sets it: the rows predate the scale rule of `model.latent = \"auto\"`); TSTR of a "
             "linear probe on the synthetic embeddings, scored on the **validation** split (the test split is not "
             "read); mean ± std over 3 seeds unless (n) says; the best of each row in bold_", "",
             "**c²**, the second moment's share of the release's sensitivity (300 synthetic per class):", "",
             *table(rows, "c2", a.seeds), "",
             "**Latent size L × synthetic records per class** (c² = 0.3, `model.residual = \"auto\"`):", "",
             *table(rows, "rank", a.seeds), "",
             "**Where the unlocated variance goes at L = 128, 3,000 per class** (`model.residual`; when these rows ran, "
             "`auto` was `located` where the release resolves at least half of L, else `latent`; from these rows it is "
             "`latent` at every L above 64):", "", *table(rows, "residual", a.seeds), "",
             "**The same setting on the smaller datasets** (digits: the bundled job; fashion: 10,000 images):", "",
             *table(rows, "small", a.seeds), "",
             "**Ours** (`fedhypevae`, the job's mixture code, per-client releases; the rows of 2026-12-04 ran on a "
             "16-core machine, one process per job, with this script's TSTR-val function — a digits row rerun here "
             "gave the same figure to the last digit):", "", *table(rows, "ours", a.seeds), "",
             "**100 clients** (`configs/fashion-mnist-full-100.toml`: the same 70,000 images, about 420 training records "
             "per client; the release alone; \"defaults\" here is the rule before the scale rule — L = 64, 300 per "
             "class — which the rows of the other tables call defaults):", "", *table(rows, "clients", a.seeds), "",
             "**The DP-SGD stage's share of ε at scale** (ours, mixture code, per-client releases, L = 128, 3,000 per "
             "class, residual latent — the scale rule's setting; `train.class_stats_share` is the release's share, "
             "DP-SGD gets the rest):", "", *table(rows, "share", a.seeds), "",
             "**The clip radius κ at scale** (`train.release_radius`, the release alone, per-client releases, L = 128, "
             "3,000 per class, residual latent):", "", *table(rows, "radius", a.seeds)]
    md = "\n".join(lines) + "\n"
    out = Path(a.results)
    (out / "release_scale.md").write_text(md)
    (out / "release_scale.json").write_text(json.dumps(
        {"date": str(datetime.date.today()), "rows": sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))},
        indent=1) + "\n")
    print(md)


if __name__ == "__main__":
    main()
