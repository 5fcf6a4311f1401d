"""A site node's own ledger (fedhype.federated.flower.node_budget): the plan of its federation file caps
what a server can make it run, whatever the server asks (no processes)."""

import json

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict  # noqa: E402

from fedhype.data.partition import make_partition  # noqa: E402
from fedhype.federated.config import TrainConfig  # noqa: E402
from fedhype.federated.flower.federation import write_federation  # noqa: E402
from fedhype.federated.flower.handshake import NodeRefusal, NodeSettings  # noqa: E402
from fedhype.federated.flower.node_budget import LEDGER, charge_request, request_digest, site_cap  # noqa: E402
from fedhype.federated.run_plan import plan_privacy  # noqa: E402
from fedhype.privacy.accountant import epsilon  # noqa: E402
from fedhype.privacy.events import RELEASE, RELEASE_CENTRE, dp_sgd_events, release_events  # noqa: E402
from fedhype.privacy.ledger import PrivacyLedger  # noqa: E402

CFG = dict(rounds=2, local_steps=2, batch_size=32, epsilon=None, noise_multiplier=1.0, delta=1e-4, seed=0,
           model={"hidden": 32, "latent": 8})


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="iid", n_clients=2, seed=0)


def _federation(tmp_path, real_store, part, **over):
    return write_federation(tmp_path, real_store, part, TrainConfig(**{**CFG, **over}))


def _requests(cfg: TrainConfig, sizes, client: str = "1"):
    """The requests of the honest plan for ``client``, in order: centre, statistics, then each round."""
    priv = plan_privacy(cfg, sizes)
    n = sizes[int(client)]
    (s_c, _, _), (s_s, _, _) = priv["prefix"]
    out = [release_events([client], [(s_c, 1.0, 1)], [RELEASE_CENTRE], 1.0),
           release_events([client], [(s_s, 1.0, 1)], [RELEASE], 1.0)]
    out += [dp_sgd_events(r, [(client, cfg.sample_rate(n), cfg.steps_per_round(n))], priv["noise_multiplier"],
                          cfg.clip_norm) for r in range(cfg.rounds)]
    return out, priv


def _node(tmp_path, fed, seed=None):
    return NodeSettings(client="", embeddings=None, partition=None, state_dir=tmp_path / "state", seed=seed,
                        federation=fed)


def _eps(state):
    led = PrivacyLedger.load(state / LEDGER)
    return led, led.epsilon("1")


def _site(real_store, part, tmp_path):
    """``(cfg, requests, plan, node, (cap, δ))`` of client 1 of an unseeded site node under :data:`CFG`."""
    fed = _federation(tmp_path / "fed", real_store, part)
    cfg = TrainConfig(**CFG)
    reqs, priv = _requests(cfg, [len(c.train) for c in part.clients])
    node = _node(tmp_path, fed)
    return cfg, reqs, priv, node, site_cap(node, "1")


