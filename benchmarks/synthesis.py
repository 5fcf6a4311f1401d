"""Synthesis throughput: `fedhype synthesize` (store with provenance) vs the bare decoder loop.

Trains nothing: reads a run's ``model.safetensors`` (default ``runs/main/run``, written by README
command (1)) and draws ``--n`` embeddings with the neutral meta-code, (a) through
:func:`fedhype.synthesis.sample.synthesize` and (b) as a bare loop of
:func:`fedhype.models.cvae.sample` over the same θ — the baseline measured in the same run.
Writes ``benchmarks/results/synthesis.json``.

    python benchmarks/synthesis.py [--run runs/main/run] [--n 200000] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from fedhype.federated.rundir import load_model
from fedhype.models.cvae import sample
from fedhype.synthesis.sample import synthesize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path(__file__).parent / "results", help="folder for the JSON")
    ap.add_argument("--run", default="runs/main/run")
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    hnet, codes, meta = load_model(a.run)
    hnet = hnet.to(a.device).eval()
    cfg = hnet.cfg
    w = torch.tensor(meta["client_sizes"], dtype=torch.float32, device=a.device)
    code = (w[:, None] * codes.to(a.device)).sum(0) / w.sum()
    labels = torch.arange(a.n, device=a.device) % cfg.n_classes
    best = {"synthesize": 0.0, "bare decoder loop": 0.0}
    for _ in range(a.repeats):
        t = time.perf_counter()
        synthesize(a.run, "neutral", n=a.n, seed=0, device=a.device)
        best["synthesize"] = max(best["synthesize"], a.n / (time.perf_counter() - t))
        t = time.perf_counter()
        with torch.no_grad():
            theta = hnet(code)
            gen = torch.Generator(device=a.device).manual_seed(0)
            for i in range(0, a.n, 8192):
                sample(theta, labels[i:i + 8192], cfg, gen, space=hnet.space())
        best["bare decoder loop"] = max(best["bare decoder loop"], a.n / (time.perf_counter() - t))
    res = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {torch.get_num_threads()} threads",
           "device": a.device, "n": a.n, "embeddings_per_s": best,
           "ratio_to_bare_loop": best["synthesize"] / best["bare decoder loop"]}
    out = a.results / "synthesis.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    for k, v in best.items():
        print(f"{k:18} {v:12,.0f} embeddings/s")
    print(f"synthesize / bare loop: {res['ratio_to_bare_loop']:.2f}  (wrote {out})")


if __name__ == "__main__":
    main()
