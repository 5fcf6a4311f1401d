"""Benchmark of the `fedhype embed` pipeline against a plain loop over the same model.

Default (≈ 1 min on 2 CPU cores): 256 digits-domains images, bundled DINOv2 ViT-S/14 at its
default input size. Both paths decode, transform and encode the same images with the same
encoder; the plain loop does it sequentially in one process, the pipeline with DataLoader
workers. Prints a table and writes ``benchmarks/results/embed.json``.

``--sweep 56,84,112,168,224`` also measures, per input size, images/s and the frozen-feature
accuracy (logistic regression and 5-NN, stratified 70/30 split) on ``--sweep-n`` images: the
trade-off used to choose the default input size.

Usage: python benchmarks/embed.py [--n 256] [--encoder dinov2-vits14] [--image-size N] [--device auto]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from fedhype.data.datasets import load_builtin
from fedhype.encoders import create_encoder
from fedhype.encoders.embed import default_workers, embed_source
from fedhype.io import atomic_write_json

RESULTS = Path(__file__).resolve().parent / "results" / "embed.json"
console = Console(stderr=True)


def plain_loop(source, enc, batch_size: int) -> torch.Tensor:
    """The baseline: decode, transform and encode batch by batch in this process."""
    out = []
    for i in range(0, len(source), batch_size):
        batch = source.records[i : i + batch_size]
        out.append(enc(torch.stack([enc.transform(r.load()) for r in batch])))
    return torch.cat(out)


def _timed(fn):
    cpu0, t0 = os.times(), time.perf_counter()
    result = fn()
    wall, cpu1 = time.perf_counter() - t0, os.times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    child = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    return result, wall, cpu, child


def peak_rss_mib() -> dict[str, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"main_mib": round(own, 1), "largest_worker_mib": round(kids, 1)}


def compare(args) -> dict:
    source = load_builtin("digits-domains", limit=args.n, seed=0)
    enc = create_encoder(args.encoder, device=args.device, image_size=args.image_size)
    workers = default_workers() if args.workers is None else args.workers
    enc(torch.zeros(2, 3, enc.preprocess["crop"], enc.preprocess["crop"]))  # warm-up
    if enc.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rows = []
    ref = None
    for rep in range(args.repeats):
        emb, wall, cpu, child = _timed(lambda: plain_loop(source, enc, args.batch_size))
        rows.append({"path": "plain loop", "repeat": rep, "images_per_s": len(source) / wall, "wall_s": wall,
                     "cpu_s": cpu, "worker_cpu_s": child})
        ref = emb
        store, wall, cpu, child = _timed(lambda: embed_source(source, enc, batch_size=args.batch_size,
                                                              num_workers=workers, progress=False))
        rows.append({"path": f"fedhype embed ({workers} workers)", "repeat": rep, "images_per_s": len(source) / wall,
                     "wall_s": wall, "cpu_s": cpu, "worker_cpu_s": child})
    same = torch.allclose(store.embeddings, ref, atol=1e-4)
    best = {p: max(r["images_per_s"] for r in rows if r["path"] == p) for p in dict.fromkeys(r["path"] for r in rows)}
    plain, pipe = best["plain loop"], best[f"fedhype embed ({workers} workers)"]
    result = {
        "encoder": enc.id, "image_size": enc.preprocess["crop"], "n_images": len(source), "batch_size": args.batch_size,
        "device": str(enc.device), "dtype": enc.describe()["dtype"], "workers": workers,
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"), "load_average": os.getloadavg(), "platform": platform.platform(), "torch": torch.__version__,
        "runs": rows, "best_images_per_s": best, "speedup_vs_plain": pipe / plain,
        "same_embeddings": bool(same), "peak_rss": peak_rss_mib(),
    }
    if enc.device.type == "cuda":
        result["gpu"] = {"name": torch.cuda.get_device_name(enc.device),
                         "peak_allocated_mib": torch.cuda.max_memory_allocated(enc.device) / 2**20}
    return result


def sweep(args) -> list[dict]:
    """Images/s and frozen-feature accuracy per input size."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    source = load_builtin("digits-domains", limit=args.sweep_n, seed=0)
    out = []
    for size in [int(s) for s in args.sweep.split(",")]:
        enc = create_encoder(args.encoder, device=args.device, image_size=size)
        store = embed_source(source, enc, batch_size=args.batch_size, num_workers=args.workers, progress=False)
        x, y, d = store.embeddings.numpy(), store.labels.numpy(), store.domains.numpy()
        xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.3, stratify=y * 10 + d, random_state=0)
        lr = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000)).fit(xtr, ytr).score(xte, yte)
        knn = KNeighborsClassifier(5).fit(xtr, ytr).score(xte, yte)
        row = {"image_size": size, "images_per_s": store.meta["images_per_s"], "logreg_acc": lr, "knn5_acc": knn}
        console.print(row)
        out.append(row)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--encoder", default="dinov2-vits14")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sweep", default="", help="comma-separated input sizes for the accuracy/throughput sweep")
    p.add_argument("--sweep-n", type=int, default=2000)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    result = compare(args)
    if args.sweep:
        result["sweep"] = sweep(args)
    table = Table(title=f"fedhype embed vs plain loop — {result['encoder']} @ {result['image_size']} px, "
                        f"{result['n_images']} images, {result['device']}")
    for col in ("path", "repeat", "images/s", "wall s", "main CPU s", "worker CPU s"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for r in result["runs"]:
        table.add_row(r["path"], str(r["repeat"]), f"{r['images_per_s']:.1f}", f"{r['wall_s']:.2f}",
                      f"{r['cpu_s']:.2f}", f"{r['worker_cpu_s']:.2f}")
    Console().print(table)
    Console().print(f"speed-up vs plain loop: {result['speedup_vs_plain']:.2f}×  (same embeddings: "
                    f"{result['same_embeddings']}); peak RSS {result['peak_rss']}; load average {result['load_average']}")
    if "gpu" in result:
        Console().print(f"GPU: {result['gpu']}")
    atomic_write_json(args.out, result)
    Console().print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
