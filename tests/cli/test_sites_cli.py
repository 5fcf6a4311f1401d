"""Per-site operation at the CLI (issue: bring your own images, safely): three sites' own image folders
(``class/patient/image`` nesting, real UCI optdigits as PNG files; one site lacks a class) go through
``fedhype embed`` → ``fedhype site`` → ``fedhype train --site`` → ``fedhype synthesize --release`` →
``fedhype evaluate --site``, as the README section "Your own images" walks through. Checked: the classes
are right, nothing the coordinator writes (the run folder) or shares (the release folder) holds a record
id, a site's store digest or a real embedding, the public card holds only public fields, and every
refusal is a clear exit 2 that writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from fedhype.cli.main import app
from fedhype.data.sites import Site
from fedhype.data.store import EmbeddingStore
from image_trees import digit_rows, save_digit

runner = CliRunner()
CLASSES = ("benign", "malignant", "normal")
#: site → (classes it holds, first optdigits row used): distinct images at every site
SITES = {"hospital_a": (CLASSES, 0), "hospital_b": (CLASSES, 12), "clinic_c": (CLASSES[:2], 24)}


def _json(r):
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def _tree(root: Path, classes, skip: int) -> Path:
    """``<class>/patient_<k>/<i>.png``: 3 patients × 4 images per class."""
    for label, cls in enumerate(CLASSES):
        if cls not in classes:
            continue
        for p in range(3):
            for i in digit_rows(label, 4, skip=skip + 4 * p):
                save_digit(root, f"{cls}/patient_{label}{p}/{i}.png", i)
    return root


@pytest.fixture(scope="module")
def consortium(tiny_dinov2_dir, tmp_path_factory):
    """Each site embeds and splits its own folder; the coordinator trains from the cards; one release."""
    root = tmp_path_factory.mktemp("sites")
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDHYPE_CACHE", str(root / "cache"))
    enc = ["--encoder", f"hf:{tiny_dinov2_dir}", "--device", "cpu", "--workers", "0"]
    out = {"root": root, "ids": [], "digests": [], "stores": {}}
    try:
        for name, (classes, skip) in SITES.items():
            images = _tree(root / name / "images", classes, skip)
            store = root / name / "embeddings.safetensors"
            _json(runner.invoke(app, ["embed", "--images", str(images), "--layout", "class", *enc, "--out", str(store),
                                      "--json"]))
            out["site"] = _json(runner.invoke(app, ["site", "--store", str(store), "--name", name, "--min-records", "5",
                                                    "--out", str(root / name / "site"), "--json"]))
            s = EmbeddingStore.load(store)
            out["stores"][name] = s
            out["ids"] += list(s.sample_ids)
            out["digests"].append(s.digest())
        sites = [f"--site={root / n / 'site'}" for n in SITES]
        # unseeded: a seeded run is ε = ∞ for the sites' ledgers (its seed travels with the run and its release)
        r = runner.invoke(app, ["train", *sites, "--out", str(root / "run"), "--epsilon", "4",
                                "--rounds", "2", "--local-steps", "2", "--batch-size", "8",
                                "--min-records", "5", "--hidden", "16", "--latent", "4", "--json"])
        out["train"], out["train_log"] = _json(r), r.stderr
        out["synthesize"] = _json(runner.invoke(app, ["synthesize", "--run", str(root / "run"), "--out",
                                                      str(root / "synthetic.safetensors"), "--per-class", "20", "--seed",
                                                      "0", "--release", str(root / "release"), "--json"]))
        out["evaluate"] = {n: _json(runner.invoke(app, ["evaluate", "--site", str(root / n / "site"), "--synthetic",
                                                        str(root / "synthetic.safetensors"), "--permutations", "0",
                                                        "--k", "2", "--json"])) for n in SITES}
        yield out
    finally:
        mp.undo()


def test_classes_stay_classes_and_each_site_evaluates_on_its_own_test_split(consortium):
    root = consortium["root"]
    for name, (classes, _) in SITES.items():
        s = consortium["stores"][name]
        assert s.class_names == list(classes)  # patient_XX folders stayed inside their class
        assert s.class_counts() == [12] * len(classes)
        site = Site.load(root / name / "site")
        sizes = {k: len(site.split.ids(k)) for k in ("train", "val", "test")}
        assert sum(sizes.values()) == 12 * len(classes) and sizes["train"] >= 7 * len(classes)
        test = site.records("test", store=s)
        assert sorted(set(test.labels.tolist())) == list(range(len(classes)))  # split per class, every class in test
        ev = consortium["evaluate"][name]
        assert ev["site"] == name and ev["real_split"] == "test"
        assert ev["n_real"] == sizes["test"] and 0.0 <= ev["tstr_accuracy"] <= 1.0 and ev["trtr_accuracy"] is not None
    syn = EmbeddingStore.load(root / "synthetic.safetensors")
    assert syn.class_names == list(CLASSES) and syn.class_counts() == [20, 20, 20]
    tr = consortium["train"]
    assert tr["private"] and 0 < tr["epsilon"] <= 4.0 + 1e-6


def test_the_card_is_public_and_the_site_file_says_it_is_private(consortium):
    root = consortium["root"]
    card = json.loads((root / "clinic_c" / "site" / "card.json").read_text())
    assert set(card) == {"format", "public", "fedhype_version", "name", "key", "n_train", "dim", "encoder", "class_names",
                         "dtype"}
    assert card["dtype"] == consortium["stores"]["clinic_c"].meta["dtype"]  # the precision it embedded in
    assert card["class_names"] == ["benign", "malignant"] and card["name"] == "clinic_c"
    assert card["encoder"]["encoder"].startswith("hf:<local>/")  # a local encoder folder: its name only, no path
    assert "nan" not in consortium["train_log"] and "round 2/2" in consortium["train_log"]
    text = (root / "clinic_c" / "site" / "card.json").read_text()
    assert not any(i in text for i in consortium["stores"]["clinic_c"].sample_ids)
    private = json.loads((root / "clinic_c" / "site" / "site.json").read_text())
    assert "PRIVATE" in private["private"] and len(private["partition"]["clients"][0]["train"]) == card["n_train"]


def _files(folder: Path, skip: str | None = None) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not (skip and skip in p.relative_to(folder).parts)]


def test_no_record_id_digest_or_real_embedding_reaches_the_coordinator_or_the_release(consortium):
    root = consortium["root"]
    real = torch.cat([s.embeddings for s in consortium["stores"].values()])
    # the coordinator's files: the run folder, minus clients/ (the simulated sites' private optimiser states)
    coordinator = _files(root / "run", skip="clients")
    release = _files(root / "release")
    assert sorted(p.name for p in release) == ["README.md", "checkpoint.json", "config.json", "ledger.json",
                                               "model.safetensors", "privacy.json", "synthetic.safetensors"]
    assert not (root / "run" / "metrics.json").exists() or "val" not in (root / "run" / "metrics.json").read_text()
    for path in coordinator + release:
        data = path.read_bytes()
        for i in consortium["ids"]:
            assert i.encode() not in data, f"record id {i} in {path}"
        assert b"patient_" not in data and b".png" not in data, path
        for d in consortium["digests"]:
            assert d.encode() not in data, f"a site's store digest in {path}"
        if path.suffix == ".safetensors":
            for name, t in load_file(str(path)).items():
                if t.ndim == 2 and t.shape[1] == real.shape[1] and t.is_floating_point():
                    dist = torch.cdist(t.float(), real).min().item()
                    assert dist > 1e-4, f"{path}:{name} holds a real embedding"
    conf = json.loads((root / "run" / "config.json").read_text())
    keys = [json.loads((root / n / "site" / "card.json").read_text())["key"] for n in SITES]
    assert conf["partition"] == {"scheme": "site", "clients": list(SITES), "keys": keys}  # the cards' random keys


def test_refusals_are_clear_and_write_nothing(consortium, tmp_path):
    root = consortium["root"]
    a = root / "hospital_a"
    r = runner.invoke(app, ["site", "--store", str(a / "embeddings.safetensors"), "--name", "hospital_a",
                            "--min-records", "5", "--out", str(a / "site"), "--json"])
    assert r.exit_code == 2 and "--overwrite" in r.output
    r = runner.invoke(app, ["site", "--store", str(a / "embeddings.safetensors"), "--name", "bad name/..",
                            "--out", str(tmp_path / "s"), "--json"])
    assert r.exit_code == 2 and "site name" in r.output and not (tmp_path / "s").exists()
    r = runner.invoke(app, ["train", f"--site={a / 'site'}", "--store", str(a / "embeddings.safetensors"),
                            "--out", str(tmp_path / "run"), "--json"])
    assert r.exit_code == 2 and "give one or the other" in r.output and not (tmp_path / "run").exists()
    r = runner.invoke(app, ["train", f"--site={a / 'site'}", f"--site={a / 'site'}", "--out", str(tmp_path / "run"),
                            "--min-records", "5", "--json"])
    assert r.exit_code == 2 and "given more than once" in r.output and not (tmp_path / "run").exists()
    r = runner.invoke(app, ["train", f"--site={a / 'site'}", "--classes", "benign,malignant", "--out",
                            str(tmp_path / "run"), "--min-records", "5", "--json"])
    assert r.exit_code == 2 and "'normal'" in r.output and "--classes" in r.output and not (tmp_path / "run").exists()
    r = runner.invoke(app, ["train", f"--site={tmp_path}", "--out", str(tmp_path / "run"), "--json"])
    assert r.exit_code == 2 and "no site.json" in r.output
    r = runner.invoke(app, ["evaluate", "--site", str(a / "site"), "--store", str(a / "embeddings.safetensors"),
                            "--synthetic", str(root / "synthetic.safetensors"), "--json"])
    assert r.exit_code == 2 and "--site" in r.output


def test_provenance_refusals_name_both_sides(consortium, tmp_path):
    """Evaluation refuses data it cannot compare with, or that may hold the run's own training records."""
    import shutil

    root = consortium["root"]
    syn = str(root / "synthetic.safetensors")
    # a site split again (new key) since the run trained on it: its test split may hold training records
    again = tmp_path / "hospital_a-site"
    shutil.copytree(root / "hospital_a" / "site", again)
    r = runner.invoke(app, ["site", "--store", str(root / "hospital_a" / "embeddings.safetensors"), "--name",
                            "hospital_a", "--min-records", "5", "--seed", "1", "--out", str(again), "--overwrite", "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["evaluate", "--site", str(again), "--synthetic", syn, "--permutations", "0", "--k", "2",
                            "--json"])
    assert r.exit_code == 4 and "split again" in r.output and "hospital_a" in r.output
    assert "while the site of that name in the run of" in r.output and "had site key" in r.output  # one sentence
    # a site the run did not train on: its overlap with the run's records cannot be checked from a synthetic store
    # (no digest of the run's data travels with it): a warning, in the JSON object too (a probe scored a site 26 of
    # whose 36 test records a pooled run had trained on, told only by a note)
    o = runner.invoke(app, ["site", "--store", str(root / "hospital_a" / "embeddings.safetensors"), "--name",
                            "outsider", "--min-records", "5", "--out", str(tmp_path / "outsider"), "--json"])
    assert o.exit_code == 0, o.output
    o = runner.invoke(app, ["evaluate", "--site", str(tmp_path / "outsider"), "--synthetic", syn, "--permutations",
                            "0", "--k", "2", "--json"])
    assert o.exit_code == 0, o.output
    warned = [w for w in _json(o)["warnings"] if "is not one of the clients of the run" in w]
    assert len(warned) == 1 and "cannot be checked from a synthetic store" in warned[0] and "warning" in o.stderr
    kept = [p for p in again.iterdir() if p.name.startswith("site.") and p.name != "site.json"]
    assert len(kept) == 1 and kept[0].name in r.output  # the previous split, kept by --overwrite, evaluates the run
    assert _json(runner.invoke(app, ["evaluate", "--site", str(kept[0]), "--synthetic", syn, "--permutations", "0",
                                     "--k", "2", "--json"]))["site"] == "hospital_a"
    # another encoder's weights: not comparable
    s = consortium["stores"]["hospital_a"]
    other = EmbeddingStore(s.embeddings, s.labels, s.domains, s.sample_ids, s.class_names, s.domain_names,
                           {**s.meta, "weights_hash": "0" * 64})
    other.save(tmp_path / "other.safetensors")
    r = runner.invoke(app, ["evaluate", "--store", str(tmp_path / "other.safetensors"), "--synthetic", syn,
                            "--permutations", "0", "--k", "2", "--json"])
    assert r.exit_code == 4 and "weights_hash" in r.output and "0000" in r.output


