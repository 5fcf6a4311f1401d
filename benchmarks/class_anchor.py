"""Class-mean anchoring at synthesis, on and off, on the same trained models (validation split).

DP-SGD moves the class means of the model the statistics release set up (``fedhype.synthesis.anchor``);
anchoring puts each code's class means back on the release's (post-processing, no ε). This draws each trained
model twice with the same seed — anchored (``synthesis.anchor = true``) and not — and scores both against the
**validation** split (``--split test`` reports the test split once the default is chosen): TSTR (linear probe), MMD² (the evaluation's RBF kernel,
median bandwidth, mean over 3 subsamples of 2,000), precision, recall and coverage (PRDC, k = 5), and the mean
L2 distance between the synthetic and the real validation class means.

Models: ours (``fedhypevae``, the grids' ``mixture`` code), ``fedhypevae+secagg`` and ``dp-gaussian`` (neutral
code; its model is the release itself, so anchoring must change nothing) at ε = 1 / 4 / 8 and without DP, 3
seeds, each dataset's job config with the grids' settings (``benchmarks/utility.py``: partition, training and
synthesis seed = seed, ``synthesis.per_class = "auto"``). A model the utility grid already trained
(``runs/bench-utility-<dataset>/<method>-eps<ε>-s<seed>/run``) is reused — same config, same seeds, so the same
model — and one trained before models kept the release's class means gets them from its own release checkpoint
(:func:`fedhype.federated.rundir.backfill_release_means`); the others are trained into
``runs/bench-class-anchor/``. Each finished (dataset, method, ε, seed) is appended to
``runs/bench-class-anchor/rows.jsonl``; a rerun skips those.

    .venv/bin/python benchmarks/class_anchor.py --datasets fashion-full fashion digits     # validation (chooses)
    .venv/bin/python benchmarks/class_anchor.py --datasets fashion-full --split test       # afterwards: the test split

Writes ``benchmarks/results/class_anchor.{json,md}``.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "runs" / "bench-class-anchor"


def scores(syn, val) -> dict:
    """TSTR, MMD² (mean of 3 subsamples), PRDC and the class-mean gap of ``syn`` against ``val``."""
    import numpy as np
    import torch

    from fedhype.eval import Probe, mmd_report, prdc
    from fedhype.eval.inputs import as_matrix

    x, y = as_matrix(syn), as_matrix(val)
    probe = Probe(val.n_classes).fit(x.numpy(), syn.labels.numpy())
    p = prdc(y, x, k=5)
    gaps = [float((x[syn.labels == k].mean(0) - y[val.labels == k].mean(0)).norm())
            for k in range(val.n_classes) if bool((val.labels == k).any())]
    return {"tstr": float(np.mean(probe.predict(y.numpy()) == val.labels.numpy())),
            "mmd2": float(np.mean([mmd_report(y, x, n_permutations=0, seed=s)["mmd2"] for s in range(3)])),
            "precision": p["precision"], "recall": p["recall"], "coverage": p["coverage"],
            "class_mean_gap": float(torch.tensor(gaps).mean())}


def trained_run(dataset: str, method: str, eps: str, seed: int, store) -> tuple[Path, object]:
    """The run directory of (method, ε, seed) and its partition: the utility grid's, or trained here."""
    from fedhype.data.partition import Partition, make_partition
    from fedhype.federated.engine import train
    from fedhype.pipeline.config import train_config

    grid = ROOT / "runs" / f"bench-utility-{dataset}" / f"{method}-eps{eps}-s{seed}"
    if (grid / "run" / "model.safetensors").exists() and (grid / "partition.json").exists() \
            and (grid / "evaluation.json").exists():
        return grid / "run", Partition.load(grid / "partition.json")
    out = OUT / dataset / f"{method}-eps{eps}-s{seed}"
    conf = job_conf(dataset, method, eps, seed)
    p = conf["partition"]
    part = make_partition(store, scheme=p["scheme"], n_clients=p["clients"] or None, alpha=p["alpha"],
                          splits=tuple(p["fractions"]), min_train_per_client=p["min_records"], seed=seed)
    if not (out / "model.safetensors").exists() or not (out / "done").exists():
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        train(store, part, train_config(conf), out, diagnostics=False)
        (out / "done").write_text("")
    return out, part


def job_conf(dataset: str, method: str, eps: str, seed: int) -> dict:
    """The resolved job config of a grid job (``benchmarks/utility.py``'s settings)."""
    from fedhype.pipeline.config import resolve

    from utility import DATASETS, FLOAT32, SECAGG, code_for

    base, secagg = (method[: -len(SECAGG)], True) if method.endswith(SECAGG) else (method, False)
    config = DATASETS[dataset]
    sets = [f'train.method="{base}"', *(["train.secure_aggregation=true"] if secagg else []), f"train.seed={seed}",
            f"partition.seed={seed}", f"synthesis.seed={seed}", f'synthesis.code="{code_for(method)}"',
            *(['data.dtype="float32"'] if dataset in FLOAT32 else []),
            "train.epsilon=none", "train.no_dp=true" if eps == "none" else f"train.epsilon={float(eps)}"]
    return resolve(config, sets)


