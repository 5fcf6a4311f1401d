"""A site's ledger across runs (fedhype.privacy.site_ledger): what its records paid over every run,
composed by the accountant, and its lifetime cap enforced before anything is charged or run."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fedhype.errors import ArtifactError, BudgetExceededError, ValidationError
from fedhype.federated.config import TrainConfig
from fedhype.privacy.accountant import epsilon
from fedhype.privacy.ledger import LedgerEvent, PrivacyLedger, charge
from fedhype.privacy.site_ledger import (SiteCharger, by_run, cap_of, composed, ledger_path, load_site_ledger,
                                         report, seeded_runs, set_site_ledger, spent, eps_text)

DELTA = 1e-5


def _events(client: str, rounds: int, sigma: float = 1.0, q: float = 0.05, steps: int = 20) -> list[LedgerEvent]:
    return [LedgerEvent(client, r, "dp-sgd", sigma, q, steps, 1.0) for r in range(rounds)]


def test_the_site_ledger_composes_every_run_with_the_accountant(tmp_path):
    a, b = SiteCharger(tmp_path, "hospital_a", "run-1", DELTA), SiteCharger(tmp_path, "hospital_a", "run-2", DELTA)
    a.charge(_events("0", 3))
    b.charge(_events("2", 2, sigma=0.8))  # another run, where the site was client 2, with less noise
    led = load_site_ledger(tmp_path)
    assert {e.client for e in led.events} == {"hospital_a"} and len(led) == 5
    both = epsilon([(1.0, 0.05, 60), (0.8, 0.05, 40)], DELTA)
    alone = [epsilon([(1.0, 0.05, 60)], DELTA), epsilon([(0.8, 0.05, 40)], DELTA)]
    assert spent(led) == pytest.approx(both, rel=1e-9)
    assert list(by_run(led)) == ["run-1", "run-2"] and list(by_run(led).values()) == pytest.approx(alone, rel=1e-9)
    assert both > max(alone) and both < sum(alone)  # composed, tighter than adding the ε's up
    assert cap_of(led) is None and led.delta == DELTA


def test_the_cap_refuses_before_anything_is_recorded_and_names_the_site(tmp_path):
    ch = SiteCharger(tmp_path, "clinic_c", "run-1", DELTA)
    ch.charge(_events("0", 2))
    first = spent(load_site_ledger(tmp_path))
    with pytest.raises(ValidationError, match="already spent"):
        set_site_ledger(tmp_path, "clinic_c", max_epsilon=first / 2)
    set_site_ledger(tmp_path, "clinic_c", max_epsilon=first * 1.2)
    before = ledger_path(tmp_path).read_text()
    run_ledger = PrivacyLedger(DELTA)
    run_ledger.mirrors["0"] = SiteCharger(tmp_path, "clinic_c", "run-2", DELTA)
    with pytest.raises(BudgetExceededError, match="clinic_c.*past the site's cap") as err:
        charge(run_ledger, _events("0", 2) + _events("1", 2), tmp_path / "ledger.json")
    assert err.value.limit == pytest.approx(first * 1.2) and err.value.epsilon > first * 1.2
    assert ledger_path(tmp_path).read_text() == before and len(run_ledger) == 0  # nothing charged anywhere
    assert not (tmp_path / "ledger.json").exists()
    charge(run_ledger, _events("0", 1, steps=1, sigma=20.0) + _events("1", 2), tmp_path / "ledger.json")
    led = load_site_ledger(tmp_path)  # only client 0's events reach its site; the cap and events are kept
    assert len(led) == 3 and cap_of(led) == pytest.approx(first * 1.2) and len(run_ledger) == 3


def test_a_site_ledger_edited_by_hand_or_another_sites_is_refused(tmp_path):
    SiteCharger(tmp_path, "hospital_a", "run-1", DELTA).charge(_events("0", 2))
    with pytest.raises(ArtifactError, match="is the ledger of site 'hospital_a', not 'hospital_b'"):
        SiteCharger(tmp_path, "hospital_b", "run-2", DELTA).charge(_events("0", 1))
    raw = json.loads(ledger_path(tmp_path).read_text())
    raw["events"][1]["noise_multiplier"] = 50.0  # a cheaper past, written by hand
    ledger_path(tmp_path).write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match="tampered"):
        SiteCharger(tmp_path, "hospital_a", "run-2", DELTA).charge(_events("0", 1))


@pytest.fixture()
def sites(real_store, tmp_path):
    from fedhype.data.sites import Site, make_site

    out = []
    for d in range(2):  # the first two digits domains, one site each
        sub = real_store.subset((real_store.domains == d).nonzero().flatten())
        sub.save(tmp_path / f"s{d}.safetensors")
        make_site(sub, tmp_path / f"s{d}.safetensors", f"site-{d}").save(tmp_path / f"site{d}")
        out.append(Site.load(tmp_path / f"site{d}"))
    return out


CFG = dict(rounds=2, local_steps=2, batch_size=32, epsilon=None, noise_multiplier=2.0, seed=0,
           model={"hidden": 16, "latent": 4})


def _client_eps(run, client: str, delta: float) -> list[tuple[float, float, int]]:
    led = PrivacyLedger.load(run / "ledger.json")
    return [(e.noise_multiplier, e.sample_rate, e.steps) for e in led.events if e.client == client]


def test_train_over_sites_charges_each_sites_ledger_across_runs_and_a_seeded_resume_charges_it_once(sites, tmp_path):
    from fedhype.federated.engine import train_sites

    cfg = TrainConfig(**CFG)
    train_sites(sites, cfg, tmp_path / "run1", stop_after=1)  # interrupted after round 1
    train_sites(sites, cfg, tmp_path / "run1", resume=True)   # a seeded resume: replays, charges nothing twice
    train_sites(sites, TrainConfig(**{**CFG, "rounds": 1}), tmp_path / "run2")
    for i, s in enumerate(sites):
        led = load_site_ledger(s.folder)
        runs = by_run(led, seeded_infinite=False)  # the accountant's figures, as if the seeded noise were secret
        assert len(runs) == 2 and all(k.startswith(("run1-", "run2-")) for k in runs)
        hist = [_client_eps(tmp_path / r, str(i), cfg.delta) for r in ("run1", "run2")]
        assert [len(h) for h in hist] == [4, 3]  # the centre, the statistics and 2 rounds; … and 1 round
        assert [(e.noise_multiplier, e.sample_rate, e.steps) for e in led.events] == hist[0] + hist[1]
        assert list(runs.values()) == pytest.approx([PrivacyLedger.load(tmp_path / r / "ledger.json").epsilon(str(i))
                                                     for r in ("run1", "run2")], rel=1e-9)
        assert composed(led.events, led.delta, seeded_infinite=False) == pytest.approx(
            epsilon(hist[0] + hist[1], cfg.delta), rel=1e-9)
        # both runs were seeded (the same seed: one noise draw, and the seed is in their config.json): no guarantee
        assert all(e.seeded for e in led.events) and seeded_runs(led) == list(runs)
        assert spent(led) == float("inf") and list(by_run(led).values()) == [float("inf")] * 2
        # a site folder written before site ledgers is marked at its first run: its ledger missing is now an error
        assert json.loads((s.folder / "site.json").read_text())["site_ledger"] == "site-ledger.json"
    from fedhype.data.sites import Site

    ledger_path(sites[0].folder).unlink()
    with pytest.raises(ArtifactError, match="is missing"):
        train_sites([Site.load(s.folder) for s in sites], cfg, tmp_path / "run3")


def test_unseeded_runs_compose_with_the_accountant_over_the_sites_records(sites, tmp_path):
    from fedhype.federated.engine import train_sites

    cfg = TrainConfig(**{**CFG, "seed": None})
    train_sites(sites, cfg, tmp_path / "run1")
    train_sites(sites, TrainConfig(**{**CFG, "seed": None, "rounds": 1}), tmp_path / "run2")
    for i, s in enumerate(sites):
        led = load_site_ledger(s.folder)
        hist = [_client_eps(tmp_path / r, str(i), cfg.delta) for r in ("run1", "run2")]
        assert not any(e.seeded for e in led.events) and seeded_runs(led) == []
        assert list(by_run(led).values()) == pytest.approx([PrivacyLedger.load(tmp_path / r / "ledger.json").epsilon(str(i))
                                                            for r in ("run1", "run2")], rel=1e-9)
        assert spent(led) == pytest.approx(epsilon(hist[0] + hist[1], cfg.delta), rel=1e-9)
        assert max(by_run(led).values()) < spent(led) < float("inf")
        rep = report(led, s.folder, s.name)
        assert rep["seeded_runs"] == [] and "seeded_note" not in rep and not any(r["seeded"] for r in rep["runs"])


def test_a_seeded_run_is_infinite_for_the_site_and_refused_under_a_cap_before_anything(sites, tmp_path):
    # a seeded run's noise comes from a seed its config.json (and any release) carries: whoever holds the release
    # regenerates it, and two runs with one seed share one draw (a probe solved two releases for the record count)
    from fedhype.federated.engine import train_sites

    set_site_ledger(sites[0].folder, "site-0", max_epsilon=50.0, delta=1e-4)  # a generous cap
    before = ledger_path(sites[0].folder).read_text()
    with pytest.raises(BudgetExceededError, match="site 'site-0': a seeded run .* gives its records no guarantee") as err:
        train_sites(sites, TrainConfig(**CFG), tmp_path / "seeded")
    assert err.value.epsilon == float("inf") and err.value.limit == 50.0 and "--seed" in str(err.value)
    assert ledger_path(sites[0].folder).read_text() == before and load_site_ledger(sites[1].folder) is None
    assert not (tmp_path / "seeded" / "config.json").exists() and not (tmp_path / "seeded" / "ckpt").exists()
    # the write-ahead charge refuses seeded events too (a SuperNode's, a run resumed with a seed)
    seeded = [dataclasses.replace(e, seeded=True, client="0") for e in _events("0", 1, sigma=50.0, steps=1)]
    with pytest.raises(BudgetExceededError, match="a seeded run"):
        SiteCharger(sites[0].folder, "site-0", "run-x", 1e-4).charge(seeded)
    assert ledger_path(sites[0].folder).read_text() == before
    # without a cap a seeded run is recorded as it ran, and the site's ε is ∞: no finite cap can hold afterwards
    set_site_ledger(sites[0].folder, "site-0", max_epsilon=None)
    train_sites(sites, TrainConfig(**{**CFG, "rounds": 1}), tmp_path / "seeded")
    led = load_site_ledger(sites[0].folder)
    assert spent(led) == float("inf") and len(seeded_runs(led)) == 1
    assert eps_text(spent(led)) == "∞" and eps_text(0.5) == "0.5000"  # messages said "ε = inf" (a probe)
    rep = report(led, sites[0].folder, "site-0")
    assert rep["epsilon"] is None and rep["epsilon_infinite"] and rep["seeded_runs"] == seeded_runs(led)
    assert rep["runs"][0]["seeded"] and rep["runs"][0]["epsilon_infinite"] and "regenerate" in rep["seeded_note"]
    with pytest.raises(ValidationError, match="seeded run.* no finite cap can hold"):
        set_site_ledger(sites[0].folder, "site-0", max_epsilon=100.0)
    # a cap written before that rule, over a seeded run: a plan is refused for the seeded run's reason, not told to
    # lower its ε or to raise a cap (a review: "spent by its other runs: inf … Lower the run's --epsilon")
    capped = PrivacyLedger(led.delta, {**led.meta, "max_epsilon": 100.0})
    for e in led.events:
        capped.record(e)
    capped.save(ledger_path(sites[0].folder))
    from fedhype.privacy.site_ledger import refuse_plan

    with pytest.raises(BudgetExceededError) as err:
        refuse_plan(SiteCharger(sites[0].folder, "site-0", "run-new", led.delta), [(5.0, 0.1, 10)])
    said = str(err.value)
    assert "seeded run(s)" in said and "--no-cap" in said and ": inf" not in said and "= inf" not in said
    assert "Lower the run's --epsilon" not in said


def test_raising_a_capped_sites_delta_needs_the_cap_restated(tmp_path):
    ch = SiteCharger(tmp_path, "clinic_c", "run-1", DELTA)
    ch.charge(_events("0", 3))
    set_site_ledger(tmp_path, "clinic_c", max_epsilon=10.0)
    at_small, at_large = spent(load_site_ledger(tmp_path)), composed(load_site_ledger(tmp_path).events, 1e-3)
    assert at_large < at_small  # the same charges cost less at a larger δ: the same cap would admit more runs
    before = ledger_path(tmp_path).read_text()
    with pytest.raises(ValidationError, match=r"raises site 'clinic_c'.*from 1e-05.*--max-epsilon E"):
        set_site_ledger(tmp_path, "clinic_c", delta=1e-3)
    assert ledger_path(tmp_path).read_text() == before
    led = set_site_ledger(tmp_path, "clinic_c", delta=1e-3, max_epsilon=8.0)  # the policy restated at the new δ
    assert led.delta == 1e-3 and cap_of(led) == 8.0 and spent(led) == pytest.approx(at_large, rel=1e-9)
    assert set_site_ledger(tmp_path, "clinic_c", delta=1e-4).delta == 1e-4  # a smaller δ only makes ε larger
    set_site_ledger(tmp_path, "clinic_c", max_epsilon=None)
    assert set_site_ledger(tmp_path, "clinic_c", delta=1e-3).delta == 1e-3  # no cap: nothing to loosen


def test_a_read_only_site_ledger_is_refused_before_the_run_folder_is_written(sites, tmp_path):
    import os

    from fedhype.federated.engine import train_sites

    cfg = TrainConfig(**{**CFG, "seed": None, "rounds": 1})
    set_site_ledger(sites[1].folder, "site-1", max_epsilon=None, delta=1e-4)
    os.chmod(ledger_path(sites[1].folder), 0o444)
    try:
        with pytest.raises(ArtifactError, match="site 'site-1': its ledger across runs, .* is read-only"):
            train_sites(sites, cfg, tmp_path / "run")
        assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
        assert load_site_ledger(sites[0].folder) is None
    finally:
        os.chmod(ledger_path(sites[1].folder), 0o644)
    train_sites(sites, cfg, tmp_path / "run")  # the same command, once writable: runs (not "already holds a run")
    assert len(load_site_ledger(sites[1].folder)) == 3


def test_a_run_whose_plan_passes_a_sites_cap_is_refused_before_anything(sites, tmp_path):
    from fedhype.federated.engine import train_sites

    cfg = TrainConfig(**{**CFG, "seed": None})  # a seeded run is refused on any capped site (ε = ∞ for it)
    train_sites(sites, cfg, tmp_path / "run1")
    first = spent(load_site_ledger(sites[1].folder))
    set_site_ledger(sites[1].folder, "site-1", max_epsilon=first * 1.2)
    before = [ledger_path(s.folder).read_text() for s in sites]
    with pytest.raises(BudgetExceededError, match="site 'site-1': this run's plan .* past the site's cap"):
        train_sites(sites, cfg, tmp_path / "run2")  # the same plan again: about √2 × the first ε
    assert [ledger_path(s.folder).read_text() for s in sites] == before  # no site was charged
    assert not (tmp_path / "run2" / "ledger.json").exists() and not (tmp_path / "run2" / "config.json").exists()
    small = TrainConfig(**{**CFG, "seed": None, "rounds": 1, "noise_multiplier": 40.0})
    train_sites(sites, small, tmp_path / "run2")  # within the cap, in the same folder: runs and is charged
    assert first < spent(load_site_ledger(sites[1].folder)) <= first * 1.2


def test_a_seeded_event_the_site_already_holds_is_not_charged_again_an_unseeded_one_is(tmp_path):
    # a stop between the site's write and the run's: the resume charges the run's ledger again, the site once
    seeded = [dataclasses.replace(e, seeded=True) for e in _events("0", 1)]
    ch = SiteCharger(tmp_path, "hospital_a", "run-1", DELTA)
    ch.charge(seeded)
    ch.charge(seeded)
    assert len(load_site_ledger(tmp_path)) == 1
    SiteCharger(tmp_path, "hospital_a", "run-2", DELTA).charge(seeded)  # another run's round 0: its own release
    ch.charge(_events("0", 1))  # unseeded: fresh noise, a new release, charged
    ch.charge(_events("0", 1))
    assert len(load_site_ledger(tmp_path)) == 4


def test_grouping_equal_mechanisms_leaves_the_composed_epsilon_unchanged(tmp_path):
    # the same mechanisms interleaved across runs: pooling equal (σ, q) first is exact (composition is order-free)
    evs = _events("s", 3, sigma=1.0) + _events("s", 2, sigma=0.8) + _events("s", 3, sigma=1.0)
    led = PrivacyLedger(DELTA)
    for e in evs:
        led.record(e)
    assert composed(evs, DELTA) == pytest.approx(led.epsilon("s"), rel=1e-6)
    assert composed(evs + [LedgerEvent("s", -1, "no-dp-training", 0.0, 1.0, 1, 0.0)], DELTA) == float("inf")


def test_a_missing_ledger_that_the_site_started_is_an_error_not_a_fresh_start(tmp_path):
    set_site_ledger(tmp_path, "hospital_a", max_epsilon=5.0, delta=DELTA)
    ledger_path(tmp_path).unlink()
    with pytest.raises(ArtifactError, match="is missing.*restore it from a backup"):
        SiteCharger(tmp_path, "hospital_a", "run-1", DELTA, expected=True).charge(_events("0", 1))
    assert not ledger_path(tmp_path).exists()


def test_a_run_without_dp_is_recorded_as_infinite_and_refused_on_a_capped_site(sites, tmp_path):
    from fedhype.federated.engine import train_sites

    nodp = TrainConfig(**{**CFG, "no_dp": True, "noise_multiplier": None, "rounds": 1})
    set_site_ledger(sites[0].folder, "site-0", max_epsilon=5.0, delta=1e-4)
    with pytest.raises(BudgetExceededError, match="site 'site-0': a run without DP gives its records no guarantee"):
        train_sites(sites, nodp, tmp_path / "nodp")
    assert not (tmp_path / "nodp" / "config.json").exists() and load_site_ledger(sites[1].folder) is None
    set_site_ledger(sites[0].folder, "site-0", max_epsilon=None)
    train_sites(sites, nodp, tmp_path / "nodp")
    for s in sites:
        led = load_site_ledger(s.folder)
        assert [e.mechanism for e in led.events] == ["no-dp-training"] and spent(led) == float("inf")
    with pytest.raises(ValidationError, match="without DP used its records .* no finite cap can hold"):
        set_site_ledger(sites[0].folder, "site-0", max_epsilon=100.0)
    train_sites(sites, nodp, tmp_path / "nodp", resume=True)  # the same run: recorded once
    assert len(by_run(load_site_ledger(sites[0].folder))) == 1


def test_two_sites_holding_the_same_records_are_refused(sites, tmp_path):
    from fedhype.data.sites import Site, make_site
    from fedhype.federated.engine import train_sites

    make_site(sites[0].store(), sites[0].store_path, "site-0-again").save(tmp_path / "again")
    with pytest.raises(ValidationError, match="'site-0' and 'site-0-again' hold the same records"):
        train_sites([sites[0], Site.load(tmp_path / "again")], TrainConfig(**CFG), tmp_path / "run")


def test_a_stop_between_the_sites_charge_and_the_runs_first_save_is_charged_once_on_resume(sites, tmp_path,
                                                                                           monkeypatch):
    from fedhype.federated.engine import train_sites

    for s in sites:  # no cap: a seeded run is refused under one (its ε is ∞ for the site)
        set_site_ledger(s.folder, s.name, max_epsilon=None, delta=1e-4)
    real_save = PrivacyLedger.save

    def stop(self, path):  # a SIGKILL right after the sites' first charge: the run's ledger never reached disk
        if str(path).endswith("run1/ledger.json"):
            raise KeyboardInterrupt
        return real_save(self, path)

    monkeypatch.setattr(PrivacyLedger, "save", stop)
    with pytest.raises(KeyboardInterrupt):
        train_sites(sites, TrainConfig(**CFG), tmp_path / "run1")
    monkeypatch.setattr(PrivacyLedger, "save", real_save)
    held = [len(load_site_ledger(s.folder)) for s in sites]
    # the release's centre step, sites only (each step is charged just before it runs: the statistics step was not)
    assert held == [1, 1] and not (tmp_path / "run1" / "ledger.json").exists()
    train_sites(sites, TrainConfig(**CFG), tmp_path / "run1", resume=True)  # seeded: the same noise, charged once
    for i, s in enumerate(sites):
        led = load_site_ledger(s.folder)
        run = [(e.noise_multiplier, e.sample_rate, e.steps) for e in PrivacyLedger.load(tmp_path / "run1" / "ledger.json").events
               if e.client == str(i)]
        assert [(e.noise_multiplier, e.sample_rate, e.steps) for e in led.events] == run and len(by_run(led)) == 1
        assert len(run) == 4 and all(e.seeded for e in led.events) and spent(led) == float("inf")
        from fedhype.eval.audit_sites import compare_site

        row = compare_site(tmp_path / "run1", s.folder)  # a probe: exit 4 with no reason for an honest seeded run
        assert row["ok"] and "seeded" in row["note"] and row["infinite"]
        assert row["recomputed"] == pytest.approx(row["claimed"], rel=1e-9)
        # the table shows the note below it, on one line (in a column it wrapped a word per line: a probe)
        from typer.testing import CliRunner

        from fedhype.cli.main import app

        shown = CliRunner().invoke(app, ["audit", "--run", str(tmp_path / "run1"), "--site", str(s.folder)])
        assert shown.exit_code == 0, shown.output
        assert any(line.startswith(f"[1] {s.name}: a seeded run: the site counts it as ε = ∞") and line.endswith(
            "as the run reports it") for line in shown.stdout.splitlines()), shown.stdout


def _stopped_at_save(sites, cfg, run, monkeypatch, stop_at: int = 1) -> None:
    """``train_sites`` into ``run``, stopped (as by a SIGKILL) at the ``stop_at``-th save of the run's ledger: that
    save never reaches disk, the sites' charge before it did."""
    from fedhype.federated.engine import train_sites

    real_save, calls = PrivacyLedger.save, {"n": 0}

    def stop(self, path):
        if str(path) == str(run / "ledger.json"):
            calls["n"] += 1
            if calls["n"] == stop_at:
                raise KeyboardInterrupt
        return real_save(self, path)

    monkeypatch.setattr(PrivacyLedger, "save", stop)
    with pytest.raises(KeyboardInterrupt):
        train_sites(sites, cfg, run)
    monkeypatch.setattr(PrivacyLedger, "save", real_save)