def test_pooled_partition_is_checked_and_the_release_drops_the_store_digest(consortium, tmp_path):
    root = consortium["root"]
    store = root / "hospital_b" / "embeddings.safetensors"
    parts = []
    for name in ("a", "b"):  # the same settings twice: two partitions, two random keys
        r = runner.invoke(app, ["partition", "--store", str(store), "--scheme", "iid", "--clients", "1",
                                "--min-records", "5", "--out", str(tmp_path / f"{name}.json"), "--json"])
        assert r.exit_code == 0, r.output
        parts.append(tmp_path / f"{name}.json")
    r = runner.invoke(app, ["partition", "--store", str(store), "--scheme", "iid", "--clients", "1",
                            "--min-records", "5", "--out", str(parts[0]), "--json"])
    assert r.exit_code == 2 and "--overwrite" in r.output
    r = runner.invoke(app, ["train", "--store", str(store), "--partition", str(parts[0]), "--out", str(tmp_path / "run"),
                            "--epsilon", "4", "--rounds", "1", "--local-steps", "1", "--batch-size", "8",
                            "--min-records", "5", "--hidden", "16", "--latent", "4", "--seed", "0", "--json"])
    assert _json(r)["noise_seeded"] is True
    # a seeded run says what its seed costs before it spends, and its release is not called shareable (a new user's
    # seeded train said nothing, and synthesize --release said "what may be shared")
    assert "warning: --seed makes the noise reproducible, which is not secure" in r.stderr
    assert "its release must not be shared as private. Leave out --seed" in r.stderr
    syn = tmp_path / "syn.safetensors"
    r = runner.invoke(app, ["synthesize", "--run", str(tmp_path / "run"), "--out", str(syn), "--per-class", "10",
                            "--seed", "0", "--release", str(tmp_path / "release"), "--json"])
    _json(r)
    assert "(seeded noise: not to be shared as private" in r.stderr and "what may be shared" not in r.stderr
    ev = ["evaluate", "--store", str(store), "--synthetic", str(syn), "--permutations", "0", "--k", "2", "--json"]
    r = runner.invoke(app, [*ev, "--partition", str(parts[1])])
    assert r.exit_code == 4 and "another `fedhype partition`" in r.output
    # the run's own partition with its key field deleted is not taken as an old unkeyed one (a probe: it scored)
    raw = json.loads(parts[0].read_text())
    del raw["key"]
    (tmp_path / "unkeyed.json").write_text(json.dumps(raw))
    r = runner.invoke(app, [*ev, "--partition", str(tmp_path / "unkeyed.json")])
    assert r.exit_code == 4 and "was edited after it was written" in r.output  # its seal no longer matches
    del raw["seal"]  # as a partition written before keys and seals existed: it matches no keyed run
    (tmp_path / "unkeyed.json").write_text(json.dumps(raw))
    r = runner.invoke(app, [*ev, "--partition", str(tmp_path / "unkeyed.json")])
    assert r.exit_code == 4 and "has no key" in r.output
    # a client's train and test lists swapped, the key kept (a probe: evaluate scored on the training records)
    raw = json.loads(parts[0].read_text())
    raw["clients"][0]["train"], raw["clients"][0]["test"] = raw["clients"][0]["test"], raw["clients"][0]["train"]
    (tmp_path / "swapped.json").write_text(json.dumps(raw))
    r = runner.invoke(app, [*ev, "--partition", str(tmp_path / "swapped.json")])
    assert r.exit_code == 4 and "was edited after it was written" in r.output
    raw = json.loads(parts[1].read_text())  # another partition with this run's key copied in
    raw["key"] = json.loads(parts[0].read_text())["key"]
    (tmp_path / "copied.json").write_text(json.dumps(raw))
    r = runner.invoke(app, [*ev, "--partition", str(tmp_path / "copied.json")])
    assert r.exit_code == 4 and "was edited after it was written" in r.output
    got = _json(runner.invoke(app, [*ev, "--partition", str(parts[0]), "--code-domain", str(tmp_path / "run")]))
    assert got["tstr_accuracy"] is not None and got["code_domain"]["codes"]  # --code-domain takes the run folder
    # a run that did not train on this partition (here: the sites' run) is refused, as --synthetic is
    r = runner.invoke(app, [*ev, "--partition", str(parts[0]), "--code-domain", str(root / "run")])
    assert r.exit_code == 4 and "--code-domain" in r.output and "partition's key" in r.output
    digest = consortium["stores"]["hospital_b"].digest()
    assert digest in (tmp_path / "run" / "config.json").read_text()  # the coordinator's private run folder keeps it
    assert not any(digest.encode() in p.read_bytes() for p in (tmp_path / "release").iterdir())
    conf = json.loads((tmp_path / "release" / "config.json").read_text())
    assert "digest" not in conf["store"] and conf["store"]["provenance"]["weights_hash"] == \
        consortium["stores"]["hospital_b"].meta["weights_hash"]
    # nor the store's size (its val/test records included, which no mechanism touched), nor a local path
    assert "n" not in conf["store"] and "n" in json.loads((tmp_path / "run" / "config.json").read_text())["store"]
    meta = json.loads((tmp_path / "release" / "ledger.json").read_text())["meta"]
    assert meta["run"] == "run" and str(tmp_path) not in (tmp_path / "release" / "ledger.json").read_text()


