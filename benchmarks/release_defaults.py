"""How the defaults of the second-order release were chosen: validation-split TSTR, never the test split.

On the bundled digits job (the main job's data, encoder and partition scheme, partition seed =
seed), each row trains with ``fedhype.federated.engine.train`` (the main job's ``[train]``/``[model]``
defaults plus the row's overrides), draws 300 synthetic embeddings per class from the neutral code
and scores a linear probe trained on them on the **validation** split of every client (TSTR-val).
The test split is not read. Grids:

* ``second_moment_share`` ∈ {0.1, 0.3, 0.5} for ``dp-gaussian`` (the release alone) at ε = 1 / 4 / 8;
* ``class_stats_share`` ∈ {0.8, 0.9, 0.95} for ``fedhypevae`` at ε = 1 / 4, beside ``dp-gaussian``;
* without DP: ``lr_local`` 1e-2 vs 1e-3 and ``latent`` 32 vs 64 for ``fedhypevae``, beside ``dp-gaussian``;
* the centred release (:mod:`fedhype.privacy.centring`) for ``dp-gaussian`` at ε = 1 / 4 / 8: off
  (``centre_share = 0``), the clip radius κ ∈ {0.6, 0.8, 1.0, 1.5} at centre share 0.06, and the share
  ∈ {0.03, 0.12} at κ = 0.8 (ε = 4). The grids above it were measured before it existed and keep
  ``centre_share = 0`` (the uncentred release they ran);
* the within-class threshold of :func:`fedhype.federated.covariance._within_class` (the James–Stein
  factor above which the between-class scatter is subtracted): 0 (always), 0.9 (default) and never,
  for ``dp-gaussian`` at ε = 4 / 8 and without DP;
* the client centres (``train.release_centre``, :func:`fedhype.privacy.centring.client_centrings`):
  ``pooled`` vs ``client`` for ``dp-gaussian`` (neutral code) and ``fedhypevae`` (the job's
  ``mixture`` code) at ε = 1 / 4 / 8, on the digits job and on ``configs/fashion-mnist.toml`` (10
  Dirichlet α = 0.3 clients: label skew only). The rows before it ran the pooled centre and say so;
* the unlocated variance (``model.residual``, :func:`fedhype.federated.covariance.covariance_estimate`):
  ``isotropic`` vs ``latent`` for the same two methods, ε and datasets, with client centres;
* without DP, the same two methods and datasets, ``latent`` vs ``located`` (nothing is hidden by noise:
  the release locates L directions and the unlocated variance is the D − L tail);
* the DP-SGD stage: ``class_stats_share`` 0.95 (default) vs 0.999 (the rounds get a thousandth of ε and
  move nothing) for ``fedhypevae`` (mixture code), both datasets, ε = 1 / 4 / 8; and the same choice by fidelity
  (precision, coverage and MMD² to the validation split as well, "DP-SGD share, fidelity") per client on both small
  sets and with 100 clients of all 70,000 images (``configs/fashion-mnist-full-100.toml``) at ε = 1; and with no
  DP-SGD stage at all ("DP-SGD stage off": ours' model from the release with the whole ε, no round, beside the release
  alone), the same cells;
* at realistic scale (``configs/fashion-mnist-full.toml``: all 70,000 images, 10 clients, about
  42,000 training records), ``latent`` vs ``located`` for ``dp-gaussian`` at ε = 1 / 4 / 8 and for
  ``fedhypevae`` (mixture code) at ε = 4 / 8: is the noise there small enough for the located residual
  to pay under DP? (the rows that set ``model.residual = "auto"``'s threshold);
* ours (mixture code, every default) on the three datasets after the clip-shift discount and the
  within-class target of the clients' statistics (:class:`fedhype.federated.client_shrinkage.ClipShift`);

* undoing the clip's shrink (``model.clip_rescale``, :func:`fedhype.federated.class_stats.clip_rescale_factor`):
  off vs on for ``dp-gaussian`` per client and under secure aggregation on the three datasets at ε = 1 / 4 / 8,
  and for ours on digits and (secure aggregation, ε = 8) on all 70,000 images;
* per client at ε = 1 on all 70,000 images: ``second_moment_share`` ∈ {0.15, 0.3, 0.45} × κ ∈ {0.5, 0.65, 0.8,
  1.0, 1.3} for ``dp-gaussian`` at the job's size (both were chosen on the digits job);
* the share of the unlocated variance on the located spikes (``model.located_share``): at scale (0 / 0.3 / 0.5 /
  0.65 / 0.8, "located share, scale"; with 100 clients at ε = 4, 0 vs 0.8) and, for the rule ``"auto"`` (0.8 where the pooled class means' James–Stein
  factor F ≥ 0.94, :func:`fedhype.federated.covariance.resolve_located_share`), 0 vs 0.8 at the job's size on
  digits and Fashion-MNIST per client and under secure aggregation ("located share, auto"; the rows with no
  ``located_share`` ran before ``"auto"`` became the default, with s = 0);
* the clients' covariances under their own heterogeneity test (``model.client_shrinkage = "client-cov"``,
  :func:`fedhype.federated.client_shrinkage.shrink_client_cov`) against the default ``"client"``: ours (mixture code, the
  job's size, ``located_share = "auto"``) on digits and Fashion-MNIST at ε = 4 / 8 ("client covariance test"), and
  with MMD² to the validation split on digits at ε = 1 / 4 / 8 ("client covariance test, MMD²": where ours' test MMD²
  is above the release alone's);
* the DP-SGD stage by records per client (docs/method.md decision 22): ours against ``no-dp-sgd`` at ε = 4 / 8 on all
  70,000 images over 10, 20, 30 and 40 clients ("DP-SGD stage, client size");
* where that rule leaves ours without its stage, the centre each client clips around: ``pooled`` against its own
  (``client``) for ``no-dp-sgd`` on digits, Fashion-MNIST and 100 clients of all 70,000 images ("release centre, stage off");
  and with 100 clients at ε = 4 / 8 the release alone and ``no-dp-sgd`` drawn from the neutral code ("code, many clients");
* the code dimension with more clients than the 32 it was: ``no-dp-sgd`` (mixture code) with 128 for 100 clients and
  64 for 40 ("code dimension, many clients"; ``model.code_dim = "auto"``, docs/method.md decision 23);
* the clients' heterogeneity test as it compared a float32 count with the float64 floor (``counts_floor = float64``:
  where float32(floor) rounds above the floor, at ε = 1 and 8 on these sets, every floored class took part) against
  the fixed comparison, for ``no-dp-sgd`` (mixture code, the job's sizes) on the three datasets ("counts floor").

Each finished row is appended to ``runs/bench-release-defaults/rows.jsonl``; a rerun skips the rows
already there or in the committed ``benchmarks/results/release_defaults.json``. Writes ``benchmarks/results/release_defaults.{json,md}`` (mean ± std over the seeds)
and prints the table.

    .venv/bin/python benchmarks/release_defaults.py              # 3 seeds (~20 min on 2 cores, one process)
    .venv/bin/python benchmarks/release_defaults.py --seeds 0    # a quick look (table in runs/bench-release-defaults/results)
    .venv/bin/python benchmarks/release_defaults.py --grids "clip rescale"   # one grid's missing rows only
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics as st  # the standard library's (this file is not named statistics.py)
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the grids measured before the centred release existed ran the uncentred release (centre_share = 0);
#: their rows say so, so that a rerun reproduces them rather than mixing them with the new default
_U = {"centre_share": 0.0}
#: the grids measured before client centres existed clipped around the pooled centre
_P = {"release_centre": "pooled"}
CONFIGS = {"digits": None, "fashion": ROOT / "configs" / "fashion-mnist.toml",
           "fashion-full": ROOT / "configs" / "fashion-mnist-full.toml",
           "fashion-full-100": ROOT / "configs" / "fashion-mnist-full-100.toml",
           "fashion-full-20": ROOT / "configs" / "fashion-mnist-full.toml",
           "fashion-full-30": ROOT / "configs" / "fashion-mnist-full.toml",
           "fashion-full-40": ROOT / "configs" / "fashion-mnist-full.toml"}
#: a dataset's partition settings beyond its config file: all 70,000 images over 20, 30 or 40 clients (median
#: training records about 2,150-2,290, 1,400-1,460 and 1,040-1,060 over seeds 0-2), between the 10-client (~4,200)
#: and the 100-client (~420) configs
PARTITION_SETS = {f"fashion-full-{k}": [f"partition.clients={k}"] for k in (20, 30, 40)}
#: the latent size every row of these grids (and of benchmarks/release_scale.py) ran with unless it sets
#: ``latent``: the rows were measured before ``model.latent = "auto"`` gave large training sets L = 128
#: (docs/method.md, decision 17), so L is pinned to keep them reproducible
PINNED_LATENT = 64
#: the code dimension every row ran with unless it sets ``code_dim`` (the fixed size before ``model.code_dim = "auto"``)
PINNED_CODE_DIM = 32
#: a job's own latent size and synthetic records per class under DP (model.latent = "auto" and
#: synthesis.per_class = "auto": L = 128 and 3,000 per class from 500 training records per class)
_JOB_SIZE = {"digits": {"latent": 64, "per_class": 300}, "fashion": {"latent": 128, "per_class": 3000},
             "fashion-full": {"latent": 128, "per_class": 3000}, "fashion-full-100": {"latent": 128, "per_class": 3000},
             "fashion-full-20": {"latent": 128, "per_class": 3000}, "fashion-full-30": {"latent": 128, "per_class": 3000},
             "fashion-full-40": {"latent": 128, "per_class": 3000}}
#: ours without its DP-SGD stage: the ``no-dp-sgd`` ablation (fedhype.federated.config) — FedHypeVAE's model (the
#: client-statistics heads, the mixture code) from the statistics release with the whole ε and no round
NO_DP_SGD = "no-dp-sgd"


GRID: list[tuple[str, str, dict]] = (
    [("second_moment_share", e, {"method": "dp-gaussian", "second_moment_share": s, **_U})
     for e in ("1", "4", "8") for s in (0.1, 0.3, 0.5)]
    + [("class_stats_share", e, {"method": "dp-gaussian", **_U}) for e in ("1", "4")]
    + [("class_stats_share", e, {"class_stats_share": s, **_U}) for e in ("1", "4") for s in (0.8, 0.9, 0.95)]
    + [("no DP: lr_local, latent", "none", {"method": "dp-gaussian"})]
    + [("no DP: lr_local, latent", "none", {"lr_local": lr, "latent": lat}) for lr in (1e-2, 1e-3) for lat in (32, 64)]
    + [("within-class threshold", e, {"method": "dp-gaussian", "within_class_min_snr": t, **({} if e == "none" else _U)})
       for e in ("4", "8", "none") for t in (0.0, 0.9, "never")]
    # the centred release (fedhype.privacy.centring): off, and the clip radius κ at the default centre share
    + [("centred release", e, {"method": "dp-gaussian", "centre_share": 0.0}) for e in ("1", "4", "8")]
    + [("centred release", e, {"method": "dp-gaussian", "centre_share": 0.06, "release_radius": k, **_P})
       for e in ("1", "4", "8") for k in (0.6, 0.8, 1.0, 1.5)]
    + [("centred release", "4", {"method": "dp-gaussian", "centre_share": s, "release_radius": 0.8, **_P}) for s in (0.03, 0.12)]
    # client centres: pooled vs client, the release alone and ours (its job code), both datasets (measured
    # before the unlocated-variance rule below existed: isotropic residual)
    + [("client centres", e, {"dataset": d, "method": m, "code": code, "release_centre": c, "residual": "isotropic"})
       for d in ("digits", "fashion") for m, code in (("dp-gaussian", "neutral"), ("fedhypevae", "mixture"))
       for e in ("1", "4", "8") for c in ("pooled", "client")]
    # where the variance the release cannot locate goes (fedhype.federated.covariance.covariance_estimate)
    + [("unlocated variance", e, {"dataset": d, "method": m, "code": code, "residual": r})
       for d in ("digits", "fashion") for m, code in (("dp-gaussian", "neutral"), ("fedhypevae", "mixture"))
       for e in ("1", "4", "8") for r in ("isotropic", "latent")]
    # without DP (nothing to locate but the D − L tail beyond the latent size): latent vs located
    + [("unlocated variance, no DP", "none", {"dataset": d, "method": m, "code": code, "residual": r})
       for d in ("digits", "fashion") for m, code in (("dp-gaussian", "neutral"), ("fedhypevae", "mixture"))
       for r in ("latent", "located")]
    # is the DP-SGD stage worth its 5 % of ε? 0.999 leaves it a thousandth (σ so large that the rounds move nothing)
    + [("DP-SGD share", e, {"dataset": d, "code": "mixture", "class_stats_share": c})
       for d in ("digits", "fashion") for e in ("1", "4", "8") for c in (0.95, 0.99, 0.999)]
    # at realistic scale (all 70,000 Fashion-MNIST images, 42,000 training records) the release's noise is
    # small: does the located residual, the default only without DP, pay under DP there? (the release alone)
    + [("unlocated variance, scale", e, {"dataset": "fashion-full", "method": "dp-gaussian", "residual": r})
       for e in ("1", "4", "8") for r in ("latent", "located")]
    # and for ours (the job's mixture code) where the release resolves more than half the latent
    # directions (ε = 4 / 8 there): the rows that set model.residual = "auto"'s threshold
    + [("unlocated variance, scale", e, {"dataset": "fashion-full", "method": "fedhypevae", "code": "mixture", "residual": r})
       for e in ("4", "8") for r in ("latent", "located")]
    # the clients' statistics with the clip-shift discount and the within-class target (client_shrinkage.ClipShift,
    # _shrunk_cov): ours (the job's mixture code, every default) on the three datasets; the same settings
    # before the change are the "DP-SGD share" rows at class_stats_share = 0.95 (digits, fashion)
    + [("client statistics, clip shift", e, {"dataset": d, "code": "mixture"})
       for d in ("digits", "fashion", "fashion-full") for e in ("1", "4", "8")]
    # at realistic scale, is the DP-SGD stage worth its 5 % of ε? (the defaults' rows are "client statistics,
    # clip shift" with dataset = fashion-full)
    + [("DP-SGD share, scale", e, {"dataset": "fashion-full", "code": "mixture", "class_stats_share": 0.999})
       for e in ("1", "4", "8")]
    # undoing the clip's shrink (model.clip_rescale, fedhype.federated.class_stats.clip_rescale_factor): the
    # release alone per client and under secure aggregation on the three datasets, at each job's latent size
    # and sample count (model.latent = "auto", synthesis.per_class = "auto"), and ours on digits (its job
    # code: mixture per client, neutral under secure aggregation) and on all 70,000 images at ε = 8
    + [("clip rescale", e, {"dataset": d, "method": "dp-gaussian", **_JOB_SIZE[d], "secure_aggregation": sa,
                            "clip_rescale": cr})
       for d in ("digits", "fashion", "fashion-full") for sa in (False, True) for e in ("1", "4", "8") for cr in (False, True)]
    + [("clip rescale", e, {"dataset": "digits", **_JOB_SIZE["digits"], "secure_aggregation": sa,
                            "code": "neutral" if sa else "mixture", "clip_rescale": cr})
       for sa in (False, True) for e in ("1", "4", "8") for cr in (False, True)]
    + [("clip rescale", "8", {"dataset": "fashion-full", **_JOB_SIZE["fashion-full"], "secure_aggregation": True,
                              "clip_rescale": cr}) for cr in (False, True)]
    # per client at ε = 1 on all 70,000 images (issue #19's 0.80): the second moment's share and the clip radius κ
    # of the release alone at the job's size, the two settings chosen on the digits job
    + [("share and radius, scale", "1", {"dataset": "fashion-full", "method": "dp-gaussian", **_JOB_SIZE["fashion-full"],
                                         "second_moment_share": sh, "release_radius": k})
       for sh in (0.15, 0.3, 0.45) for k in (0.5, 0.65, 0.8, 1.0, 1.3)]
    # per client on all 70,000 images: a share of the unlocated variance on the located spikes (model.located_share;
    # at 300 per class it had lifted the release alone at ε = 4 / 8 by 0.025, benchmarks/residual_tradeoff.py's rule)
    + [("located share, scale", e, {"dataset": "fashion-full", "method": "dp-gaussian", **_JOB_SIZE["fashion-full"],
                                    "located_share": s}) for e in ("1", "4", "8") for s in (0.0, 0.5, 0.8)]
    + [("located share, scale", "1", {"dataset": "fashion-full", "method": "dp-gaussian", **_JOB_SIZE["fashion-full"],
                                      "located_share": s}) for s in (0.3, 0.65)]
    + [("located share, scale", e, {"dataset": "fashion-full", "method": "dp-gaussian", **_JOB_SIZE["fashion-full"],
                                    "located_share": 0.5, "clip_rescale": True}) for e in ("1", "8")]
    + [("located share, scale", e, {"dataset": "fashion-full", **_JOB_SIZE["fashion-full"], "located_share": s})
       for e in ("1", "4", "8") for s in (0.0, 0.5)]
    + [("located share, scale", "1", {"dataset": "fashion-full", **_JOB_SIZE["fashion-full"], "secure_aggregation": True,
                                      "located_share": s}) for s in (0.0, 0.5)]
    # ours at ε = 1 per client with "auto"'s share: the one scale cell where F (0.988) and r (11) alone would allow it
    + [("located share, scale", "1", {"dataset": "fashion-full", **_JOB_SIZE["fashion-full"], "located_share": 0.8})]
    # the 100-client grid's ε = 4 cells (F 0.989, r 12-14), the other scale cells "auto" turns on since it no longer
    # stops at 2,000 DP records per class: the release alone and ours (the job's mixture code) at s = 0 and 0.8
    + [("located share, scale", "4", {"dataset": "fashion-full-100", "method": m, **_JOB_SIZE["fashion-full-100"],
                                      **({"code": "mixture"} if m == "fedhypevae" else {}), "located_share": s})
       for m in ("dp-gaussian", "fedhypevae") for s in (0.0, 0.8)]
    # model.located_share = "auto" (0.8 where the pooled class means' James–Stein factor F ≥ 0.94 and r ≤ 20; these
    # rows ran when it also required fewer than 2,000 DP records per class): s = 0 against 0.8 at the job's size in the cells the rule decides, the release alone and ours
    # (the job's code: mixture per client, neutral under secure aggregation), per client (ours at ε = 4 / 8, where
    # residual_tradeoff.py measured ε = 1 at 300 per class) and under secure aggregation, whose pooled release is less
    # noisy (F 0.96 / 0.99 at digits ε = 4 / 8, 0.93 at Fashion-MNIST ε = 1)
    + [("located share, auto", e, {"dataset": d, "method": m, **_JOB_SIZE[d], "secure_aggregation": sa,
                                   **({"code": "mixture"} if m == "fedhypevae" and not sa else {}), "located_share": s})
       for d in ("digits", "fashion") for sa in (False, True) for m in ("dp-gaussian", "fedhypevae")
       for e in (("4", "8") if m == "fedhypevae" and not sa else ("1", "4", "8")) for s in (0.0, 0.8)]
    # the clients' covariances moved no further than their own heterogeneity test allows (model.client_shrinkage
    # "client-cov", client_shrinkage.shrink_client_cov) against the default "client": ours (the job's mixture code, the
    # job's size and located share) where the mixture's precision stayed below 0.3 (ε = 4) and at ε = 8
    + [("client covariance test", e, {"dataset": d, "code": "mixture", **_JOB_SIZE[d], "located_share": "auto",
                                      "client_shrinkage": c})
       for d in ("digits", "fashion") for e in ("4", "8") for c in ("client", "client-cov")]
    # the same choice by MMD² too, where ours' MMD² is above the release alone's on the test split (digits, ε = 1):
    # is it the clients' noisy covariances (which "client-cov" pulls to the pool) or their means?
    + [("client covariance test, MMD²", e, {"dataset": d, "code": "mixture", **_JOB_SIZE[d], "located_share": "auto",
                                            "client_shrinkage": c})
       for e in ("1", "4", "8") for c in ("client", "client-cov") for d in ("digits",)]
    # is the DP-SGD stage worth its 5 % of ε with the current defaults (the job's size and located share)? Per client
    # (ours with its mixture code) and under secure aggregation, where the server sees no client's statistics (ours
    # with the neutral code, beside the release alone): 0.999 leaves the rounds a thousandth of ε
    + [("DP-SGD share, job", e, {"dataset": d, **_JOB_SIZE[d], "located_share": "auto", "secure_aggregation": sa,
                                 **({} if sa else {"code": "mixture"}), "class_stats_share": c})
       for d in ("digits", "fashion") for sa in (True, False) for e in ("1", "4", "8") for c in (0.95, 0.999)]
    + [("DP-SGD share, job", e, {"dataset": d, "method": "dp-gaussian", **_JOB_SIZE[d], "located_share": "auto",
                                 "secure_aggregation": True})
       for d in ("digits", "fashion") for e in ("1", "4", "8")]
    # the same at realistic scale (all 70,000 Fashion-MNIST images), first at ε = 1 (issue #19's 0.80)
    + [("DP-SGD share, job", e, {"dataset": "fashion-full", **_JOB_SIZE["fashion-full"], "located_share": "auto",
                                 "secure_aggregation": sa, **({} if sa else {"code": "mixture"}), "class_stats_share": c})
       for e in ("1",) for sa in (False, True) for c in (0.95, 0.999)]
    # the same choice by fidelity too (precision, coverage and MMD² against the validation split), per client with
    # the mixture code, on the two small sets and with 100 clients of about 420 records (where ours is behind the
    # release alone on the test split at ε = 1): does a thousandth of ε for the rounds cost anything but TSTR?
    + [("DP-SGD share, fidelity", e, {"dataset": d, **_JOB_SIZE[d], "located_share": "auto", "code": "mixture",
                                      "class_stats_share": c})
       for d in ("digits", "fashion") for e in ("1", "4", "8") for c in (0.95, 0.999)]
    + [("DP-SGD share, fidelity", e, {"dataset": "fashion-full-100", **_JOB_SIZE["fashion-full-100"],
                                      "located_share": "auto", "code": "mixture", "class_stats_share": c})
       for e in ("1",) for c in (0.95, 0.999)]
    # no DP-SGD stage at all: ours' model (client heads, mixture code) from the release with the whole ε, no round
    # (the no-dp-sgd ablation), beside the release alone (neutral code) — the rows of
    # ours at the default share are the "DP-SGD share, fidelity" grid's
    + [("DP-SGD stage off", e, {"dataset": d, "method": m, **_JOB_SIZE[d], "located_share": "auto",
                                "code": "mixture" if m == NO_DP_SGD else "neutral"})
       for d in ("digits", "fashion") for e in ("1", "4", "8") for m in (NO_DP_SGD, "dp-gaussian")]
    + [("DP-SGD stage off", "1", {"dataset": "fashion-full-100", "method": m, **_JOB_SIZE["fashion-full-100"],
                                  "located_share": "auto", "code": "mixture" if m == NO_DP_SGD else "neutral"})
       for m in (NO_DP_SGD, "dp-gaussian")]
    # with 100 clients of ~420 records the stage-off model's MMD² doubled: which part of the mixture costs it — the
    # clients' own statistics (the neutral code samples the pooled release through ours' model) or the clients' own
    # DP centres (release_centre "pooled": every client clipped around the pooled centre)
    + [("DP-SGD stage off, many clients", "1", {"dataset": "fashion-full-100", "method": NO_DP_SGD,
                                                **_JOB_SIZE["fashion-full-100"], "located_share": "auto", **v})
       for v in ({"code": "neutral"}, {"code": "mixture", "release_centre": "pooled"})]
    # the stage by records per client (client sizes are public): on the test split it paid with 10 clients of
    # ~4,200 records at ε = 4 / 8 and not on the small sets (~600-1,000) nor with 100 clients (~420); measured
    # here on validation with 10, 20, 30 and 40 clients (median ~4,150, ~2,150-2,290, ~1,400-1,460, ~1,050) of the same
    # 70,000 images, ours against no-dp-sgd
    + [("DP-SGD stage, client size", e, {"dataset": d, "method": m, **_JOB_SIZE[d], "located_share": "auto",
                                         "code": "mixture"})
       for d in ("fashion-full", "fashion-full-20", "fashion-full-30", "fashion-full-40") for e in ("4", "8")
       for m in ("fedhypevae", NO_DP_SGD)]
    # the centre each client clips around, where the rule of decision 22 leaves ours without its stage (small
    # clients): every client around the pooled centre against its own DP centre (the default per client; those rows
    # are the "DP-SGD stage off" grid's on the two small sets); with 100 clients at ε = 1 the pooled centre was the
    # best TSTR measured and halved the MMD² the clients' own centres cost ("DP-SGD stage off, many clients")
    + [("release centre, stage off", e, {"dataset": d, "method": NO_DP_SGD, **_JOB_SIZE[d], "located_share": "auto",
                                         "code": "mixture", "release_centre": rc})
       for d in ("digits", "fashion", "fashion-full-100") for e in ("1", "4", "8") for rc in ("client", "pooled")
       if not (d != "fashion-full-100" and rc == "client") and not (d == "fashion-full-100" and e == "1")]
    # with 100 clients ours (no-dp-sgd by the rule, mixture code) was 0.005 behind the release alone at ε = 8 on the
    # test split: on validation, the release alone and ours' model drawn from the neutral code beside those rows
    + [("code, many clients", e, {"dataset": "fashion-full-100", "method": m, **_JOB_SIZE["fashion-full-100"],
                                  "located_share": "auto", "code": "neutral"})
       for e in ("4", "8") for m in (NO_DP_SGD, "dp-gaussian")]
    # the client-statistics heads are linear in the code (apply_client_stats): with more clients than
    # model.code_dim (32) they are a least-squares fit, so h(c_i) is not client i's own Gaussian; with 100
    # clients the mixture was behind the neutral code at ε = 8. The same rows with a code per client (128 ≥ 100)
    + [("code dimension, many clients", e, {"dataset": "fashion-full-100", "method": NO_DP_SGD,
                                            **_JOB_SIZE["fashion-full-100"], "located_share": "auto", "code": "mixture",
                                            "code_dim": 128})
       for e in ("1", "4", "8")]
    + [("code dimension, many clients", e, {"dataset": "fashion-full-40", "method": NO_DP_SGD,
                                            **_JOB_SIZE["fashion-full-40"], "located_share": "auto", "code": "mixture",
                                            "code_dim": 64})
       for e in ("4", "8")]
    # the clients' heterogeneity test compared a float32 count with the float64 floor (client_shrinkage.shrink_client):
    # where float32(floor) rounds up (ε = 1 and 8 here) every floored class took part; ours' model without its stage
    # (the default on these sets), the comparison as it was (counts_floor = float64) and fixed, in the same session
    + [("counts floor", e, {"dataset": d, "method": NO_DP_SGD, **_JOB_SIZE[d], "located_share": "auto", "code": "mixture",
                            "code_dim": "auto", **v})
       for d in ("digits", "fashion", "fashion-full-100") for e in ("1", "8") for v in ({"counts_floor": "float64"}, {})
       if not (d == "fashion-full-100" and e == "8")]
    # without DP the release is the exact statistics: does the (non-private) training stage still add anything to
    # the full-rank Gaussian it starts from? ours against no-dp-sgd at the no-DP job's size (L = D, 3,000 per class;
    # docs/method.md decision 15), mixture code ("no DP, training stage")
    + [("no DP, training stage", "none", {"dataset": d, "method": m, "latent": 384, "per_class": 3000,
                                          "located_share": "auto", "code": "mixture"})
       for d in ("digits", "fashion", "fashion-full") for m in ("fedhypevae", NO_DP_SGD)]
)


#: grids whose rows also record precision, coverage and F (the table shows precision / coverage beside TSTR)
WITH_PRDC = ("located share, auto", "client covariance test", "client covariance test, MMD²", "DP-SGD share, fidelity",
             "DP-SGD stage off", "DP-SGD stage off, many clients", "DP-SGD stage, client size", "release centre, stage off",
             "code, many clients", "code dimension, many clients", "counts floor", "no DP, training stage")
#: grids whose rows also record MMD² to the validation split (the table shows it after precision / coverage)
WITH_MMD = ("client covariance test, MMD²", "DP-SGD share, fidelity", "DP-SGD stage off", "DP-SGD stage off, many clients", "DP-SGD stage, client size",
            "release centre, stage off", "code, many clients",
            "code dimension, many clients", "counts floor", "no DP, training stage")


def val_tstr(store, part, overrides: dict, eps: str, seed: int, config=None) -> float:
    """Validation-split TSTR of one training run (:func:`val_scores`)."""
    return val_scores(store, part, overrides, eps, seed, config, with_prdc=False)["val_tstr"]


def val_scores(store, part, overrides: dict, eps: str, seed: int, config=None, with_prdc: bool = True,
               with_mmd: bool = False) -> dict:
    """Validation-split TSTR, precision and coverage (PRDC, k = 5) of one training run (300 per class unless
    ``per_class`` is overridden, L = :data:`PINNED_LATENT` unless ``latent`` is; the neutral code unless ``code``
    is; ``model.located_share = 0`` unless ``located_share`` is: every row before ``"auto"`` became the default ran
    with 0), and the pooled class means' James–Stein factor F of its release (``class_mean_snr``, None without one)."""
    import json

    import numpy as np

    from fedhype.eval.inputs import as_matrix
    from fedhype.eval.prdc import prdc
    from fedhype.eval.utility import Probe
    from fedhype.federated.engine import train
    from fedhype.pipeline.config import resolve, train_config
    from fedhype.synthesis import synthesize

    from fedhype.federated import covariance

    sets = [f"train.seed={seed}"] + (["train.epsilon=none", "train.no_dp=true"] if eps == "none" else [f"train.epsilon={float(eps)}"])
    overrides = dict(overrides)
    overrides.pop("dataset", None)
    code = overrides.pop("code", "neutral")
    per_class = int(overrides.pop("per_class", 300))
    overrides.setdefault("latent", PINNED_LATENT)
    # every row before model.code_dim = "auto" (decision 23) ran with 32: pinned unless the row sets it (the 40- and
    # 100-client rows would otherwise rerun at 64 / 128)
    overrides.setdefault("code_dim", PINNED_CODE_DIM)
    overrides.setdefault("located_share", 0.0)
    # every row ran fedhypevae with its DP-SGD stage (the rule of docs/method.md decision 22 came after them, and
    # the "DP-SGD stage, client size" grid compares the two methods by name): the stage stays on here
    overrides.setdefault("dp_sgd_min_records", 0)
    before_fix = overrides.pop("counts_floor", None) == "float64"  # the heterogeneity test as it ran before 2026-12-06
    t = overrides.pop("within_class_min_snr", 0.9)
    covariance.WITHIN_CLASS_MIN_SNR = float("inf") if t == "never" else float(t)
    for k, v in overrides.items():
        v = str(v).lower() if isinstance(v, bool) else v
        section = "model" if k in ("latent", "residual", "clip_rescale", "located_share", "client_shrinkage",
                                   "code_dim", "pooling") else "train"
        sets.append(f'{section}.{k}="{v}"' if isinstance(v, str) and v not in ("true", "false") else f"{section}.{k}={v}")
    cfg = train_config(resolve(config, sets))
    with tempfile.TemporaryDirectory() as tmp, _floor_as_before(before_fix):
        train(store, part, cfg, Path(tmp) / "run", diagnostics=False)
        release = Path(tmp) / "run" / "release.json"
        snr = json.loads(release.read_text()).get("class_mean_snr") if release.exists() else None
        syn = synthesize(Path(tmp) / "run", code, per_class=per_class, seed=seed)
    val = part.split_store(store, "val")
    probe = Probe(store.n_classes).fit(as_matrix(syn).numpy(), syn.labels.numpy())
    pr = prdc(as_matrix(val), as_matrix(syn)) if with_prdc else {"precision": None, "coverage": None}
    mmd2 = None
    if with_mmd:  # unbiased MMD², median-heuristic bandwidth, as fedhype evaluate (no permutation test)
        from fedhype.eval.mmd import mmd_report
        mmd2 = float(mmd_report(as_matrix(val), as_matrix(syn), n_permutations=0, seed=seed)["mmd2"])
    return {"val_tstr": float(np.mean(probe.predict(as_matrix(val).numpy()) == val.labels.numpy())),
            "precision": pr["precision"] and float(pr["precision"]), "coverage": pr["coverage"] and float(pr["coverage"]),
            "class_mean_snr": snr, "mmd2": mmd2}