@pytest.mark.parametrize("stop_at", [1, 2])  # the first and the second save of the run's ledger
def test_an_unseeded_stop_between_the_sites_charge_and_the_runs_save_is_charged_once_on_resume(sites, tmp_path,
                                                                                              monkeypatch, stop_at):
    """A probe (SIGTERM / kill -9 right after ``train --site`` charged a site): the run's ledger never recorded the
    charge, its resume made it again, and every ``audit --run R --site DIR`` of the honest run failed after (site 2.875
    against run 1.955). The site's charge whose mechanism never ran is reused by the resume: both ledgers hold each
    charge once, and the audit agrees."""
    from fedhype.eval.audit_sites import compare_site
    from fedhype.federated.engine import train_sites

    cfg = TrainConfig(**{**CFG, "seed": None})
    _stopped_at_save(sites, cfg, tmp_path / "run1", monkeypatch, stop_at)
    before = [len(load_site_ledger(s.folder)) for s in sites]
    if stop_at == 1:  # nothing ran and the run claims nothing: the comparison says so instead of failing
        row = compare_site(tmp_path / "run1", sites[0].folder)
        assert row["ok"] and row["claimed"] is None and "takes it over" in row["note"], row
    train_sites(sites, cfg, tmp_path / "run1", resume=True)
    run = PrivacyLedger.load(tmp_path / "run1" / "ledger.json")
    for i, s in enumerate(sites):
        led = load_site_ledger(s.folder)
        mine = sorted((e.round, e.mechanism, e.noise_multiplier, e.steps) for e in run.events if e.client == str(i))
        assert sorted((e.round, e.mechanism, e.noise_multiplier, e.steps) for e in led.events) == mine
        assert len(led) == len(mine) < before[i] + len(mine)  # the sites' orphan charge was not made again
        row = compare_site(tmp_path / "run1", s.folder)
        assert row["ok"] and row["claimed"] == pytest.approx(row["recomputed"], rel=1e-9), row