def test_the_coordinator_plans_the_budget_from_the_cards(consortium):
    """`fedhype budget --card` gives the σ the sites' run was calibrated to, from the public cards alone."""
    root = consortium["root"]
    cards = [f"--card={root / n / 'site' / 'card.json'}" for n in SITES]
    conf = json.loads((root / "run" / "config.json").read_text())
    got = _json(runner.invoke(app, ["budget", "--epsilon", "4", "--delta", str(conf["train"]["delta"]), "--rounds", "2",
                                    "--local-steps", "2", "--batch-size", "8", *cards, "--json"]))
    assert got["noise_multiplier"] == pytest.approx(conf["privacy_plan"]["noise_multiplier"], rel=1e-9)
    sizes = [json.loads((root / n / "site" / "card.json").read_text())["n_train"] for n in SITES]
    assert [c["n"] for c in got["clients"]] == sizes
    r = runner.invoke(app, ["budget", "--epsilon", "4", "--delta", "1e-4", "--rounds", "2", "--batch-size", "8", *cards,
                            "--client-sizes", "10,10", "--json"])
    assert r.exit_code == 2 and "--card" in r.output
    # the cards are checked as `fedhype train --site` checks them: one site given twice, or sites whose
    # embeddings came from different encoders, is not a federation to plan for
    twice = [*cards, cards[0]]
    r = runner.invoke(app, ["budget", "--epsilon", "4", "--delta", "1e-4", "--rounds", "2", "--batch-size", "8", *twice, "--json"])
    assert r.exit_code == 2 and "given more than once" in r.output
    other = json.loads((root / list(SITES)[0] / "site" / "card.json").read_text())
    other = {**other, "name": "elsewhere", "key": "0" * len(other["key"]),
             "encoder": {**other["encoder"], "preprocess": "other"}}
    odd = root.parent / "odd-card.json"
    odd.write_text(json.dumps(other))
    r = runner.invoke(app, ["budget", "--epsilon", "4", "--delta", "1e-4", "--rounds", "2", "--batch-size", "8", *cards,
                            f"--card={odd}", "--json"])
    assert r.exit_code == 4 and "embedded differently" in r.output  # mismatched artifacts (evaluate --site: 4 too)
    # a card's fields are what `fedhype site` writes: true, 54.7 or "54" were read as n_train 1 / 54 / 54, and
    # an empty class list was taken (a new user's probe)
    card = json.loads((root / list(SITES)[1] / "site" / "card.json").read_text())
    for field, bad in (("n_train", True), ("n_train", 54.7), ("n_train", "54"), ("class_names", []),
                       ("class_names", [""]), ("dim", 384.0)):
        odd.write_text(json.dumps({**card, field: bad}))
        r = runner.invoke(app, ["budget", "--epsilon", "4", "--card", cards[0].split("=", 1)[1], "--card", str(odd),
                                "--json"])
        assert r.exit_code == 4 and f"{field} must be" in r.output and str(odd) in r.output, (field, bad, r.output)


