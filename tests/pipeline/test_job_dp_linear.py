"""The job's DP linear reference is compared with the generator at the generator's ε.

A job that sets ``train.noise_multiplier`` (no ε target) gave the reference the same σ over its own plan: a helper's
σ = 1 spent ε 3.8 on the generator and 11.5 on the reference, so the report compared ours with a reference three
times as private-budgeted. The reference is now calibrated to the generator's ledger ε; a reference an older
version trained at σ is reused as it is.
"""

from __future__ import annotations

import json

import pytest

from conftest import REAL_STORE, TEST_CACHE
from fedhype.pipeline.config import resolve
from fedhype.pipeline.job import dp_linear_config, run_job

SMALL = [f"data.limit={REAL_STORE['limit']}", f"data.image_size={REAL_STORE['image_size']}",
         f"data.cache_dir=\"{TEST_CACHE / 'embeddings'}\"", "train.rounds=2", "train.batch_size=32", "train.seed=0",
         "model.hidden=32", "model.latent=8", "model.hyper_hidden=16", "model.code_dim=8", "synthesis.per_class=20",
         "evaluate.permutations=20", "evaluate.dp_linear=true", "evaluate.downstream=false",
         "evaluate.interpolation=false", "evaluate.prototypes=false", "evaluate.code_domain=false"]


def test_settings_follow_the_generators_epsilon_only_where_the_job_sets_sigma():
    sigma = resolve(None, ["train.noise_multiplier=1.0"])
    cfg = dp_linear_config(sigma, 3.81234)
    assert (cfg.epsilon, cfg.noise_multiplier) == (3.812, None)  # the generator's ε, 4 significant digits
    assert dp_linear_config(sigma).noise_multiplier == 1.0  # no generator ε known: the job's σ, as before
    assert dp_linear_config(sigma, float("inf")).noise_multiplier == 1.0
    target = dp_linear_config(resolve(None, ["train.epsilon=4"]), 4.6)  # an ε target: the reference gets the target
    assert (target.epsilon, target.noise_multiplier) == (4.0, None)
    assert dp_linear_config(resolve(None, ["train.no_dp=true"]), 3.0).no_dp


@pytest.mark.slow
def test_a_job_at_a_given_sigma_trains_its_reference_at_the_generators_epsilon(tmp_path, real_store):
    out = tmp_path / "sigma"
    conf = resolve(None, [*SMALL, "train.noise_multiplier=1.0"])
    run_job(conf, out, log=lambda s: None)
    ev = json.loads((out / "evaluation.json").read_text())
    gen = json.loads((out / "report.json").read_text())["epsilon"]
    ref = ev["dp_linear"]["epsilon"]
    # calibrated to the generator's ε (the accountant's figure for the reference's own plan, at most that ε)
    assert gen > 1.0 and 0.97 * gen <= ref <= gen * 1.0001, (gen, ref)
