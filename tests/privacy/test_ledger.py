"""Privacy ledger: ε recomputed from events, merging, hash-chained persistence, budget checks."""

from __future__ import annotations

import json

import pytest

from fedhype.errors import ArtifactError, ValidationError
from fedhype.privacy.accountant import epsilon
from fedhype.privacy.ledger import LedgerEvent, PrivacyLedger, audit_consistency

Q_MNIST = 256 / 60000


def _event(client="0", rnd=0, sigma=1.1, q=0.02, steps=50, mechanism="dp-sgd", **kw):
    return LedgerEvent(client=client, round=rnd, mechanism=mechanism, noise_multiplier=sigma,
                       sample_rate=q, steps=steps, clip_norm=1.5, **kw)


def _two_client_ledger(rounds=5):
    ledger = PrivacyLedger(delta=1e-5, meta={"run": "test"})
    for r in range(rounds):
        ledger.record(_event("0", r, q=0.02, steps=50))
        ledger.record(_event("1", r, q=0.05, steps=20))
    return ledger


def test_ledger_epsilon_is_the_accountant_on_merged_events():
    # The DP-SGD MNIST run (σ 1.1, q 256/60000, 10,000 steps) recorded as 10 rounds of 1,000 steps.
    ledger = PrivacyLedger(delta=1e-5)
    for r in range(10):
        ledger.record(_event("mnist", r, sigma=1.1, q=Q_MNIST, steps=1000))
    assert ledger.history("mnist") == [(1.1, Q_MNIST, 10_000)]
    assert ledger.epsilon("mnist") == epsilon([(1.1, Q_MNIST, 10_000)], 1e-5) == pytest.approx(1.99, rel=0.01)
    assert ledger.epsilon("mnist", "rdp") == pytest.approx(2.16, rel=0.01)


def test_history_merges_consecutive_equal_events_per_client():
    ledger = PrivacyLedger(delta=1e-5)
    ledger.record(_event("a", 0, sigma=1.0, steps=10))
    ledger.record(_event("b", 0, sigma=1.0, steps=7))
    ledger.record(_event("a", 1, sigma=1.0, steps=10))
    ledger.record(_event("a", 2, sigma=2.0, steps=5))
    ledger.record(_event("a", -1, sigma=1.0, steps=3, mechanism="canary-audit", note="audit"))
    assert ledger.history("a") == [(1.0, 0.02, 20), (2.0, 0.02, 5), (1.0, 0.02, 3)]
    assert ledger.history("b") == [(1.0, 0.02, 7)]
    assert ledger.history("nobody") == [] and ledger.epsilon("nobody") == 0.0
    assert ledger.clients() == ["a", "b"]
    assert ledger.epsilon("a") == epsilon([(1.0, 0.02, 23), (2.0, 0.02, 5)], 1e-5)


def test_worst_report_and_epsilons():
    ledger = _two_client_ledger()
    eps = ledger.epsilons()
    assert set(eps) == {"0", "1"} and eps["1"] > eps["0"] > 0
    assert ledger.worst() == ("1", eps["1"])
    rep = ledger.report()
    assert rep["worst_client"] == "1" and rep["worst_epsilon"] == eps["1"] and rep["delta"] == 1e-5
    assert rep["clients"]["0"]["steps"] == 250 and rep["clients"]["1"]["events"] == 5
    assert rep["clients"]["1"]["epsilon_rdp"] > rep["clients"]["1"]["epsilon_prv"] == eps["1"]
    assert PrivacyLedger(1e-5).worst() == (None, 0.0)


