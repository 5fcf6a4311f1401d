"""``fedhype prototypes`` in the consortium vocabulary: ``evaluate --site`` (one site's own held-out split, the
checks of ``fedhype evaluate --site``), ``dp-linear --site`` (one client per site, each site's ledger across runs
charged the run's ε, a capped site refused before anything runs) and ``train --synthetic`` (``--data`` kept as a
hidden old name)."""

from __future__ import annotations

import json
import math

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from fedhype.cli.main import app
from fedhype.data.sites import Site
from fedhype.data.store import EmbeddingStore
from fedhype.privacy.ledger import LedgerEvent, PrivacyLedger
from fedhype.privacy.site_ledger import composed, load_site_ledger

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [*map(str, args)])


def _json(r):
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def _site(store, name, out, *extra):
    return _json(_run("site", "--store", store, "--name", name, "--min-records", 20, "--delta", 1e-4, "--out", out,
                      *extra, "--json"))


def _synthetic(real_store, meta=None):
    """A stand-in for a synthetic store (every 3rd real record, marked synthetic)."""
    sub = real_store.subset(list(range(0, len(real_store), 3)))
    return EmbeddingStore(sub.embeddings, sub.labels, sub.domains * 0, [f"syn/{i}" for i in range(len(sub))],
                          sub.class_names, ["neutral"], {"kind": "synthetic", "private": True, "epsilon": 1.0,
                                                         **(meta or {})})