@contextlib.contextmanager
def _floor_as_before(on: bool):
    """With ``on``, :func:`fedhype.federated.client_shrinkage.shrink_client` as it ran before 2026-12-06: its test took a
    class as resolved when its float32 count exceeded the float64 floor, so where float32(floor) rounds above the floor
    every floored class took part (the same as a floor of 0 there; elsewhere the fixed comparison gives the old result)."""
    if not on:
        yield
        return
    import torch

    from fedhype.federated import client_shrinkage as cs

    fixed = cs.shrink_client

    def before(client, pooled, clip_shift=None):
        floor = float(client.get("counts_floor", 0.0))
        if float(torch.tensor(floor, dtype=torch.float32)) > floor:
            client = {**client, "counts_floor": 0.0}
        return fixed(client, pooled, clip_shift)

    cs.shrink_client, cs.SHRINKAGE["client"] = before, before
    try:
        yield
    finally:
        cs.shrink_client, cs.SHRINKAGE["client"] = fixed, fixed


def data(name: str):
    """The store and a partition maker of a dataset's job (the digits defaults, or its config file)."""
    from fedhype.data.partition import make_partition
    from fedhype.encoders.cache import cached_embed
    from fedhype.pipeline.config import DEFAULTS, resolve

    conf = resolve(CONFIGS[name], PARTITION_SETS.get(name, [])) if CONFIGS[name] else DEFAULTS
    d, p = conf["data"], conf["partition"]
    # the earlier grids keep the encoder's default dtype they ran with; the scale grid's embeddings are
    # its config's (dtype auto: the bfloat16 embeddings utility.py --dataset fashion-full caches)
    store = cached_embed(d["dataset"], d["encoder"], limit=d["limit"] or None, seed=d["seed"],
                         image_size=d["image_size"] or None, progress=False,
                         **({"dtype": d["dtype"]} if name.startswith("fashion-full") else {}))
    return store, lambda seed: make_partition(store, scheme=p["scheme"], n_clients=p["clients"] or None, alpha=p["alpha"],
                                              splits=tuple(p["fractions"]), min_train_per_client=p["min_records"], seed=seed)


