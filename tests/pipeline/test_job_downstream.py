"""The main job's per-client downstream table: in evaluation.json, report.json and report.md; skipped, not failed,
when a client has an empty split (the model is trained and its ε spent by then)."""

import json

from conftest import REAL_STORE, TEST_CACHE
from fedhype.pipeline.config import resolve
from fedhype.pipeline.job import run_job

SMALL = [f"data.limit={REAL_STORE['limit']}", f"data.image_size={REAL_STORE['image_size']}", 'data.dtype="float32"',
         f"data.cache_dir=\"{TEST_CACHE / 'embeddings'}\"", "train.rounds=1", "train.batch_size=32", "train.seed=0",
         "train.epsilon=8", "synthesis.per_class=30", "evaluate.permutations=10", "evaluate.prototypes=false",
         "evaluate.dp_linear=false", "evaluate.code_domain=false", "model.hidden=32", "model.latent=8",
         "model.hyper_hidden=16", "model.code_dim=8"]


def _run(tmp_path, *extra):
    lines = []
    rep = run_job(resolve(None, SMALL + list(extra)), tmp_path / "job", log=lines.append, quiet=1e9)
    return rep, json.loads((tmp_path / "job" / "evaluation.json").read_text()), lines


def test_the_job_reports_the_per_client_table(tmp_path):
    rep, ev, lines = _run(tmp_path)
    assert any(x.startswith("train: ") and x.endswith("(latent size L = 8)") for x in lines)  # the model's L, said
    d = ev["downstream"]
    names = rep["clients"]
    assert list(d["clients"]) == names and "interpolation" not in d
    # the λ protocol ran once, inside the table: evaluation.json's interpolation is the same run
    assert [ev["interpolation"]["clients"][n]["lambda"] for n in names] == [d["clients"][n]["lambda"] for n in names]
    s = rep["downstream"]
    assert s["gain_union_accuracy"] == d["gain_union_accuracy"] and set(s["per_client"]) == set(names)
    md = (tmp_path / "job" / "report.md").read_text()
    assert "## Downstream value per client" in md and "For each client." in md
    for n in names:
        c = s["per_client"][n]
        assert f"| {n} | {c['n_train']} |" in md
        assert f"{c['own']['local_synthetic']:.3f} / {c['union']['local_synthetic']:.3f}" in md


def test_an_empty_split_skips_the_per_client_tables_with_a_warning(tmp_path):
    rep, ev, lines = _run(tmp_path, "partition.fractions=[0.8, 0.0, 0.2]", "evaluate.downstream=true")
    assert "downstream" not in ev and "interpolation" not in ev and rep["downstream"] is None
    warn = next(x for x in lines if "per-client tables" in x)
    assert "are skipped: empty split(s)" in warn and "(val)" in warn
    assert rep["tstr_accuracy"] is not None  # the rest of the evaluation is there
