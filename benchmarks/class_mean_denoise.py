"""Denoising the release's class means along the covariance's eigenbasis (validation split, a negative result).

The pooled DP class means carry isotropic noise (each coordinate of class k's mean: variance t_k² =
(noise variance of a coordinate of the pooled class sum) / n_k²), while the class means' signal concentrates in the
data's main directions. The release's noisy *total* covariance (whose noise is independent of the sums') gives
those directions, so a James–Stein factor per block of its eigenbasis (Efron & Morris 1973, the positive-part
estimator of :func:`fedhype.federated.covariance.class_mean_snr`, applied to the projection of the class-mean
deviations d_k on each block: f_b = max(0, 1 − |b|·Σ_k w_k t_k² / Σ_k w_k ‖P_b d_k‖²)) removes most of the noise
outside the located directions and keeps the signal inside them: free post-processing of DP outputs. A second
idea, "the predictive Gaussian": a class mean known to within N(0, t² I) gives samples N(m̂_k, Σ + t² I), so the
classifier sees the means' uncertainty (``inflate``: t² added to the residual variance; ``inflate3``: 3 t²).

Variants (the pooled moments of :func:`fedhype.federated.class_stats._moments`, patched for this diagnostic only;
the James–Stein factor F that gates the within-class subtraction and the located share is kept on the raw means):

* ``off``: the release as the jobs run it;
* ``two``: two blocks, the r located directions (the spikes of the total covariance above the Wigner edge,
  :func:`fedhype.federated.covariance.located_rank`) and the rest;
* ``blocks``: blocks doubling from r (r, 2r, 4r, … directions);
* ``k64``: the first 64 eigenvectors and the rest;
* ``inflate`` / ``inflate3``: the predictive Gaussian's extra isotropic variance.

``dp-gaussian`` (the release alone, neutral code) at each job's size (`release_defaults._JOB_SIZE`), on the digits
job and the 10,000-image Fashion-MNIST job, ε = 1 / 4 / 8, at digits ε = 4 with ``model.located_share = 0.8``
(whose TSTR cost there, ``docs/method.md`` decision 16, is blamed on the class means' noise), and on all 70,000
Fashion-MNIST images at ε = 1 (issue #19's cell, where F ≈ 0.99 but the classifier whitens by the covariance, so the
means' noise in the directions of little variance weighs more than F says); TSTR of a linear probe,
precision and coverage (PRDC, k = 5) on the **validation** split.

    .venv/bin/python benchmarks/class_mean_denoise.py      # seeds 0 1 2 (about 15 min alone)

Writes ``benchmarks/results/class_mean_denoise.{json,md}``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("off", "two", "blocks", "k64", "inflate", "inflate3")
#: (dataset, ε, located share) cells
CELLS = ([(d, e, "auto") for d in ("digits", "fashion") for e in ("1", "4", "8")] + [("digits", "4", 0.8)]
         + [("fashion-full", "1", "auto")])


def install(mode: dict) -> None:
    """Patch the pooled moments and the Gaussian built from them with ``mode["v"]``'s variant (a diagnostic)."""
    import torch

    from fedhype.federated import class_stats as cs
    from fedhype.federated import client_shrinkage as csh
    from fedhype.federated import covariance as cv

    moments, within_of, snr, gaussian = cs._moments, cv._within_of, cv.class_mean_snr, cv._gaussian

    def raw(mo: dict) -> dict:
        return {**mo, "class_means": mo["class_means_raw"]} if "class_means_raw" in mo else mo

    def noise_t2(mo: dict) -> float:
        counts = mo["counts"].to(torch.float64)
        return float((counts / counts.sum() * mo["sums_noise_var"] / counts ** 2).sum())

    def denoise(mo: dict) -> dict:
        if mo.get("cov") is None or float(torch.as_tensor(mo["sums_noise_var"]).max()) <= 0:
            return mo
        m = mo["mean"].to(torch.float64)
        d = mo["class_means"].to(torch.float64) - m  # [K, D]
        counts = mo["counts"].to(torch.float64)
        w = counts / counts.sum()
        dim = d.shape[1]
        vec = torch.linalg.eigh(mo["cov"])[1].flip(1)  # eigenvectors, largest eigenvalue first
        r = max(1, cv.located_rank(mo["cov"], mo["offdiag_var"]))
        bounds = {"two": [0, r, dim], "k64": [0, 64, dim]}.get(mode["v"])
        if bounds is None:  # "blocks": r, 2r, 4r, …
            bounds = [0, r]
            while bounds[-1] < dim:
                bounds.append(min(dim, 2 * bounds[-1]))
        proj, t2 = d @ vec, noise_t2(mo)
        for a, b in zip(bounds[:-1], bounds[1:]):
            obs = float((w[:, None] * proj[:, a:b] ** 2).sum())
            proj[:, a:b] *= max(0.0, 1.0 - (b - a) * t2 / obs) if obs > 0 else 0.0
        return {**mo, "class_means_raw": mo["class_means"], "class_means": (m + proj @ vec.T).to(torch.float32)}

    def patched_moments(*a, **k):
        mo = moments(*a, **k)
        return denoise(mo) if mode["v"] in ("two", "blocks", "k64") else mo

    def patched_gaussian(mo, max_rank, residual="latent", located_share=0.0):
        factor, resid, rank = gaussian(mo, max_rank, residual, located_share)
        if mode["v"].startswith("inflate"):
            resid = resid + float(mode["v"][7:] or 1) * noise_t2(mo)
        return factor, resid, rank

    cs._moments = patched_moments
    cv._within_of = csh._within_of = lambda mo: within_of(raw(mo))
    cv.class_mean_snr = cs.class_mean_snr = lambda mo: snr(raw(mo))
    cv._gaussian = cs._gaussian = patched_gaussian


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()

    import torch

    from release_defaults import _JOB_SIZE, CONFIGS, data, val_scores

    torch.set_num_threads(1)
    mode = {"v": "off"}
    install(mode)
    t0 = time.perf_counter()
    rows, loaded = [], {}
    for seed in a.seeds:
        parts = {}
        for name, eps, share in CELLS:
            if name not in loaded:
                loaded[name] = data(name)
            if name not in parts:
                parts[name] = loaded[name][1](seed)
            for v in VARIANTS:
                mode["v"] = v
                sc = val_scores(loaded[name][0], parts[name], {"method": "dp-gaussian", **_JOB_SIZE[name],
                                                               "located_share": share}, eps, seed, CONFIGS[name])
                rows.append({"dataset": name, "eps": eps, "located_share": share, "variant": v, "seed": seed,
                             **{k: sc[k] for k in ("val_tstr", "precision", "coverage")}})
                print(json.dumps(rows[-1]), flush=True)
    cell = lambda v: f"{st.fmean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}"
    lines = ["# Denoising the release's class means (validation split, a negative result)", "",
             f"_{datetime.date.today()}, {platform.machine()} CPU, one thread; `benchmarks/class_mean_denoise.py` "
             f"({time.perf_counter() - t0:.0f} s); `dp-gaussian` (neutral code) at each job's latent size and synthetic "
             f"count; seeds {a.seeds} (partition seed = noise seed); TSTR of a linear probe (precision / coverage, PRDC "
             "k = 5) on the **validation** split (the test split is not read)_", "",
             "| dataset | ε | located share | " + " | ".join(f"`{v}`" for v in VARIANTS) + " |",
             "|---|---|---|" + "---|" * len(VARIANTS)]
    for name, eps, share in CELLS:
        out = []
        for v in VARIANTS:
            rs = [r for r in rows if (r["dataset"], r["eps"], r["located_share"], r["variant"]) == (name, eps, share, v)]
            out.append(f"{cell([r['val_tstr'] for r in rs])} ({st.fmean(r['precision'] for r in rs):.2f} / "
                       f"{st.fmean(r['coverage'] for r in rs):.2f})")
        lines.append(f"| {name} | {eps} | {share} | " + " | ".join(out) + " |")
    md = "\n".join(lines) + "\n"
    out_dir = Path(a.results)
    (out_dir / "class_mean_denoise.md").write_text(md)
    (out_dir / "class_mean_denoise.json").write_text(json.dumps({"date": str(datetime.date.today()), "rows": rows},
                                                                indent=1) + "\n")
    print(md)


if __name__ == "__main__":
    main()
