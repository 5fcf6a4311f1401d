"""Public data for the second-order release: a public basis or a public prior (validation split, a negative result).

At ε = 1 per client the release resolves only about 12 covariance directions on all 70,000 Fashion-MNIST
images (``benchmarks/results/class_covariance.md``), and TSTR stops at 0.78 where exact statistics reach 0.80
(``benchmarks/results/release_oracle.md``). The field's answer to a noisy high-dimensional second moment is
public data (e.g. Bie, Kamath & Singhal 2022, "Private estimation with public data"): embeddings of public
images by the same frozen encoder share much of the space's anisotropy. Measured here: the top 64 / 128
principal directions of the *bundled digits* embeddings hold 75 % / 86 % of Fashion-MNIST's within-class
variance (its own top directions: 88 % / 94 %). Two ways to use such a public set, both free of ε:

* ``public basis P``: each client releases VᵀMV (P × P, the same sensitivity and noise per entry as M, so a
  Wigner noise edge √(D/P) lower) and the variance outside V (one scalar, folded into the same sensitivity);
  the server estimates the covariance inside V and spreads the outside variance evenly;
* ``public prior``: the release as now for the located directions, and the variance it cannot locate shaped
  by the public covariance (projected off the located directions) instead of the next noisy eigenvectors
  (``model.residual = "latent"``); ``public prior, L``: the same kept to the model's L latent directions.

The emulated release of ``benchmarks/class_covariance.py`` (client means as centres, clip 0.8 × the spread,
σ₀ of ``dp-gaussian`` at each ε, the release's weights), sampled as the jobs do (all 70,000 images: L = 128,
3,000 per class; digits: L = 64, 300 per class), a linear probe scored on the **validation** split. Public
sets: the bundled digits domains for Fashion-MNIST, the 10,000-image Fashion-MNIST set for the digits.

    .venv/bin/python benchmarks/public_prior.py          # fashion-full and digits, ε 1 / 4 / 8, seeds 0 1 2 (~10 min)

Writes ``benchmarks/results/public_prior.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics as st
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from class_covariance import emulation_data, release_sigma, symmetric_noise  # noqa: E402  (the same emulated release)
from release_defaults import data  # noqa: E402

#: dataset → (public set, latent L, synthetic per class): the jobs' sizes (docs/method.md, decision 17)
SETUP = {"fashion-full": ("digits", 128, 3000), "digits": ("fashion", 64, 300)}
BASES = (64, 128)
COLUMNS = (("release", "the release (as now)"), ("basis64", "public basis 64"), ("basis128", "public basis 128"),
           ("prior", "public prior"), ("prior_L", "public prior, L"))


def unit(x):
    return x / x.norm(dim=1, keepdim=True)


def public_cov(name: str):
    """The public set's covariance of unit-norm embeddings [D, D] float64 and its eigenvectors (descending)."""
    import torch

    from fedhype.eval.inputs import as_matrix

    x = unit(as_matrix(data(name)[0]).to(torch.float64))
    xc = x - x.mean(0)
    cov = xc.T @ xc / len(x)
    return cov, torch.linalg.eigh(cov)[1].flip(1)


