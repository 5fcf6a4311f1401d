"""Time per round and peak memory for 10, 100, 1,000 and 10,000 small clients (in-process engine).

Each client holds 24 real records (UCI optdigits pixels, 64-d, drawn with replacement: a speed
benchmark), runs 1 local DP step per round; each N runs in its own subprocess so peak RSS is
per configuration. Memory should grow only with the data and the per-client codes (client
private state lives on disk, one file per client; the server folds each update into its
pseudo-gradient as it arrives, and pools the statistics release with running sums). Writes
benchmarks/results/clients_scaling.json (also each row's peak RSS relative to the first row's).

    .venv/bin/python benchmarks/clients_scaling.py [--clients 10 100 1000 10000] [--rounds 2]   # ~15 min on 2 cores

The 10,000-client row used to run for more than an hour without finishing: each client's store rows
were found by rebuilding an id → row table over every record (``EmbeddingStore.positions``), quadratic
in the clients; the table is now built once per store (2,000 clients, 1 round: 84 s → 50 s).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(n_clients: int, rounds: int) -> dict:
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    from fedhype.data.partition import ClientSplit, Partition
    from fedhype.data.store import EmbeddingStore
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    per = 40
    idx = rng.integers(0, len(y), n_clients * per)
    store = EmbeddingStore(torch.tensor(x[idx], dtype=torch.float32) + 0.1, torch.tensor(y[idx]),
                           torch.zeros(len(idx), dtype=torch.long), [f"r{i}" for i in range(len(idx))],
                           [str(i) for i in range(10)], ["digits"])
    clients = [ClientSplit(i, f"c{i}", [f"r{j}" for j in range(i * per, i * per + 24)],
                           [f"r{j}" for j in range(i * per + 24, i * per + 32)],
                           [f"r{j}" for j in range(i * per + 32, (i + 1) * per)]) for i in range(n_clients)]
    part = Partition("iid", {}, 0, store.digest(), len(store), store.class_names, clients)
    cfg = TrainConfig(rounds=rounds, local_steps=1, batch_size=8, noise_multiplier=1.0, epsilon=None, delta=1e-3,
                      seed=0, min_records=10, model={"hidden": 64, "latent": 16, "hyper_hidden": 32},
                      dp_sgd_min_records=0)  # the rounds are what this measures (decision 22 would skip them)
    times = []
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        train(store, part, cfg, Path(d) / "run", diagnostics=False,
              progress=lambda m: times.append(m["seconds"]))
        total = time.perf_counter() - t0
    return {"clients": n_clients, "rounds": rounds, "s_per_round": sum(times) / len(times), "total_s": total,
            "s_per_client_round": sum(times) / len(times) / n_clients,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_before_mb": rss0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=Path(__file__).parent / "results", help="folder for the JSON")
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.rounds)))
        return
    rows = []
    for n in a.clients:
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--rounds", str(a.rounds)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{n:5d} clients: {r['s_per_round']:.2f} s/round ({1000 * r['s_per_client_round']:.1f} ms/client), "
              f"peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    base = rows[0]
    for r in rows:
        r["rss_growth_vs_first_mb"] = r["peak_rss_mb"] - base["peak_rss_mb"]
        r["rss_ratio_to_first"] = r["peak_rss_mb"] / base["peak_rss_mb"]
    import torch

    path = a.results / "clients_scaling.json"
    path.write_text(json.dumps({"machine": f"{platform.machine()} {torch.get_num_threads()} threads",
                                "date": time.strftime("%Y-%m-%d"), "results": rows}, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