def test_a_run_that_charged_a_site_more_than_it_recorded_is_ok_with_a_note_saying_why(sites, tmp_path):
    """A helper's Flower run: a SuperNode killed before it charged the server's request left the run's write-ahead
    charge without its site-ledger twin; `audit --run R --site S` said ok (the run reports no less) with no word."""
    import dataclasses

    from fedhype.eval.audit_sites import compare_site
    from fedhype.federated.engine import train_sites
    from fedhype.privacy.ledger import charge

    cfg = TrainConfig(**{**CFG, "seed": None})
    train_sites(sites, cfg, tmp_path / "run1")
    row = compare_site(tmp_path / "run1", sites[0].folder)
    assert row["ok"] and "note" not in row  # an honest run: the two agree, nothing to say
    run = PrivacyLedger.load(tmp_path / "run1" / "ledger.json")
    last = [e for e in run.events if e.client == "0" and e.mechanism == "dp-sgd"][-1]
    charge(run, [dataclasses.replace(last, round=last.round + 1)], tmp_path / "run1" / "ledger.json")  # the server's
    row = compare_site(tmp_path / "run1", sites[0].folder)  # write-ahead charge of a round the node never ran
    assert row["ok"] and row["claimed"] > row["recomputed"] and "write-ahead" in row["note"], row