def test_would_exceed_predicts_before_spending():
    ledger = _two_client_ledger(rounds=3)
    now = ledger.epsilons()
    planned = [_event("0", 3, q=0.02, steps=50), _event("1", 3, q=0.05, steps=20)]
    after = {c: epsilon(ledger.history(c) + [(1.1, q, t)], 1e-5) for c, q, t in (("0", 0.02, 50), ("1", 0.05, 20))}
    limit = (after["0"] + after["1"]) / 2  # between the two clients' next ε
    assert after["0"] < limit < after["1"]
    assert ledger.would_exceed(planned, limit) == {"1": after["1"]}
    assert ledger.would_exceed(planned, 100.0) == {}
    assert ledger.epsilons() == now and len(ledger) == 6  # nothing recorded
    with pytest.raises(ValidationError, match="max_epsilon"):
        ledger.would_exceed(planned, 0)


def test_event_validation_names_the_field():
    with pytest.raises(ValidationError, match="LedgerEvent.steps"):
        _event(steps=-1)
    with pytest.raises(ValidationError, match="LedgerEvent.sample_rate"):
        _event(q=1.5)
    with pytest.raises(ValidationError, match="LedgerEvent.round"):
        _event(rnd=-2)
    with pytest.raises(ValidationError, match="unknown event field"):
        LedgerEvent.from_dict({**_event().to_dict(), "epsilon": 0.1})
    with pytest.raises(ValidationError, match="delta"):
        PrivacyLedger(delta=1.0)


def test_save_load_round_trip(tmp_path):
    ledger = _two_client_ledger()
    path = ledger.save(tmp_path / "ledger.json")
    loaded = PrivacyLedger.load(path)
    assert loaded.events == ledger.events and loaded.delta == 1e-5 and loaded.meta == {"run": "test"}
    assert loaded.epsilons() == ledger.epsilons()
    assert loaded.state_dict() == ledger.state_dict()
    assert json.loads(path.read_text())["format"] == "fedhype-ledger/1"

    fresh = PrivacyLedger(delta=1e-5)
    fresh.load_state_dict(ledger.state_dict())
    assert fresh.events == ledger.events and fresh.meta == {"run": "test"}
    fresh.record(_event("0", 5))
    assert PrivacyLedger.from_state_dict(fresh.state_dict()).epsilon("0") == fresh.epsilon("0")
    with pytest.raises(ValidationError, match="would rewrite"):
        fresh.load_state_dict(ledger.state_dict())
    with pytest.raises(ArtifactError, match="delta=1e-05, this run uses delta=0.001"):
        PrivacyLedger(delta=1e-3).load_state_dict(ledger.state_dict())


def test_appending_never_rewrites_earlier_events(tmp_path):
    path = _two_client_ledger(rounds=2).save(tmp_path / "ledger.json")
    before = path.read_text().splitlines()
    ledger = PrivacyLedger.load(path)
    ledger.record(_event("0", 2, sigma=1.3))
    ledger.save(path)
    after = path.read_text().splitlines()
    start = before.index('  "events": [')
    old_events = [line.rstrip(",") for line in before[start + 1:start + 5]]
    assert [line.rstrip(",") for line in after[start + 1:start + 5]] == old_events
    old_chain = before[before.index('  "chain": [') + 1:][:4]
    new_chain = after[after.index('  "chain": [') + 1:][:4]
    assert [h.rstrip(",") for h in new_chain] == [h.rstrip(",") for h in old_chain]
    assert len(PrivacyLedger.load(path)) == 5


def test_edited_sigma_is_detected_at_its_event(tmp_path):
    ledger = _two_client_ledger()  # 10 events
    path = ledger.save(tmp_path / "ledger.json")
    data = json.loads(path.read_text())
    data["events"][7]["noise_multiplier"] = 5.0  # pretend more noise was added
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="ledger tampered: event 7 hash mismatch"):
        PrivacyLedger.load(path)


