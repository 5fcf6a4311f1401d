"""The public files a Flower server reads, the app folder, and the server's run config (no processes)."""

import dataclasses
import json
import tomllib

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from fedhype.data.partition import make_partition  # noqa: E402
from fedhype.data.sites import encoder_of  # noqa: E402
from fedhype.errors import ArtifactError, ValidationError  # noqa: E402
from fedhype.federated.config import TrainConfig  # noqa: E402
from fedhype.federated.flower.apps import ServerSettings  # noqa: E402
from fedhype.federated.flower.federation import (Federation, write_app, write_federation,  # noqa: E402
                                                 write_site_federation)

CFG = dict(rounds=2, local_steps=2, batch_size=32, epsilon=None, noise_multiplier=1.0, seed=0,
           model={"hidden": 32, "latent": 8})


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="iid", n_clients=2, seed=0)


def test_federation_file_is_public_and_round_trips(real_store, part, tmp_path):
    path = write_federation(tmp_path, real_store, part, TrainConfig(**CFG))
    raw = json.loads(path.read_text())
    assert set(raw) == {"format", "federation_id", "train", "store", "n_classes", "roster"}
    # a file written again with the same settings is a new file (the nodes bind a file to the one run it served)
    again = json.loads(write_federation(tmp_path.parent / f"{tmp_path.name}-again", real_store, part,
                                        TrainConfig(**CFG)).read_text())
    assert again["federation_id"] != raw["federation_id"] and len(raw["federation_id"]) == 32
    assert {k: v for k, v in again.items() if k != "federation_id"} == {k: v for k, v in raw.items() if k != "federation_id"}
    assert raw["store"] == {"digest": real_store.digest(), "n": len(real_store), "dim": real_store.dim,
                            "encoder": real_store.meta.get("encoder"), "provenance": encoder_of(real_store)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["federation.json"]  # the partition stays with the data holder
    text = path.read_text()
    assert not any(s in text for s in real_store.sample_ids)  # no record id reaches the server
    fed = Federation.load(path)
    assert fed.train == TrainConfig(**CFG) and fed.n_classes == real_store.n_classes
    assert [c.n_train for c in fed.roster.clients] == [len(c.train) for c in part.clients]
    assert {c.key for c in fed.roster.clients} == {part.key}  # the partition's random key, no digest of the data


def test_federation_refuses_pooled_training_and_a_bad_roster(real_store, part, tmp_path):
    with pytest.raises(ValidationError, match="cannot run on a Flower deployment"):
        write_federation(tmp_path / "a", real_store, part, TrainConfig(**{**CFG, "method": "central-cvae"}))
    write_federation(tmp_path / "b", real_store, part, TrainConfig(**CFG))
    raw = json.loads((tmp_path / "b" / "federation.json").read_text())
    raw["n_classes"] = 3
    (tmp_path / "b" / "federation.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match="disagrees with its roster"):
        Federation.load(tmp_path / "b" / "federation.json")
    raw["n_classes"] = real_store.n_classes
    raw["roster"]["clients"][1]["name"] = raw["roster"]["clients"][0]["name"]
    (tmp_path / "b" / "federation.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match="used twice"):
        Federation.load(tmp_path / "b" / "federation.json")


def test_site_federation_is_built_from_the_public_cards_only(real_store, tmp_path):
    from fedhype.data.sites import SiteCard, make_site

    sites = []
    for d in range(2):  # two sites: the first two digits domains, the second without class 0
        sub = real_store.subset((real_store.domains == d).nonzero().flatten())
        if d == 1:
            sub = sub.subset((sub.labels != 0).nonzero().flatten())
        sub.save(tmp_path / f"s{d}.safetensors")
        sites.append(make_site(sub, tmp_path / f"s{d}.safetensors", f"site-{d}").save(tmp_path / f"site{d}"))
    cards = [SiteCard.load(s) for s in sites]
    path = write_site_federation(tmp_path / "fed", sites[::-1], TrainConfig(**CFG))  # card paths, any order
    fed = Federation.load(path)
    assert [c.name for c in fed.roster.clients] == ["site-1", "site-0"]
    assert [c.key for c in fed.roster.clients] == [cards[1].key, cards[0].key]
    assert [c.n_train for c in fed.roster.clients] == [cards[1].n_train, cards[0].n_train]
    assert fed.roster.class_names == real_store.class_names and fed.store["sites"] == ["site-1", "site-0"]
    assert real_store.digest() not in path.read_text()
    with pytest.raises(ValidationError, match="given more than once"):
        write_site_federation(tmp_path / "x", [sites[0], sites[0]], TrainConfig(**CFG))
    other = dataclasses.replace(cards[1], encoder={**cards[1].encoder, "weights_hash": "0" * 64})
    with pytest.raises(ArtifactError, match="embedded differently: weights_hash"):
        write_site_federation(tmp_path / "x", [cards[0], other], TrainConfig(**CFG))
    with pytest.raises(ValidationError, match="not among the federation's classes"):
        write_site_federation(tmp_path / "x", cards, TrainConfig(**CFG), classes=["1", "2"])
    assert not (tmp_path / "x").exists()
    # a site's node holds the federation file it agreed to: a server running another plan is refused (a new
    # user's probe: nodes holding an ε = 1 file trained a coordinator's ε = 8 run without a word)
    from fedhype.federated.flower import handshake

    node = handshake.NodeSettings.from_node_config({"site": str(sites[0]), "federation": str(path),
                                                   "state-dir": str(tmp_path / "state")})
    ident = handshake.decode_identity(handshake.node_identity({"site": str(sites[0]), "federation": str(path),
                                                               "state-dir": str(tmp_path / "state")}), "t")
    assert ident["federation"] == fed.digest == handshake.federation_digest(json.loads(path.read_text()))
    handshake.check_federation(node, fed.digest)
    raw = json.loads(path.read_text())
    path.write_text(json.dumps(raw, indent=4, sort_keys=False))  # re-formatted: the same plan, the same digest
    handshake.check_federation(node, Federation.load(path).digest)
    elsewhere = write_site_federation(tmp_path / "fed8", sites[::-1], TrainConfig(**{**CFG, "epsilon": 8.0}))
    assert Federation.load(elsewhere).digest != fed.digest
    with pytest.raises(handshake.NodeMismatch, match="another federation file"):
        handshake.check_federation(node, Federation.load(elsewhere).digest)
    # a roster entry that does not describe the site is refused at the identity handshake, before any site
    # releases anything, with a text the server may see (no local path; a new user's probe found these caught
    # only at the first release, after the healthy sites had spent ε, or sent as an opaque NodeError)
    nc = {"site": str(sites[0]), "federation": str(path), "state-dir": str(tmp_path / "state")}
    mine = [c["name"] for c in raw["roster"]["clients"]].index("site-0")
    for edit, match in ((lambda r: r["roster"]["clients"][mine].update(n_train=100),
                         f"plans site 'site-0' with 100 training records, but the site holds {cards[0].n_train}"),
                        (lambda r: r["roster"].update(class_names=[k for k in r["roster"]["class_names"] if k != "3"]),
                         r"holds class\(es\) \['3'\], which are not among the federation's classes"),
                        (lambda r: r["roster"]["clients"][mine].update(key="0" * 32), "another site key"),
                        (lambda r: r["roster"]["clients"][mine].update(name="elsewhere"), "is not in the server's")):
        bad = json.loads(json.dumps(raw))
        edit(bad)
        path.write_text(json.dumps(bad))
        with pytest.raises(handshake.NodeMismatch, match=match) as exc:
            handshake.node_identity(nc)
        assert str(tmp_path) not in str(exc.value) and isinstance(exc.value, handshake.Refusal)
    path.write_text(json.dumps(raw))
    assert handshake.decode_identity(handshake.node_identity(nc), "t")["client"] == str(mine)


def test_app_folder_names_our_apps_and_run_config(tmp_path):
    pyproject = write_app(tmp_path / "app", federation=tmp_path / "fed.json", run_dir=tmp_path / "run",
                          straggler_timeout=30)
    doc = tomllib.loads(pyproject.read_text())
    app = doc["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fedhype.federated.flower.apps:server_app",
                                 "clientapp": "fedhype.federated.flower.apps:client_app"}
    settings = ServerSettings.from_run_config(app["config"])
    assert settings.run_dir == tmp_path / "run" and settings.resume is False and settings.straggler_timeout == 30
    assert settings.wire_log is None and "FLWR_TELEMETRY_ENABLED=0" in pyproject.read_text()


@pytest.mark.parametrize("rc, match", [({"run-dir": "/r"}, "lacks 'federation'"),
                                       ({"federation": "/f", "run-dir": "/r", "resume": "false"}, "true or false"),
                                       ({"federation": "/f", "run-dir": "/r", "round-timeout": 0}, "> 0 seconds")])
def test_server_run_config_is_validated(rc, match):
    with pytest.raises(ValidationError, match=match):
        ServerSettings.from_run_config(rc)