def test_a_copy_of_a_run_folder_resumed_beside_the_original_is_charged_at_the_sites(sites, tmp_path):
    """A helper: an interrupted run folder copied (a backup), then the original and the copy both resumed: the copy's
    rounds ran on the sites' records, yet each site's ledger held one run's charges (every event the original charged
    under the shared run key was taken for the copy's own unfinished charge), and `audit --site` said ok. Now only
    a charge made by the folder's own last charge (its token) is reused: the copy's rounds are charged, a cap refuses
    them, and the audit of the copy names what the sites hold beyond its ledger."""
    import shutil

    from fedhype.eval.audit_sites import compare_site
    from fedhype.federated.engine import train_sites
    from fedhype.privacy.site_ledger import charge_of, run_of

    cfg = TrainConfig(**{**CFG, "seed": None, "rounds": 3})
    train_sites(sites, cfg, tmp_path / "run", stop_after=1)
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    train_sites(sites, cfg, tmp_path / "run", resume=True)
    one = [len(load_site_ledger(s.folder)) for s in sites]
    train_sites(sites, cfg, tmp_path / "copy", resume=True)
    run = PrivacyLedger.load(tmp_path / "run" / "ledger.json")
    for i, s in enumerate(sites):
        led = load_site_ledger(s.folder)
        rounds = [e for e in run.events if e.client == str(i) and e.round >= 1]  # what the resumes ran: rounds 2, 3
        assert len(rounds) == 2 and len(led) == one[i] + len(rounds), (len(led), one[i])
        assert len({run_of(e) for e in led.events}) == 1 and all(charge_of(e) for e in led.events)
        assert composed(led.events, led.delta) > run.epsilon(str(i)) * 1.01  # the site paid for both copies' rounds
        row = compare_site(tmp_path / "run", s.folder)
        assert not row["ok"] and "another copy of this run's folder" in row["reason"], row
    # under a cap that one run fits, the copy's rounds are refused before they run
    for s in sites:
        ledger_path(s.folder).unlink()
        set_site_ledger(s.folder, s.name, delta=DELTA)
    shutil.rmtree(tmp_path / "run"), shutil.rmtree(tmp_path / "copy")
    train_sites(sites, cfg, tmp_path / "run", stop_after=1)
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    train_sites(sites, cfg, tmp_path / "run", resume=True)
    cap = max(spent(load_site_ledger(s.folder)) for s in sites) * 1.001
    for s in sites:
        set_site_ledger(s.folder, s.name, max_epsilon=cap)
    held = [len(load_site_ledger(s.folder)) for s in sites]
    with pytest.raises(BudgetExceededError, match="this run's plan .* past the site's cap"):  # before its first step
        train_sites(sites, cfg, tmp_path / "copy", resume=True)
    assert [len(load_site_ledger(s.folder)) for s in sites] == held  # nothing charged
    # while the original's own resume is priced with what it charged as its own (a finished run: nothing left)
    train_sites(sites, cfg, tmp_path / "run", resume=True)