def label(overrides: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in overrides.items()) or "defaults"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--results", default=None,
                    help="folder for release_defaults.json / .md (default: benchmarks/results with seeds 0 1 2, "
                         "runs/bench-release-defaults/results for other seeds: a slice never overwrites the committed table)")
    ap.add_argument("--grids", nargs="+", default=None, metavar="NAME",
                    help="measure only these grids' missing rows (e.g. \"clip rescale\"); the table keeps every row measured")
    a = ap.parse_args()
    names = {g for g, _, _ in GRID}
    if a.grids is not None and not set(a.grids) <= names:
        ap.error(f"unknown grid(s) {sorted(set(a.grids) - names)}; the grids are {sorted(names)}")

    import torch

    torch.set_num_threads(1)
    loaded: dict = {}
    t0 = time.perf_counter()
    log = ROOT / "runs" / "bench-release-defaults" / "rows.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    # rows already measured: the committed results (a fresh checkout), then this machine's log
    committed = ROOT / "benchmarks" / "results" / "release_defaults.json"
    if a.results is None:
        a.results = str(committed.parent if sorted(a.seeds) == [0, 1, 2] else log.parent / "results")
    known = json.loads(committed.read_text())["rows"] if committed.exists() else []
    known += list(map(json.loads, log.read_text().splitlines() if log.exists() else []))
    done = {json.dumps([r["grid"], r["eps"], r["overrides"], r["seed"]]): r for r in known}
    rows, ran = [], 0
    for seed in a.seeds:
        parts: dict = {}
        for grid, eps, ov in GRID:
            key = json.dumps([grid, eps, ov, seed])
            if key not in done and a.grids is not None and grid not in a.grids:
                continue  # not measured, and not asked for
            if key not in done:
                name = ov.get("dataset", "digits")
                if name not in loaded:
                    loaded[name] = data(name)
                if name not in parts:
                    parts[name] = loaded[name][1](seed)
                sc = val_scores(loaded[name][0], parts[name], ov, eps, seed, CONFIGS[name], with_prdc=grid in WITH_PRDC,
                                with_mmd=grid in WITH_MMD)
                acc = sc["val_tstr"]
                ran += 1
                done[key] = {"grid": grid, "eps": eps, "overrides": ov, "seed": seed, "val_tstr": acc,
                             # precision / coverage shown for the grids that choose by them (the earlier rows lack them)
                             **({k: sc[k] for k in ("precision", "coverage", "class_mean_snr")} if grid in WITH_PRDC else {}),
                             **({"mmd2": sc["mmd2"]} if grid in WITH_MMD else {})}
                with log.open("a") as f:
                    f.write(json.dumps(done[key]) + "\n")
                print(f"{grid} ε={eps} {label(ov)} seed {seed}: TSTR-val {acc:.3f}", flush=True)
            rows.append(done[key])
    groups: dict = {}
    prdc: dict = {}  # the rows that also scored precision / coverage against the validation split (PRDC, k = 5)
    mmd: dict = {}  # and MMD² (unbiased, median-heuristic bandwidth, as fedhype evaluate)
    for r in rows:
        key = (r["grid"], r["eps"], label(r["overrides"]))
        groups.setdefault(key, []).append(r["val_tstr"])
        if "precision" in r:
            prdc.setdefault(key, []).append((r["precision"], r["coverage"]))
        if r.get("mmd2") is not None:
            mmd.setdefault(key, []).append(r["mmd2"])
    lines = [f"_{datetime.date.today()}, {platform.machine()} CPU, one process × 1 thread; `benchmarks/release_defaults.py` "
             f"({ran} rows run by this call in {time.perf_counter() - t0:.0f} s, the others recorded in {log.relative_to(ROOT)}); "
             f"bundled digits job (configs/fashion-mnist.toml where a row says dataset = fashion, "
             f"configs/fashion-mnist-full.toml where it says fashion-full, the same over 20 / 30 / 40 clients where it says "
             f"fashion-full-20 / -30 / -40, configs/fashion-mnist-full-100.toml where it says fashion-full-100), seeds {a.seeds}; TSTR on the **validation** split "
             "(the test split is not read); defaults in bold_", "",
             "| grid | target ε | setting | TSTR-val | seeds |", "|---|---|---|---|---|"]
    defaults = {"second_moment_share = 0.3", "class_stats_share = 0.95", "lr_local = 0.001, latent = 64",
                "method = dp-gaussian, within_class_min_snr = 0.9",
                "method = dp-gaussian, centre_share = 0.06, release_radius = 0.8, release_centre = pooled"}
    for (grid, eps, lab), v in groups.items():
        cell = f"{st.fmean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}"
        if (grid, eps, lab) in prdc:
            pc = prdc[(grid, eps, lab)]
            cell += f" (precision / coverage {st.fmean(p for p, _ in pc):.2f} / {st.fmean(c for _, c in pc):.2f}" \
                + (f", MMD² {st.fmean(mmd[(grid, eps, lab)]):.4f})" if (grid, eps, lab) in mmd else ")")
        shown = f"**{lab}**" if lab.replace(", centre_share = 0.0", "") in defaults \
            or ("second_moment_share = 0.3" in lab and (grid != "share and radius, scale" or "radius = 0.8" in lab)) \
            or lab.endswith("release_centre = client, residual = isotropic") or lab.endswith("residual = latent") \
            or (grid.startswith("DP-SGD share") and lab.endswith("class_stats_share = 0.95")) \
            or lab.endswith("clip_rescale = False") or lab.endswith("client_shrinkage = client") \
            else lab
        lines.append(f"| {grid} | {'no DP' if eps == 'none' else eps} | {shown} | {cell} | {len(v)} |")
    md = "\n".join(lines) + "\n"
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "release_defaults.json").write_text(json.dumps({"rows": rows}, indent=1))
    (out / "release_defaults.md").write_text("# Choosing the release defaults (validation split)\n\n" + md)
    print(md)


if __name__ == "__main__":
    main()