def test_edited_delta_dropped_event_and_truncation_are_detected(tmp_path):
    path = _two_client_ledger().save(tmp_path / "ledger.json")
    text = path.read_text()
    data = json.loads(text)

    edited = dict(data, delta=1e-3)
    (tmp_path / "delta.json").write_text(json.dumps(edited))
    with pytest.raises(ArtifactError, match="event 0 hash mismatch"):
        PrivacyLedger.load(tmp_path / "delta.json")

    dropped = dict(data, events=data["events"][:-1], chain=data["chain"][:-1])  # links still valid
    (tmp_path / "dropped.json").write_text(json.dumps(dropped))
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        PrivacyLedger.load(tmp_path / "dropped.json")

    unpaired = dict(data, events=data["events"][:-1])
    (tmp_path / "unpaired.json").write_text(json.dumps(unpaired))
    with pytest.raises(ArtifactError, match="chain has 10 hashes for 9 events") as unpaired_err:
        PrivacyLedger.load(tmp_path / "unpaired.json")
    assert "restore it from a backup" in str(unpaired_err.value)  # every failed check, not only bad JSON (a probe)
    with pytest.raises(ArtifactError, match="not found") as missing:
        PrivacyLedger.load(tmp_path / "no-such-ledger.json")
    assert "restore it from a backup" in str(missing.value)

    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(ArtifactError, match="not valid JSON") as cut:
        PrivacyLedger.load(tmp_path / "cut.json")
    # restored, never re-created: that would reset the spend (a probe was told "re-create it")
    assert "restore it from a backup" in str(cut.value) and "re-create it" not in str(cut.value)

    with pytest.raises(ArtifactError, match="missing key 'checksum'"):
        PrivacyLedger.from_state_dict({k: v for k, v in data.items() if k != "checksum"})
    with pytest.raises(ArtifactError, match="format"):
        PrivacyLedger.from_state_dict(dict(data, format="opacus/1"))


def test_audit_consistency_reports_mismatches():
    ledger = _two_client_ledger()
    eps = ledger.epsilons()
    assert audit_consistency(ledger, {"0": eps["0"], "1": eps["1"], "worst": eps["1"]}) == []
    bad = audit_consistency(ledger, {"0": 1.0, "1": eps["1"], "ghost": 0.5})
    assert [m["name"] for m in bad] == ["0", "ghost"]
    assert bad[0]["recomputed"] == eps["0"] and bad[0]["difference"] == pytest.approx(1.0 - eps["0"])
    assert bad[1]["recomputed"] is None and "ghost" in bad[1]["reason"]


def test_epsilons_of_all_clients_equal_each_clients_own_epsilon():
    """``epsilons()`` groups the events in one pass and shares one accountant call between clients with the
    same history; each figure must still be :meth:`epsilon` of that client (Gaussian, mixed-σ and Skellam
    histories, interleaved; clients with equal histories and one that differs only in its last round)."""
    ledger = PrivacyLedger(delta=1e-5)
    for r in range(4):
        for c in ("a", "b", "c"):
            ledger.record(_event(c, r, q=0.02, steps=10))
        ledger.record(_event("d", r, sigma=1.1 if r < 3 else 2.0, q=0.02, steps=10))
    ledger.record(LedgerEvent(client="e", round=0, mechanism="class-stats", noise_multiplier=3.0, sample_rate=1.0,
                              steps=1, clip_norm=1.0, noise="skellam", scale=2.0 ** 10, record_dim=385))
    ledger.record(_event("e", 1, q=0.02, steps=10))
    eps = ledger.epsilons()
    assert list(eps) == ["a", "b", "c", "d", "e"]
    assert eps == {c: ledger.epsilon(c) for c in eps}
    assert eps["a"] == eps["b"] == eps["c"] != eps["d"]
    assert ledger.epsilons("rdp") == {c: ledger.epsilon(c, "rdp") for c in eps}


