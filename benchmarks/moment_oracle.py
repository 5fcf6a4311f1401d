"""What would a generator that models more than two moments add? Exact statistics, no DP (validation split, a bound)

Issue #19 notes that a class-conditional Gaussian caps near 0.80–0.83 TSTR on all 70,000 Fashion-MNIST images while a
probe trained on the real records reaches 0.87, so "anything above needs a generator that models more than two
moments". This script measures, **without privacy** (exact statistics of the pooled training records, no clipping,
no noise: an upper bound for any DP release of the same statistics), how much of that gap each richer family of
statistics closes, so a DP design is only built where its noiseless bound is worth the extra noise:

* ``shared Gaussian``: class means + one within-class covariance (what the release estimates; the ceiling
  ``benchmarks/release_oracle.py`` calls "exact moments", here full rank, 3,000 per class);
* ``cells, m``: each class split into 2^m cells by the signs of its records' projections on the top m eigenvectors
  of the shared within-class covariance (a release of per-(class, cell) sums has the class sums' sensitivity);
  cell means + weights, one shared within-cell covariance;
* ``k-means, c``: c k-means clusters per class (the best a c-component mixture of that form does), shared
  within-cluster covariance;
* ``per-class variance scale, r``: the shared covariance with each class's own variance along the top r
  eigenvectors (K·r more numbers);
* ``per-class block, r``: each class's own r × r covariance block in the top-r eigenbasis, shared elsewhere;
* ``per-class covariance``: each class's own full covariance (the D × D second moment per class).

TSTR of the project's linear probe (``fedhype.eval.utility.Probe``), 3,000 synthetic per class, scored on the
**validation** split (the test split is not read); ``real``: the probe on the real training records.

    .venv/bin/python benchmarks/moment_oracle.py            # seeds 0 1 2 (about 15 min alone after the embedding)

Writes ``benchmarks/results/moment_oracle.{json,md}``.
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]
PER_CLASS = 3000
MODES = ("real", "shared Gaussian", "cells, m = 1", "cells, m = 2", "cells, m = 3", "k-means, c = 4", "k-means, c = 8",
         "per-class variance scale, r = 64", "per-class block, r = 16", "per-class block, r = 64", "per-class covariance")


def _sample(rng, means, weights, covs, n):
    """n draws per class from Σ_c w_kc N(means[k][c], covs[k]); returns x [K·n, D] float64, y [K·n] int64."""
    xs, ys = [], []
    for k, (m, w, c) in enumerate(zip(means, weights, covs)):
        chol = np.linalg.cholesky(c + 1e-9 * np.eye(len(c)))
        idx = rng.choice(len(w), size=n, p=w)
        xs.append(m[idx] + rng.standard_normal((n, len(c))) @ chol.T)
        ys.append(np.full(n, k))
    return np.concatenate(xs), np.concatenate(ys)


def families(x, y, n_classes, seed):
    """The statistics of each mode from the exact training records x [N, D] (unit rows), y [N]: mode → (means, weights, covs)."""
    from sklearn.cluster import KMeans

    K, D = n_classes, x.shape[1]
    mu = np.stack([x[y == k].mean(0) for k in range(K)])
    dev = x - mu[y]
    W = dev.T @ dev / len(x)
    V = np.linalg.eigh(W)[1][:, ::-1]
    out = {"shared Gaussian": ([mu[k][None] for k in range(K)], [np.ones(1)] * K, [W] * K)}

    def split(labels_of, n_cells):
        means, weights, scat = [], [], np.zeros((D, D))
        for k in range(K):
            d = dev[y == k]
            code = labels_of(d)
            cm = np.stack([d[code == c].mean(0) if (code == c).any() else np.zeros(D) for c in range(n_cells)])
            means.append(mu[k] + cm)
            weights.append(np.bincount(code, minlength=n_cells) / len(d))
            r = d - cm[code]
            scat += r.T @ r
        return means, weights, [scat / len(x)] * K

    for m in (1, 2, 3):
        out[f"cells, m = {m}"] = split(lambda d, m=m: ((d @ V[:, :m]) > 0).astype(int) @ (1 << np.arange(m)), 2 ** m)
    for c in (4, 8):
        out[f"k-means, c = {c}"] = split(lambda d, c=c: KMeans(c, n_init=2, random_state=seed).fit(d).labels_, c)
    own = [dev[y == k].T @ dev[y == k] / (y == k).sum() for k in range(K)]
    one = [mu[k][None] for k in range(K)], [np.ones(1)] * K
    Vr = V[:, :64]
    scale = []
    for k in range(K):
        s = np.sqrt(np.diag(Vr.T @ own[k] @ Vr) / np.diag(Vr.T @ W @ Vr))
        T = np.eye(D) + Vr @ (np.diag(s) - np.eye(64)) @ Vr.T
        scale.append(T @ W @ T.T)
    out["per-class variance scale, r = 64"] = (*one, scale)
    for r in (16, 64):
        Vr = V[:, :r]
        out[f"per-class block, r = {r}"] = (*one, [W + Vr @ (Vr.T @ (own[k] - W) @ Vr) @ Vr.T for k in range(K)])
    out["per-class covariance"] = (*one, own)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()

    import torch

    from fedhype.eval.inputs import as_matrix
    from fedhype.eval.utility import Probe
    from release_defaults import data

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    store, make = data("fashion-full")
    rows = []
    for seed in a.seeds:
        part = make(seed)
        tr, va = part.split_store(store, "train"), part.split_store(store, "val")
        x = as_matrix(tr).numpy().astype(np.float64)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        y = tr.labels.numpy()
        xv, yv = as_matrix(va).numpy(), va.labels.numpy()
        acc = lambda xs, ys: float(np.mean(Probe(store.n_classes, seed=seed).fit(xs, ys).predict(xv) == yv))
        rows.append({"seed": seed, "mode": "real", "val_tstr": acc(x, y)})
        rng = np.random.default_rng(seed)
        for mode, (means, weights, covs) in families(x, y, store.n_classes, seed).items():
            rows.append({"seed": seed, "mode": mode, "val_tstr": acc(*_sample(rng, means, weights, covs, PER_CLASS))})
            print(f"seed {seed} {mode}: TSTR-val {rows[-1]['val_tstr']:.4f}", flush=True)
    cell = lambda v: f"{st.mean(v):.3f} ± {st.stdev(v) if len(v) > 1 else 0.0:.3f}"
    lines = ["# Beyond two moments: what richer exact statistics would give (validation split, no DP: a bound)", "",
             f"_{datetime.date.today()}, {platform.machine()} CPU, one thread; `benchmarks/moment_oracle.py` "
             f"({time.perf_counter() - t0:.0f} s); all 70,000 Fashion-MNIST images, 10 Dirichlet α = 0.3 clients "
             f"(`configs/fashion-mnist-full.toml`), the pooled training records' exact statistics (no clipping, no "
             f"noise); {PER_CLASS:,} synthetic per class; seeds {a.seeds} (partition seed = sampling seed); TSTR of a "
             "linear probe scored on the **validation** split_", "",
             "| statistics | TSTR-val | over the shared Gaussian |", "|---|---|---|"]
    base = st.mean(r["val_tstr"] for r in rows if r["mode"] == "shared Gaussian")
    for m in MODES:
        v = [r["val_tstr"] for r in rows if r["mode"] == m]
        lines.append(f"| {m} | {cell(v)} | {st.mean(v) - base:+.3f} |")
    md = "\n".join(lines) + "\n"
    out = Path(a.results)
    (out / "moment_oracle.md").write_text(md)
    (out / "moment_oracle.json").write_text(json.dumps({"date": str(datetime.date.today()), "rows": rows}, indent=1) + "\n")
    print(md)


if __name__ == "__main__":
    main()
