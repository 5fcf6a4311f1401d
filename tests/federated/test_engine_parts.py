"""The engine's named parts: the steps of a run, its result, the server and client protocols, the method registry."""

import json

import pytest
import torch
from safetensors.torch import load_file

from fedhype.data.partition import make_partition
from fedhype.errors import ValidationError
from fedhype.federated.baselines import LocalServers, federation, make_server, training_partition
from fedhype.federated.config import (METHOD_PRESETS, METHOD_REGISTRY, METHODS, NO_SECURE_AGGREGATION, STATISTICS_ONLY,
                                      Method, TrainConfig, get_method, register_method)
from fedhype.federated.engine import (InProcessTransport, TrainResult, _build_clients, charge_round, commit_round,
                                      committed_rounds, describe_store, open_run, release_statistics, resolve_plan,
                                      result_of, run_round, sample_clients, train)
from fedhype.federated.rundir import RunDir, load_model
from fedhype.federated.server import Server, ServerStrategy
from fedhype.federated.transport import SupportsPreflight
from fedhype.privacy.ledger import PrivacyLedger

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}
#: the keys (and their order) of the dict train returned before TrainResult
OLD_KEYS = ["run_dir", "epsilon", "delta", "rounds", "rounds_planned", "clients", "noise_multiplier", "private",
            "class_stats_noise_multiplier", "epsilon_per_client", "clip_norm", "seed", "noise_seeded", "traffic",
            "secure_aggregation", "complete"]
ADDED_KEYS = ["client_names", "method"]  # added after the dictionary became TrainResult: appended, old order kept


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="domain", seed=0)


def _cfg(**kw):
    return TrainConfig(**{**dict(rounds=2, local_steps=1, batch_size=32, epsilon=4.0, delta=1e-4, seed=0,
                                 class_stats_share=0.8, model=SMALL), **kw})


def _tensors(path):
    return load_file(str(path))


def test_the_named_steps_are_the_run(real_store, part, tmp_path):
    """Driving resolve → open → release → (run round → commit)* by hand writes exactly what train writes;
    each round's ledger events are on disk before any client runs."""
    cfg = _cfg()
    ref = train(real_store, part, cfg, tmp_path / "ref", diagnostics=False)

    run = RunDir(tmp_path / "steps")
    plan = resolve_plan(part, cfg, store_info=describe_store(real_store), n_classes=real_store.n_classes)
    assert plan.noise_multiplier == ref.noise_multiplier and plan.sizes == [len(c.train) for c in part.clients]
    assert not run.root.exists()  # step 1 writes nothing
    with run.writer_lock():
        done = committed_rounds(run, plan, resume=False)

        def connect(r):
            clients, _ = _build_clients(real_store, part, r, cfg)
            return InProcessTransport(clients, None)

        state = open_run(run, plan, done, connect)
        assert done == 0 and isinstance(state.server, Server) and state.dp.noise_multiplier == ref.noise_multiplier
        release_statistics(state)
        orig, seen = state.transport.run_round, []

        def spy(round_idx, tasks):
            events = PrivacyLedger.load(run.ledger).events  # read from disk while the clients run
            seen.append(sorted(e.client for e in events if e.round == round_idx and e.mechanism == "dp-sgd"))
            yield from orig(round_idx, tasks)

        state.transport.run_round = spy
        for r in range(cfg.rounds):
            seen.clear()
            outcome = run_round(state, r)
            assert seen == [sorted(c.id for c in state.clients)]  # charged write-ahead, every participant
            assert not run.server_ckpt(r + 1).exists() and run.committed_round() == r  # not committed yet
            m = commit_round(state, outcome)
            assert m["round"] == r and run.committed_round() == r + 1
        res = result_of(state)
    assert {k: v for k, v in res.items() if k != "run_dir"} == {k: v for k, v in ref.items() if k != "run_dir"}
    a, b = _tensors(tmp_path / "ref" / "model.safetensors"), _tensors(run.model)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda evs: [{k: v for k, v in e.items() if k != "time"} for e in evs]  # noqa: E731
    assert strip(json.loads((tmp_path / "ref" / "ledger.json").read_text())["events"]) == \
        strip(json.loads(run.ledger.read_text())["events"])


def test_charge_round_refuses_before_writing(real_store, part, tmp_path):
    cfg = _cfg(max_epsilon=4.05)
    run = RunDir(tmp_path / "run")
    plan = resolve_plan(part, cfg, store_info=describe_store(real_store), n_classes=real_store.n_classes)
    with run.writer_lock():
        state = open_run(run, plan, 0, lambda r: InProcessTransport(_build_clients(real_store, part, r, cfg)[0]))
        release_statistics(state)
        commit_round(state, run_round(state, 0))
        commit_round(state, run_round(state, 1))  # the plan: exactly within 4.05
        before = run.ledger.read_bytes()
        from fedhype.errors import BudgetExceededError

        with pytest.raises(BudgetExceededError) as info:  # a third round is not in the plan and goes over
            charge_round(state, 2, sample_clients(state))
        assert info.value.limit == 4.05 and info.value.epsilon > 4.05
        assert run.ledger.read_bytes() == before