def model_with_means(run: Path, tmp: Path) -> Path:
    """``run``'s model file, or a copy given its release's class means when it was written without them."""
    from fedhype.federated.rundir import backfill_release_means, load_model, save_model

    hnet, codes, meta = load_model(run)
    if not backfill_release_means(hnet, run / "ckpt" / "release-state.safetensors"):
        return run / "model.safetensors"
    path = tmp / "model.safetensors"
    save_model(path, hnet, codes, meta)
    return path


def rows_for(dataset: str, method: str, eps: str, seed: int, store, split: str = "val") -> list[dict]:
    import tempfile

    from fedhype.synthesis import synthesize

    from utility import code_for

    t0 = time.perf_counter()
    run, part = trained_run(dataset, method, eps, seed, store)
    val = part.split_store(store, split)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = model_with_means(run, Path(tmp))
        for anchor in (False, True):
            syn = synthesize(model, code_for(method), per_class="auto", seed=seed, anchor=anchor)
            rows.append({"dataset": dataset, "split": split, "method": method, "eps": eps, "seed": seed, "anchor": anchor,
                         "anchored": syn.meta.get("anchor"), "n_synthetic": len(syn), **scores(syn, val)})
    for r in rows:
        r["seconds"] = time.perf_counter() - t0
        print(f"{dataset} ({split}) {method} ε={eps} seed {seed} anchor {r['anchor']!s:5}: "
              + ", ".join(f"{k} {r[k]:.4f}" for k in ("tstr", "mmd2", "precision", "coverage", "class_mean_gap")),
              flush=True)
    return rows


def _cell(vals: list[float], digits: int = 3) -> str:
    if not vals:
        return "–"
    sd = st.stdev(vals) if len(vals) > 1 else 0.0
    return f"{st.mean(vals):.{digits}f} ± {sd:.{digits}f}"


def table(rows: list[dict]) -> str:
    keys = ("tstr", "mmd2", "precision", "coverage", "recall", "class_mean_gap")
    out = ["| split | dataset | method | ε | anchor | " + " | ".join(("TSTR", "MMD²", "precision", "coverage", "recall",
                                                              "class-mean gap")) + " | seeds |",
           "|---|---|---|---|---|" + "---|" * len(keys) + "---|"]
    order = {"1": 1, "4": 4, "8": 8, "none": 99}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.get("split", "val"), r["dataset"], r["method"], r["eps"], r["anchor"]), []).append(r)
    for (sp, d, m, e, a) in sorted(groups, key=lambda g: (g[0] != "val", g[1], g[2], order[g[3]], g[4])):
        rs = groups[(sp, d, m, e, a)]
        cells = [_cell([r[k] for r in rs], 4 if k == "mmd2" else 3) for k in keys]
        out.append(f"| {sp} | {d} | {m} | {'no DP' if e == 'none' else e} | {'on' if a else 'off'} | " + " | ".join(cells)
                   + f" | {len(rs)} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["fashion-full", "fashion", "digits"])
    ap.add_argument("--methods", nargs="+", default=["fedhypevae", "fedhypevae+secagg", "dp-gaussian"])
    ap.add_argument("--epsilons", nargs="+", default=["1", "4", "8", "none"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--split", choices=["val", "test"], default="val",
                    help="score against this split: val chooses the default; test reports it afterwards")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()

    import torch

    from release_defaults import data

    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / "rows.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    done = {(r.get("split", "val"), r["dataset"], r["method"], r["eps"], r["seed"]) for r in rows}
    for dataset in a.datasets:
        store, _ = data(dataset)
        for method in a.methods:
            for eps in a.epsilons:
                if eps == "none" and method.endswith("+secagg"):
                    continue
                for seed in a.seeds:
                    if (a.split, dataset, method, eps, seed) in done:
                        continue
                    new = rows_for(dataset, method, eps, seed, store, a.split)
                    with log.open("a") as fh:
                        fh.writelines(json.dumps(r) + "\n" for r in new)
                    rows += new
    res = Path(a.results)
    stamp = (f"_{datetime.date.today()}, {platform.machine()} CPU, 1 thread; `benchmarks/class_anchor.py`; the default "
             "was chosen on the validation split (`val` rows); the `test` rows (`--split test`) were run after it_")
    md = (f"{stamp}\n\nEach trained model drawn twice with the same seed, its class means anchored to the statistics "
          "release's (on) or not (off); scored against the split of the first column (the validation split chose the "
          "default, off; the test rows were run after it). Class-mean gap: mean over classes of "
          "the L2 distance between the synthetic and the real class means (unit-sphere units).\n\n" + table(rows) + "\n")
    (res / "class_anchor.md").write_text(md)
    (res / "class_anchor.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(md)


if __name__ == "__main__":
    main()
