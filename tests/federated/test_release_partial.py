"""A statistics step that failed for some clients after the others' updates arrived (a Flower SuperNode killed during
it; in process, one client's release raising). A probe saw every node release — and be charged for — its statistics
again on the unseeded resume: the surviving nodes paid ~0.95 ε for nothing. Now the updates that arrived (public DP
outputs) are saved as a partial release-outputs file before the error is re-raised; the resume releases, and is
charged for, the statistics of the missing clients only, merges in client order and goes on as a normal run."""

from collections import Counter

import pytest
import torch

from fedhype.data.partition import make_partition
from fedhype.federated.class_stats import MECHANISM as STATS
from fedhype.federated.client import Client
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.federated.release_outputs import load_release_outputs
from fedhype.federated.rundir import RunDir
from fedhype.io import load_tensors
from fedhype.pipeline.job import release_resume_note
from fedhype.privacy.centring import MECHANISM as CENTRE
from fedhype.privacy.ledger import PrivacyLedger

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}
FAILED = 1  # the client whose release fails on the first attempt


class Lost(Exception):
    """A client lost during the statistics step."""


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="iid", n_clients=3, seed=0)


def _charges(run, mechanism):
    return Counter(e.client for e in PrivacyLedger.load(run / "ledger.json").events if e.mechanism == mechanism)


def _stats_tensors(path):
    """The saved statistics' tensors by client id (the file's own layout: ``stats.<index>.<name>``)."""
    import json

    from fedhype.io import tensor_metadata

    t = load_tensors(path)
    meta = json.loads(tensor_metadata(path)["fedhype_release_outputs"])
    return {m["client"]: {k.split(".", 2)[2]: v for k, v in t.items() if k.startswith(f"stats.{m['index']}.")}
            for m in meta if m["kind"] == "stats"}


def _fail_once(monkeypatch, failed_id):
    real = Client.release_class_stats
    asked, tries = [], Counter()

    def release(self, *a, **k):
        asked.append(self.id)
        tries[self.id] += 1
        if self.id == failed_id and tries[failed_id] == 1:
            raise Lost("client lost during the statistics step")
        return real(self, *a, **k)

    monkeypatch.setattr(Client, "release_class_stats", release)
    return asked


@pytest.mark.parametrize("centred", [True, False], ids=["centred", "uncentred"])
@pytest.mark.parametrize("seed", [None, 0], ids=["unseeded", "seeded"])
def test_a_statistics_step_failing_for_one_client_keeps_the_others_updates(real_store, part, tmp_path, monkeypatch,
                                                                           seed, centred):
    cfg = TrainConfig(method="fedhypevae", rounds=1, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=seed,
                      model=SMALL, centre_share=0.06 if centred else 0.0)
    run = tmp_path / "run"
    ids = [str(c.id) for c in part.clients]
    failed_id = ids[FAILED]
    outputs = run / "ckpt" / "release-outputs.safetensors"
    asked = _fail_once(monkeypatch, failed_id)

    with pytest.raises(Lost):
        train(real_store, part, cfg, run, diagnostics=False, stop_after=0)
    assert asked == ids  # the clients after the failed one were still asked (their release was charged)
    assert RunDir(run).release_stage() == "statistics partly saved"
    note = release_resume_note("statistics partly saved", seed is not None)
    assert "runs again for the missing clients only" in note
    kept = load_release_outputs(outputs, part.clients)
    assert kept is not None and [None if u is None else u.client for u in kept[1]] == [
        None if i == FAILED else c for i, c in enumerate(ids)]
    assert (len(kept[0]) == len(ids)) == centred  # a centred release keeps its centres too
    saved = _stats_tensors(outputs)
    assert sorted(saved) == sorted(c for c in ids if c != failed_id)
    assert _charges(run, STATS) == Counter(ids)  # charged write-ahead, once per client

    asked.clear()
    res = train(real_store, part, cfg, run, resume=True, diagnostics=False, stop_after=0)
    assert asked == [failed_id]  # only the missing client released again
    assert not res["complete"] and RunDir(run).release_stage() == "saved"
    # the statistics step is charged again for the failed client only, and only with fresh noise
    again = Counter(ids) + (Counter() if seed is not None else Counter([failed_id]))
    assert _charges(run, STATS) == again
    if centred:
        assert _charges(run, CENTRE) == Counter(ids)  # the centres were not released or charged again
    whole = _stats_tensors(outputs)
    assert list(whole) == ids  # complete, in client order
    for c, tensors in saved.items():  # the survivors' updates are the ones saved after the failure, byte for byte
        assert tensors.keys() == whole[c].keys()
        for k, v in tensors.items():
            assert torch.equal(v, whole[c][k]) and v.numpy().tobytes() == whole[c][k].numpy().tobytes(), (c, k)
    kept = load_release_outputs(outputs, part.clients)
    assert kept is not None and all(u is not None for u in kept[1])  # a complete file reads as before

    res = train(real_store, part, cfg, run, resume=True, diagnostics=False)
    assert res["complete"] and _charges(run, STATS) == again  # the rest of the run charges no release