def test_a_site_file_given_as_a_partition_says_what_it_is_and_what_takes_it(consortium, tmp_path):
    """`audit --mia --partition <site>/site.json` said "format 'fedhype-site/1', expected …" as if the file were
    damaged, though it was sound and only given where it does not belong (a new user's probe): the message says what
    the file is. Its exit code is 4, as the README's for every file of another kind than the option asks (a store
    given as --partition; a later helper found this one at 2)."""
    from fedhype.data.partition import Partition
    from fedhype.errors import ArtifactError

    root = consortium["root"]
    site = root / list(SITES)[0] / "site"
    for f in ("site.json", "card.json"):
        r = runner.invoke(app, ["audit", "--run", str(root / "run"), "--mia", "--store",
                                str(root / list(SITES)[0] / "embeddings.safetensors"), "--partition", str(site / f),
                                "--json"])
        assert r.exit_code == 2, r.output
        err = json.loads(r.stdout)["error"]
        # the run is a site run: that is said first (no pooled store to attack), whatever --store/--partition are
        assert "trained with `train --site`" in err and "no pooled store" in err and "evaluate --site" in err
        with pytest.raises(ArtifactError) as e:  # the file itself, given where a partition is read
            Partition.load(site / f)
        assert "is a site's file" in str(e.value) and "--site" in str(e.value) and "audit --mia" in str(e.value)


def test_what_the_fresh_user_broke_is_refused(consortium, tmp_path):
    """Refusals found by trying the workflow as a new user: each exits 2 (or 4 for a damaged file), writes nothing."""
    import shutil

    root = consortium["root"]
    sites = [f"--site={root / n / 'site'}" for n in SITES]
    small = ["--rounds", "2", "--local-steps", "2", "--batch-size", "8", "--min-records", "5", "--hidden", "16",
             "--latent", "4", "--epsilon", "4", "--json"]
    # resuming with the classes in another order: another run (its release is in the old order)
    r = runner.invoke(app, ["train", *sites, "--classes", "malignant,benign,normal", "--out", str(root / "run"),
                            "--resume", *small])
    assert r.exit_code == 2 and "class_names" in r.output
    for classes, needle in (("benign,malignant,normal,hexagon", "held by no site"),
                            ("benign,malignant,normal,", "empty name")):
        r = runner.invoke(app, ["train", *sites, "--classes", classes, "--out", str(tmp_path / "x"), *small])
        assert r.exit_code == 2 and needle in r.output and not (tmp_path / "x").exists(), r.output
    # a card edited after `fedhype site`: the coordinator would be told something else than the site holds
    edited = tmp_path / "edited"
    shutil.copytree(root / "clinic_c" / "site", edited)
    card = json.loads((edited / "card.json").read_text())
    (edited / "card.json").write_text(json.dumps({**card, "n_train": 1000}))
    r = runner.invoke(app, ["train", sites[0], f"--site={edited}", "--out", str(tmp_path / "x"), *small])
    assert r.exit_code == 4 and "differs from its site.json" in r.output and "n_train" in r.output
    assert not (tmp_path / "x").exists()
    # one site per evaluation; a synthetic store is not a site's data
    syn = str(root / "synthetic.safetensors")
    r = runner.invoke(app, ["evaluate", *sites[:2], "--synthetic", syn, "--json"])
    assert r.exit_code == 2 and "one site per command" in r.output
    r = runner.invoke(app, ["site", "--store", syn, "--name", "s", "--out", str(tmp_path / "s"), "--json"])
    assert r.exit_code == 4 and "kind='synthetic'" in r.output and not (tmp_path / "s").exists()
    # too few records: the site's own advice, not a partition's
    r = runner.invoke(app, ["site", "--store", str(root / "clinic_c" / "embeddings.safetensors"), "--name", "c",
                            "--min-records", "500", "--out", str(tmp_path / "s"), "--json"])
    assert r.exit_code == 2 and "site 'c' would have" in r.output and "--clients" not in r.output
    # a site whose test split is empty: warned when it is split, and `evaluate --site` says which split and what to
    # do (a probe's 3-image site split 2 / 1 / 0 silently; evaluation then failed on "MMD² needs at least 2 samples")
    r = runner.invoke(app, ["site", "--store", str(root / "clinic_c" / "embeddings.safetensors"), "--name", "clinic_z",
                            "--min-records", "5", "--fractions", "0.9,0.1,0", "--out", str(tmp_path / "no-test"),
                            "--json"])
    res = _json(r)
    assert res["splits"]["test"] == 0 and "split(s) test 0 hold fewer than 2 records" in res["warnings"][0]
    assert "warning: site 'clinic_z': split(s) test 0 hold fewer than 2 records" in r.stderr
    r = runner.invoke(app, ["evaluate", "--site", str(tmp_path / "no-test"), "--synthetic", syn, "--json"])
    assert r.exit_code == 2 and "its test split holds 0 record(s), and a score needs at least 2" in r.output, r.output
    # a class of a few records at a site is warned about, as `fedhype run` does for the pooled data (a probe's
    # one-image class went through `site` and `train --site` without a word)
    import numpy as np

    from fedhype.data.store import EmbeddingStore

    full = EmbeddingStore.load(root / "clinic_c" / "embeddings.safetensors")
    labels = full.labels.numpy()
    keep = np.concatenate([np.flatnonzero(labels != 0), np.flatnonzero(labels == 0)[:4]])
    full.subset(np.sort(keep)).save(tmp_path / "thin.safetensors")
    r = runner.invoke(app, ["site", "--store", str(tmp_path / "thin.safetensors"), "--name", "clinic_t",
                            "--min-records", "5", "--out", str(tmp_path / "thin-site"), "--json"])
    res = _json(r)
    name0 = full.class_names[0]
    said = [w for w in res["warnings"] if "have fewer than 10 training records here" in w]
    assert len(said) == 1 and f"{name0!r} (" in said[0] and "warning: site 'clinic_t': class(es)" in r.stderr, res
    # a moved store: the message names site.json's "store" key
    moved = tmp_path / "moved"
    shutil.copytree(root / "hospital_b" / "site", moved)
    raw = json.loads((moved / "site.json").read_text())
    (moved / "site.json").write_text(json.dumps({**raw, "store": str(tmp_path / "gone.safetensors")}))
    r = runner.invoke(app, ["evaluate", "--site", str(moved), "--synthetic", syn, "--json"])
    assert r.exit_code == 4 and '"store"' in r.output and "moved" in r.output


