"""The privacy–utility curves of the committed utility grids: TSTR and MMD² against ε, ours beside the baselines.

Reads ``benchmarks/results/utility.json`` (digits domains) and, when present,
``benchmarks/results/utility-fashion.json`` (both written by ``benchmarks/utility.py``; nothing is
rerun here) and draws, for each, the mean over seeds with the std as error bars at ε = 1 / 4 / 8 and
without DP (the right-most point): ``fedhypevae`` (ours), ``dp-gaussian``, ``local-cvae``,
``central-cvae`` (a trusted curator, not a federated method), ``fedhypevae+secagg`` where measured,
and the DP-SGD FedAvg linear classifier trained on the real embeddings at the same ε (TSTR panel
only), with the real-data TRTR and chance as horizontal lines. Writes
``benchmarks/results/privacy_utility.png``.

    .venv/bin/python benchmarks/privacy_utility_plot.py
"""

from __future__ import annotations

import json
import statistics as st
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EPS = ["1", "4", "8", "none"]
SHOWN = {"fedhypevae": ("ours (fedhypevae)", "tab:blue", "o"), "dp-gaussian": ("dp-gaussian", "tab:orange", "s"),
         "local-cvae": ("local-cvae", "tab:green", "^"), "central-cvae": ("central-cvae (trusted curator)", "tab:gray", "v"),
         "fedhypevae+secagg": ("ours + secure aggregation", "tab:purple", "D")}


def series(rows: list[dict], method: str, key: str) -> tuple[list[float], list[float]]:
    mean, std = [], []
    for e in EPS:
        v = [r[key] for r in rows if r["method"] == method and str(r["eps_target"]) == e and r.get(key) is not None]
        mean.append(st.fmean(v) if v else float("nan"))
        std.append(st.stdev(v) if len(v) > 1 else 0.0)
    return mean, std


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grids = [(n, RESULTS / f) for n, f in (("digits domains", "utility.json"), ("Fashion-MNIST", "utility-fashion.json"))
             if (RESULTS / f).exists()]
    fig, axes = plt.subplots(len(grids), 2, figsize=(12, 4.2 * len(grids)), squeeze=False)
    x = list(range(len(EPS)))
    labels = ["ε = 1", "ε = 4", "ε = 8", "no DP"]
    for row, (name, path) in zip(axes, grids):
        rows = json.loads(path.read_text())["rows"]
        n_classes = 10
        for method, (label, color, marker) in SHOWN.items():
            if not any(r["method"] == method for r in rows):
                continue
            for ax, key in ((row[0], "tstr_accuracy"), (row[1], "mmd2")):
                m, s = series(rows, method, key)
                ax.errorbar(x, m, yerr=s, label=label, color=color, marker=marker, capsize=3,
                            linestyle="--" if method == "central-cvae" else "-")
        m, s = series(rows, "fedhypevae", "dp_fedavg_linear_accuracy")
        row[0].errorbar(x, m, yerr=s, label="DP-SGD linear on real (reference)", color="black", marker="x", capsize=3,
                        linestyle=":")
        trtr, _ = series(rows, "fedhypevae", "trtr_accuracy")
        row[0].axhline(st.fmean([v for v in trtr if v == v]), color="black", linewidth=0.8, label="TRTR (real data)")
        row[0].axhline(1 / n_classes, color="black", linewidth=0.8, linestyle="-.", label="chance")
        row[0].set_ylabel("TSTR accuracy (higher is better)")
        row[0].set_title(f"{name}: utility")
        row[1].set_yscale("log")
        row[1].set_ylabel("MMD² to real test (lower is better)")
        row[1].set_title(f"{name}: fidelity")
        for ax in row:
            ax.set_xticks(x, labels)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = RESULTS / "privacy_utility.png"
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