@pytest.mark.parametrize("first", ["run1", "copy"])
def test_two_copies_of_a_folder_made_at_a_stop_between_the_two_writes_take_its_unfinished_charge_over_once(
        sites, tmp_path, monkeypatch, first):
    """Stop 65's hole: a stop right after the sites' charge (the run's ledger never recorded it), then the folder
    copied: both copies held that charge's token, and both resumes took the one charge over as their own unfinished
    one — one step charged, two run. The first resume now records at the site that it took the charge over
    (``site-claims.json``, under the site's lock); the second charges its step afresh, and the audit of either copy
    names the other's charges."""
    import shutil

    from fedhype.eval.audit_sites import compare_site
    from fedhype.federated.engine import train_sites
    from fedhype.privacy.site_ledger import CLAIMS_FILE

    cfg = TrainConfig(**{**CFG, "seed": None})
    _stopped_at_save(sites, cfg, tmp_path / "run1", monkeypatch)  # the sites hold the release's charge alone
    shutil.copytree(tmp_path / "run1", tmp_path / "copy")
    orphan = [len(load_site_ledger(s.folder)) for s in sites]
    second = "copy" if first == "run1" else "run1"
    train_sites(sites, cfg, tmp_path / first, resume=True)
    one = [len(load_site_ledger(s.folder)) for s in sites]
    run = PrivacyLedger.load(tmp_path / first / "ledger.json")
    for i, s in enumerate(sites):  # the first resume took the orphan over: its run's charges, each once
        assert one[i] == len([e for e in run.events if e.client == str(i)]) > orphan[i]
        assert len(json.loads((s.folder / CLAIMS_FILE).read_text())["taken"]) == 1
        assert compare_site(tmp_path / first, s.folder)["ok"]
    train_sites(sites, cfg, tmp_path / second, resume=True)
    for i, s in enumerate(sites):  # the second charged its whole run, the release included
        led = load_site_ledger(s.folder)
        assert len(led) == 2 * one[i], (len(led), one[i])
        for folder in (first, second):
            row = compare_site(tmp_path / folder, s.folder)
            assert not row["ok"] and "another copy of this run's folder" in row["reason"], row