def test_a_card_can_announce_the_agreed_classes_instead_of_the_sites_own(consortium, tmp_path):
    """`fedhype site --classes`: the card does not say which classes the site holds (clinic_c lacks 'normal')."""
    root = consortium["root"]
    store = str(root / "clinic_c" / "embeddings.safetensors")
    base = ["site", "--store", store, "--name", "clinic_c", "--min-records", "5"]
    r = runner.invoke(app, [*base, "--classes", "benign", "--out", str(tmp_path / "bad"), "--json"])
    assert r.exit_code == 2 and "'malignant'" in r.output and not (tmp_path / "bad").exists()
    _json(runner.invoke(app, [*base, "--classes", ",".join(CLASSES), "--out", str(tmp_path / "c"), "--json"]))
    card = json.loads((tmp_path / "c" / "card.json").read_text())
    assert card["class_names"] == list(CLASSES)
    site = Site.load(tmp_path / "c")
    assert site.public_card() == site.card()  # the checked card is the announced one
    train = site.records("train", list(CLASSES))
    assert set(train.labels.tolist()) == {0, 1}  # its records keep their own classes


def test_each_sites_ledger_across_runs_records_the_run_and_its_cap_refuses_the_next(consortium, tmp_path):
    import shutil

    from fedhype.privacy.ledger import PrivacyLedger

    root = consortium["root"]
    run_ledger = PrivacyLedger.load(root / "run" / "ledger.json")
    reps = {}
    for i, name in enumerate(SITES):  # the fixture's run is on each site's ledger, with the run ledger's ε
        reps[name] = rep = _json(runner.invoke(app, ["budget", "--site", str(root / name / "site"), "--json"]))
        assert rep["site"] == name and rep["max_epsilon"] is None and rep["left"] is None
        assert [r["run"].split("-")[0] for r in rep["runs"]] == ["run"] and rep["runs"][0]["events"] == 4
        assert rep["epsilon"] == pytest.approx(run_ledger.epsilon(str(i)), rel=1e-9) and 0 < rep["epsilon"] <= 4 + 1e-6
    sites = []
    for name in SITES:  # copies: the other tests keep the fixture's sites uncapped
        shutil.copytree(root / name / "site", tmp_path / name)
        sites.append(tmp_path / name)
    spent = reps["clinic_c"]["epsilon"]
    r = runner.invoke(app, ["budget", "--site", str(sites[2]), "--max-epsilon", f"{spent / 2}", "--json"])
    assert r.exit_code == 2 and "already spent" in r.output
    got = _json(runner.invoke(app, ["budget", "--site", str(sites[2]), "--max-epsilon", f"{spent * 1.2}", "--json"]))
    assert got["max_epsilon"] == pytest.approx(spent * 1.2) and got["left"] == pytest.approx(spent * 0.2)
    before = (sites[2] / "site-ledger.json").read_text()
    # the site checks the coordinator's plan (from the cards) against its ledger before joining
    plan = _json(runner.invoke(app, ["budget", "--epsilon", "4", "--rounds", "2", "--local-steps", "2", "--batch-size",
                                     "8", *[f"--card={s / 'card.json'}" for s in sites], "--site", str(sites[2]),
                                     "--site", str(sites[0]), "--json"]))
    mine, other = plan["sites"]
    assert mine["site"] == "clinic_c" and mine["plan_epsilon"] == pytest.approx(spent, rel=1e-6)  # the same plan again
    assert mine["spent_epsilon"] == pytest.approx(spent, rel=1e-9) and mine["after_epsilon"] > spent * 1.2
    assert not mine["fits"] and other["fits"] and other["max_epsilon"] is None
    assert any("site 'clinic_c': this plan would take its records" in w for w in plan["warnings"])
    train2 = ["train", *[f"--site={s}" for s in sites], "--out", str(tmp_path / "run2"), "--epsilon", "4", "--rounds",
              "2", "--local-steps", "2", "--batch-size", "8", "--min-records", "5", "--hidden", "16", "--latent", "4"]
    r = runner.invoke(app, [*train2, "--json"])
    assert r.exit_code == 3 and "site 'clinic_c': this run's plan" in r.output and "past the site's cap" in r.output
    assert (sites[2] / "site-ledger.json").read_text() == before and not (tmp_path / "run2" / "config.json").exists()
    # budget composes the run train makes: with the DP-SGD stage, and the statistics release alone where the sites
    # are below dp_sgd_min_records (a probe's budget composed the stage's plan there: 8.841 where train refused at 8.842)
    import re

    for extra in ([], ["--dp-sgd-min-records", "100000"]):
        plan = _json(runner.invoke(app, ["budget", "--epsilon", "4", "--rounds", "2", "--local-steps", "2",
                                         "--batch-size", "8", *[f"--card={s / 'card.json'}" for s in sites], "--site",
                                         str(sites[2]), *extra, "--json"]))
        assert ("default_run" in plan) == bool(extra)
        r = runner.invoke(app, [*train2, *extra, "--json"])
        assert r.exit_code == 3, r.output
        refused = float(re.search(r"to ε = ([0-9.]+)", " ".join(r.output.split())).group(1))
        assert plan["sites"][0]["after_epsilon"] == pytest.approx(refused, abs=1e-4), (plan["sites"], r.output)
    # a seeded run, however small its plan, is ε = ∞ for a capped site: refused before anything is written
    seeded = [a if a != "4" or train2[i - 1] != "--epsilon" else "0.5" for i, a in enumerate(train2)]  # ε once
    r = runner.invoke(app, [*seeded, "--rounds", "1", "--seed", "0", "--json"])
    assert r.exit_code == 3 and "site 'clinic_c': a seeded run" in r.output and "no guarantee" in r.output, r.output
    assert (sites[2] / "site-ledger.json").read_text() == before and not (tmp_path / "run2" / "config.json").exists()
    assert len(_json(runner.invoke(app, ["budget", "--site", str(sites[0]), "--json"]))["runs"]) == 1  # nor another site
    # splitting again keeps the records' ledger; its cap can be set there too
    got = _json(runner.invoke(app, ["site", "--store", str(root / "clinic_c" / "embeddings.safetensors"), "--name",
                                    "clinic_c", "--min-records", "5", "--out", str(sites[2]), "--overwrite",
                                    "--max-epsilon", f"{spent * 3}", "--json"]))
    assert got["max_epsilon"] == pytest.approx(spent * 3) and got["spent_epsilon"] == pytest.approx(spent, rel=1e-9)
    for args, msg in ((["budget", "--site", str(sites[0]), "--epsilon", "1"], "--epsilon describes no such plan"),
                      (["budget", "--epsilon", "1", "--client-sizes", "100", "--max-epsilon", "3"], "with --site DIR"),
                      # were ignored without a word (a probe): they describe a plan's release
                      (["budget", "--site", str(sites[0]), "--secure-aggregation"], "give the plan's cards"),
                      (["budget", "--site", str(sites[0]), "--dropout-tolerance", "1"], "give the plan's cards")):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and msg in r.output, r.output


