"""Do the client codes capture their domains? Neutral vs mixture and the code × domain matrix, on the test split.

Issue #16 asks, on the held-out test split with 3 seeds, (1) that ``mixture`` synthesis beat ``neutral`` in
pooled TSTR at ε ≥ 4 and (2) that the code × domain MMD² matrix have its minimum on the diagonal for every
domain. This benchmark trains nothing: it reads the models ``benchmarks/utility.py`` trained for its
grid (``runs/bench-utility*/<method>-eps<ε>-s<seed>/``: the job's ``run/``, ``embeddings.safetensors`` and
``partition.json``) and, for each (ε, seed):

* synthesises 300 per class with the ``neutral`` and the ``mixture`` code (synthesis seed = seed, as the
  grid) and scores both with :func:`fedhype.eval.evaluate` exactly as the job does (pooled test split,
  MMD² with the job's ``max_samples`` and ``seed``, TSTR of the linear probe). The mixture's TSTR must equal
  the grid row's (the same draw): the script checks it, so the neutral row is the same experiment with
  one thing changed;
* computes :func:`fedhype.eval.domains.code_domain_matrix` with the job's settings (100 per class and
  code, 1,000 rows per set, evaluate seed): every client's code against every client's test split.

Figures on held-out real records are for the data holder: not DP. Writes
``benchmarks/results/codes.{json,md}`` and prints the tables (``--dataset fashion``: the Fashion-MNIST
grid, 10 label-skewed clients of one domain, where no diagonal is expected).

    .venv/bin/python benchmarks/codes.py                      # digits, ours, 3 seeds (~5 min on 1 core)
    .venv/bin/python benchmarks/codes.py --dataset fashion
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics as st
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRIDS = {"digits": ROOT / "runs" / "bench-utility", "fashion": ROOT / "runs" / "bench-utility-fashion"}
DESCRIPTION = {"digits": "bundled digits domains, 4 natural-domain clients",
               "fashion": "configs/fashion-mnist.toml, 10,000 images, 10 Dirichlet α = 0.3 clients of one domain"}
EPSILONS = ("1", "4", "8", "none")


def one(job: Path, seed: int) -> dict:
    """The neutral/mixture figures and the code × domain matrix of one grid job folder."""
    from fedhype.data.partition import Partition
    from fedhype.data.store import EmbeddingStore
    from fedhype.eval import evaluate
    from fedhype.eval.domains import code_domain_matrix
    from fedhype.pipeline.config import DEFAULTS
    from fedhype.synthesis import synthesize

    conf = json.loads((job / "config.json").read_text())
    e, s = conf.get("evaluate", DEFAULTS["evaluate"]), conf.get("synthesis", DEFAULTS["synthesis"])
    store, part = EmbeddingStore.load(job / "embeddings.safetensors"), Partition.load(job / "partition.json")
    test = part.split_store(store, "test")
    out: dict = {}
    for code in ("neutral", "mixture"):
        syn = synthesize(job / "run", code, per_class=s["per_class"], seed=s["seed"], temperature=s["temperature"])
        ev = evaluate(test, syn, n_permutations=0, max_samples=e["max_samples"], k=e["k"], seed=e["seed"], per_domain=True)
        out[code] = {k: ev[k] for k in ("tstr_accuracy", "mmd2", "precision", "coverage")}
        out[code]["per_domain_tstr"] = {d: v.get("tstr_accuracy") for d, v in (ev.get("per_domain") or {}).items()}
    grid_row = json.loads((job / "evaluation.json").read_text())["tstr_accuracy"]
    if abs(grid_row - out["mixture"]["tstr_accuracy"]) > 1e-9:
        raise SystemExit(f"{job}: mixture TSTR {out['mixture']['tstr_accuracy']} differs from the grid's {grid_row}: "
                         "the job folder is not the grid row's (rerun benchmarks/utility.py)")
    out["matrix"] = code_domain_matrix(job / "run", {c.name: part.client_store(store, c.id, "test") for c in part.clients},
                                       seed=e["seed"])
    return out


def tables(res: dict, dataset: str) -> str:
    def cell(v: list[float]) -> str:
        return f"{st.fmean(v):.3f} ± {st.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}"

    eps = [x for x in EPSILONS if x in res]
    head = "| " + " | ".join(f"ε = {x}" if x != "none" else "no DP" for x in eps) + " |"
    lines = ["Pooled test split (mean ± std over seeds; 300 per class, the job's evaluation):", "",
             "| code | figure " + head, "|---|---|" + "---|" * len(eps)]
    for fig, name in (("tstr_accuracy", "TSTR"), ("mmd2", "MMD²"), ("precision", "precision"), ("coverage", "coverage")):
        for code in ("neutral", "mixture"):
            lines.append(f"| {code} | {name} | " + " | ".join(cell([r[code][fig] for r in res[x]]) for x in eps) + " |")
    lines += ["", "Mixture minus neutral, pooled TSTR, per seed:", "",
              "| " + " | ".join(f"ε = {x}" if x != "none" else "no DP" for x in eps) + " |", "|" + "---|" * len(eps),
              "| " + " | ".join(" / ".join(f"{r['mixture']['tstr_accuracy'] - r['neutral']['tstr_accuracy']:+.3f}"
                                           for r in res[x]) for x in eps) + " |"]
    doms = res[eps[0]][0]["matrix"]["domains"][:-1]
    lines += ["", "Code × domain MMD² (rows: the client code; columns: the client's test split; mean over seeds; "
              "the row minimum in bold); the last column counts the seeds where the row's own domain is the closest:", ""]
    for x in eps:
        rs = res[x]
        codes = rs[0]["matrix"]["codes"]
        lines += [f"**{'no DP' if x == 'none' else f'ε = {x}'}**", "",
                  "| code | " + " | ".join(doms) + " | own domain closest |", "|---|" + "---|" * (len(doms) + 1)]
        for i, c in enumerate(codes):
            row = [st.fmean(r["matrix"]["mmd2"][i][j] for r in rs) for j in range(len(doms))]
            lo = min(row)
            own = c.split(":", 1)[1] if c.startswith("client:") else None
            hold = f"{sum(bool(r['matrix']['own_domain_is_closest'].get(own)) for r in rs)} / {len(rs)}" if own else "–"
            lines.append(f"| {c} | " + " | ".join(f"**{v:.4f}**" if v == lo else f"{v:.4f}" for v in row) + f" | {hold} |")
        lines.append("")
    lines.append("Per-domain TSTR of the neutral and mixture samples (mean over seeds; the job's per-domain figures):")
    lines += ["", "| target ε | code | " + " | ".join(doms) + " |", "|---|---|" + "---|" * len(doms)]
    for x in eps:
        for code in ("neutral", "mixture"):
            vals = [st.fmean(r[code]["per_domain_tstr"][d] for r in res[x]) for d in doms]
            lines.append(f"| {'no DP' if x == 'none' else x} | {code} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", choices=sorted(GRIDS), default="digits")
    ap.add_argument("--method", default="fedhypevae", help="a grid method whose codes carry client statistics")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--epsilons", nargs="+", default=list(EPSILONS), choices=EPSILONS,
                    help="measure only these ε (the others are kept from the results file: e.g. after a default that "
                         "changed only the DP models, as the DP-SGD stage rule of docs/method.md decision 22)")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    suffix = "" if a.dataset == "digits" else f"-{a.dataset}"
    res: dict = {}
    kept = []
    if set(a.epsilons) != set(EPSILONS):
        earlier = json.loads((Path(a.results) / f"codes{suffix}.json").read_text())
        if earlier.get("method") != a.method or earlier.get("seeds") != a.seeds:
            raise SystemExit("--epsilons keeps the other ε from the results file, which holds another method or seeds")
        kept = [x for x in EPSILONS if x not in a.epsilons and x in earlier["results"]]
        res = {x: earlier["results"][x] for x in kept}
    for x in [x for x in EPSILONS if x in a.epsilons]:
        for seed in a.seeds:
            job = GRIDS[a.dataset] / f"{a.method}-eps{x}-s{seed}"
            if not (job / "evaluation.json").exists():
                raise SystemExit(f"{job} is missing: run benchmarks/utility.py --dataset {a.dataset} first")
            res.setdefault(x, []).append(one(job, seed))
            r = res[x][-1]
            print(f"ε={x} seed {seed}: TSTR neutral {r['neutral']['tstr_accuracy']:.4f} mixture "
                  f"{r['mixture']['tstr_accuracy']:.4f}; own domain closest {r['matrix']['own_domain_is_closest']}", flush=True)
    md = (f"# Client codes on the test split: neutral vs mixture, code × domain ({a.dataset})\n\n"
          f"_{datetime.date.today()}, {platform.machine()} CPU, one thread; `benchmarks/codes.py --dataset {a.dataset}` "
          f"({time.perf_counter() - t0:.0f} s); {DESCRIPTION[a.dataset]}; the models of `benchmarks/utility.py`'s "
          f"`{a.method}` rows (seeds {a.seeds}, partition seed = train seed = synthesis seed = seed); held-out "
          f"**test** split (not DP: for the data holder)"
          + (f"; ε = {', '.join(kept)} kept from the previous results (their models did not change)" if kept else "")
          + "_\n\n" + tables({x: res[x] for x in EPSILONS if x in res}, a.dataset) + "\n")
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"codes{suffix}.json").write_text(json.dumps({"dataset": a.dataset, "method": a.method, "seeds": a.seeds,
                                                          "results": res}, indent=1))
    (out / f"codes{suffix}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
