"""How fast every ``fedhype COMMAND --help`` answers, beside the interpreter's own start-up and a torch import.

Each figure is the median wall time of ``--repeats`` fresh processes (``python -m fedhype.cli.main
COMMAND --help``), measured in the same run as two baselines: ``python -c pass`` (the floor any
command pays) and ``python -c "import torch"`` (what ``--help`` would cost if a command imported the
heavy libraries before parsing). Target (#20): every ``--help`` under 1 s. Writes
``benchmarks/results/cli_help.{json,md}`` and prints the table.

    .venv/bin/python benchmarks/cli_help.py              # ≈ 1 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["", "embed", "partition", "train", "synthesize", "evaluate", "budget", "audit", "prototypes",
            "prototypes train", "run"]


def wall(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()
    py = sys.executable
    floor, heavy = wall([py, "-c", "pass"], a.repeats), wall([py, "-c", "import torch"], a.repeats)
    base = {"python -c pass": floor, "python -c 'import torch'": heavy}
    rows = {f"fedhype {c} --help".replace("  ", " "): wall([py, "-m", "fedhype.cli.main", *c.split(), "--help"], a.repeats)
            for c in COMMANDS}
    worst = max(rows.values())
    lines = [f"_{datetime.date.today()}, {platform.machine()} CPU; `benchmarks/cli_help.py`, median of {a.repeats} "
             "fresh processes each_", "", "| command | wall s | × `python -c pass` |", "|---|---|---|"]
    for k, v in {**base, **rows}.items():
        lines.append(f"| `{k}` | {v:.2f} | {v / floor:.1f} |")
    lines += ["", f"Slowest `--help`: {worst:.2f} s (target < 1 s: {'met' if worst < 1 else 'NOT met'}); "
              f"importing torch alone takes {heavy:.2f} s."]
    md = "\n".join(lines) + "\n"
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cli_help.json").write_text(json.dumps({"baselines_s": base, "help_s": rows, "repeats": a.repeats,
                                                   "date": str(datetime.date.today())}, indent=1))
    (out / "cli_help.md").write_text("# `--help` latency\n\n" + md)
    print(md)


if __name__ == "__main__":
    main()
