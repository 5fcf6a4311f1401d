"""Speed and memory: one command for every speed figure in the README.

Runs, one after the other (so they do not compete for the cores), each in its own process:

1. ``benchmarks/embed.py``: `fedhype embed` images/s against a plain loop over the same encoder;
2. ``benchmarks/dp_step.py``: the DP step (book-keeping clipping, and the ``vmap`` reference)
   against the non-DP step of the same model;
3. ``fedhype run`` on the bundled default job: wall time and time per stage (embeddings from the
   user's cache when present; ``--cold`` uses an empty cache, so the images are embedded too);
4. ``benchmarks/synthesis.py`` on the model of step 3 (with ``--only synthesis``: the model of the
   last ``run`` step, else ``runs/main/run`` from README command 1): `fedhype synthesize`
   embeddings/s against a bare decoder loop;
5. ``benchmarks/clients_scaling.py``: time per round and peak memory for 10, 100, 1,000 and
   10,000 clients.

Each step writes its JSON to ``benchmarks/results/``; this script then writes ``speed.md`` (one
table, every figure next to the baseline measured in the same run) and, with ``--readme``,
replaces the block between the ``speed`` markers in README.md. ``--quick`` shrinks every step (a
smoke test of the command, not figures to publish). ``benchmarks/gpu.py`` is the GPU section.

    .venv/bin/python benchmarks/speed.py --readme        # ≈ 15 min on 2 unloaded cores
    .venv/bin/python benchmarks/speed.py --quick --only dp_step synthesis
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
STEPS = ("embed", "dp_step", "run", "synthesis", "clients_scaling")


def _py(script: str, *args: str, env: dict | None = None) -> None:
    cmd = [sys.executable, str(BENCH / script), *args]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)


def run_main_job(results: Path, cold: bool, quick: bool) -> dict:
    """``fedhype run`` on the bundled default into a temporary folder; returns its timings."""
    out = Path(tempfile.mkdtemp(prefix="fedhype-speed-"))
    env = dict(os.environ)
    if cold:
        env["FEDHYPE_CACHE"] = str(out / "cache")
    cmd = [sys.executable, "-m", "fedhype.cli.main", "run", "--out", str(out / "job")]
    if quick:
        cmd += ["--set", "train.rounds=2", "--set", "evaluate.dp_linear=false"]
    print("$ fedhype", " ".join(cmd[3:]), flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    rep = json.loads((out / "job" / "report.json").read_text())
    res = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} cores",
           "cold_cache": cold, "quick": quick, "wall_s": wall, "stages_s": rep.get("timings_s", {}),
           "rounds": rep.get("rounds"), "epsilon": rep.get("epsilon"), "model_dir": str(out / "job" / "run")}
    (results / "run.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"fedhype run: {wall:.1f} s wall; stages " + ", ".join(f"{k} {v:.1f} s" for k, v in res["stages_s"].items()))
    return res


def _load(results: Path, name: str) -> dict | None:
    p = results / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def speed_table(results: Path) -> str:
    """The README table from the JSON files in ``results`` (rows for the files present)."""
    rows = []
    dp = _load(results, "dp_step")
    if dp:
        r = next(x for x in dp["results"] if x["device"] == "cpu")
        b, n, v = r["dp_bookkeeping"], r["nodp"], r["dp_vmap"]
        rows.append((f"DP step, book-keeping clipping (B = {r['batch']}, {r['parameters']:,} parameters, D = {r['dim']})",
                     f"**{b['ratio_to_nodp']:.2f}×** the non-DP step ({b['ms_per_step']:.1f} vs {n['ms_per_step']:.1f} ms); "
                     f"peak RSS {r['peak_rss_mb']:.0f} MB", "non-DP forward + backward of the same model", dp["date"]))
        rows.append(("DP step, `torch.func` `vmap(grad)` reference",
                     f"{v['ratio_to_nodp']:.2f}× the non-DP step ({v['ms_per_step']:.1f} ms)", "same", dp["date"]))
    em = _load(results, "embed")
    if em:
        best = em["best_images_per_s"]
        plain = best["plain loop"]
        ours_k = next(k for k in best if k != "plain loop")
        rows.append((f"`fedhype embed`, {em['encoder']} at {em['image_size']} px, {em['n_images']} images",
                     f"**{em['speedup_vs_plain']:.2f}×** a plain loop ({best[ours_k]:.1f} vs {plain:.1f} img/s), "
                     f"peak RSS {em['peak_rss']['main_mib'] / 1024:.2f} GiB", "plain loop over the same model",
                     em.get("date", "")))
    run = _load(results, "run")
    if run:
        st = run["stages_s"]
        parts = ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in st.items() if v >= 0.5)
        what = (f"{run['rounds']} rounds" if run["rounds"] else "no DP-SGD round: its clients are below "
                "train.dp_sgd_min_records")
        rows.append((f"`fedhype run`, bundled default ({what}, ε {run['epsilon']:.2f}"
                     f"{', cold cache: embeds the images' if run['cold_cache'] else ', embeddings cached'})",
                     f"**{run['wall_s']:.0f} s** wall ({parts})", "its stages", run["date"]))
    sy = _load(results, "synthesis")
    if sy:
        e = sy["embeddings_per_s"]
        rows.append((f"`fedhype synthesize` (neutral code, {sy['n']:,} embeddings)",
                     f"{e['synthesize']:,.0f} embeddings/s = **{sy['ratio_to_bare_loop']:.2f}×** the bare decoder loop "
                     f"({e['bare decoder loop']:,.0f}/s)", "bare `sample()` loop over the same θ", sy["date"]))
    cs = _load(results, "clients_scaling")
    if cs:
        rs = cs["results"]
        first, last = rs[0], rs[-1]
        per = "; ".join(f"{r['clients']}: {r['s_per_round']:.1f} s/round ({1000 * r['s_per_client_round']:.0f} ms/client), "
                        f"{r['peak_rss_mb']:.0f} MB" for r in rs)
        extra = last["clients"] - first["clients"]
        growth = (last["peak_rss_mb"] - first["peak_rss_mb"]) / extra if extra else 0.0
        ratios = ", ".join(f"{r['clients']:,}: **{r['peak_rss_mb'] / first['peak_rss_mb']:.3f}×**" for r in rs[1:])
        rows.append(("clients scaling, 1 DP step per client per round (peak RSS)",
                     f"{per} — peak RSS against {first['clients']} clients: {ratios}; {growth:.3f} MB per extra client "
                     f"(the records themselves: 40 per client)", f"{first['clients']} clients", cs["date"]))
    lines = ["| what | figure | baseline in the same run | date |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS),
                    help="run these steps only (synthesis alone needs a trained model: the last run step's, "
                         "else runs/main/run from README command 1)")
    ap.add_argument("--quick", action="store_true", help="small sizes: checks the command, figures not for the README")
    ap.add_argument("--cold", action="store_true", help="fedhype run with an empty embedding cache")
    ap.add_argument("--results", type=Path, default=None,
                    help="folder for the JSON and speed.md (default benchmarks/results; with --quick runs/bench-speed-quick)")
    ap.add_argument("--readme", action="store_true", help="replace the speed block in README.md")
    a = ap.parse_args()
    if a.quick and a.readme:
        ap.error("--quick figures are not for the README; drop --readme")
    if a.results is None:
        a.results = ROOT / "runs" / "bench-speed-quick" if a.quick else BENCH / "results"
    a.results.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = None
    if "embed" in a.only:
        _py("embed.py", "--out", str(a.results / "embed.json"), *(["--n", "32", "--repeats", "1"] if a.quick else []))
    if "dp_step" in a.only:
        _py("dp_step.py", "--results", str(a.results), *(["--repeats", "2"] if a.quick else []))
    if "run" in a.only:
        model = run_main_job(a.results, a.cold, a.quick)["model_dir"]
    if "synthesis" in a.only:
        if model is None:
            prev = _load(a.results, "run")
            model = prev["model_dir"] if prev and Path(prev["model_dir"]).exists() else str(ROOT / "runs" / "main" / "run")
        if not (Path(model) / "model.safetensors").exists():
            sys.exit(f"synthesis: no trained model at {model}; run with --only run synthesis (or README command 1 first)")
        _py("synthesis.py", "--run", model, "--results", str(a.results), *(["--n", "20000", "--repeats", "1"] if a.quick else []))
    if "clients_scaling" in a.only:
        _py("clients_scaling.py", "--results", str(a.results),
            *(["--clients", "10", "100", "--rounds", "1"] if a.quick else []))
    md = (f"_{time.strftime('%Y-%m-%d')}, {platform.machine()} CPU, {os.cpu_count()} cores, load average at the end "
          f"{os.getloadavg()[0]:.1f}; `benchmarks/speed.py {' '.join(sys.argv[1:])}` ({time.perf_counter() - t0:.0f} s); "
          f"ratios are against the baseline measured in the same run_\n\n" + speed_table(a.results) + "\n")
    (a.results / "speed.md").write_text(md)
    print(md)
    if a.readme:
        readme = ROOT / "README.md"
        text = readme.read_text()
        new, n = re.subn(r"(<!-- speed:start -->\n).*?(<!-- speed:end -->)", lambda m: m.group(1) + md + m.group(2),
                         text, flags=re.S)
        if n != 1:
            sys.exit("README.md has no <!-- speed:start --> … <!-- speed:end --> block")
        readme.write_text(new)
    if "run" in a.only and model and model.startswith(tempfile.gettempdir()) and a.quick:
        shutil.rmtree(Path(model).parents[1], ignore_errors=True)


if __name__ == "__main__":
    main()
