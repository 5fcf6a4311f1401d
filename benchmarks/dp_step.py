"""DP step vs non-DP step of the same FedHypeVAE model, measured in the same run.

Prints ms/step, samples/s, the ratio to the non-DP step, and peak memory for:
  * non-DP: one batched forward + backward of the mean loss (the baseline);
  * DP, book-keeping clipping (fedhype's default path);
  * DP, torch.func vmap(grad) per-example gradients (the reference path).
Writes benchmarks/results/dp_step.json. CPU always; CUDA too when available.

    .venv/bin/python benchmarks/dp_step.py [--dim 384] [--batch 64] [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from fedhype.models.config import ModelConfig
from fedhype.models.cvae import init_local_encoder
from fedhype.models.hypernet import HyperNetwork
from fedhype.models.losses import make_batch_loss, make_per_example_loss
from fedhype.privacy.bookkeeping import clipped_sum_bookkeeping
from fedhype.privacy.dp_step import clip_and_sum, per_example_grads


def setup(dim: int, batch: int, device: str):
    cfg = ModelConfig(dim=dim, n_classes=10)
    g = torch.Generator().manual_seed(0)
    hnet = HyperNetwork(cfg, g)
    theta = {k: v.detach() for k, v in hnet(torch.randn(cfg.code_dim, generator=g)).items()}
    psi = init_local_encoder(cfg, g)
    params = {**{f"shared.{k}": v.to(device) for k, v in theta.items()}, **{f"local.{k}": v.to(device) for k, v in psi.items()}}
    y = torch.randint(0, 10, (batch,), generator=g)
    b = (torch.randn(batch, dim, generator=g), F.one_hot(y, 10).float(), torch.randn(batch, cfg.latent, generator=g),
         torch.randn(batch, cfg.mmd_samples, cfg.latent, generator=g))
    return cfg, params, tuple(t.to(device) for t in b)


def timeit(fn, repeats: int, device: str) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeats


def bench(device: str, dim: int, batch: int, repeats: int) -> dict:
    cfg, params, b = setup(dim, batch, device)
    per_ex, batched = make_per_example_loss(cfg), make_batch_loss(cfg)

    def nodp():
        p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        torch.autograd.grad(batched(p, None, *b).mean(), list(p.values()))

    def book():
        clipped_sum_bookkeeping(batched, params, b, 1.0)

    def vmap_path():
        clip_and_sum(per_example_grads(per_ex, params, b), 1.0)

    out = {"device": device, "dim": dim, "batch": batch, "parameters": sum(v.numel() for v in params.values())}
    paths = (("nodp", nodp), ("dp_bookkeeping", book), ("dp_vmap", vmap_path))
    # interleaved rounds, median per path: robust to load changes on a shared machine
    samples: dict[str, list[float]] = {name: [] for name, _ in paths}
    for _ in range(repeats):
        for name, fn in paths:
            samples[name].append(timeit(fn, 1, device))
    med = {name: sorted(v)[len(v) // 2] for name, v in samples.items()}
    for name, _ in paths:
        s = med[name]
        out[name] = {"ms_per_step": 1000 * s, "samples_per_s": batch / s, "ratio_to_nodp": s / med["nodp"]}
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=Path(__file__).parent / "results", help="folder for the JSON")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    results = [bench("cpu", args.dim, args.batch, args.repeats)]
    if torch.cuda.is_available():
        results.append(bench("cuda", args.dim, 256, args.repeats * 5))
    print(f"{'device':6} {'path':16} {'ms/step':>9} {'samples/s':>10} {'× non-DP':>9}")
    for r in results:
        for name in ("nodp", "dp_bookkeeping", "dp_vmap"):
            x = r[name]
            print(f"{r['device']:6} {name:16} {x['ms_per_step']:9.1f} {x['samples_per_s']:10.0f} {x['ratio_to_nodp']:9.2f}")
        print(f"{r['device']}: {r['parameters']} parameters, batch {r['batch']}, peak RSS {r['peak_rss_mb']:.0f} MB")
    path = args.results / "dp_step.json"
    path.write_text(json.dumps({"machine": f"{platform.machine()} {torch.get_num_threads()} threads",
                                "date": time.strftime("%Y-%m-%d"), "results": results}, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