def test_the_site_ledger_refuses_what_would_reset_or_orphan_it(consortium, tmp_path):
    import shutil

    root = consortium["root"]
    store = str(root / "hospital_b" / "embeddings.safetensors")
    site = tmp_path / "hb"
    shutil.copytree(root / "hospital_b" / "site", site)
    spent = _json(runner.invoke(app, ["budget", "--site", str(site), "--json"]))["epsilon"]
    before = {p.name: p.read_text() for p in site.iterdir()}
    base = ["site", "--store", store, "--min-records", "5", "--out", str(site), "--overwrite", "--json"]
    for extra, msg in (([ "--name", "hospital_b", "--max-epsilon", f"{spent / 2}"], "already spent"),
                       (["--name", "renamed"], "ledger across runs is site 'hospital_b'"),
                       (["--name", "hospital_b", "--delta", "0.5"], "not below 1/n")):
        r = runner.invoke(app, [*base, *extra])
        assert r.exit_code == 2 and msg in r.output, r.output
        assert {p.name: p.read_text() for p in site.iterdir()} == before  # nothing written: no new split, no key
    # a new site starts its ledger at its own δ; deleting it later is refused, not a fresh start
    got = _json(runner.invoke(app, ["site", "--store", store, "--name", "hospital_b", "--min-records", "5", "--out",
                                    str(tmp_path / "new"), "--delta", "1e-6", "--json"]))
    assert got["delta"] == 1e-6 and got["max_epsilon"] is None and got["spent_epsilon"] == 0.0
    assert json.loads((tmp_path / "new" / "site.json").read_text())["site_ledger"] == "site-ledger.json"
    (tmp_path / "new" / "site-ledger.json").unlink()
    r = runner.invoke(app, ["train", f"--site={tmp_path / 'new'}", f"--site={root / 'clinic_c' / 'site'}", "--out",
                            str(tmp_path / "run"), "--epsilon", "4", "--rounds", "1", "--local-steps", "1",
                            "--batch-size", "8", "--min-records", "5", "--hidden", "16", "--latent", "4", "--json"])
    assert r.exit_code == 4 and "is missing" in r.output and "restore it from a backup" in r.output
    assert not (tmp_path / "run" / "config.json").exists()
    # budget --site: not a site (exit 2), two sites at once, a cap lifted
    r = runner.invoke(app, ["budget", "--site", str(tmp_path), "--json"])
    assert r.exit_code == 2 and "no site.json there" in r.output
    both = _json(runner.invoke(app, ["budget", "--site", str(site), "--site", str(root / "clinic_c" / "site"), "--json"]))
    assert [s["site"] for s in both["sites"]] == ["hospital_b", "clinic_c"]
    assert _json(runner.invoke(app, ["budget", "--site", str(site), "--max-epsilon", "9", "--json"]))["max_epsilon"] == 9
    assert _json(runner.invoke(app, ["budget", "--site", str(site), "--no-cap", "--json"]))["max_epsilon"] is None


def _small_train(sites, out, *extra):
    return ["train", *[f"--site={s}" for s in sites], "--out", str(out), "--epsilon", "4", "--rounds", "1",
            "--local-steps", "1", "--batch-size", "8", "--min-records", "5", "--hidden", "16", "--latent", "4", *extra,
            "--json"]


def test_budget_site_lists_seeded_runs_as_infinite_and_no_cap_can_follow(consortium, tmp_path):
    """Two seeded runs with one seed reuse one noise draw, and the seed is in every release's config.json: the
    site's ledger composes them as ε = ∞ (a probe had solved two releases for a site's exact record count)."""
    import shutil

    root = consortium["root"]
    sites = []
    for name in ("hospital_a", "hospital_b"):
        shutil.copytree(root / name / "site", tmp_path / name)
        sites.append(tmp_path / name)
    finite = _json(runner.invoke(app, ["budget", "--site", str(sites[0]), "--json"]))
    assert finite["epsilon"] > 0 and not finite["epsilon_infinite"] and finite["seeded_runs"] == []
    for k in (1, 2):
        _json(runner.invoke(app, _small_train(sites, tmp_path / f"seeded{k}", "--seed", "7")))
    rep = _json(runner.invoke(app, ["budget", "--site", str(sites[0]), "--json"]))
    assert rep["epsilon"] is None and rep["epsilon_infinite"] and len(rep["seeded_runs"]) == 2
    assert [r["seeded"] for r in rep["runs"]] == [False, True, True]
    assert [r["epsilon_infinite"] for r in rep["runs"]] == [False, True, True]
    assert "regenerate the noise" in rep["seeded_note"] and "same seed" in rep["seeded_note"]
    text = runner.invoke(app, ["budget", "--site", str(sites[0])])
    assert text.exit_code == 0 and "∞ (seeded)" in text.output and "seeded run(s)" in text.output
    r = runner.invoke(app, ["budget", "--site", str(sites[0]), "--max-epsilon", "100", "--json"])
    assert r.exit_code == 2 and "seeded run(s)" in r.output and "no finite cap can hold" in r.output


def test_raising_a_capped_sites_delta_needs_the_cap_restated_and_warns_like_train(consortium, tmp_path):
    import shutil

    root = consortium["root"]
    site = tmp_path / "cc"
    shutil.copytree(root / "clinic_c" / "site", site)
    n = json.loads((site / "card.json").read_text())["n_train"]
    capped = _json(runner.invoke(app, ["budget", "--site", str(site), "--max-epsilon", "20", "--json"]))
    before = (site / "site-ledger.json").read_text()
    big = f"{0.5 / n:.3g}"  # n·δ = 0.5: below 1/n, above the usual 0.1
    r = runner.invoke(app, ["budget", "--site", str(site), "--delta", big, "--json"])
    assert r.exit_code == 2 and "raises site 'clinic_c'" in r.output and "--max-epsilon E" in r.output, r.output
    assert (site / "site-ledger.json").read_text() == before  # the cap still means what it meant
    r = runner.invoke(app, ["budget", "--site", str(site), "--delta", big, "--max-epsilon", "20", "--json"])
    got = _json(r)
    assert got["delta"] == float(big) and got["max_epsilon"] == 20 and got["epsilon"] < capped["epsilon"]
    assert any("the usual advice is delta well below 1/n" in w for w in got["warnings"])
    assert "warning" in r.stderr and "n·delta reaches" in r.stderr
    # `fedhype site --overwrite --delta` is the same change: refused without --max-epsilon, before anything is written
    store = str(root / "clinic_c" / "embeddings.safetensors")
    files = {p.name: p.read_text() for p in site.iterdir()}
    r = runner.invoke(app, ["site", "--store", store, "--name", "clinic_c", "--min-records", "5", "--out", str(site),
                            "--overwrite", "--delta", f"{0.9 / n:.3g}", "--json"])
    assert r.exit_code == 2 and "raises site 'clinic_c'" in r.output
    assert {p.name: p.read_text() for p in site.iterdir()} == files


