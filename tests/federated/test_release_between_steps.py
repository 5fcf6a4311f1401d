"""A centred release interrupted between its two steps (the centre released and saved, the statistics step not
arrived: a Flower node killed during it). Before, every path released the centre again on the resume — charged
again with fresh noise. Now the centre's outputs are saved the moment they arrive and reused: the resume charges
and releases the statistics step alone (again, if unseeded; not at all, if seeded), in process per client, in process
under secure aggregation, and on the integer (Flower SecAgg+) path."""

import pytest

from fedhype.data.partition import make_partition
from fedhype.federated.class_stats import MECHANISM as STATS
from fedhype.federated.client import Client
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import _build_clients, describe_store, run_federation, train
from fedhype.federated.rundir import RunDir
from fedhype.federated.secure_release import LocalIntegerSession, attach_local_session, planned_tails
from fedhype.federated.transport import InProcessTransport
from fedhype.pipeline.job import release_resume_note
from fedhype.privacy.centring import MECHANISM as CENTRE
from fedhype.privacy.ledger import PrivacyLedger

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}


class Killed(Exception):
    """A node lost during the statistics step."""


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="iid", n_clients=3, seed=0)


def _cfg(seed, **kw):
    return TrainConfig(method="fedhypevae", rounds=1, local_steps=1, batch_size=32, epsilon=2.0, delta=1e-4, seed=seed,
                       model=SMALL, centre_share=0.06, **kw)


def _charges(run):
    events = PrivacyLedger.load(run / "ledger.json").events
    return sum(e.mechanism == CENTRE for e in events), sum(e.mechanism == STATS for e in events)


def _integer(real_store, part, cfg, out, **kw):
    def connect(run):
        clients, _ = _build_clients(real_store, part, run, cfg)
        attach_local_session(clients, cfg.distributed_noise(len(clients)), cfg.delta,
                             planned_tails(cfg, [len(c.train) for c in part.clients]))
        return InProcessTransport(clients, None)

    return run_federation(part, cfg, out, store_info=describe_store(real_store), n_classes=real_store.n_classes,
                          connect=connect, **kw)


def _in_process(real_store, part, cfg, out, **kw):
    return train(real_store, part, cfg, out, diagnostics=False, **kw)


PATHS = {"per client": (_in_process, {}), "secure, in process": (_in_process, {"secure_aggregation": True}),
         "secure, integer": (_integer, {"secure_aggregation": True, "dropout_tolerance": 1})}


@pytest.mark.parametrize("seed", [None, 0])
@pytest.mark.parametrize("path", list(PATHS))
def test_a_release_killed_during_its_statistics_step_reuses_its_centre(real_store, part, tmp_path, monkeypatch, path, seed):
    run_fn, extra = PATHS[path]
    cfg = _cfg(seed, **extra)
    run = tmp_path / "run"
    m = len(part.clients)
    integer = run_fn is _integer

    def killed(*a, **k):
        raise Killed("node lost during the statistics step")

    with monkeypatch.context() as mp:  # the first attempt dies in the statistics step, after the centre arrived
        if integer:
            real = LocalIntegerSession.release
            mp.setattr(LocalIntegerSession, "release",
                       lambda self, stage, *a, **k: killed() if stage == "statistics" else real(self, stage, *a, **k))
        else:
            mp.setattr(Client, "release_class_stats", killed)
        with pytest.raises(Killed):
            run_fn(real_store, part, cfg, run, stop_after=0)
    assert RunDir(run).release_stage() == "centre saved"
    assert "the released centre is reused (not charged again)" in release_resume_note("centre saved", seed is not None)
    assert _charges(run) == (m, m)  # both steps charged write-ahead, each just before it ran

    centres_released = []
    if integer:
        real_open = LocalIntegerSession.open
        monkeypatch.setattr(LocalIntegerSession, "open",
                            lambda self, stage: (centres_released.append(stage), real_open(self, stage))[1])
    else:
        real_centre = Client.release_centre
        monkeypatch.setattr(Client, "release_centre",
                            lambda self, *a, **k: (centres_released.append(self.id), real_centre(self, *a, **k))[1])
    res = run_fn(real_store, part, cfg, run, resume=True, stop_after=0)
    assert not res["complete"] and RunDir(run).release_stage() == "saved"
    # the centre was not released again; the statistics step ran once more, charged again only with fresh noise
    assert centres_released == (["statistics"] if integer else [])
    assert _charges(run) == (m, m if seed is not None else 2 * m)
    res = run_fn(real_store, part, cfg, run, resume=True)
    assert res["complete"] and _charges(run) == (m, m if seed is not None else 2 * m)