def test_a_resume_whose_rounds_left_pass_the_cap_is_refused_before_spending(real_store, part, tmp_path):
    """A new user's probe: a run interrupted after charging a round (unseeded: the resume charges it again) resumed
    with --max-epsilon above the plan's ε ran rounds until the last one would pass the cap, then stopped there — the
    budget spent, the model a round short. The rounds still to run are priced with the ledger before the first."""
    from fedhype.errors import BudgetExceededError

    cfg = _cfg(rounds=3, seed=None)
    train(real_store, part, cfg, tmp_path / "run", diagnostics=False, stop_after=1)
    run = RunDir(tmp_path / "run")
    plan = resolve_plan(part, cfg, store_info=describe_store(real_store), n_classes=real_store.n_classes)
    with run.writer_lock():  # round 2 charged (write-ahead), then the process stopped before committing it
        state = open_run(run, plan, 1, lambda r: InProcessTransport(_build_clients(real_store, part, r, cfg)[0]))
        charge_round(state, 1, sample_clients(state))
    before = run.ledger.read_bytes()
    capped = _cfg(rounds=3, seed=None, max_epsilon=4.05)  # above the plan's ε = 4, below it with round 2 charged twice
    with pytest.raises(BudgetExceededError, match=r"the 2 DP-SGD rounds still to run \(rounds 2–3\) would take "
                                                  r"client\(s\) .* > --max-epsilon 4.05 with what the ledger already "
                                                  r"holds \(client .*\); stopped before spending .*completed rounds: "
                                                  r"1\)\. To finish the run, raise --max-epsilon to at least "
                                                  r"\d\.\d{4}; or keep the last committed round \(1\)") as info:
        train(real_store, part, capped, tmp_path / "run", diagnostics=False, resume=True)
    assert info.value.limit == 4.05 and info.value.epsilon > 4.05
    assert run.ledger.read_bytes() == before and run.committed_round() == 1  # nothing charged, nothing run
    res = train(real_store, part, _cfg(rounds=3, seed=None, max_epsilon=5.0), tmp_path / "run", diagnostics=False,
                resume=True)  # room for the round charged again: the run finishes
    assert res["complete"] and 4.05 < res["epsilon"] <= 5.0


def test_train_result_is_a_read_only_mapping_of_the_old_keys(real_store, part, tmp_path):
    res = train(real_store, part, _cfg(method="dp-gaussian", no_dp=True, epsilon=None), tmp_path / "g",
                diagnostics=False)
    assert isinstance(res, TrainResult) and list(res) == OLD_KEYS + ADDED_KEYS == list(res.to_dict())
    assert dict(res) == res.to_dict() and res == res.to_dict() and len(res) == len(OLD_KEYS) + len(ADDED_KEYS)
    assert res["client_names"] == [c.name for c in part.clients] and res["method"] == "dp-gaussian"
    assert res["private"] is False and res.private is False and res.get("epsilon") is None and res.rounds_planned == 0
    assert res["complete"] and "epsilon" in res and "nope" not in res
    with pytest.raises(KeyError):
        res["nope"]
    with pytest.raises(TypeError):
        res["epsilon"] = 1.0  # type: ignore[index]
    json.dumps(dict(res))  # plain JSON values


def test_servers_and_transports_meet_their_protocols(real_store, part, tmp_path):
    from fedhype.federated.client import Client
    from fedhype.federated.transport import ClientHandle

    mcfg = _cfg().model_config(real_store.dim, real_store.n_classes)
    members = [n for n in dir(ServerStrategy) if not n.startswith("_")] + ["cfg", "hnet"]
    for method in ("fedhypevae", "local-cvae"):
        server = make_server(mcfg, 3, torch.Generator().manual_seed(0), method, lr_server=1.0, lr_hyper=1e-3, lr_code=1e-3)
        assert isinstance(server, LocalServers if method == "local-cvae" else Server)
        assert all(hasattr(server, n) for n in members), method
        for i in range(3):
            m, s = server.space_for(i)
            assert m.shape == (real_store.dim,) and s.shape == ()
        assert server.codes.shape == (3, mcfg.code_dim)
    client_members = [n for n in dir(ClientHandle) if not n.startswith("_")] + ["id", "index"]
    clients, _ = _build_clients(real_store, part, RunDir(tmp_path), _cfg())
    assert all(isinstance(c, Client) and all(hasattr(c, n) for n in client_members) for c in clients)
    assert isinstance(InProcessTransport(clients), SupportsPreflight)
    assert not isinstance(object(), SupportsPreflight)


