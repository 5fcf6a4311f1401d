"""GPU section of the benchmarks: one script for a machine with a CUDA GPU (CPU figures beside it).

Measures, in the same run:

* the DP step (book-keeping clipping and torch.func vmap) vs the non-DP step, CPU and CUDA
  (:mod:`benchmarks.dp_step`);
* the embedding pipeline (``fedhype embed``'s ``embed_source``) vs a plain loop on CUDA, with a
  DINOv2 ViT-S/14 of the bundled architecture (``--weights random``: same architecture, random
  weights — throughput only; use ``--encoder dinov2-vits14`` where the bundled weights are
  cached);
* synthesis throughput (embeddings/s) of the default model's decoder on CPU and CUDA.

Writes ``benchmarks/results/gpu.json`` and ``gpu.md`` (and copies them to ``$OUT`` if set).

    python benchmarks/gpu.py [--n 2048] [--encoder random-vits14]
    python benchmarks/gpu.py --smoke --results /tmp/gpu-smoke   # where no GPU is lent: checks every step on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
RESULTS = Path(__file__).resolve().parent / "results"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def random_vits14(path: Path) -> str:
    """Save a random-init DINOv2 ViT-S/14 (the bundled encoder's architecture) for ``hf:``."""
    from transformers import Dinov2Config, Dinov2Model

    cfg = Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                       patch_size=14, image_size=518, layerscale_value=1.0)
    Dinov2Model(cfg).save_pretrained(path)
    return f"hf:{path}"