def test_a_budget_check_on_the_resume_sees_only_the_missing_clients_events(real_store, part, tmp_path, monkeypatch):
    """``train.max_epsilon`` prices the resume's release with the failed client's statistics step alone."""
    from fedhype.federated import class_stats

    cfg = TrainConfig(method="fedhypevae", rounds=1, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=None,
                      model=SMALL, centre_share=0.06)
    run = tmp_path / "run"
    ids = [str(c.id) for c in part.clients]
    _fail_once(monkeypatch, ids[FAILED])
    with pytest.raises(Lost):
        train(real_store, part, cfg, run, diagnostics=False, stop_after=0)
    seen = []
    real = class_stats.run_class_stats_stage

    def spy(*a, budget_check=None, **k):
        def check(pending):
            seen.append([(e.client, e.mechanism) for e in pending])
            return budget_check(pending) if budget_check is not None else None

        return real(*a, budget_check=check, **k)

    monkeypatch.setattr("fedhype.federated.engine.run_class_stats_stage", spy)
    train(real_store, part, cfg, run, resume=True, diagnostics=False, stop_after=0)
    assert seen == [[(ids[FAILED], STATS)]]


def test_local_cvae_resumes_a_partial_statistics_step(real_store, part, tmp_path, monkeypatch):
    """``local-cvae`` sets each client's model from its own update: a partial file merges into the same models."""
    cfg = TrainConfig(method="local-cvae", rounds=1, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=0,
                      model=SMALL)
    ids = [str(c.id) for c in part.clients]
    ref = tmp_path / "ref"
    train(real_store, part, cfg, ref, diagnostics=False, stop_after=0)  # the same seeded release, uninterrupted
    run = tmp_path / "run"
    _fail_once(monkeypatch, ids[FAILED])
    with pytest.raises(Lost):
        train(real_store, part, cfg, run, diagnostics=False, stop_after=0)
    assert RunDir(run).release_stage() == "statistics partly saved"
    train(real_store, part, cfg, run, resume=True, diagnostics=False, stop_after=0)
    a = load_tensors(ref / "ckpt" / "release-state.safetensors")
    b = load_tensors(run / "ckpt" / "release-state.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # seeded: the same models, per client
    assert _charges(run, STATS) == Counter(ids)
    res = train(real_store, part, cfg, run, resume=True, diagnostics=False)
    assert res["complete"]


def test_a_partial_file_of_other_clients_is_not_reused(tmp_path):
    """The partial file names its clients' ids and number: another federation's is not taken for this one's."""
    from types import SimpleNamespace

    from fedhype.federated.release_outputs import save_release_outputs
    from fedhype.privacy.dp_step import PrivatizedUpdate

    def up(c):
        t = {"class_sums": torch.ones(2, 3), "class_counts": torch.ones(2)}
        return PrivatizedUpdate.from_wire(client=c, tensors=t, like=t, steps=1, noise_multiplier=1.0, clip_norm=1.0,
                                          sample_rate=1.0, private=True)

    path = tmp_path / "outputs.safetensors"
    save_release_outputs(path, [], [up("a"), None, up("c")])
    mine = [SimpleNamespace(id=i) for i in "abc"]
    kept = load_release_outputs(path, mine)
    assert kept is not None and kept[0] == [] and [u and u.client for u in kept[1]] == ["a", None, "c"]
    assert load_release_outputs(path, [SimpleNamespace(id=i) for i in "abcd"]) is None  # four clients, not three
    assert load_release_outputs(path, [SimpleNamespace(id=i) for i in "xbc"]) is None  # another client at index 0
    save_release_outputs(path, [], [up("a"), up("b"), up("c")])  # complete: no partial mark, read as before
    assert [u.client for u in load_release_outputs(path, mine)[1]] == ["a", "b", "c"]


def test_a_partial_centre_step_is_saved_and_read_back_with_its_holes(tmp_path):
    """A centre step that failed for some clients: the centres that arrived, each at its client's index; the file says
    so (the run folder's release stage), another federation's is not reused, and statistics never sit beside a partial
    centre step (they need every centre)."""
    from types import SimpleNamespace

    from fedhype.federated.release_outputs import saved_steps, save_release_outputs
    from fedhype.privacy.dp_step import PrivatizedUpdate

    def centre(c):
        t = {"sum": torch.full((3,), 2.0), "count": torch.ones(1)}
        return PrivatizedUpdate.from_wire(client=c, tensors=t, like=t, steps=1, noise_multiplier=1.0, clip_norm=1.0,
                                          sample_rate=1.0, private=True)

    def stats(c):
        t = {"class_sums": torch.ones(2, 3), "class_counts": torch.ones(2)}
        return PrivatizedUpdate.from_wire(client=c, tensors=t, like=t, steps=1, noise_multiplier=1.0, clip_norm=1.0,
                                          sample_rate=1.0, private=True)

    path = tmp_path / "outputs.safetensors"
    mine = [SimpleNamespace(id=i) for i in "abc"]
    save_release_outputs(path, [None, centre("b"), centre("c")], [])
    assert saved_steps(path) == "partial centre"
    centres, updates = load_release_outputs(path, mine)
    assert updates is None and [u and u.client for u in centres] == [None, "b", "c"]
    assert torch.equal(centres[1].tensors["sum"], torch.full((3,), 2.0))
    assert load_release_outputs(path, [SimpleNamespace(id=i) for i in "abcd"]) is None  # four clients, not three
    assert load_release_outputs(path, [SimpleNamespace(id=i) for i in "axc"]) is None  # another client at index 1
    save_release_outputs(path, [None, None, None], [])  # nothing arrived: nothing to reuse
    assert load_release_outputs(path, mine) is None
    save_release_outputs(path, [None, centre("b"), centre("c")], [stats("a"), stats("b"), stats("c")])
    assert load_release_outputs(path, mine) is None  # not a file the release writes: released again
    save_release_outputs(path, [centre("a"), centre("b"), centre("c")], [])  # complete: read as before
    assert saved_steps(path) == "centre" and [u.client for u in load_release_outputs(path, mine)[0]] == ["a", "b", "c"]