def test_outputs_of_an_uncentred_run_are_not_taken_for_a_centred_ones(real_store, part, tmp_path):
    """The reuse checks that the saved outputs are of this release's shape: an uncentred release's updates are not
    read as a centred release's (the release runs again instead)."""
    from fedhype.federated.release_outputs import _has_centre, load_release_outputs

    run = tmp_path / "run"
    _in_process(real_store, part, TrainConfig(**{**_cfg(0).__dict__, "centre_share": 0.0}), run, stop_after=0)

    class C:
        def __init__(self, i):
            self.id = i

    kept = load_release_outputs(run / "ckpt" / "release-outputs.safetensors", [C(str(c.id)) for c in part.clients])
    assert kept is not None and kept[0] == [] and not _has_centre(kept[0]) and len(kept[1]) == len(part.clients)


@pytest.mark.parametrize("seed", [None, 0])
@pytest.mark.parametrize("path", list(PATHS))
def test_a_release_killed_during_its_centre_step_charges_no_statistics_step(real_store, part, tmp_path, monkeypatch,
                                                                            path, seed):
    """A helper's kill -9 of a Flower node during the centre step: both steps had been charged write-ahead at once, so
    the statistics step — which no client had run — was charged, and the resume charged both again (ε 0.85 above
    what any site spent; the consortium had to raise its cap to finish). Each step is now charged just before it
    runs: the stop leaves the centre step charged alone, and the resume charges the centre again (it ran again, with
    fresh noise; a seeded one replays it) and the statistics step once.

    Per client, the centres that did arrive are saved (a partial file): the other clients are still asked, and the
    resume asks — and charges, unless seeded — the lost client's centre alone (before, every client's centre was
    released and charged again; the clients after the lost one had been charged without being asked). Under secure
    aggregation the server holds only the sum, which did not arrive: every centre runs again."""
    run_fn, extra = PATHS[path]
    cfg = _cfg(seed, **extra)
    run = tmp_path / "run"
    m = len(part.clients)
    per_client = not extra

    def killed(*a, **k):
        raise Killed("node lost during the centre step")

    with monkeypatch.context() as mp:
        if run_fn is _integer:
            real = LocalIntegerSession.release
            mp.setattr(LocalIntegerSession, "release",
                       lambda self, stage, *a, **k: killed() if stage == "centre" else real(self, stage, *a, **k))
        else:
            real_centre, calls = Client.release_centre, []

            def second_dies(self, *a, **k):  # the first client's centre arrives, the second's node is lost
                calls.append(self.id)
                return killed() if len(calls) == 2 else real_centre(self, *a, **k)

            mp.setattr(Client, "release_centre", second_dies)
        with pytest.raises(Killed):
            run_fn(real_store, part, cfg, run, stop_after=0)
    assert _charges(run) == (m, 0)  # the statistics step was never asked, and is not charged
    if per_client:
        assert calls == [str(c.id) for c in part.clients]  # every client was asked, though the second one failed
        assert RunDir(run).release_stage() == "centre partly saved"
        assert "the centre step runs again for the missing clients only" in release_resume_note(
            "centre partly saved", seed is not None)
    asked = []
    real_again = Client.release_centre
    monkeypatch.setattr(Client, "release_centre",
                        lambda self, *a, **k: (asked.append(str(self.id)), real_again(self, *a, **k))[1])
    res = run_fn(real_store, part, cfg, run, resume=True)
    again = 1 if per_client else m  # the centres released again: the lost client's alone, or every one (a sum)
    assert res["complete"] and _charges(run) == (m if seed is not None else m + again, m)
    if per_client:
        assert asked == [str(part.clients[1].id)]