def test_the_registry_is_the_one_list_of_methods():
    assert METHODS == tuple(METHOD_REGISTRY) and METHOD_PRESETS == {n: m.preset for n, m in METHOD_REGISTRY.items()}
    assert STATISTICS_ONLY == ("dp-gaussian", "no-dp-sgd") and get_method("dp-gaussian").statistics_only
    assert set(NO_SECURE_AGGREGATION) == {"local-cvae", "central-cvae", "dp-cvae", "no-class-stats"}
    assert [federation(n) for n in ("fedhypevae", "local-cvae", "central-cvae")] == ["federated", "local", "pooled"]
    assert federation("None") == "federated"  # a model's metadata without a method
    with pytest.raises(ValidationError, match="train.method must be one of"):
        get_method("nope")
    with pytest.raises(ValidationError, match="train.method must be one of"):
        TrainConfig(method="nope")
    with pytest.raises(ValueError):
        register_method(Method("fedhypevae"))
    with pytest.raises(ValueError):
        Method("x", federation="p2p")


def test_a_new_baseline_is_one_registry_entry(real_store, part, tmp_path):
    """Registering a method is all it takes: its preset, its federation (server, partition), its refusals."""
    name = "test-local-no-lipschitz"
    register_method(Method(name, {"lambda_lip": 0.0, "client_stats": False}, federation="local",
                           no_secure_aggregation="keeps one model per client"))
    try:
        cfg = _cfg(method=name, rounds=1, no_dp=True, epsilon=None)
        assert cfg.model_config(8, 2).lambda_lip == 0.0 and not cfg.method_spec.statistics_only
        with pytest.raises(ValidationError, match="keeps one model per client"):
            _cfg(method=name, secure_aggregation=True)
        assert training_partition(part, name) is part
        res = train(real_store, part, cfg, tmp_path / "run", diagnostics=False)
        assert res.complete and res.traffic["upload_bytes_per_round"] == 0  # LocalServers: nothing is communicated
        hnet, codes, meta = load_model(tmp_path / "run")
        assert meta["method"] == name and type(hnet).__name__ == "LocalModels" and codes.shape[0] == len(part.clients)
    finally:
        del METHOD_REGISTRY[name]


def test_a_statistics_only_method_names_the_settings_it_does_not_use():
    """dp-gaussian / no-dp-sgd run no DP-SGD round: a probe's --rounds 5, --clip-norm 0.5, --batch-size 64 were taken
    silently; with --class-stats-noise-multiplier 5 the release ran at σ₀ = 5 while the header said σ = 2."""
    from fedhype.federated.config import ROUND_SETTINGS

    assert TrainConfig(method="no-dp-sgd").unused_settings() == [] and TrainConfig(rounds=5).unused_settings() == []
    cfg = TrainConfig(method="no-dp-sgd", rounds=5, clip_norm=0.5, batch_size=64, class_stats_share=0.5)
    assert cfg.unused_settings() == ["rounds", "batch_size", "clip_norm", "class_stats_share"]
    assert cfg.unused_note() == ("train.method = 'no-dp-sgd' runs no DP-SGD round (the statistics release takes the "
                                 "whole ε): train.rounds, train.batch_size, train.clip_norm, train.class_stats_share "
                                 "have no effect (recorded in config.json as given)")
    two = TrainConfig(method="dp-gaussian", epsilon=None, noise_multiplier=2.0, class_stats_noise_multiplier=5.0)
    assert two.unused_settings() == ["noise_multiplier"] and "at σ₀ = 5)" in two.unused_note()
    assert TrainConfig(method="dp-gaussian", epsilon=None, noise_multiplier=2.0).unused_settings() == []  # σ₀ = 2
    # every round setting is a field, and none of them moves a statistics-only plan
    from fedhype.federated.run_plan import plan_privacy

    base = plan_privacy(TrainConfig(method="no-dp-sgd", epsilon=1.0), [400, 900])
    for k in ROUND_SETTINGS:
        other = {"rounds": 3, "local_epochs": 5.0, "local_steps": 7, "batch_size": 16, "participation": 0.5,
                 "lr_local": 0.1, "lr_server": 0.5, "lr_hyper": 0.1, "lr_code": 0.1, "clip_norm": 0.3,
                 "class_stats_share": 0.5}[k]
        moved = plan_privacy(TrainConfig(method="no-dp-sgd", epsilon=1.0, **{k: other}), [400, 900])
        assert moved["class_stats_noise_multiplier"] == base["class_stats_noise_multiplier"], k
        assert moved["noise_multiplier"] is None and all(steps == 0 for _, steps in moved["plan"]), k


class _SiteNodes(InProcessTransport):
    """The in-process clients, each behind a node that refuses past its plan's ε (as a Flower site node does)."""

    def enforces_plan_cap(self, index: int) -> bool:
        return True


