"""A federation of two sites whose agreed class list names a class that neither holds ("zebra"), as a new
user's probe did (`fedhype site --classes "bägs,sneaker,tshirt,zebra"`): `synthesize` must say, for every code,
which classes the release cannot tell from absent (their samples are the model's noise), calibrated on the noise
of the DP class counts; and `audit --mia` on a site run must say that a site run has no pooled store."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from typer.testing import CliRunner

from fedhype.cli.main import app
from fedhype.data.store import EmbeddingStore

runner = CliRunner()
AGREED = "bägs,sneaker,tshirt,zebra"
#: site → the real digit labels it holds and the names they get (site_a lacks tshirt, site_b bägs; none zebra)
SITES = {"site_a": ({0: "bägs", 1: "sneaker"}), "site_b": ({1: "sneaker", 2: "tshirt"})}


def _json(r):
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def _site_store(real_store, names: dict[int, str]) -> EmbeddingStore:
    idx = [i for i, y in enumerate(real_store.labels.tolist()) if y in names]
    s = real_store.subset(idx)
    order = sorted(names.values())
    return EmbeddingStore(embeddings=s.embeddings, domains=s.domains, sample_ids=s.sample_ids, class_names=order,
                          labels=torch.tensor([order.index(names[y]) for y in s.labels.tolist()], dtype=torch.int64),
                          domain_names=s.domain_names, meta={**s.meta, "class_counts": None})


@pytest.fixture(scope="module")
def site_run(real_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("zebra")
    for name, names in SITES.items():
        _site_store(real_store, names).save(root / f"{name}.safetensors")
        _json(runner.invoke(app, ["site", "--store", str(root / f"{name}.safetensors"), "--name", name,
                                  "--classes", AGREED, "--min-records", "5", "--out", str(root / name), "--json"]))
    # seeded: the same DP counts every time (the thresholds tested below are then not left to chance)
    r = runner.invoke(app, ["train", *(f"--site={root / n}" for n in SITES), "--out", str(root / "run"),
                            "--epsilon", "4", "--rounds", "1", "--local-steps", "1", "--batch-size", "16",
                            "--min-records", "5", "--hidden", "16", "--latent", "4", "--seed", "0", "--json"])
    _json(r)
    return root


def _ledger_count_std(run) -> float:
    """σ / b of the count entries, read from the ledger's statistics step (its note names the weights a, b, c)."""
    events = json.loads((run / "ledger.json").read_text())["events"]
    stats = [e for e in events if e["mechanism"] == "dp-class-stats"]
    assert stats
    b = float(re.search(r"weights \(a, b, c\) = \[([^]]+)\]", stats[0]["note"]).group(1).split(",")[1])
    return stats[0]["noise_multiplier"] / b