def test_splitting_again_from_a_store_of_other_records_is_refused_unless_same_records(consortium, tmp_path):
    import shutil

    root = consortium["root"]
    site = tmp_path / "hospital_b-site"
    shutil.copytree(root / "hospital_b" / "site", site)
    files = {p.name: p.read_text() for p in site.iterdir()}
    other = str(root / "hospital_a" / "embeddings.safetensors")  # another site's records
    base = ["site", "--store", other, "--name", "hospital_b", "--min-records", "5", "--out", str(site), "--overwrite"]
    r = runner.invoke(app, [*base, "--json"])
    assert r.exit_code == 2 and other in r.output and str(root / "hospital_b" / "embeddings.safetensors") in r.output
    assert "another --out" in r.output and "--same-records" in r.output
    assert {p.name: p.read_text() for p in site.iterdir()} == files  # no new split, key or ledger
    r = runner.invoke(app, ["site", "--store", other, "--name", "hospital_b", "--min-records", "5", "--out",
                            str(tmp_path / "new"), "--same-records", "--json"])
    assert r.exit_code == 2 and "with --overwrite" in r.output
    # the same records re-embedded (here: a copy of the store, moved): --same-records keeps their ledger
    spent = _json(runner.invoke(app, ["budget", "--site", str(site), "--json"]))["epsilon"]
    moved = tmp_path / "moved.safetensors"
    shutil.copy(root / "hospital_b" / "embeddings.safetensors", moved)
    got = _json(runner.invoke(app, ["site", "--store", str(moved), "--name", "hospital_b", "--min-records", "5",
                                    "--out", str(site), "--overwrite", "--json"]))  # the same digest: the same records
    assert got["spent_epsilon"] == pytest.approx(spent, rel=1e-9)
    # another site's records with --same-records: they share none of the split's records, so its ledger cannot be
    # kept for them (a new user's probe moved hospital_a's ledger onto hospital_b's records without a word)
    r = runner.invoke(app, [*base, "--same-records", "--json"])
    assert r.exit_code == 2 and "holds none of the" in r.output and "of the previous split" in r.output
    assert {p.name for p in site.iterdir()} >= {"site-ledger.json"}
    # the same site's records with some removed (a new digest): kept, and how many are shared is said
    from fedhype.data.store import EmbeddingStore

    store_b = EmbeddingStore.load(moved)
    fewer = tmp_path / "fewer.safetensors"
    store_b.subset(list(range(len(store_b) - 3))).save(fewer)
    r = runner.invoke(app, ["site", "--store", str(fewer), "--name", "hospital_b", "--min-records", "5", "--out",
                            str(site), "--overwrite", "--same-records", "--json"])
    got = _json(r)
    assert got["spent_epsilon"] == pytest.approx(spent, rel=1e-9)
    assert f"{len(store_b) - 3:,} of its {len(store_b) - 3:,} records are images of the previous split's " \
           f"{len(store_b):,} (by their embeddings)" in r.stderr
    # another site's images under this site's file names (ids are relative paths: `one/000.png` at both sites): the
    # names match, the images do not, and the ledger stays with this site's images (a helper's site_b store was
    # taken as site_a's records, "220 of its 221 records are among the previous split's")
    store_a = EmbeddingStore.load(other)
    n = min(len(store_a), len(store_b) - 3)
    named = tmp_path / "named.safetensors"
    EmbeddingStore(store_a.embeddings[:n], store_a.labels[:n], store_b.domains[:n], store_b.sample_ids[:n],
                   store_b.class_names, store_b.domain_names, store_b.meta).save(named)
    files = {p.name: p.read_text() for p in site.iterdir()}
    r = runner.invoke(app, ["site", "--store", str(named), "--name", "hospital_b", "--min-records", "5", "--out",
                            str(site), "--overwrite", "--same-records", "--json"])
    assert r.exit_code == 2 and "holds none of the" in r.output and "names alone do not make the same records" in r.output
    assert {p.name: p.read_text() for p in site.iterdir()} == files
    # this site's images under new names (moved into other folders): the same records by their embeddings
    renamed = tmp_path / "renamed.safetensors"
    fewer_b = EmbeddingStore.load(fewer)
    fewer_b = fewer_b.subset(list(range(len(fewer_b) - 1)))  # another digest: the store is compared record by record
    EmbeddingStore(fewer_b.embeddings, fewer_b.labels, fewer_b.domains, [f"moved/{i}" for i in fewer_b.sample_ids],
                   fewer_b.class_names, fewer_b.domain_names, fewer_b.meta).save(renamed)
    r = runner.invoke(app, ["site", "--store", str(renamed), "--name", "hospital_b", "--min-records", "5", "--out",
                            str(site), "--overwrite", "--same-records", "--json"])
    assert _json(r)["spent_epsilon"] == pytest.approx(spent, rel=1e-9)
    assert f"{len(fewer_b):,} of its {len(fewer_b):,} records are images of the previous split's" in r.stderr
    # the previous split's store gone: matched by names only, and said so
    less = tmp_path / "less.safetensors"
    EmbeddingStore.load(renamed).subset(list(range(len(fewer_b) - 1))).save(less)
    renamed.unlink()
    r = runner.invoke(app, ["site", "--store", str(less), "--name", "hospital_b", "--min-records", "5", "--out",
                            str(site), "--overwrite", "--same-records", "--json"])
    assert _json(r)["spent_epsilon"] == pytest.approx(spent, rel=1e-9)
    assert "by their names only" in r.stderr and "make sure they are the same images" in r.stderr


def test_a_class_only_announced_is_worded_so_and_the_python_api_names_its_argument(consortium, tmp_path):
    from fedhype.data.sites import SiteCard
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.flower.federation import write_site_federation

    root = consortium["root"]
    store = str(root / "clinic_c" / "embeddings.safetensors")  # clinic_c holds no 'normal' record
    _json(runner.invoke(app, ["site", "--store", store, "--name", "clinic_c", "--min-records", "5", "--classes",
                              ",".join(CLASSES), "--out", str(tmp_path / "c"), "--json"]))
    r = runner.invoke(app, ["train", f"--site={tmp_path / 'c'}", "--classes", "benign,malignant", "--out",
                            str(tmp_path / "run"), "--min-records", "5", "--json"])
    assert r.exit_code == 2 and "site 'clinic_c' announces class(es) ['normal']" in r.output
    assert "has class(es)" not in r.output and "add them to --classes" in r.output
    with pytest.raises(Exception, match=r"announces class\(es\) \['normal'\].*write_site_federation\(classes="):
        write_site_federation(tmp_path / "fed", [SiteCard.load(tmp_path / "c")], TrainConfig(), ["benign", "malignant"])


def test_a_read_only_site_ledger_stops_train_before_the_run_folder_is_written(consortium, tmp_path):
    import os
    import shutil

    root = consortium["root"]
    sites = []
    for name in ("hospital_a", "hospital_b"):
        shutil.copytree(root / name / "site", tmp_path / name)
        sites.append(tmp_path / name)
    os.chmod(sites[1] / "site-ledger.json", 0o444)
    try:
        r = runner.invoke(app, _small_train(sites, tmp_path / "run"))
        assert r.exit_code == 4 and "site 'hospital_b'" in r.output and "read-only" in r.output, r.output
        assert not (tmp_path / "run" / "config.json").exists() and not (tmp_path / "run" / "ckpt").exists()
    finally:
        os.chmod(sites[1] / "site-ledger.json", 0o644)
    _json(runner.invoke(app, _small_train(sites, tmp_path / "run")))  # the same command again: it runs