def _over_site_nodes(real_store, part, cfg, out, **kw):
    from fedhype.federated.engine import run_federation

    return run_federation(part, cfg, out, store_info=describe_store(real_store), n_classes=real_store.n_classes,
                          connect=lambda r: _SiteNodes(_build_clients(real_store, part, r, cfg, val=False)[0]), **kw)


def test_over_site_nodes_a_resume_is_priced_against_their_plan_cap_before_the_first_round(real_store, part, tmp_path):
    """A helper's Flower probe (secure aggregation, a node killed, unseeded nodes): the resume ran 7 rounds and the
    other nodes refused round 8, their own ledgers past their federation file's plan (the interrupted step charged
    again). Without train.max_epsilon the server priced nothing; it now prices the rounds left against the cap the
    nodes enforce — the same function (planned_epsilon_caps) — and refuses before spending."""
    from fedhype.errors import BudgetExceededError
    from fedhype.federated.run_plan import planned_epsilon_caps

    cfg = _cfg(rounds=3, seed=None)
    _over_site_nodes(real_store, part, cfg, tmp_path / "run", stop_after=1)
    run = RunDir(tmp_path / "run")
    plan = resolve_plan(part, cfg, store_info=describe_store(real_store), n_classes=real_store.n_classes)
    caps = planned_epsilon_caps(plan.cfg, list(plan.sizes))
    assert caps is not None and 3.95 < max(caps) <= 4.0 + 1e-9  # each client's ε under the plan (the worst binds σ)
    with run.writer_lock():  # round 2 charged (write-ahead), then the server stopped before committing it
        state = open_run(run, plan, 1, lambda r: InProcessTransport(_build_clients(real_store, part, r, cfg)[0]))
        charge_round(state, 1, sample_clients(state))
    before = run.ledger.read_bytes()
    with pytest.raises(BudgetExceededError, match=r"the 2 DP-SGD rounds still to run \(rounds 2–3\) would take "
                                                  r"client\(s\) .* past the ε that the plan of the federation file "
                                                  r"gives them.*\(client \d: ε = [0-9.]+ > [0-9.]+.*completed rounds: "
                                                  r"1\).*train\.max_epsilon to at least (\d\.\d{4})") as info:
        _over_site_nodes(real_store, part, cfg, tmp_path / "run", resume=True)
    assert info.value.limit in caps and info.value.epsilon > info.value.limit
    assert run.ledger.read_bytes() == before and run.committed_round() == 1  # nothing charged, nothing run
    # each client beside its own cap (a helper read the worst ε beside the smallest cap, of two different clients)
    import re

    for c, eps, cap in re.findall(r"client (\d): ε = ([0-9.]+) > ([0-9.]+)", str(info.value)):
        assert float(eps) > float(cap) and min(abs(float(cap) - x) for x in caps) < 1e-5
    # the advised max_epsilon works as printed (a helper set the 2.01 printed for 2.010277 and was refused again)
    advised = float(re.search(r"at least (\d\.\d{4})", str(info.value)).group(1))
    assert advised >= info.value.epsilon
    res = _over_site_nodes(real_store, part, _cfg(rounds=3, seed=None, max_epsilon=advised), tmp_path / "run",
                           resume=True)
    assert res["complete"] and max(caps) < res["epsilon"] <= advised


@pytest.mark.parametrize("secure", [False, True], ids=["gaussian-release", "secure-aggregation"])
def test_over_site_nodes_an_honest_run_and_a_seeded_resume_stay_within_their_plan_cap(real_store, part, tmp_path,
                                                                                     secure):
    """No false refusal: the plan's own run (its Skellam release under secure aggregation, whose ε is at most the
    Gaussian prefix's) and a seeded resume stay within the cap the server now prices against."""
    from fedhype.federated.run_plan import planned_epsilon_caps

    cfg = _cfg(rounds=3, secure_aggregation=secure, dropout_tolerance=1 if secure else 0)  # seeded: a resume replays
    _over_site_nodes(real_store, part, cfg, tmp_path / "run", stop_after=1)
    run = RunDir(tmp_path / "run")
    plan = resolve_plan(part, cfg, store_info=describe_store(real_store), n_classes=real_store.n_classes)
    with run.writer_lock():
        state = open_run(run, plan, 1, lambda r: InProcessTransport(_build_clients(real_store, part, r, cfg)[0]))
        charge_round(state, 1, sample_clients(state))
    res = _over_site_nodes(real_store, part, cfg, tmp_path / "run", resume=True)
    caps = planned_epsilon_caps(plan.cfg, list(plan.sizes))
    assert res["complete"] and all(res["epsilon_per_client"][c] <= cap * (1 + 1e-9)
                                   for c, cap in zip(res["epsilon_per_client"], caps))