def test_the_honest_plan_runs_and_reaches_the_planned_epsilon_and_nothing_more(real_store, part, tmp_path):
    cfg, reqs, priv, node, (limit, delta) = _site(real_store, part, tmp_path)
    # the cap is the plan's ε for this client: its release prefix and all its planned DP-SGD steps
    q, steps = priv["plan"][1]
    assert limit == pytest.approx(epsilon(list(priv["prefix"]) + [(priv["noise_multiplier"], q, steps)], 1e-4), rel=1e-12)
    assert delta == 1e-4 and 0 < limit < 50
    # the one function the server prices a resume's rounds with (fedhype.federated.engine._limits): the same cap
    from fedhype.federated.flower.federation import Federation
    from fedhype.federated.run_plan import planned_epsilon_caps

    fed = Federation.load(node.federation)
    assert planned_epsilon_caps(fed.train, [c.n_train for c in fed.roster.clients])[1] == limit
    state = tmp_path / "state" / "run-000000000000" / "client-1"
    for k, ev in enumerate(reqs):
        charge_request(node, state, ev, f"{k:064x}")
    led, eps = _eps(state)
    assert len(led) == len(reqs) and eps == pytest.approx(limit, rel=1e-9)
    # a third round, a second statistics release or the same round at a smaller σ: refused, nothing charged
    extra = [dp_sgd_events(cfg.rounds, [("1", q, steps // cfg.rounds)], priv["noise_multiplier"], cfg.clip_norm),
             reqs[1], dp_sgd_events(0, [("1", q, steps // cfg.rounds)], priv["noise_multiplier"] / 2, cfg.clip_norm)]
    for k, ev in enumerate(extra):
        with pytest.raises(NodeRefusal, match="over the ε = .* that the plan of its federation file gives it") as exc:
            charge_request(node, state, ev, f"{k + 100:064x}")
        assert ("the statistics release" if k == 1 else f"round {cfg.rounds + 1 if k == 0 else 1})") in str(exc.value)
    assert len(PrivacyLedger.load(state / LEDGER)) == len(reqs)


def test_a_server_that_front_loads_a_larger_sampling_rate_is_stopped_at_the_cap(real_store, part, tmp_path):
    cfg, reqs, priv, node, (limit, _) = _site(real_store, part, tmp_path)
    state = tmp_path / "state" / "r-000000000000" / "client-1"
    for k, ev in enumerate(reqs[:2]):
        charge_request(node, state, ev, f"{k:064x}")
    # the server asks for ten times the planned batch (q × 10) each round: it gets fewer rounds than planned,
    # and the node never passes its cap
    q, steps = priv["plan"][1]
    ran = 0
    with pytest.raises(NodeRefusal, match="over the ε"):
        for r in range(100):
            charge_request(node, state, dp_sgd_events(r, [("1", min(1.0, 10 * q), steps // cfg.rounds)],
                                                      priv["noise_multiplier"], cfg.clip_norm), f"{r + 10:064x}")
            ran += 1
    _, eps = _eps(state)
    assert ran < cfg.rounds and eps <= limit * (1 + 1e-9)


def test_seeded_node_replays_the_same_request_free_and_refuses_another_one_for_the_same_round(real_store, part,
                                                                                              tmp_path):
    fed = _federation(tmp_path / "fed", real_store, part)
    reqs, _ = _requests(TrainConfig(**CFG), [len(c.train) for c in part.clients])
    node = _node(tmp_path, fed, seed=0)
    state = tmp_path / "state" / "r-000000000000" / "client-1"
    for k, ev in enumerate(reqs[:3]):
        charge_request(node, state, ev, f"{k:064x}")
    charge_request(node, state, reqs[2], f"{2:064x}")  # the server resumed: the same round-0 request again
    led, _ = _eps(state)
    assert len(led) == 3 and all(e.seeded for e in led.events)
    # another request for round 0 (other θ): the same noise on other inputs would release their difference
    with pytest.raises(NodeRefusal, match="already answered round 1 .* same noise"):  # counted from 1
        charge_request(node, state, reqs[2], f"{99:064x}")
    with pytest.raises(NodeRefusal, match="already answered the statistics release"):
        charge_request(node, state, reqs[1], f"{98:064x}")
    assert len(PrivacyLedger.load(state / LEDGER)) == 3


def test_an_unseeded_rerun_is_charged_again_and_needs_max_epsilon_room(real_store, part, tmp_path):
    cfg, sizes = TrainConfig(**CFG), [len(c.train) for c in part.clients]
    reqs, _ = _requests(cfg, sizes)
    for room, fed in ((False, _federation(tmp_path / "a", real_store, part)),
                      (True, _federation(tmp_path / "b", real_store, part, max_epsilon=1000.0))):
        node = _node(tmp_path / str(room), fed)
        state = tmp_path / str(room) / "state" / "r-000000000000" / "client-1"
        for k, ev in enumerate(reqs):
            charge_request(node, state, ev, f"{k:064x}")
        if room:  # the federation allows reruns up to max_epsilon: the last round again is a new release, charged
            charge_request(node, state, reqs[-1], f"{len(reqs) - 1:064x}")
            led, _ = _eps(state)
            assert len(led) == len(reqs) + 1 and led.events[-1].note.startswith("rerun")
            assert led.events[-1].note.endswith(f"{len(reqs) - 1:064x}")
        else:
            with pytest.raises(NodeRefusal, match="rerun of an unseeded round is a new release"):
                charge_request(node, state, reqs[-1], f"{len(reqs) - 1:064x}")


def test_a_pooled_partition_node_and_a_no_dp_plan_keep_no_ledger(real_store, part, tmp_path):
    reqs, _ = _requests(TrainConfig(**CFG), [len(c.train) for c in part.clients])
    pooled = NodeSettings(client="1", embeddings=None, partition=None, state_dir=tmp_path / "s")
    charge_request(pooled, tmp_path / "s", reqs[0], "0" * 64)
    fed = _federation(tmp_path / "nodp", real_store, part, no_dp=True, noise_multiplier=None)
    assert site_cap(_node(tmp_path, fed), "1") is None
    charge_request(_node(tmp_path, fed), tmp_path / "s", reqs[0], "0" * 64)
    assert not (tmp_path / "s" / LEDGER).exists()


def test_request_digest_covers_every_value_and_array_byte():
    def msg(v, w):
        return RecordDict({"task": ConfigRecord({"round": v, "lr": 0.01}),
                           "theta": ArrayRecord({"w": Array(np.asarray(w, dtype=np.float32))})})

    base = request_digest(msg(1, [0.0, 1.0]))
    assert base == request_digest(msg(1, [0.0, 1.0])) and len(base) == 64
    assert request_digest(msg(2, [0.0, 1.0])) != base
    assert request_digest(msg(1, [0.0, 1.0000001])) != base
    assert request_digest(msg(1, [[0.0, 1.0]])) != base  # the shape counts
    json.dumps(base)


def test_a_site_node_charges_its_site_ledger_across_runs_and_refuses_past_its_cap(real_store, part, tmp_path):
    from fedhype.data.sites import make_site
    from fedhype.privacy.site_ledger import by_run, load_site_ledger, set_site_ledger, spent

    cfg, reqs, priv, node, (limit, delta) = _site(real_store, part, tmp_path)
    sub = part.client_store(real_store, part.clients[1].id, "train")
    sub.save(tmp_path / "s1.safetensors")
    make_site(sub, tmp_path / "s1.safetensors", "hospital_b", min_train=5).save(tmp_path / "site")
    node = NodeSettings(**{**node.__dict__, "site": tmp_path / "site"})
    for run in ("first-000000000001", "second-000000000002"):  # two runs the SuperNode served with this site
        for k, ev in enumerate(reqs):
            charge_request(node, tmp_path / "state" / run / "client-1", ev, f"{k:064x}")
    led = load_site_ledger(tmp_path / "site")
    hist = [(e.noise_multiplier, e.sample_rate, e.steps) for e in PrivacyLedger.load(
        tmp_path / "state" / "first-000000000001" / "client-1" / LEDGER).events]
    assert by_run(led) == pytest.approx({"first-000000000001": limit, "second-000000000002": limit}, rel=1e-9)
    assert spent(led) == pytest.approx(epsilon(hist + hist, delta), rel=1e-9) and spent(led) > limit
    set_site_ledger(tmp_path / "site", "hospital_b", max_epsilon=spent(led) * 1.01)
    third = tmp_path / "state" / "third-000000000003" / "client-1"
    with pytest.raises(NodeRefusal, match="this site's ledger across runs: the request would pass the site's lifetime") \
            as refused:
        charge_request(node, third, reqs[1], f"{1:064x}")  # its statistics release: within its run's cap, not the site's
    assert str(tmp_path) not in str(refused.value)  # the server is not told the site's folder or its figures
    assert not (third / LEDGER).exists() and len(load_site_ledger(tmp_path / "site")) == 2 * len(reqs)


def test_a_site_node_records_a_task_without_dp_as_infinite_once_per_run_or_refuses_it_under_a_cap(real_store, part,
                                                                                               tmp_path):
    from fedhype.data.sites import make_site
    from fedhype.federated.flower.node_budget import charge_no_dp
    from fedhype.privacy.site_ledger import load_site_ledger, set_site_ledger, spent

    sub = part.client_store(real_store, part.clients[1].id, "train")
    sub.save(tmp_path / "s1.safetensors")
    make_site(sub, tmp_path / "s1.safetensors", "hospital_b", min_train=5).save(tmp_path / "site")
    node = NodeSettings(client="", embeddings=None, partition=None, state_dir=tmp_path / "state", allow_no_dp=True,
                        site=tmp_path / "site", federation=None)
    set_site_ledger(tmp_path / "site", "hospital_b", max_epsilon=8.0, delta=1e-4)
    with pytest.raises(NodeRefusal, match="a task without DP .* would pass the site's lifetime ε cap"):
        charge_no_dp(node, tmp_path / "state" / "r-000000000001" / "client-1")
    assert len(load_site_ledger(tmp_path / "site")) == 0
    set_site_ledger(tmp_path / "site", "hospital_b", max_epsilon=None)
    for _ in range(3):  # the release and two rounds of one run: recorded once
        charge_no_dp(node, tmp_path / "state" / "r-000000000001" / "client-1")
    led = load_site_ledger(tmp_path / "site")
    assert len(led) == 1 and spent(led) == float("inf")


def test_a_stop_between_the_site_charge_and_the_nodes_own_is_not_charged_twice(real_store, part, tmp_path, monkeypatch):
    """A node killed after its site's ledger took a request's charge and before its own ledger did: the request
    never ran, and the server's retry is that charge (the site's and the node's ledgers hold each request once)."""
    from fedhype.data.sites import make_site
    from fedhype.privacy.site_ledger import load_site_ledger

    cfg, reqs, priv, node, _ = _site(real_store, part, tmp_path)
    sub = part.client_store(real_store, part.clients[1].id, "train")
    sub.save(tmp_path / "s1.safetensors")
    make_site(sub, tmp_path / "s1.safetensors", "hospital_b", min_train=5).save(tmp_path / "site")
    node = NodeSettings(**{**node.__dict__, "site": tmp_path / "site"})
    state = tmp_path / "state" / "run-000000000001" / "client-1"
    charge_request(node, state, reqs[0], f"{0:064x}")
    real_save = PrivacyLedger.save

    def killed(self, path):
        if str(path).endswith(f"client-1/{LEDGER}"):
            raise KeyboardInterrupt
        return real_save(self, path)

    monkeypatch.setattr(PrivacyLedger, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        charge_request(node, state, reqs[1], f"{1:064x}")
    monkeypatch.setattr(PrivacyLedger, "save", real_save)
    assert len(load_site_ledger(tmp_path / "site")) == 2 and len(PrivacyLedger.load(state / LEDGER)) == 1
    charge_request(node, state, reqs[1], f"{9:064x}")  # the server's retry (unseeded: a new request)
    site = [(e.round, e.mechanism, e.noise_multiplier) for e in load_site_ledger(tmp_path / "site").events]
    own = [(e.round, e.mechanism, e.noise_multiplier) for e in PrivacyLedger.load(state / LEDGER).events]
    assert site == own and len(own) == 2
