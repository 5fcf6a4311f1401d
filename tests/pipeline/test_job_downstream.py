"""The main job's per-client downstream table: in evaluation.json, report.json and report.md; skipped, not failed,
when a client has an empty split (the model is trained and its ε spent by then)."""

import json

import pytest

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


def test_the_per_client_verdict_needs_a_gain_beyond_the_tables_resolution():
    """A probe's report said the synthetic data "helps the clients beyond what they hold" on +0.003 (a third of one
    of 108 union test records) where two of three clients lost: the verdict needs the mean gain beyond two standard
    errors of the clients' gains (at least two test records) and most clients on its side."""
    from fedhype.pipeline.report import _downstream_verdict, gain_resolution

    probe = [0.704 - 0.722, 0.815 - 0.824, 0.685 - 0.648]  # the probe's three hospitals (union test set, 108 records)
    res = gain_resolution(probe, 108)
    assert res == pytest.approx(0.0341, abs=1e-4) and res > 2 / 108  # sd 0.0295 of the gains, over √3, twice
    assert _downstream_verdict(sum(probe) / 3, 1, 3, res).startswith("No measurable effect")
    assert gain_resolution([0.01], 200) == pytest.approx(0.01)  # one client: two of the 200 records
    clear = [0.17, 0.16, 0.18, 0.17]  # README's Fashion-MNIST ε = 1 gains: every client gains
    assert _downstream_verdict(0.17, 4, 4, gain_resolution(clear, 2000)).startswith("The synthetic data helps")
    assert _downstream_verdict(-0.05, 0, 4, gain_resolution([-0.05, -0.06, -0.04, -0.05], 2000)).startswith(
        "The synthetic data lowers")
    assert _downstream_verdict(0.05, 1, 4, 0.01).startswith("No measurable")  # most clients lose: no verdict


def test_the_job_warns_of_a_delta_not_well_below_one_over_n_before_training(tmp_path):
    """`fedhype train`, `budget` and the API warned when n·δ > 0.1; `fedhype run` said nothing (a probe)."""
    _, _, lines = _run(tmp_path, "train.delta=0.002", "evaluate.downstream=false", "evaluate.interpolation=false")
    (warn,) = [x for x in lines if "n·delta reaches" in x]
    first_train = next(i for i, x in enumerate(lines) if x.startswith("train: ") and "warning" not in x)
    assert warn.startswith("train: warning: delta = 0.002 is below 1/n") and lines.index(warn) < first_train
    n = int(warn.split("n = ")[1].split(")")[0])
    assert 0.1 < n * 0.002 < 1 and f"{n * 0.002:.3g}" in warn
    _, _, quiet = _run(tmp_path / "b", "evaluate.downstream=false", "evaluate.interpolation=false")  # δ = 1e-4
    assert not [x for x in quiet if "n·delta" in x]
