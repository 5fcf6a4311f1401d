"""An option chosen on validation, on the test split: a ``benchmarks/utility.py`` slice against the grid's rows.

An option that the validation benchmarks favour (for instance ``model.located_share``, chosen in
``benchmarks/residual_tradeoff.py``) is run once through the utility grid's own jobs with ``--set`` into a
separate folder; this puts each of those rows beside the committed grid row of the same method, target ε
and seed (the default settings), so the option's test-split cost or gain is read per seed, not only in the
mean. Nothing is chosen here: the test split only reports what validation chose. (``model.located_share = 0.8``
later became part of the default, ``"auto"``, where the release's class means are precise: in those cells the
grid's rows now are this slice's rows; tests/benchmarks/test_readme_tables.py checks it.)

    .venv/bin/python benchmarks/utility.py --dataset digits --methods fedhypevae dp-gaussian --epsilons 4 8 \\
        --set model.located_share=0.8 --out runs/bench-share08-digits
    .venv/bin/python benchmarks/option_test.py --name located-share-0.8 --label "model.located_share = 0.8" \\
        --slice digits=runs/bench-share08-digits fashion=runs/bench-share08-fashion

Reads ``<slice>/rows.jsonl`` and ``benchmarks/results/utility[-dataset].json``; writes
``benchmarks/results/option-<name>.{json,md}`` (the json keeps both sides' rows, so the table can be rebuilt
without the job folders) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics as st
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLS = ("tstr_accuracy", "precision", "coverage", "recall", "mmd2")


def grid_file(dataset: str) -> Path:
    """The committed utility grid of a dataset (``utility.json`` for the bundled digits job)."""
    return ROOT / "benchmarks" / "results" / ("utility.json" if dataset == "digits" else f"utility-{dataset}.json")


def pairs(dataset: str, slice_rows: list[dict], grid_rows: list[dict]) -> list[dict]:
    """Each slice row with the grid row of the same (method, target ε, seed) and no extra settings.

    Raises:
        SystemExit: a slice row without its grid row (the grid was not run for that cell).
    """
    grid = {(r["method"], r["eps_target"], r["seed"]): r for r in grid_rows if not r.get("extra")}
    out = []
    for r in slice_rows:
        k = (r["method"], r["eps_target"], r["seed"])
        if k not in grid:
            raise SystemExit(f"{grid_file(dataset)} has no row for {k}: run the grid's cell first")
        out.append({"dataset": dataset, "option": r, "grid": grid[k]})
    return out


def table(rows: list[dict], label: str) -> str:
    """Markdown: per (dataset, method, ε) the grid's and the option's means and the per-seed TSTR change."""
    groups: dict = {}
    for p in rows:
        o = p["option"]
        groups.setdefault((p["dataset"], o["method"], o["eps_target"]), []).append(p)
    lines = [f"| dataset | method | target ε | TSTR, default | TSTR, {label} | per seed | precision / coverage / recall, "
             "default | with the option | MMD², default → option | seeds |", "|---|---|---|---|---|---|---|---|---|---|"]

    def mean(ps, side, c):
        return st.fmean(p[side][c] for p in ps)

    def pm(ps, side):
        v = [p[side]["tstr_accuracy"] for p in ps]
        return f"{st.fmean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}"

    for (d, m, e), ps in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "fedhypevae", kv[0][2])):
        ps = sorted(ps, key=lambda p: p["option"]["seed"])
        seeds = " / ".join(f"{p['option']['tstr_accuracy'] - p['grid']['tstr_accuracy']:+.3f}" for p in ps)
        prc = [" / ".join(f"{mean(ps, side, c):.3f}" for c in ("precision", "coverage", "recall")) for side in ("grid", "option")]
        lines.append(f"| {d} | {m} | {e} | {pm(ps, 'grid')} | {pm(ps, 'option')} | {seeds} | {prc[0]} | {prc[1]} | "
                     f"{mean(ps, 'grid', 'mmd2'):.4f} → {mean(ps, 'option', 'mmd2'):.4f} | {len(ps)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True, help="file name: benchmarks/results/option-<name>.{json,md}")
    ap.add_argument("--label", required=True, help="the option as the table names it")
    ap.add_argument("--slice", nargs="+", required=True, metavar="DATASET=FOLDER",
                    help="utility.py --out folders run with the option, one per dataset")
    a = ap.parse_args()
    rows, sources = [], []
    for item in a.slice:
        dataset, sep, folder = item.partition("=")
        log = ROOT / folder / "rows.jsonl"
        if not sep or not log.exists():
            ap.error(f"--slice {item!r}: give DATASET=FOLDER with a FOLDER/rows.jsonl from benchmarks/utility.py --out")
        got = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        rows += pairs(dataset, got, json.loads(grid_file(dataset).read_text())["rows"])
        extra = sorted({" ".join(r.get("extra", [])) for r in got})
        sources.append(f"{dataset}: `{folder}` (`--set {' | '.join(extra)}`) against "
                       f"`{grid_file(dataset).relative_to(ROOT)}`")
    md = (f"# {a.label} on the test split, against the utility grid's rows (same seeds)\n\n"
          f"_{datetime.date.today()}; `benchmarks/option_test.py`; the option's rows from `benchmarks/utility.py` "
          f"run with it; the default's from the committed grid; held-out real test split. {'; '.join(sources)}_\n\n"
          + table(rows, a.label))
    out = ROOT / "benchmarks" / "results"
    (out / f"option-{a.name}.json").write_text(json.dumps({"label": a.label, "pairs": rows}, indent=1))
    (out / f"option-{a.name}.md").write_text(md)  # not with_suffix: a name may hold a dot ("located-share-0.8")
    print(md)


if __name__ == "__main__":
    main()
