"""Hyper-prototype classifier (FedHPro) vs a linear probe, with ablations, on real and synthetic training sets.

For each classifier seed and each training set, trains every configuration below and tests it on
the held-out real test split of the run's partition (TSTR for the synthetic sets, TRTR for the
real one). Training sets:

* ``real``: the real training split of the DP run (its ``embeddings.safetensors`` + ``partition.json``);
* ``synthetic ε = 1``: the DP run's ``synthetic.safetensors``;
* ``synthetic no DP``: the ``--no-dp`` run's ``synthetic.safetensors`` (same store and partition).

Rows: the linear probe (:func:`fedhype.eval.utility.fit_probe`, L2 space, as in
:mod:`fedhype.prototypes.downstream`), the hyper-prototype classifier with its defaults and the
ablations in ``CONFIGS`` (each a set of overrides of the defaults; a config equal to the defaults
reuses their fit). Every fit is scored with the three prediction heads (they share the training),
so the head comparison costs nothing extra.
``collapse`` is the mean inter-class cosine of the normalised class means of the fitted prototypes
(0 for the orthonormal initial anchors). Writes ``benchmarks/results/prototypes.json`` and
``prototypes.md`` and prints the markdown.

    .venv/bin/python benchmarks/prototypes.py
    .venv/bin/python benchmarks/prototypes.py --dp-run runs/eps1 --nodp-run runs/nodp --seeds 0 1 2

Regenerate the inputs with ``fedhype run --set train.seed=0 --set evaluate.prototypes=false --out DIR``
(and ``--set train.no_dp=true`` for the non-private run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

#: ablations: name → overrides of HyperPrototypeClassifier's defaults ({} = the defaults).
CONFIGS: dict[str, dict] = {
    "defaults": {},
    "no margin": {"margin": False},
    "no contrastive": {"lambda_contrastive": 0.0},
    "no consistency": {"lambda_consistency": 0.0},
    "consistency λ_cons = 0.3": {"lambda_consistency": 0.3},
    "matching none": {"matching": "none"},
    "matching synthetic": {"matching": "synthetic"},
    "matching synthetic, match_lr 1e-4": {"matching": "synthetic", "match_lr": 1e-4},
    "previous defaults (matching synthetic, λ_cons = 0.3)": {"matching": "synthetic", "lambda_consistency": 0.3},
}
HEADS = ("both", "linear", "prototype")
METRICS = ("accuracy", "balanced_accuracy")


def load_sets(dp_run: Path, nodp_run: Path):
    """``(train sets {name: store}, real test store)`` from the two run directories."""
    from fedhype.data.partition import Partition
    from fedhype.data.store import EmbeddingStore

    for run in (dp_run, nodp_run):
        for f in ("embeddings.safetensors", "partition.json", "synthetic.safetensors"):
            if not (run / f).is_file():
                sys.exit(f"{run / f} is missing: pass the output directory of `fedhype run` (see --help)")
    store = EmbeddingStore.load(dp_run / "embeddings.safetensors")
    part = Partition.load(dp_run / "partition.json")
    part.check_store(store)
    nodp_part = json.loads((nodp_run / "partition.json").read_text())
    if nodp_part.get("store_digest") != part.store_digest or nodp_part.get("seed") != part.seed:
        sys.exit(f"{nodp_run} was made from another store or partition than {dp_run}: its test split would differ")
    sets = {"real": part.split_store(store, "train"),
            "synthetic ε = 1": EmbeddingStore.load(dp_run / "synthetic.safetensors"),
            "synthetic no DP": EmbeddingStore.load(nodp_run / "synthetic.safetensors")}
    return sets, part.split_store(store, "test")


def _epsilon(run: Path) -> str:
    """The run's reported ε (``report.json``), as text; ``"?"`` when absent."""
    try:
        eps = json.loads((run / "report.json").read_text()).get("epsilon")
    except (OSError, ValueError):
        eps = None
    return f"{eps:.3f}" if isinstance(eps, (int, float)) else "?"


def collapse(prototypes) -> float:
    """Mean off-diagonal cosine of the K normalised class means of ``prototypes`` ``[K, L, d]``."""
    import torch.nn.functional as F

    c = F.normalize(F.normalize(prototypes, dim=2).mean(1), dim=1)
    g = (c @ c.T).double()
    k = g.shape[0]
    return float((g.sum() - g.diagonal().sum()) / (k * (k - 1)))


def run_set(train, test, seed: int, configs: dict[str, dict]) -> list[dict]:
    """All rows for one training set and seed: the probe, then each config scored with every head."""
    from fedhype.eval.inputs import as_matrix
    from fedhype.eval.utility import classification_metrics, fit_probe
    from fedhype.prototypes import HyperPrototypeClassifier

    y_test = test.labels.numpy()
    rows = []
    t = time.perf_counter()
    probe = fit_probe(train, space="l2", seed=seed)
    m = classification_metrics(y_test, probe.predict(as_matrix(test, "l2").numpy()))
    rows.append({"config": "linear probe", "head": None, "seconds": time.perf_counter() - t, **m})
    done: dict[str, list[dict]] = {}                      # resolved parameters → rows (configs equal to the defaults)
    for name, params in configs.items():
        clf = HyperPrototypeClassifier(**{"seed": seed, "n_threads": 1, **params})
        key = json.dumps(clf.get_params(), sort_keys=True, default=str)
        if key in done:
            rows += [{**r, "config": name, "params": params, "seconds": 0.0, "same_fit_as": r["config"]}
                     for r in done[key]]
            continue
        t = time.perf_counter()
        clf.fit(train.embeddings, train.labels.numpy(), classes=np.arange(train.n_classes))
        secs = time.perf_counter() - t
        done[key] = []
        for head in HEADS:
            m = classification_metrics(y_test, clf.predict(test.embeddings, head=head))
            done[key].append({"config": name, "params": params, "head": head, "seconds": secs,
                              "collapse": collapse(clf.prototypes_), **m})
        rows += done[key]
    return rows