def embed_bench(encoder: str, n: int, device: str, image_size: int, batch_size: int) -> dict:
    from embed import plain_loop  # benchmarks/embed.py

    from fedhype.data.datasets import load_builtin
    from fedhype.encoders import create_encoder
    from fedhype.encoders.embed import default_workers, embed_source

    source = load_builtin("digits-domains", limit=n, seed=0)
    enc = create_encoder(encoder, device=device, image_size=image_size)
    enc(torch.zeros(2, 3, enc.preprocess["crop"], enc.preprocess["crop"]))
    out = {"encoder": encoder, "device": str(enc.device), "image_size": enc.preprocess["crop"], "n_images": len(source),
           "batch_size": batch_size, "dtype": enc.describe()["dtype"]}
    _sync(device)
    t = time.perf_counter()
    plain_loop(source, enc, batch_size)
    _sync(device)
    out["plain_images_per_s"] = len(source) / (time.perf_counter() - t)
    workers = default_workers()
    t = time.perf_counter()
    embed_source(source, enc, batch_size=batch_size, num_workers=workers, progress=False)
    _sync(device)
    out["pipeline_images_per_s"] = len(source) / (time.perf_counter() - t)
    out["workers"] = workers
    out["speedup_vs_plain"] = out["pipeline_images_per_s"] / out["plain_images_per_s"]
    if device.startswith("cuda"):
        out["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def synth_bench(device: str, n: int) -> dict:
    from fedhype.models.config import ModelConfig
    from fedhype.models.cvae import sample
    from fedhype.models.hypernet import HyperNetwork

    cfg = ModelConfig(dim=384, n_classes=10, hidden=128, latent=32)
    hnet = HyperNetwork(cfg, torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        theta = hnet(torch.zeros(cfg.code_dim, device=device))
        gen = torch.Generator(device=device).manual_seed(0)
        labels = torch.arange(n, device=device) % 10
        sample(theta, labels[:1000], cfg, gen, space=hnet.space())
        _sync(device)
        t = time.perf_counter()
        for i in range(0, n, 65536):
            sample(theta, labels[i:i + 65536], cfg, gen, space=hnet.space())
        _sync(device)
        dt = time.perf_counter() - t
    return {"device": device, "n": n, "embeddings_per_s": n / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2048, help="images for the embedding benchmark")
    ap.add_argument("--encoder", default="random-vits14")
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for gpu.json / gpu.md")
    ap.add_argument("--smoke", action="store_true",
                    help="run every step on the CPU with tiny sizes (checks the script where no GPU is lent; "
                         "figures meaningless)")
    a = ap.parse_args()
    for flag, v in (("--n", a.n), ("--image-size", a.image_size), ("--batch-size", a.batch_size)):
        if v < 1:
            ap.error(f"{flag} must be ≥ 1, got {v}")
    if not a.smoke and not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); --smoke checks it on CPU")
    import dp_step  # benchmarks/dp_step.py

    acc = "cpu" if a.smoke else "cuda"
    n, n_cpu, s_cpu, s_acc, reps = (16, 16, 20_000, 20_000, 2) if a.smoke else (a.n, min(a.n, 256), 200_000, 2_000_000, 50)
    res = {"date": time.strftime("%Y-%m-%d"), "gpu": "none (--smoke on CPU)" if a.smoke else torch.cuda.get_device_name(0),
           "torch": torch.__version__, "platform": platform.platform(), "cpu_count": os.cpu_count(),
           "torch_threads": torch.get_num_threads()}
    res["dp_step"] = [dp_step.bench("cpu", 384, 64, 2 if a.smoke else 5), dp_step.bench(acc, 384, 256, reps)]
    res["synthesis"] = [synth_bench("cpu", s_cpu), synth_bench(acc, s_acc)]
    tmp = Path(tempfile.mkdtemp())
    enc = random_vits14(tmp / "vits14") if a.encoder == "random-vits14" else a.encoder
    res["embed"] = [embed_bench(enc, n, acc, size, a.batch_size) for size in (a.image_size, 224)]
    res["embed"].append(embed_bench(enc, n_cpu, "cpu", a.image_size, 64))
    if a.encoder == "random-vits14":
        for r in res["embed"]:
            r["encoder"] = "DINOv2 ViT-S/14 architecture, random weights (throughput only)"
    acc_name = "accelerator: CPU (--smoke)" if a.smoke else "GPU"
    lines = [f"_{res['date']}, {res['gpu']}, torch {res['torch']}, {res['cpu_count']} CPU cores_"
             + (" — **smoke run: every 'GPU' figure is the CPU; not for publication**" if a.smoke else ""), "",
             f"| what | CPU | {acc_name} | {acc_name} / CPU |", "|---|---|---|---|"]
    c, g = res["dp_step"]
    for k in ("nodp", "dp_bookkeeping", "dp_vmap"):
        lines.append(f"| {k} step, samples/s (×non-DP: CPU {c[k]['ratio_to_nodp']:.2f}, GPU {g[k]['ratio_to_nodp']:.2f}) "
                     f"| {c[k]['samples_per_s']:.0f} | {g[k]['samples_per_s']:.0f} | {g[k]['samples_per_s'] / c[k]['samples_per_s']:.2f} |")
    sc, sg = res["synthesis"]
    lines.append(f"| synthesis, embeddings/s | {sc['embeddings_per_s']:.3g} | {sg['embeddings_per_s']:.3g} | "
                 f"{sg['embeddings_per_s'] / sc['embeddings_per_s']:.2f} |")
    e112, e224, ecpu = res["embed"]
    lines.append(f"| embed {e112['image_size']} px, images/s (pipeline; plain loop on GPU {e112['plain_images_per_s']:.0f}) | "
                 f"{ecpu['pipeline_images_per_s']:.0f} | {e112['pipeline_images_per_s']:.0f} | "
                 f"{e112['pipeline_images_per_s'] / ecpu['pipeline_images_per_s']:.2f} |")
    lines.append(f"| embed 224 px on GPU, images/s (pipeline / plain loop) | – | {e224['pipeline_images_per_s']:.0f} / "
                 f"{e224['plain_images_per_s']:.0f} | – |")
    md = "\n".join(lines) + "\n"
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / "gpu.json").write_text(json.dumps(res, indent=2) + "\n")
    (a.results / "gpu.md").write_text(md)
    print(md)
    if os.environ.get("OUT"):
        for f in ("gpu.json", "gpu.md"):
            shutil.copy(a.results / f, Path(os.environ["OUT"]) / f)


if __name__ == "__main__":
    main()