def test_audit_compares_the_run_s_ledger_with_each_site_s_own(consortium, tmp_path):
    """A probe rewrote every coordinator file consistently (ledger chain recomputed, plan, metrics, model) and
    `audit --run` passed at ε 0.263 instead of 0.999; each site's own ledger still held the truth. `audit --run R
    --site DIR` compares them: the run must not report less ε for a site's client than the site recorded for it."""
    import shutil

    from fedhype.privacy import ledger as lm
    from fedhype.privacy.site_ledger import composed, load_site_ledger, run_of

    root = consortium["root"]
    sites = [str(root / n / "site") for n in SITES]
    ok = _json(runner.invoke(app, ["audit", "--run", str(root / "run"), *[f"--site={s}" for s in sites], "--json"]))
    assert ok["consistent"] and len(ok["sites"]) == len(SITES)
    for row, name in zip(ok["sites"], SITES):
        own = load_site_ledger(root / name / "site", site=name)
        mine = [e for e in own.events if run_of(e) == row["run_key"]]
        assert row["events"] == len(mine) > 0 and row["ok"]
        assert abs(row["recomputed"] - composed(mine, lm.PrivacyLedger.load(root / "run" / "ledger.json").delta)) < 1e-9
        assert abs(row["claimed"] - row["recomputed"]) < 1e-6  # the same events on both sides
    text = runner.invoke(app, ["audit", "--run", str(root / "run"), *[f"--site={s}" for s in sites]])
    assert text.exit_code == 0 and "against each site's own" in text.stdout  # a passing comparison is shown too
    assert all(name in text.stdout for name in SITES), text.stdout

    # what a site receives is the release, never the run folder: a helper's `audit --run release --site` was refused
    # ("not the folder of a run trained over sites"); the release names the run's key, so each site checks it
    from fedhype.pipeline.release import write_release

    release = write_release(root / "run", tmp_path / "release")
    assert json.loads((release / "config.json").read_text())["run_key"] == ok["sites"][0]["run_key"]
    shared = _json(runner.invoke(app, ["audit", "--run", str(release), *[f"--site={s}" for s in sites], "--json"]))
    assert shared["consistent"] and [r["claimed"] for r in shared["sites"]] == [r["claimed"] for r in ok["sites"]]
    assert [r["recomputed"] for r in shared["sites"]] == [r["recomputed"] for r in ok["sites"]]

    # the coordinator's ledger rebuilt without its first client's statistics-release events (chain recomputed)
    forged = tmp_path / "run"
    shutil.copytree(root / "run", forged)
    state = json.loads((forged / "ledger.json").read_text())
    first = ok["sites"][0]["name"].split("client ")[1].split("'")[0]
    keep = [e for e in state["events"] if not (e["client"] == first and e["round"] == -1)]
    led = lm.PrivacyLedger(state["delta"], state["meta"])
    for e in keep:
        led.record(lm.LedgerEvent.from_dict(e))
    led.save(forged / "ledger.json")
    bad = runner.invoke(app, ["audit", "--run", str(forged), f"--site={sites[0]}", "--json"])
    assert bad.exit_code == 4
    out = json.loads(bad.stdout)
    assert not out["consistent"] and out["sites"][0]["claimed"] < out["sites"][0]["recomputed"]
    assert any("lacks charges the site recorded" in (m.get("reason") or "") for m in out["mismatches"])
    # --site needs --run; a site outside the run is named
    assert runner.invoke(app, ["audit", "--canaries", "white-box", f"--site={sites[0]}"]).exit_code != 0


def test_a_site_json_s_relative_store_and_an_archived_split_s_store_are_named_right(consortium, tmp_path):
    """A probe: a relative "store" edited into site.json was read against the current folder, not the site's; an
    archived split's wrong store was blamed on site.json with advice (split again) that cannot help its runs."""
    import shutil

    from fedhype.data.sites import Site
    from fedhype.errors import ArtifactError

    root, names = consortium["root"], list(SITES)
    site = tmp_path / "site"
    shutil.copytree(root / names[0] / "site", site)
    raw = json.loads((site / "site.json").read_text())
    shutil.copy(raw["store"], site / "moved.safetensors")
    (site / "site.json").write_text(json.dumps({**raw, "store": "moved.safetensors"}))
    assert Site.load(site).store_path == site / "moved.safetensors"
    assert len(Site.load(site).store()) > 0  # found from any working folder
    other = root / names[1] / "site"
    archived = site / "site.0000abcd.json"
    archived.write_text(json.dumps({**raw, "store": json.loads((other / "site.json").read_text())["store"]}))
    with pytest.raises(ArtifactError, match="site.0000abcd.json.*archived split.*splitting again cannot help"):
        Site.load(archived).store()
    (site / "site.json").write_text(json.dumps({**raw, "store": json.loads((other / "site.json").read_text())["store"]}))
    with pytest.raises(ArtifactError, match="--overwrite --same-records"):
        Site.load(site).store()


def test_a_site_folder_without_its_site_json_keeps_its_ledger(consortium, tmp_path):
    """A probe: a site folder whose site.json was lost was called "a folder of other files; give a new or empty
    folder" — which starts its records at ε = 0. It names the ledger it holds and takes --overwrite --same-records."""
    import shutil

    root = consortium["root"]
    site = tmp_path / "hospital_b-site"
    shutil.copytree(root / "hospital_b" / "site", site)
    spent = _json(runner.invoke(app, ["budget", "--site", str(site), "--json"]))["epsilon"]
    (site / "site.json").unlink()
    store = str(root / "hospital_b" / "embeddings.safetensors")
    base = ["site", "--store", store, "--name", "hospital_b", "--min-records", "5", "--out", str(site)]
    r = runner.invoke(app, [*base, "--overwrite", "--json"])
    assert r.exit_code == 2 and "site-ledger.json" in r.output and "--overwrite --same-records" in r.output, r.output
    assert "A new folder would start them at ε = 0" in json.loads(r.stdout)["error"]
    got = _json(runner.invoke(app, [*base, "--overwrite", "--same-records", "--json"]))
    assert got["spent_epsilon"] == pytest.approx(spent, rel=1e-9) and (site / "site.json").is_file()


def test_a_folder_without_site_json_given_as_site_is_a_usage_error_everywhere(consortium, tmp_path):
    """A release folder given as --site: evaluate exited 4 ("artifact", "site file not found") where budget said
    exit 2 and what to give (a helper's)."""
    root = consortium["root"]
    for args in (["evaluate", "--site", str(root / "release"), "--synthetic", str(root / "synthetic.safetensors")],
                 ["budget", "--site", str(root / "release")],
                 ["audit", "--run", str(root / "release"), "--site", str(tmp_path / "nowhere")]):
        r = runner.invoke(app, [*args, "--json"])
        assert r.exit_code == 2, (args, r.output)
        assert "give a site folder written by `fedhype site`" in json.loads(r.stdout)["error"], r.output
