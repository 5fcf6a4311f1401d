"""Without DP: the latent size (the rank cap of the decoder's linear-Gaussian path) × the synthetic set's size.

Chooses ``model.latent = "auto"`` (L = D without DP) and ``synthesis.per_class = "auto"`` (3,000 per class from a
model trained without DP). Ours (``fedhypevae``, the job's ``mixture`` code, every other default) is trained
without DP on the bundled digits job and on ``configs/fashion-mnist.toml`` (partition seed = train seed =
synthesis seed = seed) at L = 64 (the DP default) and L = D = 384 (full rank), and each model is sampled at
300, 1,000 and 3,000 per class; a linear probe on the synthetic set is scored on the **validation** split
(the test split is not read). Under DP the release resolves far fewer than 64 directions
(benchmarks/results/class_covariance.md), so the DP default stays L = 64 and 300 per class
(benchmarks/results/synthetic_size.md).

Each finished (dataset, seed, L) is appended to ``runs/bench-no-dp-rank/rows.jsonl``; a rerun skips the rows
already there. Writes ``benchmarks/results/no_dp_rank.{json,md}`` and prints the table.

    .venv/bin/python benchmarks/no_dp_rank.py          # 2 datasets × 3 seeds × 2 sizes (~8 min on 1 core)
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
sys.path.insert(0, str(ROOT / "benchmarks"))
LATENTS = (64, 384)
SIZES = (300, 1000, 3000)


def rows_of(name: str, seed: int, latent: int, store, part, config) -> list[dict]:
    """Train ours without DP at latent size ``latent``; validation TSTR at every synthetic size."""
    import numpy as np

    from fedhype.eval.inputs import as_matrix
    from fedhype.eval.utility import Probe
    from fedhype.federated.engine import train
    from fedhype.pipeline.config import resolve, train_config
    from fedhype.synthesis import synthesize

    val = part.split_store(store, "val")
    t = time.perf_counter()
    cfg = train_config(resolve(config, [f"train.seed={seed}", "train.epsilon=none", "train.no_dp=true", f"model.latent={latent}"]))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        train(store, part, cfg, Path(tmp) / "run", diagnostics=False)
        train_s = time.perf_counter() - t
        for n in SIZES:
            syn = synthesize(Path(tmp) / "run", "mixture", per_class=n, seed=seed)
            probe = Probe(store.n_classes).fit(as_matrix(syn).numpy(), syn.labels.numpy())
            acc = float(np.mean(probe.predict(as_matrix(val).numpy()) == val.labels.numpy()))
            out.append({"dataset": name, "seed": seed, "latent": latent, "per_class": n, "val_tstr": acc, "train_s": train_s})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["digits", "fashion"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()

    import torch

    import release_defaults as rd

    torch.set_num_threads(1)
    log = ROOT / "runs" / "bench-no-dp-rank" / "rows.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    t0, ran = time.perf_counter(), 0
    for name in a.datasets:
        loaded = None
        for seed in a.seeds:
            for latent in LATENTS:
                if any(r["dataset"] == name and r["seed"] == seed and r["latent"] == latent for r in rows):
                    continue
                loaded = loaded or rd.data(name)
                new = rows_of(name, seed, latent, loaded[0], loaded[1](seed), rd.CONFIGS[name])
                ran += 1
                rows += new
                with log.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in new)
                print(" ".join(f"{r['dataset']} seed {seed} L={latent} {r['per_class']}/class: {r['val_tstr']:.3f}" for r in new),
                      flush=True)
    groups: dict = {}
    for r in rows:
        if r["dataset"] in a.datasets and r["seed"] in a.seeds:
            groups.setdefault((r["dataset"], r["latent"]), {}).setdefault(r["per_class"], []).append(r)
    lines = [f"_{datetime.date.today()}, {platform.machine()} CPU, one thread; `benchmarks/no_dp_rank.py` ({ran} models trained "
             f"by this call in {time.perf_counter() - t0:.0f} s, the others recorded in {log.relative_to(ROOT)}); ours "
             f"(fedhypevae, code mixture) **without DP**, seeds {a.seeds}; TSTR of a linear probe on the **validation** split "
             "(the test split is not read); the defaults (L = D and 3,000 per class without DP) in bold_", "",
             "| dataset | latent L | " + " | ".join(f"{n} per class" for n in SIZES) + " | training time |",
             "|---|---|" + "---|" * (len(SIZES) + 1)]
    for (name, latent), by_size in sorted(groups.items()):
        cells = []
        for n in SIZES:
            v = [r["val_tstr"] for r in by_size.get(n, [])]
            c = (f"{st.fmean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}") if v else "–"
            cells.append(f"**{c}**" if latent != 64 and n == 3000 else c)
        secs = st.fmean(r["train_s"] for r in by_size[SIZES[0]])
        lines.append(f"| {name} | {latent}{' (= D)' if latent == 384 else ''} | " + " | ".join(cells) + f" | {secs:.0f} s |")
    md = "# Without DP: latent size × synthetic set size (validation split)\n\n" + "\n".join(lines) + "\n"
    out = Path(a.results)
    (out / "no_dp_rank.json").write_text(json.dumps({"rows": rows}, indent=1))
    (out / "no_dp_rank.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