def one(store, part, name: str, seed: int, eps_list: list[str], pub) -> list[dict]:
    import numpy as np
    import torch

    from fedhype.eval.utility import Probe
    from fedhype.federated.covariance import covariance_estimate

    _, latent, per_class = SETUP[name]
    pub_cov, pub_vec = pub
    K = store.n_classes
    xv, yv, X, Y, cl, radius = emulation_data(store, part)
    m, dim = len(part.clients), X.shape[1]
    eye = torch.eye(dim, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)

    def sym_noise(s: float, size: int):
        return symmetric_noise(gen, s, size)

    def probe(mus, cov) -> float:
        g = torch.Generator().manual_seed(seed + 1)
        lam, vec = torch.linalg.eigh((cov + cov.T) / 2)
        fac = vec * lam.clamp_min(0).sqrt()
        xs_, ys_ = [], []
        for k in range(K):
            z = torch.randn(per_class, dim, generator=g, dtype=torch.float64) @ fac.T
            xs_.append((mus[k] + z).numpy().astype(np.float32))
            ys_.append(np.full(per_class, k))
        p = Probe(K).fit(np.concatenate(xs_), np.concatenate(ys_))
        return float(np.mean(p.predict(xv) == yv))

    def moment(ci, sy, n, mm):  # Σ x xᵀ of x = c + R·y from the statistics of y
        return n * torch.outer(ci, ci) + radius * (torch.outer(ci, sy) + torch.outer(sy, ci)) + radius ** 2 * mm

    rows = []
    sizes = [int((cl == i).sum()) for i in range(m)]
    for eps in eps_list:
        sigma, (wa, wb, wc) = release_sigma(name, eps, sizes)
        s_sum, s_cnt, s_m = sigma / wa, sigma / wb, sigma / wc
        n_k = torch.zeros(K, dtype=torch.float64)
        sx_k = torch.zeros(K, dim, dtype=torch.float64)
        mx = torch.zeros(dim, dim, dtype=torch.float64)
        kept = []
        for i in range(m):
            xi, yi = X[cl == i], Y[cl == i]
            ci = xi.mean(0)
            d = xi - ci
            d = d * torch.clamp(radius / d.norm(dim=1, keepdim=True).clamp_min(1e-12), max=1.0) / radius
            sy_tot, n_tot = torch.zeros(dim, dtype=torch.float64), 0.0
            for k in range(K):
                dk = d[yi == k]
                n = len(dk) + float(torch.randn(1, generator=gen)) * s_cnt
                sy = dk.sum(0) + torch.randn(dim, generator=gen, dtype=torch.float64) * s_sum
                sy_tot, n_tot = sy_tot + sy, n_tot + n
                n_k[k] += n
                sx_k[k] += n * ci + radius * sy
            kept.append((ci, sy_tot, n_tot, d.T @ d))
            mx += moment(ci, sy_tot, n_tot, d.T @ d + sym_noise(s_m, dim))
        n_k = n_k.clamp_min(1.0)
        mus = sx_k / n_k[:, None]
        total = float(n_k.sum())
        between = sum(n_k[k] * torch.outer(mus[k], mus[k]) for k in range(K))
        shared = (mx - between) / total
        v = radius ** 4 * m * s_m ** 2 / 2 / total ** 2  # noise variance per off-diagonal entry, x units
        trace = max(float(torch.trace(shared)), 1e-6)
        fac, res, r = covariance_estimate(shared, trace, v, max_rank=latent, residual="latent")
        row = {"dataset": name, "seed": seed, "eps": eps, "sigma": sigma, "resolved": r,
               "release": probe(mus, fac @ fac.T + float(res) * eye)}
        for p in BASES:  # VᵀMV and the variance outside V, the same noise per entry
            V = pub_vec[:, :p]
            inner, tr_all = torch.zeros(p, p, dtype=torch.float64), 0.0
            for ci, sy, n, mm in kept:
                full = V @ (V.T @ mm @ V + sym_noise(s_m, p)) @ V.T
                outside = float(torch.trace(mm) - torch.trace(V.T @ mm @ V)) + float(torch.randn(1, generator=gen)) * s_m
                inner += V.T @ moment(ci, sy, n, full) @ V
                tr_all += float(torch.trace(moment(ci, sy, n, full))) + radius ** 2 * outside
            w_in = (inner - V.T @ between @ V) / total
            f2, r2s, r2 = covariance_estimate(w_in, max(float(torch.trace(w_in)), 1e-6), v, max_rank=min(latent, p - 1),
                                              residual="latent")
            ins = f2 @ f2.T + float(r2s) * torch.eye(p, dtype=torch.float64)
            out = max((tr_all - float(torch.trace(between))) / total - float(torch.trace(ins)), 0.0) / (dim - p)
            row[f"basis{p}"] = probe(mus, V @ ins @ V.T + out * (eye - V @ V.T))
            row[f"resolved_basis{p}"] = r2
        # the located spikes from the release; the variance it cannot locate shaped by the public covariance
        fl, _, r0 = covariance_estimate(shared, trace, v, max_rank=latent, residual="isotropic")
        loc = fl[:, :r0]
        q = torch.linalg.qr(loc)[0] if r0 else torch.zeros(dim, 0, dtype=torch.float64)
        off = eye - q @ q.T
        unlocated = max(trace - float((loc ** 2).sum()), 0.0)
        shaped = off @ pub_cov @ off
        shaped = shaped * (unlocated / float(torch.trace(shaped)))
        row["prior"] = probe(mus, loc @ loc.T + shaped)
        lam, vec = torch.linalg.eigh(shaped)
        lam, vec = lam.flip(0), vec.flip(1)
        top = vec[:, :latent - r0] * lam[:latent - r0].clamp_min(0).sqrt()
        rest = max(unlocated - float(lam[:latent - r0].sum()), 0.0) / (dim - latent)
        row["prior_L"] = probe(mus, loc @ loc.T + top @ top.T + rest * off)
        rows.append(row)
        print(json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()}), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    def cell(rs, key):
        v = [r[key] for r in rs if key in r]
        return f"{st.fmean(v):.3f}" + (f" ± {st.stdev(v):.3f}" if len(v) > 1 else "") if v else "–"

    lines = ["| dataset | target ε | " + " | ".join(t for _, t in COLUMNS) + " | resolved: release / basis 64 / 128 | seeds |",
             "|---|---|" + "---|" * (len(COLUMNS) + 2)]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["eps"]), []).append(r)
    for (name, eps), rs in groups.items():
        res = " / ".join(f"{st.fmean(r[k] for r in rs):.0f}" for k in ("resolved", "resolved_basis64", "resolved_basis128"))
        lines.append(f"| {name} | {eps} | " + " | ".join(cell(rs, k) for k, _ in COLUMNS) + f" | {res} | {len(rs)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", choices=sorted(SETUP), default=["fashion-full", "digits"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epsilons", nargs="+", default=["1", "4", "8"])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = []
    for name in a.datasets:
        store, parts = data(name)
        pub = public_cov(SETUP[name][0])
        for seed in a.seeds:
            rows += one(store, parts(seed), name, seed, a.epsilons, pub)
    head = (f"_{datetime.date.today()}, {platform.machine()} CPU, one thread; `benchmarks/public_prior.py` "
            f"({time.perf_counter() - t0:.0f} s); seeds {a.seeds}; emulated release (as `benchmarks/class_covariance.py`), "
            f"public sets: {', '.join(f'{k} ← {v[0]}' for k, v in SETUP.items() if k in a.datasets)}; TSTR of a linear "
            f"probe on the **validation** split (the test split is not read)_")
    md = ("# Public data for the second-order release (validation split)\n\n" + head + "\n\n" + table(rows) + "\n")
    res = Path(a.results)
    res.mkdir(parents=True, exist_ok=True)
    (res / "public_prior.json").write_text(json.dumps({"header": head, "rows": rows}, indent=1) + "\n")
    (res / "public_prior.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
