"""The public files a Flower server reads, the app folder, and the server's run config (no processes)."""

import json
import tomllib

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install -e '.[flower]' (scripts/setup.sh does)")

from fedhype.data.partition import make_partition  # noqa: E402
from fedhype.errors import ArtifactError, ValidationError  # noqa: E402
from fedhype.federated.config import TrainConfig  # noqa: E402
from fedhype.federated.flower.apps import ServerSettings  # noqa: E402
from fedhype.federated.flower.federation import Federation, write_app, write_federation  # noqa: E402

CFG = dict(rounds=2, local_steps=2, batch_size=32, epsilon=None, noise_multiplier=1.0, seed=0,
           model={"hidden": 32, "latent": 8})


@pytest.fixture(scope="module")
def part(real_store):
    return make_partition(real_store, scheme="iid", n_clients=2, seed=0)


def test_federation_file_is_public_and_round_trips(real_store, part, tmp_path):
    path = write_federation(tmp_path, real_store, part, TrainConfig(**CFG))
    raw = json.loads(path.read_text())
    assert set(raw) == {"format", "train", "store", "n_classes", "partition"}
    assert raw["store"] == {"digest": real_store.digest(), "n": len(real_store), "dim": real_store.dim,
                            "encoder": real_store.meta.get("encoder")}
    fed = Federation.load(path)
    assert fed.train == TrainConfig(**CFG) and fed.n_classes == real_store.n_classes
    assert [len(c.train) for c in fed.partition.clients] == [len(c.train) for c in part.clients]


def test_federation_refuses_pooled_training_and_another_store(real_store, part, tmp_path):
    with pytest.raises(ValidationError, match="cannot run on a Flower deployment"):
        write_federation(tmp_path / "a", real_store, part, TrainConfig(**{**CFG, "method": "central-cvae"}))
    write_federation(tmp_path / "b", real_store, part, TrainConfig(**CFG))
    raw = json.loads((tmp_path / "b" / "federation.json").read_text())
    raw["store"]["digest"] = "0" * 64
    (tmp_path / "b" / "federation.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match="made from another store"):
        Federation.load(tmp_path / "b" / "federation.json")


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
