"""The code × domain matrix: each client's code is closest to its own domain when the codes carry
their clients' statistics, and not when they do not (the no-client-stats ablation)."""

import pytest

from fedhype.data.partition import make_partition
from fedhype.eval.domains import code_domain_matrix
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="domain", seed=0)


def _matrix(real_store, part, tmp_path, method):
    cfg = TrainConfig(rounds=1, local_steps=1, batch_size=32, no_dp=True, epsilon=None, seed=0, model=SMALL, method=method)
    train(real_store, part, cfg, tmp_path / method, diagnostics=False)
    doms = {c.name: part.client_store(real_store, c.id, "test") for c in part.clients}
    return code_domain_matrix(tmp_path / method, doms, per_class=60, seed=0)


def test_client_codes_are_closest_to_their_own_domain(real_store, part, tmp_path):
    r = _matrix(real_store, part, tmp_path, "fedhypevae")
    names = [c.name for c in part.clients]
    assert r["codes"] == [f"client:{n}" for n in names] + ["neutral", "mixture"]
    assert r["domains"] == names + ["all"]
    assert len(r["mmd2"]) == len(r["codes"]) and all(len(row) == len(r["domains"]) for row in r["mmd2"])
    assert r["own_domain_is_closest"] == {n: True for n in names}
    assert r["own_code_is_closest"] == {n: True for n in names} and not r["codes_indistinguishable"]
    # and a client's code scores best on its own domain's test split
    for i, n in enumerate(names):
        assert max(range(len(names)), key=lambda j: r["tstr"][i][j]) == i, n


def test_without_client_statistics_the_codes_do_not_capture_their_domains(real_store, part, tmp_path):
    r = _matrix(real_store, part, tmp_path, "no-client-stats")
    assert not all(r["own_domain_is_closest"].values())
    assert not all(r["own_code_is_closest"].values())


def test_the_report_does_not_credit_a_code_for_its_domain_being_closest_to_every_code():
    """A probe's report said "hospital_c yes" where all client codes gave the same row: hospital_c's domain was the
    closest to every code. A yes now needs the client's own code to be the closest code to its domain as well, and
    codes whose rows agree within :data:`~fedhype.eval.domains.INDISTINGUISHABLE_MMD2` are called indistinguishable."""
    from fedhype.pipeline.report import _code_domain_sentence

    row = [0.751, 0.714, 0.702]
    same = {"own_domain_is_closest": {"a": False, "b": False, "c": True}, "own_code_is_closest": {"a": False, "b": False,
            "c": False}, "codes_spread": 0.0002, "codes_indistinguishable": True, "mmd2": [row] * 3}
    assert _code_domain_sentence(same).startswith("The client codes are indistinguishable") and "c yes" not in \
        _code_domain_sentence(same)
    apart = {**same, "codes_spread": 0.05, "codes_indistinguishable": False}
    assert _code_domain_sentence(apart).endswith("a no, b no, c no.")
    good = {**apart, "own_domain_is_closest": {"a": True, "c": True}, "own_code_is_closest": {"a": True, "c": False}}
    assert _code_domain_sentence(good).endswith("a yes, c no.")