@pytest.fixture(scope="module")
def files(real_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("proto-sites")
    real = real_store.save(root / "real.safetensors")
    halves = {}
    for name, start in (("north", 0), ("south", 1)):  # two sites with distinct records
        halves[name] = real_store.subset(list(range(start, len(real_store), 2))).save(root / f"{name}.safetensors")
    _site(real, "whole", root / "whole")
    syn = _synthetic(real_store).save(root / "syn.safetensors")
    model = root / "model"
    _json(_run("prototypes", "train", "--synthetic", syn, "--epochs", 6, "--out", model, "--json"))
    return {"root": root, "real": real, "halves": halves, "syn": syn, "model": model}


# ---------------------------------------------------------------------------- evaluate --site
def test_evaluate_site_scores_the_same_records_as_store_and_partition(files):
    root = files["root"]
    Site.load(root / "whole").partition.save(root / "whole-part.json")  # the site's split as a partition file
    for split in ("test", "val"):
        by_site = _json(_run("prototypes", "evaluate", "--model", files["model"], "--site", root / "whole",
                             *(["--split", split] if split != "test" else []), "--json"))
        pooled = _json(_run("prototypes", "evaluate", "--model", files["model"], "--store", files["real"],
                            "--partition", root / "whole-part.json", "--split", split, "--json"))
        assert by_site["site"] == "whole" and by_site["split"] == split and by_site["partition"] is None
        assert by_site["store"] == str(files["real"].resolve()) and by_site["site_dir"] == str(root / "whole")
        assert by_site["n"] == pooled["n"] == len(Site.load(root / "whole").split.ids(split)) > 0
        for m in ("accuracy", "balanced_accuracy", "macro_f1"):
            assert by_site[m] == pooled[m]
        assert by_site["heads"] == pooled["heads"] and by_site["per_domain"] == pooled["per_domain"]
        assert by_site["per_client"] == pooled["per_client"] and set(by_site["per_client"]) == {"whole"}
        assert 0.2 < by_site["accuracy"] <= 1 and by_site["warnings"] == []  # chance 0.1
    table = _run("prototypes", "evaluate", "--model", files["model"], "--site", root / "whole")
    assert table.exit_code == 0 and "site 'whole'" in table.stdout and "site whole" in table.stdout


def test_evaluate_site_runs_the_provenance_checks_of_evaluate_site(files, real_store):
    root = files["root"]
    site = Site.load(root / "whole")
    # a model of a run that trained on a site named "whole" with another split (site key): refused, exit 4
    other = _synthetic(real_store, {"data_keys": ["0" * 32], "client_names": ["whole"]}).save(root / "keyed.safetensors")
    _json(_run("prototypes", "train", "--synthetic", other, "--epochs", 1, "--out", root / "keyed", "--json"))
    r = _run("prototypes", "evaluate", "--model", root / "keyed", "--site", root / "whole", "--json")
    assert r.exit_code == 4 and "split again" in json.loads(r.stdout)["error"], r.output
    # the run's own split of that site: accepted
    own = _synthetic(real_store, {"data_keys": [site.key], "client_names": ["whole"]}).save(root / "own.safetensors")
    _json(_run("prototypes", "train", "--synthetic", own, "--epochs", 1, "--out", root / "own", "--json"))
    ev = _json(_run("prototypes", "evaluate", "--model", root / "own", "--site", root / "whole", "--json"))
    assert ev["warnings"] == [] and ev["site"] == "whole"
    # a site the run did not train on: said, as `fedhype evaluate --site` says it
    outside = _synthetic(real_store, {"data_keys": ["1" * 32], "client_names": ["elsewhere"]}).save(root / "out.safetensors")
    _json(_run("prototypes", "train", "--synthetic", outside, "--epochs", 1, "--out", root / "outside", "--json"))
    ev = _json(_run("prototypes", "evaluate", "--model", root / "outside", "--site", root / "whole", "--json"))
    assert len(ev["warnings"]) == 1 and "is not one of the clients of the run" in ev["warnings"][0]
    # a model trained on real records of the site's own store: its held-out split may hold them, said
    _json(_run("prototypes", "train", "--synthetic", files["real"], "--epochs", 1, "--out", root / "on-real", "--json"))
    ev = _json(_run("prototypes", "evaluate", "--model", root / "on-real", "--site", root / "whole", "--json"))
    assert len(ev["warnings"]) == 1 and "site 'whole'" in ev["warnings"][0] and "may include them" in ev["warnings"][0]
    # another embedding of the same dimension: refused, exit 4 (as `evaluate --site`)
    emb = _synthetic(real_store, {"embedding": {"encoder": "hf:other", "weights_hash": "f" * 64}})
    _json(_run("prototypes", "train", "--synthetic", emb.save(root / "emb.safetensors"), "--epochs", 1, "--out",
               root / "emb", "--json"))
    r = _run("prototypes", "evaluate", "--model", root / "emb", "--site", root / "whole", "--json")
    assert r.exit_code == 4 and "not comparable" in json.loads(r.stdout)["error"], r.output


@pytest.mark.parametrize("args, message", [
    (["--site", "{site}", "--store", "{real}"], "give --site, or --store"),
    (["--site", "{site}", "--partition", "{part}"], "give --site, or --store"),
    (["--site", "{site}", "--site", "{site}"], "--site given 2 times"),
    ([], "give the real held-out data: --store"),
    (["--site", "{root}"], "no site.json there; give a site folder written by `fedhype site`"),
])
def test_evaluate_site_usage_errors(files, args, message):
    root = files["root"]
    if not (root / "whole-part.json").exists():
        Site.load(root / "whole").partition.save(root / "whole-part.json")
    fill = {"{site}": root / "whole", "{real}": files["real"], "{part}": root / "whole-part.json", "{root}": root}
    r = _run("prototypes", "evaluate", "--model", files["model"], *[fill.get(a, a) for a in args], "--json")
    assert r.exit_code in (2, 4), r.output
    assert message in json.loads(r.stdout)["error"]


# ---------------------------------------------------------------------------- dp-linear --site
def _ledger_bytes(*folders):
    return {f: ((f / "site-ledger.json").read_bytes(), (f / "site.json").read_bytes()) for f in folders}


def test_dp_linear_site_charges_each_site_ledger_the_runs_epsilon(files, tmp_path):
    north, south = tmp_path / "north", tmp_path / "south"
    _site(files["halves"]["north"], "north", north)
    _site(files["halves"]["south"], "south", south)
    out = tmp_path / "dpl"
    # (ε = 8: at ε = 1 two clients of 240 records score chance, with --store/--partition too)
    res = _json(_run("prototypes", "dp-linear", "--site", north, "--site", south, "--epsilon", 8, "--rounds", 2,
                     "--out", out, "--json"))
    assert res["private"] and res["sites"] == ["north", "south"] and set(res["per_client"]) == {"north", "south"}
    assert set(res["epsilon_per_client"]) == {"north", "south"} and 0 < res["epsilon"] <= 8 + 1e-6
    n_test = sum(len(Site.load(f).split.test) for f in (north, south))
    assert res["n_test"] == n_test == sum(c["n"] for c in res["per_client"].values())
    assert res["n_train"] == sum(len(Site.load(f).split.train) for f in (north, south))
    assert 0.2 < res["accuracy"] <= 1  # chance 0.1
    run_ledger = PrivacyLedger.load(out / "ledger.json")
    assert run_ledger.meta["run_key"] == res["run_key"]
    for name, folder in (("north", north), ("south", south)):
        led = load_site_ledger(folder, site=name)
        mine = [e for e in run_ledger.events if e.client == name]
        # exactly the run's events on the site's records: the statistics release and one event per round
        assert len(led.events) == len(mine) == 1 + 2
        assert [(e.mechanism, e.round, e.noise_multiplier, e.sample_rate, e.steps) for e in led.events] == \
               [(e.mechanism, e.round, e.noise_multiplier, e.sample_rate, e.steps) for e in mine]
        assert all(e.note.startswith(f"run {res['run_key']}") and not e.seeded for e in led.events)
        eps = composed(led.events, led.delta)
        assert led.delta == res["delta"] and eps == pytest.approx(res["epsilon_per_client"][name], rel=1e-6)
        assert res["site_ledgers"][name]["epsilon"] == pytest.approx(eps, rel=1e-9)
        assert not res["site_ledgers"][name]["epsilon_infinite"]
    # the audit compares the model's ledger with each site's own (a folder without ckpt/run-key.json: its ledger's
    # meta names the run; `audit --run DPLIN --site S` said "not the folder of a run trained over sites")
    audited = _run("audit", "--run", out, "--site", north, "--site", south, "--json")
    assert audited.exit_code == 0, audited.output
    rep = json.loads(audited.stdout)
    assert rep["consistent"] and [r["site"] for r in rep["sites"]] == ["north", "south"]
    for row in rep["sites"]:
        assert row["ok"] and row["run_key"] == res["run_key"] and row["events"] == 3
        assert row["claimed"] == pytest.approx(res["epsilon_per_client"][row["site"]], rel=1e-6)
        assert row["recomputed"] == pytest.approx(row["claimed"], abs=1e-6)
    # the model's ledger rebuilt without north's release event (its chain recomputed): the site's own ledger says so
    forged = tmp_path / "forged"
    forged.mkdir()
    for f in out.iterdir():
        (forged / f.name).write_bytes(f.read_bytes())
    state = json.loads((out / "ledger.json").read_text())
    led = PrivacyLedger(state["delta"], state["meta"])
    for e in state["events"]:
        if not (e["client"] == "north" and e["round"] == -1):
            led.record(LedgerEvent.from_dict(e))
    led.save(forged / "ledger.json")
    bad = _run("audit", "--run", forged, "--site", north, "--json")
    assert bad.exit_code == 4, bad.output
    rep = json.loads(bad.stdout)
    assert not rep["consistent"] and rep["sites"][0]["claimed"] < rep["sites"][0]["recomputed"]
    assert any("lacks charges the site recorded" in (m.get("reason") or "") for m in rep["mismatches"])
    # a second run on the same records composes with the first in each site's ledger
    again = _json(_run("prototypes", "dp-linear", "--site", north, "--site", south, "--epsilon", 8, "--rounds", 2,
                       "--json"))
    assert len(load_site_ledger(north, site="north").events) == 6
    assert again["site_ledgers"]["north"]["epsilon"] > res["site_ledgers"]["north"]["epsilon"] * 1.2


def test_dp_linear_site_over_cap_or_seeded_is_refused_with_nothing_written(files, tmp_path):
    north, capped = tmp_path / "north", tmp_path / "capped"
    _site(files["halves"]["north"], "north", north)
    _site(files["halves"]["south"], "capped", capped, "--max-epsilon", 0.5)
    before = _ledger_bytes(north, capped)
    out = tmp_path / "dpl"
    r = _run("prototypes", "dp-linear", "--site", north, "--site", capped, "--epsilon", 1, "--rounds", 2, "--out", out,
             "--json")
    err = json.loads(r.stdout)
    assert r.exit_code == 3 and "site 'capped'" in err["error"] and "nothing was run" in err["error"], r.output
    assert err["limit"] == 0.5 and err["epsilon"] > 0.5
    assert not out.exists() and _ledger_bytes(north, capped) == before
    # a seeded run is ε = ∞ for a site: refused on the capped one however small its plan
    r = _run("prototypes", "dp-linear", "--site", north, "--site", capped, "--epsilon", 0.05, "--rounds", 1, "--seed",
             0, "--out", out, "--json")
    assert r.exit_code == 3 and "site 'capped': a seeded run" in json.loads(r.stdout)["error"], r.output
    assert not out.exists() and _ledger_bytes(north, capped) == before
    # without DP: refused on the capped site too
    r = _run("prototypes", "dp-linear", "--site", capped, "--no-dp", "--rounds", 1, "--json")
    assert r.exit_code == 3 and _ledger_bytes(north, capped) == before
    # a seeded run on an uncapped site runs, and the site's ledger says ε = ∞
    res = _json(_run("prototypes", "dp-linear", "--site", north, "--epsilon", 1, "--rounds", 1, "--seed", 0, "--json"))
    led = load_site_ledger(north, site="north")
    assert len(led.events) == 2 and all(e.seeded for e in led.events) and math.isinf(composed(led.events, led.delta))
    rep = res["site_ledgers"]["north"]
    assert rep["epsilon_infinite"] and rep["epsilon"] is None and rep["seeded_runs"] == [res["run_key"]]
    assert res["noise_seeded"] and res["epsilon"] is not None  # the run's own figure is the accountant's


def test_dp_linear_one_site_is_the_partition_of_its_split(files):
    """A seeded run over one site trains on the records `--store/--partition` gives it with the site's split as the
    partition: the same model, scored on the same test records."""
    root = files["root"]
    Site.load(root / "whole").partition.save(root / "whole-part.json")
    common = ("--epsilon", 8, "--rounds", 2, "--seed", 3, "--json")
    by_site = _json(_run("prototypes", "dp-linear", "--site", root / "whole", *common))
    pooled = _json(_run("prototypes", "dp-linear", "--store", files["real"], "--partition", root / "whole-part.json",
                        *common))
    for k in ("accuracy", "balanced_accuracy", "macro_f1", "epsilon", "noise_multiplier", "n_train", "n_test"):
        assert by_site[k] == pooled[k], k
    assert by_site["per_client"] == pooled["per_client"] and set(by_site["per_client"]) == {"whole"}


@pytest.mark.parametrize("args, message", [
    (["--site", "{site}", "--store", "{real}"], "give one or the other"),
    (["--store", "{real}"], "give --store and --partition"),
    (["--classes", "a,b", "--store", "{real}", "--partition", "{part}"], "use it with --site"),
    (["--site", "{root}"], "no site.json there"),
])
def test_dp_linear_site_usage_errors(files, args, message):
    root = files["root"]
    if not (root / "whole-part.json").exists():
        Site.load(root / "whole").partition.save(root / "whole-part.json")
    fill = {"{site}": root / "whole", "{real}": files["real"], "{part}": root / "whole-part.json", "{root}": root}
    r = _run("prototypes", "dp-linear", *[fill.get(a, a) for a in args], "--json")
    assert r.exit_code == 2, r.output
    assert message in json.loads(r.stdout)["error"]


# ---------------------------------------------------------------------------- train --synthetic / --data
def test_train_synthetic_and_its_old_name_data_give_the_same_model(files):
    root = files["root"]
    a = _json(_run("prototypes", "train", "--synthetic", files["syn"], "--epochs", 2, "--out", root / "by-syn", "--json"))
    b = _json(_run("prototypes", "train", "--data", files["syn"], "--epochs", 2, "--out", root / "by-data", "--json"))
    assert a["train_accuracy"] == b["train_accuracy"] and a["n_train"] == b["n_train"]
    ta, tb = load_file(root / "by-syn" / "model.safetensors"), load_file(root / "by-data" / "model.safetensors")
    assert set(ta) == set(tb) and all(ta[k].equal(tb[k]) for k in ta)
    r = _run("prototypes", "train", "--synthetic", files["syn"], "--data", files["syn"], "--out", root / "both", "--json")
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 2 and "--synthetic" in err and "--data" in err and not (root / "both").exists()
    r = _run("prototypes", "train", "--out", root / "none", "--json")
    assert r.exit_code == 2 and "--synthetic" in json.loads(r.stdout)["error"]
    shown = _run("prototypes", "train", "--help").stdout
    assert "--synthetic" in shown and "--data" not in shown  # the old name works, hidden


# ---------------------------------------------------------------------------- what a run prints (a user's probe)
def test_dp_linear_seeded_says_the_noise_can_be_regenerated_and_the_plan_line_waits_for_acceptance(files, tmp_path):
    """A probe: `dp-linear --site siteC --seed 3` printed "ε = 0.09973 (PRV, worst client)" as if private (only the
    site line said ∞), and "10 rounds over 2 sites …" came before a refusal."""
    north, capped = tmp_path / "north", tmp_path / "capped"
    _site(files["halves"]["north"], "north", north)
    _site(files["halves"]["south"], "capped", capped, "--max-epsilon", 0.5)
    r = _run("prototypes", "dp-linear", "--site", north, "--epsilon", 1, "--rounds", 1, "--seed", 3)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert ("note: --seed makes the noise reproducible, which is not secure: whoever holds the seed (the model's "
            "metadata carries it) can regenerate the noise and remove it, so the ε of this run holds only while the seed "
            "stays secret and its release must not be shared as private; the sites' ledgers count this run as ε = ∞") \
        in text
    assert "(PRV, worst client; seeded noise: only while the seed stays secret" in text
    assert "DP FedAvg linear classifier: 1 round over 1 site (the plan fits every site's ledger)" in text
    res = _json(_run("prototypes", "dp-linear", "--site", north, "--epsilon", 1, "--rounds", 1, "--seed", 3, "--json"))
    assert res["seeded"] is True and res["noise_seeded"] is True
    res = _json(_run("prototypes", "dp-linear", "--site", north, "--epsilon", 1, "--rounds", 1, "--json"))
    assert res["seeded"] is False
    # a refused plan prints its refusal only, not the plan line
    r = _run("prototypes", "dp-linear", "--site", north, "--site", capped, "--epsilon", 1, "--rounds", 10)
    assert r.exit_code == 3 and "rounds over" not in r.output and "site 'capped'" in r.output, r.output


def test_train_synthetic_shows_the_stores_delta_or_none(files, real_store, tmp_path):
    """A probe: `prototypes train --synthetic` showed "delta None" beside ε."""
    r = _run("prototypes", "train", "--synthetic", files["syn"], "--epochs", 1, "--out", tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert not [ln for ln in r.output.splitlines() if "│ delta " in ln]  # the store carries no δ: left out
    syn = _synthetic(real_store, {"delta": 1e-5}).save(tmp_path / "syn-delta.safetensors")
    r = _run("prototypes", "train", "--synthetic", syn, "--epochs", 1, "--out", tmp_path / "b")
    assert r.exit_code == 0, r.output
    assert [ln.split("│")[2].strip() for ln in r.output.splitlines() if "│ delta " in ln] == ["1e-05"], r.output
    res = _json(_run("prototypes", "train", "--synthetic", syn, "--epochs", 1, "--out", tmp_path / "c", "--json"))
    assert res["delta"] == 1e-5 and res["epsilon"] == 1.0
# Append to tests/cli/test_prototypes_sites_cli.py once /tmp/helper-check/inputs.diff is applied (it fails without it).


def test_evaluate_with_another_split_names_the_file_of_the_runs_split(files, real_store, tmp_path):
    """A probe: `prototypes evaluate --model proto2 --site siteB/site.2922b685.json` (the old split; the model was
    trained on the new one) suggested site.30046d30.json, the current split's key, which is no file (it is site.json)."""
    folder = tmp_path / "siteB"
    old = _site(files["halves"]["north"], "siteB", folder)
    old_key = Site.load(folder).key
    _site(files["halves"]["north"], "siteB", folder, "--overwrite")
    new_key = Site.load(folder).key
    kept = folder / f"site.{old_key[:8]}.json"
    assert kept.is_file() and old_key != new_key and old is not None
    for key, model in ((new_key, "on-new"), (old_key, "on-old")):
        syn = _synthetic(real_store, {"data_keys": [key], "client_names": ["siteB"]}).save(tmp_path / f"{model}.st")
        _json(_run("prototypes", "train", "--synthetic", syn, "--epochs", 1, "--out", tmp_path / model, "--json"))
    r = _run("prototypes", "evaluate", "--model", tmp_path / "on-new", "--site", kept, "--json")
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 4 and f"evaluate with the split the run used: --site {folder / 'site.json'}" in err, err
    assert f"site.{new_key[:8]}.json" not in err
    r = _run("prototypes", "evaluate", "--model", tmp_path / "on-old", "--site", folder, "--json")
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 4 and f"evaluate with the split the run used: --site {kept}" in err, err
    _json(_run("prototypes", "evaluate", "--model", tmp_path / "on-old", "--site", kept, "--json"))  # its own split