def test_every_code_says_which_classes_the_release_cannot_tell_from_absent(site_run):
    from fedhype.federated.rundir import load_model
    from fedhype.synthesis.absent import ABSENT_Z, count_noise_std

    run = site_run / "run"
    meta = load_model(run)[2]
    assert meta["class_names"] == ["bägs", "sneaker", "tshirt", "zebra"]
    counts = meta["client_class_counts"]
    std = count_noise_std(run)
    assert std == pytest.approx(_ledger_count_std(run), rel=1e-6)  # the noise the release added, per client count
    pooled = sum(c[3] for c in counts)
    assert pooled <= ABSENT_Z * std * math.sqrt(2)  # zebra: noise only
    out = site_run / "syn.safetensors"
    r = runner.invoke(app, ["synthesize", "--run", str(run), "--out", str(out), "--per-class", "20", "--json"])
    got = _json(r)
    assert list(got["class_counts"].values()) == [20, 20, 20, 20] and got["absent_classes"] == ["zebra"]
    err = " ".join(r.stderr.split())
    assert (f"warning: class(es) the release cannot tell from absent: zebra (pooled DP count {pooled:.1f} ± "
            f"{std * math.sqrt(2):.1f})") in err
    assert "their 20 samples may be the model's noise rather than data" in err
    assert "drop them with `fedhype synthesize --n 60 --label-weights 1,1,1,0`" in err and "store.subset(" in err
    syn = EmbeddingStore.load(out)
    assert syn.meta["absent_classes"] == [{"class": "zebra", "dp_count": round(pooled, 3),
                                           "noise_std": round(std * math.sqrt(2), 3)}]
    assert syn.meta["notes"][0]["kind"] == "absent" and "zebra" in syn.meta["codes_note"]
    # the advice leaves zebra out, the other classes keep their numbers, and nothing is left to warn about
    r = runner.invoke(app, ["synthesize", "--run", str(run), "--out", str(site_run / "syn2.safetensors"),
                            "--n", "60", "--label-weights", "1,1,1,0", "--json"])
    assert list(_json(r)["class_counts"].values()) == [20, 20, 20, 0] and "cannot tell from absent" not in r.stderr
    # one site's code: the class it lacks (tshirt, held by site_b) is drawn from the pooled statistics, said per code;
    # zebra keeps its own warning (not repeated in the per-code note)
    for code, lacks, k in (("client:site_a", "tshirt", 2), ("mixture:site_b=1", "bägs", 0)):
        r = runner.invoke(app, ["synthesize", "--run", str(run), "--out", str(site_run / "c.safetensors"), "--code",
                                code, "--per-class", "5", "--overwrite", "--json"])
        err = " ".join(r.stderr.split())
        own = counts[0 if "site_a" in code else 1][k]
        assert _json(r)["absent_classes"] == ["zebra"]
        assert f"cannot be told to hold class(es) {lacks} (DP count {own:.1f} ± {std:.1f})" in err, err
        assert "pooled class statistics" in err and err.count("zebra") == 1
    # a class both sites hold is never named
    r = runner.invoke(app, ["synthesize", "--run", str(run), "--out", str(site_run / "c.safetensors"), "--code",
                            "mixture", "--per-class", "5", "--overwrite", "--json"])
    assert "sneaker" not in r.stderr and "cannot be told to hold" not in r.stderr


def test_mia_on_a_site_run_says_a_site_run_has_no_pooled_store(site_run, real_store, tmp_path):
    from fedhype.data.partition import make_partition

    store = tmp_path / "D.safetensors"
    real_store.save(store)
    make_partition(real_store, scheme="iid", n_clients=2, seed=0).save(tmp_path / "Dp.json")
    r = runner.invoke(app, ["audit", "--run", str(site_run / "run"), "--mia", "--store", str(store),
                            "--partition", str(tmp_path / "Dp.json"), "--json"])
    assert r.exit_code == 2, r.output
    err = " ".join(r.output.split())
    assert "trained with `train --site` on the sites site_a, site_b" in err
    assert "no pooled store" in err and "evaluate --site" in err
    assert "digest" not in err  # not the store-mismatch message, whose digest is the sites' keys'
    # without --store/--partition: the same reason, not "--mia needs --run, --store and --partition"
    r = runner.invoke(app, ["audit", "--run", str(site_run / "run"), "--mia", "--json"])
    assert r.exit_code == 2 and "no pooled store" in r.output
    # the ledger check of the same run still works
    r = runner.invoke(app, ["audit", "--run", str(site_run / "run"), "--json"])
    assert r.exit_code == 0, r.output


def test_n_below_the_number_of_classes_is_refused_and_a_class_rounded_to_none_is_warned_about(site_run):
    """`synthesize --n 3` on 4 classes drew [1, 1, 1, 0] without a word (every class is drawn, whatever the code)."""
    run, out = str(site_run / "run"), site_run / "few.safetensors"
    r = runner.invoke(app, ["synthesize", "--run", run, "--out", str(out), "--n", "3", "--json"])
    assert r.exit_code == 2 and not out.exists(), r.output
    err = " ".join(r.output.split())
    assert "--n 3 is fewer than the 4 classes" in err and "--n is the total number" in err and "--per-class N" in err
    r = runner.invoke(app, ["synthesize", "--run", run, "--out", str(out), "--n", "10", "--label-weights", "100,1,1,1",
                            "--json"])
    assert list(_json(r)["class_counts"].values()) == [10, 0, 0, 0]
    assert "warning: class(es) sneaker, tshirt, zebra got no sample: --n 10 split by --label-weights" in \
        " ".join(r.stderr.split())
