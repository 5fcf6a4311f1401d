"""The README's benchmark tables are the benchmarks' own output (not hand-edited), and the tables
regenerate from the recorded rows."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _block(tag: str) -> str:
    m = re.search(rf"<!-- {tag}:start -->\n(.*?)<!-- {tag}:end -->", (ROOT / "README.md").read_text(), flags=re.S)
    assert m, f"README.md has no {tag} block"
    return m.group(1)


@pytest.mark.parametrize("tag, md", [("utility", "utility.md"), ("utility-fashion", "utility-fashion.md"),
                                     ("utility-fashion-full", "utility-fashion-full.md"),
                                     ("utility-fashion-full-100", "utility-fashion-full-100.md"),
                                     ("speed", "speed.md"), ("downstream", "downstream.md")])
def test_readme_block_is_the_benchmark_output(tag, md):
    block = _block(tag)
    assert block.count("\n|") >= 3, f"README {tag} block has no table"
    assert (RESULTS / md).read_text().startswith(block)


@pytest.mark.parametrize("name", ["utility", "utility-fashion", "utility-fashion-full", "utility-fashion-full-100"])
def test_utility_tables_regenerate_from_the_recorded_rows(name):
    mod = _module("utility")
    rows = json.loads((RESULTS / f"{name}.json").read_text())["rows"]
    md = (RESULTS / f"{name}.md").read_text()
    # digits: every method of `fedhype train --method`; Fashion-MNIST: every method, or the core set
    # (`--methods core`: ours, dp-gaussian, no-second-moment and the baselines), said so in its header
    core = {r["method"] for r in rows} == set(mod.CORE)
    methods = list(mod.CORE) if core and name != "utility" else mod.all_methods()
    if core and name != "utility":
        assert "the core set" in md.splitlines()[0]
    if name.startswith("utility-fashion-full"):  # the realistic-scale grids: the scale set, said so in the header
        methods = list(mod.scale_set(name.removeprefix("utility-")))
        assert "the scale set" in md.splitlines()[0]
    assert mod.table(rows, methods) in md and mod.reference_table(rows) in md
    assert mod.matrix(rows, methods, "tstr_accuracy", True) in md and mod.matrix(rows, methods, "mmd2", False) in md
    # each method at every ε, 3 seeds each
    assert {r["method"] for r in rows} == set(methods)
    groups = {(r["method"], r["eps_target"]) for r in rows}
    # (secure aggregation splits the noise of a private release: its rows have no "no DP" cell)
    assert groups == {(m, e) for m in methods for e in ("1", "4", "8", "none")
                      if not (e == "none" and m.endswith(mod.SECAGG))}
    assert all(sum((r["method"], r["eps_target"]) == g for r in rows) == 3 for g in groups)
    # ε in every private row is the accountant's figure for the run, within 0.5 % below its target
    for r in rows:
        if r["eps_target"] != "none":
            assert 0.99 * float(r["eps_target"]) <= r["epsilon"] <= float(r["eps_target"]) * (1 + 1e-9)


def test_speed_table_regenerates_from_the_results():
    mod = _module("speed")
    assert mod.speed_table(RESULTS) in (RESULTS / "speed.md").read_text()


def test_downstream_tables_regenerate_from_the_recorded_rows():
    mod = _module("downstream")
    res = json.loads((RESULTS / "downstream.json").read_text())
    rows = res["rows"]
    md = (RESULTS / "downstream.md").read_text()
    assert mod.markdown(rows, res["header"]) == md
    # both datasets, every ε, 3 seeds each, or the header names each (dataset, ε) left out (--recorded-only);
    # the README block is the part before the details
    have = {(r["dataset"], r["eps"], r["seed"]) for r in rows}
    for d in mod.DATASETS:
        for e in mod.EPSILONS:
            if {(d, e, s) for s in mod.SEEDS} <= have:
                assert mod.missing_label(d, e) + "," not in res["header"] + ","
            else:
                assert not any((d, e, s) in have for s in mod.SEEDS)
                assert "not in these tables" in res["header"] and mod.missing_label(d, e) in res["header"]
    assert {"digits"} <= {d for d, _, _ in have}
    assert _block("downstream") == md[: md.index("## Details")]
    # every private row reports the generator's accountant ε and the DP linear reference's own ε
    for r in rows:
        if r["eps"] != "none":
            assert 0.99 * float(r["eps"]) <= r["generator_epsilon"] <= float(r["eps"]) * (1 + 1e-9)
            assert r["dp_linear_epsilon"] is not None


def test_the_header_names_every_machine_the_rows_ran_on():
    """Rows measured on another machine (a lent GPU machine's CPUs) are named in the header with their count:
    their wall times and peak RSS are not comparable with this machine's."""
    mod = _module("utility")
    here = mod.machine()
    assert mod.machines_note([{"machine": here}, {}] if here == mod.LEGACY_MACHINE else [{"machine": here}],
                             "2 processes × 1 thread") == f"{here}, 2 processes × 1 thread"
    other = "x86_64 CPU, 16 cores"
    note = mod.machines_note([{"machine": other}] * 3 + [{}], "2 processes × 1 thread")
    assert note == f"rows from 3 on {other}; 1 on {mod.LEGACY_MACHINE}"


def test_option_test_table_regenerates_from_its_pairs_and_pairs_by_cell():
    """benchmarks/option_test.py: the committed located-share table is its own output from the pairs it keeps;
    each option row sits beside the grid row of the same (method, ε, seed), and a cell the grid lacks is refused."""
    mod = _module("option_test")
    saved = json.loads((RESULTS / "option-located-share-0.8.json").read_text())
    md = (RESULTS / "option-located-share-0.8.md").read_text()
    assert mod.table(saved["pairs"], saved["label"]) in md
    grids = {d: json.loads(mod.grid_file(d).read_text())["rows"] for d in ("digits", "fashion")}
    grid = grids["digits"]
    figures = ("tstr_accuracy", "mmd2", "precision", "coverage", "epsilon")
    changed = ruled = 0
    for p in saved["pairs"]:
        o, g = p["option"], p["grid"]
        assert (o["method"], o["eps_target"], o["seed"]) == (g["method"], g["eps_target"], g["seed"])
        assert o["extra"] == ["model.located_share=0.8"] and not g.get("extra")
        if o["method"] == "fedhypevae":  # the pairs were measured with the DP-SGD stage, which these sets' ours rows
            ruled += _is_the_stage_rules_row(grids[p["dataset"]], o)  # no longer run (decision 22)
            continue
        if g not in [_undated(r) for r in grids[p["dataset"]]]:
            # the kept grid row is the committed grid's row, unless the default changed that cell since: where
            # model.located_share = "auto" resolves to 0.8 (digits ε = 8, Fashion-MNIST ε = 4 / 8; docs/method.md
            # decision 16) the grid's job
            # now is the option's job, so its row has the option row's figures (MMD² to float rounding: the kernel sums
            # ran with another thread count)
            now = next(r for r in grids[p["dataset"]]
                       if (r["method"], r["eps_target"], r["seed"]) == (o["method"], o["eps_target"], o["seed"]))
            assert {k: now[k] for k in figures} == pytest.approx({k: o[k] for k in figures}, rel=1e-5, abs=0), \
                (o["method"], o["eps_target"], o["seed"])
            assert now["tstr_accuracy"] == o["tstr_accuracy"] and now["precision"] == o["precision"]
            changed += 1
    assert changed == 3 + 6  # the release alone, 3 seeds: digits at ε = 8, Fashion-MNIST at ε = 4 / 8
    assert ruled == 12  # ours, 3 seeds: digits and Fashion-MNIST at ε = 4 / 8
    digits8 = [p for p in saved["pairs"] if p["dataset"] == "digits" and p["option"]["method"] == "fedhypevae"
               and p["option"]["eps_target"] == "8"]
    assert "| digits | fedhypevae | 8 | 0.776 ± 0.007 | 0.777 ± 0.017 |" in mod.table(digits8, saved["label"])
    with pytest.raises(SystemExit, match="no row for"):
        mod.pairs("digits", [{**saved["pairs"][0]["option"], "seed": 99}], grid)


def _is_the_stage_rules_row(grid: list[dict], o: dict) -> int:
    """1 after checking that the grid's ``fedhypevae`` row of ``o``'s cell is the grid's ``no-dp-sgd`` row of that
    cell: since the DP-SGD stage rule (docs/method.md, decision 22) ours on the small sets (median client below 1,500
    training records) is that model, and its rows were measured again (benchmarks/utility.py --rerun)."""
    def row(method: str) -> dict:
        return next(r for r in grid if (r["method"], r["eps_target"], r["seed"]) == (method, o["eps_target"], o["seed"]))

    now, nodp = row("fedhypevae"), row("no-dp-sgd")
    figures = ("tstr_accuracy", "mmd2", "precision", "coverage", "epsilon")
    assert {k: now[k] for k in figures} == pytest.approx({k: nodp[k] for k in figures}, rel=1e-5, abs=0), \
        (o["eps_target"], o["seed"])
    assert now["tstr_accuracy"] == nodp["tstr_accuracy"] and now["precision"] == nodp["precision"]
    return 1


def _undated(row: dict) -> dict:
    """A grid row without the date `utility.py --reuse-results` gave it (the pairs kept the row as measured)."""
    return {k: v for k, v in row.items() if k != "measured"}


def test_the_client_cov_table_is_its_own_output_beside_the_committed_grid_rows():
    """benchmarks/results/option-client-cov.md (model.client_shrinkage = "client-cov", not the default): the table
    is option_test.py's output from the pairs it keeps, each grid row is the committed Fashion-MNIST grid's own
    row of that cell, and the README quotes its ε = 4 precision / coverage."""
    mod = _module("option_test")
    saved = json.loads((RESULTS / "option-client-cov.json").read_text())
    assert mod.table(saved["pairs"], saved["label"]) in (RESULTS / "option-client-cov.md").read_text()
    grid = json.loads(mod.grid_file("fashion").read_text())["rows"]
    for p in saved["pairs"]:
        assert p["option"]["extra"] == ["model.client_shrinkage=client-cov"]
        # ours' grid rows were measured again with the DP-SGD stage rule (decision 22), the pairs before it
        assert p["grid"] in [_undated(r) for r in grid] or _is_the_stage_rules_row(grid, p["option"])
    ours4 = [p["option"] for p in saved["pairs"] if p["option"]["eps_target"] == "4"]
    prec = sum(o["precision"] for o in ours4) / len(ours4)
    cov = sum(o["coverage"] for o in ours4) / len(ours4)
    assert f"**{prec:.2f} / {cov:.2f} at ε = 4**" in (ROOT / "README.md").read_text()


def test_a_job_folder_of_other_settings_is_moved_aside_and_the_job_runs_fresh(tmp_path, monkeypatch):
    """benchmarks/utility.py after a default changed: the old job folder's run is refused by the resume check
    ("the configuration differs"); run_one moves it to <job>.stale and runs the job again; other errors stay errors."""
    import fedhype.pipeline.job as job_mod
    from fedhype.errors import ValidationError

    mod = _module("utility")
    calls = []

    def fake_run_job(conf, out, log):
        calls.append(out)
        if len(calls) == 1:
            raise ValidationError("--resume: the configuration differs from the one in x (model.located_share: 0.0 → 'auto')")
        out.mkdir(parents=True)
        (out / "evaluation.json").write_text(json.dumps({}))
        return {"tstr_accuracy": 0.5, "timings_s": {"train_s": 1.0}}

    monkeypatch.setattr(job_mod, "run_job", fake_run_job)
    old = tmp_path / "dp-gaussian-eps8-s0"
    old.mkdir()
    (old / "marker").write_text("old run")
    row = mod.run_one(None, "dp-gaussian", "8", 0, tmp_path, [])
    assert "error" not in row and row["tstr_accuracy"] == 0.5 and len(calls) == 2
    assert (tmp_path / "dp-gaussian-eps8-s0.stale" / "marker").read_text() == "old run"
    assert (tmp_path / "dp-gaussian-eps8-s0" / "evaluation.json").exists()

    def failing(conf, out, log):
        raise ValidationError("model.latent must be ≥ 1")

    monkeypatch.setattr(job_mod, "run_job", failing)
    row = mod.run_one(None, "dp-gaussian", "4", 0, tmp_path, [])
    assert "model.latent must be ≥ 1" in row["error"] and not (tmp_path / "dp-gaussian-eps4-s0.stale").exists()


def test_the_subspace_table_is_its_own_output_beside_the_committed_grid_rows():
    """benchmarks/results/option-subspace.md (model.client_shrinkage = "subspace", chosen on validation, not the
    default): the table is option_test.py's output from the pairs it keeps, each grid row is the committed digits
    grid's own row of that cell, and the README quotes the test split's ε = 1 TSTR and MMD² of both sides."""
    mod = _module("option_test")
    saved = json.loads((RESULTS / "option-subspace.json").read_text())
    assert mod.table(saved["pairs"], saved["label"]) in (RESULTS / "option-subspace.md").read_text()
    grid = json.loads(mod.grid_file("digits").read_text())["rows"]
    for p in saved["pairs"]:
        assert p["option"]["extra"] == ['model.client_shrinkage="subspace"']
        assert _undated(p["grid"]) in [_undated(r) for r in grid]
    one = [p for p in saved["pairs"] if p["option"]["eps_target"] == "1"]
    assert len(one) == 3
    mean = lambda side, key: sum(p[side][key] for p in one) / len(one)  # noqa: E731
    quoted = (f"{mean('grid', 'tstr_accuracy'):.3f} → {mean('option', 'tstr_accuracy'):.3f}, MMD² "
              f"{mean('grid', 'mmd2'):.4f} → {mean('option', 'mmd2'):.4f}")
    assert quoted in (ROOT / "README.md").read_text()