def test_an_unreadable_claims_file_reuses_no_charge(tmp_path):
    """Where ``site-claims.json`` cannot be read, no unfinished charge is taken over (at worst a step is charged
    twice); a charge the folder's token names is reused while the file reads."""
    tokens = tmp_path / "run" / "site-charges.json"
    ch = SiteCharger(tmp_path / "site", "s", "run-1", DELTA, tokens=tokens)
    (tmp_path / "site").mkdir()
    ch.charge(_events("0", 1))  # charged at the site; the run's ledger never recorded it (recorded=[] below)
    assert len(ch._new(ch._open(), _events("0", 1), recorded=[])) == 0  # its own unfinished charge: reused
    (tmp_path / "site" / "site-claims.json").write_text("{not json")
    assert len(ch._new(ch._open(), _events("0", 1), recorded=[])) == 1  # unreadable: charged again
    (tmp_path / "site" / "site-claims.json").unlink()
    ch.charge(_events("0", 1), recorded=[])  # the resume takes it over and says so
    assert len(load_site_ledger(tmp_path / "site")) == 1
    again = SiteCharger(tmp_path / "site", "s", "run-1", DELTA, tokens=tokens)  # a copy with the same token
    again.charge(_events("0", 1), recorded=[])
    assert len(load_site_ledger(tmp_path / "site")) == 2