def _cell(vals: list[float]) -> str:
    if not vals:
        return "–"
    mu = statistics.fmean(vals)
    return f"{mu:.3f} ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else f"{mu:.3f}"


def _values(rows, set_name, config, head, key):
    return [r[key] for r in rows if r["set"] == set_name and r["config"] == config and r["head"] == head]


def _label(rows: list[dict], config: str) -> str:
    same = {r["same_fit_as"] for r in rows if r["config"] == config and "same_fit_as" in r}
    return f"{config} (= {', '.join(sorted(same))})" if same else config


def markdown(rows: list[dict], header: str, sets: list[str], configs: list[str], default_head: str,
             wall_s: float) -> str:
    out = [header, ""]
    cols = " | ".join(sets)
    for key, title in (("accuracy", "Accuracy"), ("balanced_accuracy", "Balanced accuracy")):
        out += [f"{title} on the held-out real test split (mean ± std over seeds; hyper-prototype rows use "
                f"head `{default_head}` unless stated):", "", f"| row | {cols} |", "|---" * (len(sets) + 1) + "|"]
        out.append("| linear probe | " + " | ".join(_cell(_values(rows, s, "linear probe", None, key)) for s in sets)
                   + " |")
        for c in configs:
            out.append(f"| hyper-prototypes, {_label(rows, c)} | "
                       + " | ".join(_cell(_values(rows, s, c, default_head, key)) for s in sets) + " |")
        out.append("")
    out += ["Accuracy by prediction head (same fits; `collapse` = mean inter-class cosine of the prototype class "
            "means, 0 at initialisation):", "", f"| config | head | {cols} | collapse ({sets[0]}) |",
            "|---|---" + "|---" * (len(sets) + 1) + "|"]
    for c in configs:
        for h in HEADS:
            accs = " | ".join(_cell(_values(rows, s, c, h, "accuracy")) for s in sets)
            out.append(f"| {_label(rows, c)} | {h} | {accs} | {_cell(_values(rows, sets[0], c, h, 'collapse'))} |")
    secs = sum(r["seconds"] for r in rows if r["head"] in (None, HEADS[0]))
    out += ["", f"_Fit time {secs / 60:.1f} min, wall time {wall_s / 60:.1f} min._"]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dp-run", type=Path, default=Path("/tmp/exp/cs1"), help="`fedhype run` output at ε = 1")
    ap.add_argument("--nodp-run", type=Path, default=Path("/tmp/exp/cs-nodp"), help="`fedhype run --no-dp` output")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    a = ap.parse_args()

    import torch
    from threadpoolctl import threadpool_limits

    from fedhype.prototypes import HyperPrototypeClassifier

    torch.set_num_threads(1)
    sets, test = load_sets(a.dp_run, a.nodp_run)
    configs = {c: CONFIGS[c] for c in a.configs}
    defaults = HyperPrototypeClassifier().get_params()
    rows = []
    t0 = time.perf_counter()
    with threadpool_limits(1):
        for seed in a.seeds:
            for set_name, train in sets.items():
                for r in run_set(train, test, seed, configs):
                    rows.append({"set": set_name, "seed": seed, **r})
                print(f"seed {seed} {set_name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    header = (f"_{datetime.date.today().isoformat()}, {platform.machine()} CPU ({os.cpu_count()} cores, shared), "
              f"torch {torch.__version__}, 1 torch thread, 1 BLAS thread; seeds {a.seeds}; train sets from "
              f"`{a.dp_run}` (accountant ε = {_epsilon(a.dp_run)}; real train split n = {len(sets['real'])}, "
              f"synthetic n = {len(sets['synthetic ε = 1'])}) "
              f"and `{a.nodp_run}` (synthetic n = {len(sets['synthetic no DP'])}); real test n = {len(test)}; "
              f"classifier defaults: matching={defaults['matching']!r}, head={defaults['head']!r}, "
              f"λ_con={defaults['lambda_contrastive']}, λ_cons={defaults['lambda_consistency']}, "
              f"epochs={defaults['epochs']}_")
    md = markdown(rows, header, list(sets), list(configs), defaults["head"], time.perf_counter() - t0)
    a.results.mkdir(parents=True, exist_ok=True)
    from fedhype.io import atomic_write_text

    doc = {"header": header, "dp_run": str(a.dp_run), "nodp_run": str(a.nodp_run), "seeds": a.seeds,
           "dp_run_epsilon": _epsilon(a.dp_run), "defaults": defaults, "configs": configs, "n_test": len(test),
           "n_train": {k: len(v) for k, v in sets.items()}, "wall_s": time.perf_counter() - t0, "rows": rows}
    atomic_write_text(a.results / "prototypes.json", json.dumps(doc, indent=1, default=str))
    atomic_write_text(a.results / "prototypes.md", md + "\n")
    print(md)


if __name__ == "__main__":
    main()
