"""Beyond two shared moments: per-class covariances against the shared within-class covariance.

The release (``docs/method.md``, privacy model) gives the server each client's class sums, counts and
*one* second-moment matrix Σ x xᵀ over all its records, hence one within-class covariance shared by
the classes. Adding or removing one record changes only its own class's block of the per-class
matrices Σ_{x in class k} x xᵀ, so releasing the K blocks instead has the same L2 sensitivity and the
same ε — but each block carries the noise the one matrix carried. Is that worth it?

This script answers on the **validation** split (the test split is not read) with an *emulated*
release: per client, the records' deviations from the client's own mean (standing in for its DP
centre), clipped to 0.8 × the pooled spread and divided by it, their class sums, counts and second
moments (the total, or the K class blocks) plus Gaussian noise at the noise multiplier σ₀ that
``dp-gaussian`` gets at each ε (:func:`fedhype.federated.run_plan.plan_privacy`) and the release's
weights (a, b, c) (:meth:`fedhype.federated.config.TrainConfig.release_weights`); the server pools them
into class means and covariances and keeps what rises above the noise edge
(:func:`fedhype.federated.covariance.covariance_estimate`, rank ≤ the model's latent size L = 64).
No client shrinkage, no mixture code, no training: only the second-order design differs between
rows. Each row is the validation accuracy of a linear probe (``fedhype.eval.utility.Probe``) trained
on 300 samples per class from the Gaussians. Without DP the table adds the unlimited-rank
covariances, 3,000 samples per class, and the real training records subsampled to the same sizes; every
ε adds the sampler's choices for the shared covariance: where the variance the release cannot locate
goes (``model.residual``: the default ``auto``, or ``isotropic``) and 3,000 samples per class. Under DP
a last column splits the second moment's weight c in two halves at the same ε: the first releases M
as now, the server takes the top 64 eigenvectors V of its within-class covariance, and the second
releases VᵀMV (64 × 64 entries, so a noise edge √(D/64) lower; the unlocated variance spreads evenly
outside V).

    .venv/bin/python benchmarks/class_covariance.py                       # digits, fashion, fashion-full; 3 seeds (~5 min)
    .venv/bin/python benchmarks/class_covariance.py --datasets fashion-full --seeds 0

Writes ``benchmarks/results/class_covariance.{json,md}``.
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
from release_defaults import CONFIGS, data  # noqa: E402  (the same jobs and partitions as the release grid)

EPS = ("1", "4", "8", "none")
LATENT = 64
PROJ = 64  # the two-stage rows' basis size
KAPPA = 0.8  # the clip radius as a multiple of the spread (the release's default, docs/method.md decision 12)


def release_sigma(name: str, eps: str, sizes: list[int]) -> tuple[float, tuple[float, float, float]]:
    """σ₀ of the statistics release when it gets the whole ε (``dp-gaussian``) and its weights (a, b, c)."""
    from fedhype.federated.run_plan import plan_privacy
    from fedhype.pipeline.config import resolve, train_config

    sets = ['train.method="dp-gaussian"'] + (["train.epsilon=none", "train.no_dp=true"] if eps == "none" else [f"train.epsilon={float(eps)}"])
    cfg = train_config(resolve(CONFIGS[name], sets))
    w = cfg.release_weights(cfg.model_config(1, 1))
    weights = (float(w.sums), float(w.counts), float(w.second_moment))
    sigma = plan_privacy(cfg, sizes)["class_stats_noise_multiplier"]
    return (0.0 if sigma is None else float(sigma)), weights


def emulation_data(store, part):
    """What the emulated release reads: the validation split ``(x [n, D] float32 numpy, y [n])`` and the clients'
    training records on the unit sphere ``X [N, D]`` float64 with labels ``Y [N]``, owners ``cl [N]`` (client index)
    and the clip radius R = κ × their root-mean-square distance from the pooled mean."""
    import torch

    from fedhype.eval.inputs import as_matrix

    val = part.split_store(store, "val")
    xs, ys, owner = [], [], []
    for i, c in enumerate(part.clients):
        cs = part.client_store(store, c.id, "train")
        xs.append(as_matrix(cs).to(torch.float64))
        ys.append(cs.labels)
        owner.append(torch.full((len(cs.labels),), i))
    X = torch.cat(xs)
    X = X / X.norm(dim=1, keepdim=True)
    radius = KAPPA * math.sqrt(float(((X - X.mean(0)) ** 2).sum(1).mean()))
    return as_matrix(val).numpy(), val.labels.numpy(), X, torch.cat(ys), torch.cat(owner), radius


def symmetric_noise(gen, std_entry: float, size: int):
    """Noise of m(M) (the diagonal and √2 × the upper off-diagonal entries) of std s per entry, as a symmetric
    [size, size] float64 matrix: s on the diagonal, s/√2 off it."""
    import torch

    a = torch.triu(torch.randn(size, size, generator=gen, dtype=torch.float64) * std_entry / math.sqrt(2), 1)
    return a + a.T + torch.diag(torch.randn(size, generator=gen, dtype=torch.float64) * std_entry)


def one(store, part, name: str, seed: int, eps_list: list[str]) -> list[dict]:
    import numpy as np
    import torch

    from fedhype.eval.utility import Probe
    from fedhype.federated.covariance import covariance_estimate

    K = store.n_classes
    xv, yv, X, Y, cl, radius = emulation_data(store, part)
    n_clients, dim = len(part.clients), X.shape[1]
    gen = torch.Generator().manual_seed(seed)

    def sym_noise(std_entry: float, size: int | None = None) -> "torch.Tensor":
        return symmetric_noise(gen, std_entry, dim if size is None else size)

    def probe(mus, covs, n: int) -> float:
        g = torch.Generator().manual_seed(seed + 1)
        samples, labels = [], []
        for k in range(K):
            fac, res = covs[k]
            z = torch.randn(n, fac.shape[1], generator=g, dtype=torch.float64) @ fac.T
            z += math.sqrt(float(res)) * torch.randn(n, dim, generator=g, dtype=torch.float64)
            samples.append((mus[k] + z).numpy().astype(np.float32))
            labels.append(np.full(n, k))
        p = Probe(K).fit(np.concatenate(samples), np.concatenate(labels))
        return float(np.mean(p.predict(xv) == yv))

    def full_rank(cov) -> tuple:
        lam, vec = torch.linalg.eigh((cov + cov.T) / 2)
        return vec * lam.clamp_min(0).sqrt(), torch.tensor(0.0, dtype=torch.float64)

    def moment(ci, sy, n, m):
        # Σ x xᵀ of records x = c + R·y from the statistics of y (fedhype.federated.class_stats._unit_sphere's map)
        return n * torch.outer(ci, ci) + radius * (torch.outer(ci, sy) + torch.outer(sy, ci)) + radius ** 2 * m

    rows = []
    sizes = [int((cl == i).sum()) for i in range(n_clients)]
    for eps in eps_list:
        sigma, (wa, wb, wc) = release_sigma(name, eps, sizes)
        s_sum, s_cnt, s_m = (sigma / wa, sigma / wb, sigma / wc) if sigma else (0.0, 0.0, 0.0)
        n_k = torch.zeros(K, dtype=torch.float64)
        sx_k = torch.zeros(K, dim, dtype=torch.float64)
        mx_k = torch.zeros(K, dim, dim, dtype=torch.float64)  # per-class blocks, each with its own noise
        mx_tot = torch.zeros(dim, dim, dtype=torch.float64)  # the released design: one matrix per client
        kept = []  # per client: centre, noisy sum and count, noise-free Σ y yᵀ (for the two-stage rows)
        for i in range(n_clients):
            xi, yi = X[cl == i], Y[cl == i]
            ci = xi.mean(0)
            d = xi - ci
            d = d * torch.clamp(radius / d.norm(dim=1, keepdim=True).clamp_min(1e-12), max=1.0) / radius
            m_tot, sy_tot, n_tot = d.T @ d, torch.zeros(dim, dtype=torch.float64), 0.0
            for k in range(K):
                dk = d[yi == k]
                n = len(dk) + (float(torch.randn(1, generator=gen)) * s_cnt if sigma else 0.0)
                sy = dk.sum(0) + (torch.randn(dim, generator=gen, dtype=torch.float64) * s_sum if sigma else 0.0)
                my = dk.T @ dk + (sym_noise(s_m) if sigma else 0.0)
                sy_tot, n_tot = sy_tot + sy, n_tot + n
                n_k[k] += n
                sx_k[k] += n * ci + radius * sy
                mx_k[k] += moment(ci, sy, n, my)
            kept.append((ci, sy_tot, n_tot, m_tot))
            if sigma:
                m_tot = m_tot + sym_noise(s_m)
            mx_tot += moment(ci, sy_tot, n_tot, m_tot)
        n_k = n_k.clamp_min(1.0)
        mus = sx_k / n_k[:, None]
        total = float(n_k.sum())
        between = sum(n_k[k] * torch.outer(mus[k], mus[k]) for k in range(K))
        shared = (mx_tot - between) / total
        per_class = [(mx_k[k] - n_k[k] * torch.outer(mus[k], mus[k])) / n_k[k] for k in range(K)]
        blocks_sum = sum(n_k[k] * per_class[k] for k in range(K)) / total
        # noise variance per off-diagonal entry, in x units: R⁴ × (clients × (σ/c)²/2) / n²
        v_shared = radius ** 4 * n_clients * s_m ** 2 / 2 / total ** 2
        v_k = [radius ** 4 * n_clients * s_m ** 2 / 2 / float(n_k[k]) ** 2 for k in range(K)]

        def est(cov, noise_var, residual="auto"):
            # the noisy matrix's own trace (a small class's can come out negative under DP noise)
            trace = max(float(torch.trace(cov)), 1e-6)
            fac, res, r = covariance_estimate(cov, trace, noise_var, max_rank=LATENT, residual=residual)
            return (fac, res), r

        sh, r_sh = est(shared, v_shared)
        row = {"dataset": name, "seed": seed, "eps": eps, "sigma": sigma,
               "shared": probe(mus, [sh] * K, 300), "rank_shared": r_sh}
        # the sampler: where the unlocated variance goes, and how many samples per class
        iso = est(shared, v_shared, "isotropic")[0]
        row["shared_isotropic"] = probe(mus, [iso] * K, 300)
        row["shared_3000"] = probe(mus, [sh] * K, 3000)
        row["shared_isotropic_3000"] = probe(mus, [iso] * K, 3000)
        if sigma:
            # two stages at the same ε: the second moment's weight c split c₁² = c₂² = c²/2 (joint sensitivity
            # still 1); stage 1 releases M as now (√2 × the noise) and its top PROJ eigenvectors V become the
            # basis in which stage 2 releases VᵀMV (PROJ × PROJ entries: a noise edge √(D/PROJ) lower)
            s1 = s_m * math.sqrt(2)

            w1 = (sum(moment(ci, sy, n, m + sym_noise(s1)) for ci, sy, n, m in kept) - between) / total
            v1 = 2 * v_shared
            basis = torch.linalg.eigh((w1 + w1.T) / 2)[1].flip(1)[:, :PROJ]
            proj = sum(basis.T @ moment(ci, sy, n, m) @ basis
                       + radius ** 2 * sym_noise(s1, PROJ) for ci, sy, n, m in kept)
            w2 = (proj - basis.T @ between @ basis) / total
            fac, res, r2 = covariance_estimate(w2, max(float(torch.trace(w2)), 1e-6), v1, max_rank=PROJ)
            inside = basis @ (fac @ fac.T + float(res) * torch.eye(PROJ, dtype=torch.float64)) @ basis.T
            outside = max(float(torch.trace(w1)) - float(torch.trace(inside)), 0.0) / (dim - PROJ)
            two = inside + outside * (torch.eye(dim, dtype=torch.float64) - basis @ basis.T)
            row["two_stage"] = probe(mus, [full_rank(two)] * K, 300)
            row["rank_two_stage"] = r2
        pcs = [est(per_class[k], v_k[k]) for k in range(K)]
        row["per_class"] = probe(mus, [p[0] for p in pcs], 300)
        row["rank_per_class"] = st.fmean(p[1] for p in pcs)
        half = [est(0.5 * per_class[k] + 0.5 * blocks_sum, 0.25 * v_k[k] + 0.25 * v_shared * K)[0] for k in range(K)]
        row["per_class_half"] = probe(mus, half, 300)
        if eps == "none":
            row["shared_full_rank"] = probe(mus, [full_rank(shared)] * K, 300)
            row["per_class_full_rank"] = probe(mus, [full_rank(c) for c in per_class], 300)
            row["shared_full_rank_3000"] = probe(mus, [full_rank(shared)] * K, 3000)
            row["per_class_full_rank_3000"] = probe(mus, [full_rank(c) for c in per_class], 3000)
            rng = np.random.default_rng(seed)
            xn, yn = X.numpy(), Y.numpy()
            for n in (300, 3000):
                idx = np.concatenate([rng.permutation(np.flatnonzero(yn == k))[:n] for k in range(K)])
                p = Probe(K).fit(xn[idx].astype(np.float32), yn[idx])
                row[f"real_{n}"] = float(np.mean(p.predict(xv) == yv))
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    return rows


COLUMNS = (("shared", "shared (the release)"), ("per_class", "per-class blocks"),
           ("per_class_half", "per-class blocks, ½ toward their pool"), ("shared_isotropic", "shared, isotropic residual"),
           ("shared_3000", "shared, 3,000/class"), ("shared_isotropic_3000", "shared, isotropic residual, 3,000/class"),
           ("two_stage", f"two stages: basis, then the {PROJ}-dim projection"))
NO_DP = (("shared_full_rank", "shared, full rank"), ("per_class_full_rank", "per-class, full rank"),
         ("shared_full_rank_3000", "shared, full rank, 3,000/class"),
         ("per_class_full_rank_3000", "per-class, full rank, 3,000/class"),
         ("real_300", "real, 300/class"), ("real_3000", "real, 3,000/class"))


def table(rows: list[dict]) -> str:
    def cell(rs, key, nd=3):
        v = [r[key] for r in rs if key in r]
        if not v:
            return "–"
        return f"{st.fmean(v):.{nd}f}" + (f" ± {st.stdev(v):.{nd}f}" if len(v) > 1 else "")

    lines = ["| dataset | target ε | " + " | ".join(t for _, t in COLUMNS) + " | resolved directions: shared / per class |",
             "|---|---|" + "---|" * (len(COLUMNS) + 1)]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["eps"]), []).append(r)
    for (name, eps), rs in groups.items():
        lines.append(f"| {name} | {'no DP' if eps == 'none' else eps} | " + " | ".join(cell(rs, k) for k, _ in COLUMNS)
                     + f" | {cell(rs, 'rank_shared', 0)} / {cell(rs, 'rank_per_class', 1)} |")
    lines += ["", "Without DP (300 samples per class unless said; `real`: the real training records subsampled):", "",
              "| dataset | " + " | ".join(t for _, t in NO_DP) + " |", "|---|" + "---|" * len(NO_DP)]
    for (name, eps), rs in groups.items():
        if eps == "none":
            lines.append(f"| {name} | " + " | ".join(cell(rs, k) for k, _ in NO_DP) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", choices=sorted(CONFIGS), default=["digits", "fashion", "fashion-full"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epsilons", nargs="+", default=list(EPS))
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = []
    for name in a.datasets:
        store, parts = data(name)
        for seed in a.seeds:
            rows += one(store, parts(seed), name, seed, a.epsilons)
    head = (f"_{datetime.date.today()}, {platform.machine()} CPU, one thread; `benchmarks/class_covariance.py` "
            f"({time.perf_counter() - t0:.0f} s); seeds {a.seeds} (partition seed = noise seed); emulated release "
            f"(client means as centres, clip {KAPPA} × the spread, σ₀ of `dp-gaussian` at each ε, rank ≤ {LATENT}); "
            f"TSTR of a linear probe on the **validation** split (the test split is not read)_")
    md = "# Per-class covariances against the shared one (validation split)\n\n" + head + "\n\n" + table(rows) + "\n"
    res = Path(a.results)
    res.mkdir(parents=True, exist_ok=True)
    (res / "class_covariance.json").write_text(json.dumps({"header": head, "rows": rows}, indent=1) + "\n")
    (res / "class_covariance.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