def test_train_sites_takes_site_folders_and_names_what_it_cannot_take(sites, tmp_path):
    """A helper's ``train_sites(["/data/site-a"], …)``, as the README words it (site folders), failed with
    "'str' object has no attribute 'store'"."""
    from fedhype.federated.engine import train_sites

    res = train_sites([str(s.folder) for s in sites], TrainConfig(**{**CFG, "rounds": 1}), tmp_path / "run")
    assert res["complete"] and len(PrivacyLedger.load(tmp_path / "run" / "ledger.json").clients()) == 2
    with pytest.raises(ValidationError, match="sites is one path"):
        train_sites(str(sites[0].folder), TrainConfig(**CFG), tmp_path / "run2")
    with pytest.raises(ValidationError, match=r"got \['int'\]"):
        train_sites([3], TrainConfig(**CFG), tmp_path / "run3")


def test_a_site_that_recorded_nothing_of_the_run_gets_a_row_not_a_usage_error(sites, tmp_path):
    """A helper's Flower node killed before its first charge: `audit --run R --site S` stopped with a usage error
    (exit 2) where the site simply spent nothing on the run. It is a row now: the site's ε 0, the run's write-ahead
    figure the conservative one, a note naming `budget --site` (a release naming another run's key reads the same)."""
    from fedhype.eval.audit_sites import compare_site
    from fedhype.federated.engine import train_sites
    from fedhype.privacy.site_ledger import load_site_ledger, run_of

    train_sites(sites, TrainConfig(**{**CFG, "seed": None}), tmp_path / "run1")
    key = compare_site(tmp_path / "run1", sites[0].folder)["run_key"]
    own = load_site_ledger(sites[0].folder, site=sites[0].name)
    kept = PrivacyLedger(own.delta, own.meta)  # the site's ledger as if its node never ran this run
    for e in own.events:
        if run_of(e) != key:
            kept.record(e)
    kept.save(sites[0].folder / "site-ledger.json")
    row = compare_site(tmp_path / "run1", sites[0].folder)
    assert row["ok"] and row["events"] == 0 and row["recomputed"] == 0.0 and row["claimed"] > 0, row
    assert "holds no event of run" in row["note"] and "fedhype budget --site" in row["note"]
