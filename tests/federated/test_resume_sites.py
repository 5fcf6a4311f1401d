"""Resuming a ``--site`` run with other sites (or a pooled run with sites) is refused naming both lists, before any
line says the run is finished or resuming (a probe was told "finished, nothing to resume", then "the partition's
random keys differ: it was drawn again" with advice for a pooled partition)."""

import pytest

from fedhype.errors import ValidationError
from fedhype.federated.run_plan import check_resumed_sites
from fedhype.federated.rundir import RunDir

SITES = {"train": {}, "partition": {"scheme": "site", "clients": ["hospital_a", "hospital_b", "hospital_c"],
                                  "keys": ["1", "2", "3"]}}
POOLED = {"train": {}, "partition": {"scheme": "dirichlet", "clients": 10, "keys": ["1"]}}


def test_the_same_sites_in_any_order_resume(tmp_path):
    check_resumed_sites(RunDir(tmp_path), SITES, ["hospital_c", "hospital_a", "hospital_b"])
    check_resumed_sites(RunDir(tmp_path), POOLED, None)
    check_resumed_sites(RunDir(tmp_path), None, ["hospital_a"])  # no recorded run: nothing to compare


@pytest.mark.parametrize("recorded, given, said", [
    (SITES, ["hospital_a", "hospital_b"], "the --site folders given are hospital_a, hospital_b (missing: hospital_c)"),
    (SITES, ["hospital_a", "hospital_b", "hospital_c", "hospital_d"], "(not in the run: hospital_d)"),
    (SITES, None, "holds a run of the sites hospital_a, hospital_b, hospital_c: resume it with their --site folders"),
    (POOLED, ["hospital_a"], "trained on a pooled store and partition, not on --site folders"),
])
def test_other_sites_are_refused_naming_both(tmp_path, recorded, given, said):
    with pytest.raises(ValidationError) as e:
        check_resumed_sites(RunDir(tmp_path), recorded, given)
    assert said in str(e.value) and "drawn again" not in str(e.value)


def test_a_site_runs_key_difference_does_not_get_the_pooled_partitions_advice(tmp_path):
    import json

    from fedhype.federated.run_plan import _refuse_differences

    run = RunDir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(SITES))
    with pytest.raises(ValidationError) as e:
        _refuse_differences(run, SITES, {**SITES, "partition": {**SITES["partition"], "keys": ["1", "2", "4"]}})
    assert "a site's split differs" in str(e.value) and "drawn again" not in str(e.value)
    with pytest.raises(ValidationError) as e:
        _refuse_differences(run, POOLED, {**POOLED, "partition": {**POOLED["partition"], "keys": ["2"]}})
    assert "drawn again" in str(e.value)


def test_a_site_runs_roster_digest_is_named_as_the_sites_keys_digest(tmp_path):
    """A helper read ``store.digest: 'fb59…' → '8b17…'`` in a site run's refused resume as a digest of the sites'
    records, which the coordinator never holds; a site run's ``store.digest`` is the digest of the sites' keys."""
    import json

    from fedhype.federated.run_plan import _refuse_differences

    run = RunDir(tmp_path)
    old = {**SITES, "store": {"digest": "fb59", "sites": ["hospital_a", "hospital_b", "hospital_c"]}}
    (tmp_path / "config.json").write_text(json.dumps(old))
    with pytest.raises(ValidationError) as e:
        _refuse_differences(run, old, {**old, "store": {**old["store"], "digest": "8b17"},
                                       "partition": {**SITES["partition"], "keys": ["1", "2", "4"]}})
    assert "store.digest (of the sites' keys, not of any records): 'fb59' → '8b17'" in str(e.value)
    pooled = {**POOLED, "store": {"digest": "aa"}}
    with pytest.raises(ValidationError) as e:  # a pooled store's digest is one of its records: named as it is
        _refuse_differences(run, pooled, {**pooled, "store": {"digest": "bb"}})
    assert "store.digest: 'aa' → 'bb'" in str(e.value)