def test_the_rerun_rule_trusts_the_recorded_attempt_not_a_report_today(tmp_path):
    """A rerun is free only if it replays seeded noise *and* the charged attempt was seeded: a node that
    ran a round with OS-entropy noise and reports "seeded" after a restart releases something new."""
    from fedhype.privacy.ledger import pending_charges

    def ledger_after(first_seeded: bool) -> PrivacyLedger:
        led = PrivacyLedger(delta=1e-5)
        for e in pending_charges(led, [_event("0", 0)], replays=lambda e: first_seeded):
            led.record(e)
        return led

    seeded_first, fresh_first = ledger_after(True), ledger_after(False)
    assert seeded_first.events[0].seeded is True and fresh_first.events[0].seeded is False
    # seeded, then replayed with the same seed: nothing new
    assert pending_charges(seeded_first, [_event("0", 0)], replays=lambda e: True) == []
    # OS-entropy noise first: whatever the rerun reports, it is a new release, charged again
    for now in (True, False):
        again = pending_charges(fresh_first, [_event("0", 0)], replays=lambda e: now)
        assert len(again) == 1 and "charged again" in again[0].note and again[0].seeded is now
    # seeded first, fresh noise now: charged again
    again = pending_charges(seeded_first, [_event("0", 0)], replays=lambda e: False)
    assert len(again) == 1 and "charged again" in again[0].note
    # a charged seeded rerun of an unseeded attempt is then replayed for free by a third, seeded attempt
    for e in pending_charges(fresh_first, [_event("0", 0)], replays=lambda e: True):
        fresh_first.record(e)
    assert pending_charges(fresh_first, [_event("0", 0)], replays=lambda e: True) == []
    assert fresh_first.epsilon("0") > ledger_after(True).epsilon("0")  # two releases charged, not one


def test_seeded_is_written_only_when_true_and_survives_a_round_trip(tmp_path):
    plain = _event("0", 0).to_dict()
    assert "seeded" not in plain  # an unseeded event keeps the form (and hash) of earlier versions
    assert LedgerEvent.from_dict(plain).seeded is False
    led = PrivacyLedger(delta=1e-5)
    led.record(_event("0", 0, seeded=True))
    led.record(_event("0", 1))
    led.save(tmp_path / "l.json")
    raw = json.loads((tmp_path / "l.json").read_text())
    assert [("seeded" in e, e.get("seeded")) for e in raw["events"]] == [(True, True), (False, None)]
    back = PrivacyLedger.load(tmp_path / "l.json")
    assert [e.seeded for e in back.events] == [True, False]
    raw["events"][0]["seeded"] = False  # edited after the fact: the chain says so
    (tmp_path / "l.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError):
        PrivacyLedger.load(tmp_path / "l.json")
    with pytest.raises(ValidationError, match="seeded"):
        _event("0", 0, seeded="yes")


def test_what_was_charged_again_is_named_release_or_rounds():
    """A probe's resume ended at ε 1.416 against 1 and was told "an interrupted round was charged again": it was the
    statistics release (most of ε). :func:`recharged_text` names the release and the rounds (counted from 1)."""
    from fedhype.privacy.ledger import as_rerun, recharged_text

    ledger = PrivacyLedger(delta=1e-4)
    for e in (_event(rnd=-1, mechanism="dp-class-stats", q=1.0, steps=1), _event(rnd=0), _event(rnd=1)):
        ledger.record(e)
    assert recharged_text(ledger) is None
    ledger.record(as_rerun(_event(rnd=-1, mechanism="dp-class-stats", q=1.0, steps=1)))
    assert recharged_text(ledger) == "the statistics release before round 0 (most of ε)"
    ledger.record(as_rerun(_event(rnd=2)))
    ledger.record(as_rerun(_event(rnd=3)))
    assert recharged_text(ledger) == "the statistics release before round 0 (most of ε) and rounds 3, 4 (counted from 1)"
    only = PrivacyLedger(delta=1e-4)  # a run with no DP-SGD event (dp-gaussian, no-dp-sgd): the release is all of ε
    only.record(_event(rnd=-1, mechanism="dp-class-stats", q=1.0, steps=1))
    only.record(as_rerun(_event(rnd=-1, mechanism="dp-class-stats", q=1.0, steps=1)))
    assert recharged_text(only) == "the statistics release before round 0 (all of the ε spent)"
