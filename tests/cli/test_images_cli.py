"""Your own images at the CLI: --layout, split folders through `fedhype partition` and `fedhype run`,
the content-hash embedding cache, one preprocessing for `embed` and `run`, and a job refused before it
writes anything. Image folders are real UCI optdigits (sklearn load_digits) written as PNG files; the
encoder is the tiny saved DINOv2 directory (tests/conftest.py), the cache a temporary $FEDHYPE_CACHE."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from fedhype.cli.main import app
from fedhype.data.partition import Partition
from fedhype.data.store import EmbeddingStore, opaque_id
import image_trees  # tests/image_trees.py
from image_trees import digit_rows as _rows
from image_trees import patient_tree
from image_trees import save_digit as _save

runner = CliRunner()
def split_tree(root: Path, train: int = 10, test: int = 4) -> Path:
    """train|test/<digit>/<i>.png for digits 0, 1, 2."""
    return image_trees.split_tree(root, train=train, test=test)


def _json(r):
    assert r.stdout.count("\n") == 1, r.output
    return json.loads(r.stdout)


@pytest.fixture()
def enc(tiny_dinov2_dir, tmp_path, monkeypatch) -> list[str]:
    monkeypatch.setenv("FEDHYPE_CACHE", str(tmp_path / "cache"))
    return ["--encoder", f"hf:{tiny_dinov2_dir}", "--device", "cpu", "--workers", "0"]


def test_embed_layout_class_keeps_patients_in_their_class_and_auto_refuses(tmp_path, enc):
    root = patient_tree(tmp_path / "clinic")
    r = runner.invoke(app, ["embed", "--images", str(root), *enc, "--out", str(tmp_path / "a.safetensors"), "--json"])
    assert r.exit_code == 2
    err = _json(r)["error"]
    assert "ambiguous layout" in err and "--layout class (classes benign, malignant, normal" in err
    assert "--layout domain/class (domains benign, malignant, normal; classes patient_00" in err
    assert not (tmp_path / "a.safetensors").exists()
    r = runner.invoke(app, ["embed", "--images", str(root), "--layout", "class", *enc,
                            "--out", str(tmp_path / "a.safetensors"), "--json"])
    assert r.exit_code == 0, r.output
    got = _json(r)
    assert got["class_counts"] == {"benign": 4, "malignant": 4, "normal": 4} and got["domain_counts"] == {"clinic": 12}
    assert got["layout"] == "class" and got["from_cache"] is False
    store = EmbeddingStore.load(tmp_path / "a.safetensors")
    assert store.meta["source"]["layout"] == "class" and store.meta["source"]["layout_asked"] == "class"
    r = runner.invoke(app, ["embed", "--images", str(root), "--layout", "flat", *enc,
                            "--out", str(tmp_path / "b.safetensors"), "--json"])
    assert r.exit_code == 2 and "flat" in r.output


def test_second_embed_of_the_same_files_comes_from_the_cache(tmp_path, enc, monkeypatch):
    import fedhype.encoders.embed as embed_mod

    root = patient_tree(tmp_path / "clinic")
    args = ["embed", "--images", str(root), "--layout", "class", *enc, "--image-size", "28", "--json"]
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "first.safetensors")])
    assert r.exit_code == 0 and _json(r)["from_cache"] is False, r.output
    first = EmbeddingStore.load(tmp_path / "first.safetensors")
    cache = tmp_path / "cache" / "embeddings"
    (entry,) = cache.iterdir()
    # the same files in another place: served from the cache, the encoder is never run
    moved = tmp_path / "elsewhere" / "clinic"
    moved.parent.mkdir()
    root.rename(moved)
    monkeypatch.setattr(embed_mod, "embed_source", lambda *a, **k: pytest.fail("embedded again"))
    r = runner.invoke(app, ["embed", "--images", str(moved), *args[3:], "--out", str(tmp_path / "second.safetensors")])
    assert r.exit_code == 0 and _json(r)["from_cache"] is True, r.output
    second = EmbeddingStore.load(tmp_path / "second.safetensors")
    assert torch.equal(second.embeddings, first.embeddings) and second.sample_ids == first.sample_ids
    assert second.meta["cache_key"] == first.meta["cache_key"] and second.meta["source"]["root"] == str(moved)
    assert second.meta["cache_key"]["layout"] == "class" and second.meta["cache_key"]["image_size"] == 28
    monkeypatch.undo()
    monkeypatch.setenv("FEDHYPE_CACHE", str(tmp_path / "cache"))
    # one changed byte of one file is a miss; --no-cache embeds again and leaves nothing in the cache
    victim = sorted((moved / "normal").rglob("*.png"))[0]
    Image.fromarray(np.zeros((32, 32), np.uint8), "L").save(victim)
    r = runner.invoke(app, ["embed", "--images", str(moved), *args[3:], "--no-cache",
                            "--out", str(tmp_path / "third.safetensors")])
    assert r.exit_code == 0 and _json(r)["from_cache"] is False
    assert sorted(cache.iterdir()) == [entry]
    r = runner.invoke(app, ["embed", "--images", str(moved), *args[3:], "--out", str(tmp_path / "fourth.safetensors")])
    assert r.exit_code == 0 and _json(r)["from_cache"] is False
    assert len(list(cache.iterdir())) == 2


def test_partition_uses_the_given_train_and_test_folders(tmp_path, enc):
    root = split_tree(tmp_path / "digits")
    r = runner.invoke(app, ["embed", "--images", str(root), *enc, "--image-size", "28",
                            "--out", str(tmp_path / "s.safetensors"), "--json"])
    assert r.exit_code == 0, r.output
    got = _json(r)
    assert got["layout"] == "class" and got["splits"] == {"train": 30, "test": 12}
    assert got["domain_counts"] == {"digits": 42}  # train/ and test/ are splits, not two domains
    r = runner.invoke(app, ["partition", "--store", str(tmp_path / "s.safetensors"), "--scheme", "iid", "--clients", "2",
                            "--min-records", "5", "--out", str(tmp_path / "p.json"), "--json"])
    assert r.exit_code == 0, r.output
    assert "using the splits the image folders give (train, test)" in r.stderr and "val drawn" in r.stderr
    assert _json(r)["given_splits"] == {"given": ["train", "test"], "drawn_from_train": {"val": 0.25}}
    part = Partition.load(tmp_path / "p.json")
    tests = sorted(s for c in part.clients for s in c.test)
    assert tests == sorted(opaque_id(str(p.relative_to(root))) for p in (root / "test").rglob("*.png"))
    trains = {opaque_id(str(p.relative_to(root))) for p in (root / "train").rglob("*.png")}
    assert all(s in trains for c in part.clients for s in c.train + c.val)
    r = runner.invoke(app, ["partition", "--store", str(tmp_path / "s.safetensors"), "--scheme", "iid", "--clients", "2",
                            "--min-records", "5", "--draw-splits", "--out", str(tmp_path / "q.json"), "--json"])
    assert r.exit_code == 0 and _json(r)["given_splits"] is None and "using the splits" not in r.stderr


SMALL_JOB = ["--set", "train.rounds=1", "--set", "train.batch_size=16", "--set", "train.seed=0",
             "--set", "train.epsilon=8", "--set", "partition.min_records=5", "--set", "train.min_records=5", "--set", "synthesis.per_class=20",
             "--set", "evaluate.permutations=10", "--set", "evaluate.interpolation=false",
             "--set", "evaluate.dp_linear=false", "--set", "evaluate.prototypes=false",
             "--set", "evaluate.code_domain=false", "--set", "model.hidden=16", "--set", "model.latent=4",
             "--set", "model.hyper_hidden=8", "--set", "model.code_dim=4"]


def test_run_checks_the_job_before_writing_then_embeds_like_embed_and_keeps_the_splits(tmp_path, enc, tiny_dinov2_dir,
                                                                                      monkeypatch):
    import fedhype.pipeline.job as job

    root = split_tree(tmp_path / "digits")
    out = tmp_path / "job"
    data = ["--set", f"data.images='{root}'", "--set", "data.device='cpu'", "--set", "partition.scheme='iid'",
            "--set", "partition.clients=2"]
    # a typo in the encoder name or the layout is refused before anything is embedded or written
    real = job._embed_store
    monkeypatch.setattr(job, "_embed_store", lambda *a, **k: pytest.fail("embedded before the job was checked"))
    for bad, needle in (("data.encoder='dinov2-vitS14'", "data.encoder = 'dinov2-vitS14': unknown encoder"),
                        ("data.layout='flat'", "data.layout must be one of auto, class, domain/class, got 'flat'"),
                        ("data.pooling='max'", "data.pooling must be one of"),
                        (f"data.images='{tmp_path / 'nope'}'", "no such folder")):
        given = data[2:] if bad.startswith("data.images=") else data  # one data.images (twice is refused)
        r = runner.invoke(app, ["run", "--out", str(out), *given, "--set", bad, *SMALL_JOB, "--json"])
        assert r.exit_code == 2 and needle in _json(r)["error"], r.output
        assert not out.exists()
    monkeypatch.setattr(job, "_embed_store", real)
    # `fedhype embed` with the encoder's default size, then `fedhype run` with its default data.image_size (0):
    # the same preprocessing, so the run's embeddings are the cached ones, identical
    r = runner.invoke(app, ["embed", "--images", str(root), *enc, "--out", str(tmp_path / "e.safetensors"), "--json"])
    assert r.exit_code == 0, r.output
    assert _json(r)["image_size"] == 56  # the tiny model's own input size (its config)
    r = runner.invoke(app, ["run", "--out", str(out), *data, "--set", f"data.encoder='hf:{tiny_dinov2_dir}'",
                            "--set", f"data.cache_dir='{tmp_path / 'cache' / 'embeddings'}'", *SMALL_JOB, "--json"])
    assert r.exit_code == 0, r.output
    assert "from the embedding cache" in r.stderr and "read as layout 'class' (detected)" in r.stderr
    assert "partition: using the splits the image folders give (train, test)" in r.stderr
    mine = EmbeddingStore.load(out / "embeddings.safetensors")
    theirs = EmbeddingStore.load(tmp_path / "e.safetensors")
    assert torch.equal(mine.embeddings, theirs.embeddings) and mine.meta["preprocess"] == theirs.meta["preprocess"]
    part = Partition.load(out / "partition.json")
    assert sorted(s for c in part.clients for s in c.test) == sorted(opaque_id(s) for s in mine.sample_ids if s.startswith("test/"))
    assert json.loads((out / "config.json").read_text())["data"]["layout"] == "auto"


def test_rerun_refuses_a_changed_image_folder_and_a_too_small_test_split_before_training(tmp_path, enc, tiny_dinov2_dir):
    """A new user's findings: rerunning a finished job after one image changed is refused (the job's ε
    belongs to the old files), and a test split too small for PRDC's k is refused before any ε is spent."""
    root = split_tree(tmp_path / "digits")
    data = ["--set", f"data.images='{root}'", "--set", "data.device='cpu'", "--set", "partition.scheme='iid'",
            "--set", "partition.clients=2", "--set", f"data.encoder='hf:{tiny_dinov2_dir}'"]
    small = tmp_path / "small-job"
    r = runner.invoke(app, ["run", "--out", str(small), *data, *SMALL_JOB, "--set", "evaluate.k=12", "--json"])
    assert r.exit_code == 2, r.output
    assert "leaves 12 real test record(s) over 2 client(s)" in _json(r)["error"] and "evaluate.k = 12" in _json(r)["error"]
    assert not (small / "run").exists() and not (small / "config.json").exists()  # nothing trained, nothing written
    out = tmp_path / "job"
    r = runner.invoke(app, ["run", "--out", str(out), *data, *SMALL_JOB, "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["run", "--out", str(out), *data, *SMALL_JOB, "--json"])  # the same files: it resumes
    assert r.exit_code == 0, r.output
    _save(root, "train/0/extra.png", int(_rows(0, 1, skip=30)[0]))
    r = runner.invoke(app, ["run", "--out", str(out), *data, *SMALL_JOB, "--json"])
    assert r.exit_code == 2, r.output
    assert "changed since this job embedded it" in _json(r)["error"] and "42 → 43 images" in _json(r)["error"]
    (root / "train/0/extra.png").unlink()
    first = sorted((root / "train/1").glob("*.png"))[0]
    _save(root, f"train/1/{first.name}", int(_rows(1, 1, skip=40)[0]))  # same name, other pixels
    r = runner.invoke(app, ["run", "--out", str(out), *data, *SMALL_JOB, "--json"])
    assert r.exit_code == 2 and "other content" in _json(r)["error"], r.output


def test_folder_edge_cases_get_clear_errors_and_the_cache_follows_content(tmp_path, enc, monkeypatch):
    # a renamed domain/class folder is found in the cache (the cache file name holds no folder name; with
    # --layout class the top folder names the domain, so there a rename is a different store)
    sites = tmp_path / "sites"
    for site, skip in (("site_a", 0), ("site_b", 3)):
        for label in range(2):
            for i in _rows(label, 3, skip=skip):
                _save(sites, f"{site}/{label}/{i}.png", i)
    r = runner.invoke(app, ["embed", "--images", str(sites), "--layout", "domain/class", *enc,
                            "--out", str(tmp_path / "a.safetensors"), "--json"])
    assert r.exit_code == 0 and _json(r)["from_cache"] is False and _json(r)["layout"] == "domain/class", r.output
    moved = sites.rename(tmp_path / "sites-renamed")
    r = runner.invoke(app, ["embed", "--images", str(moved), "--layout", "domain/class", *enc,
                            "--out", str(tmp_path / "b.safetensors"), "--json"])
    assert r.exit_code == 0 and _json(r)["from_cache"] is True, r.output
    renamed = split_tree(tmp_path / "digits")
    # --limit: the split counts are those of the subset kept
    r = runner.invoke(app, ["embed", "--images", str(renamed), *enc, "--limit", "12", "--no-cache",
                            "--out", str(tmp_path / "c.safetensors"), "--json"])
    assert r.exit_code == 0, r.output
    got = _json(r)
    assert got["n"] == 12 and sum(got["splits"].values()) == 12
    # a symlink loop below a class folder: a clear error (exit 2), not a traceback
    loop = tmp_path / "loop"
    _save(loop, "a/1.png", 0)
    _save(loop, "b/1.png", 1)
    (loop / "a" / "again").symlink_to(loop, target_is_directory=True)
    r = runner.invoke(app, ["embed", "--images", str(loop), "--layout", "class", *enc,
                            "--out", str(tmp_path / "d.safetensors"), "--json"])
    assert r.exit_code == 2 and "symlink loop" in _json(r)["error"], r.output
    # an unwritable cache folder names the folder and the way out
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FEDHYPE_CACHE", str(blocker))
    r = runner.invoke(app, ["embed", "--images", str(renamed), *enc, "--out", str(tmp_path / "e.safetensors"), "--json"])
    assert r.exit_code == 2 and "cannot write the embedding cache" in _json(r)["error"], r.output
    assert not (tmp_path / "e.safetensors").exists()
    # an unquoted number for a folder name
    r = runner.invoke(app, ["run", "--out", str(tmp_path / "job"), "--set", "data.images=2024", "--json"])
    assert r.exit_code == 2 and "data.images must be a string" in _json(r)["error"], r.output


def test_a_class_without_training_records_is_warned_about(tmp_path, enc, tiny_dinov2_dir):
    root = split_tree(tmp_path / "digits")
    for i in _rows(3, 6):  # class 3 only under test/
        _save(root, f"test/3/{i}.png", i)
    data = ["--set", f"data.images='{root}'", "--set", "data.device='cpu'", "--set", "partition.scheme='iid'",
            "--set", "partition.clients=2", "--set", f"data.encoder='hf:{tiny_dinov2_dir}'"]
    r = runner.invoke(app, ["run", "--out", str(tmp_path / "job"), *data, *SMALL_JOB, "--json"])
    assert r.exit_code == 0, r.output
    assert "no client has a training record of class(es) ['3']" in r.stderr
    # the synthesis' warning for that class's samples was only in report.md: the log says it too
    line = [ln for ln in r.stderr.splitlines() if "synthesize: warning:" in ln and "absent" in ln]
    assert line and "3" in line[0], r.stderr[-2000:]


def test_unreadable_files_are_in_the_report_and_data_strict_stops_on_them(tmp_path, enc, tiny_dinov2_dir):
    """A probe's `fedhype run` skipped unreadable images with a warning on stderr only: report.md said nothing, `run` had
    no `embed --strict`, and a zero-byte file was "not an image". The report lists them (report.json data_warnings,
    report.md), data.strict stops on the first one before anything is written, and a rerun may change data.strict."""
    root = split_tree(tmp_path / "digits")
    (root / "train" / "1" / "empty.png").write_bytes(b"")  # an interrupted copy
    good = (root / "train" / "2" / f"{_rows(2, 1)[0]}.png").read_bytes()
    (root / "train" / "2" / "cut.png").write_bytes(good[: len(good) // 2])  # truncated
    out = tmp_path / "job"
    data = ["--set", f"data.images='{root}'", "--set", "data.device='cpu'", "--set", "partition.scheme='iid'",
            "--set", "partition.clients=2", "--set", f"data.encoder='hf:{tiny_dinov2_dir}'"]
    r = runner.invoke(app, ["run", "--out", str(out), *data, "--set", "data.strict=true", *SMALL_JOB, "--json"])
    assert r.exit_code == 2, r.output
    err = _json(r)["error"]
    assert "unusable file" in err and "empty.png: an empty file (0 bytes)" in err and "drop --strict" in err, err
    assert not out.exists()  # refused before the job wrote anything
    r = runner.invoke(app, ["run", "--out", str(out), *data, *SMALL_JOB, "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "report.json").read_text())
    said = [w for w in rep["data_warnings"] if "could not be read and were skipped" in w]
    assert len(said) == 1 and said[0].startswith("2 image file(s)"), rep["data_warnings"]
    assert f"- data warning: {said[0]}" in (out / "report.md").read_text()
    # the finished job reruns with data.strict given now: the store is reused, nothing is read or refused
    r = runner.invoke(app, ["run", "--out", str(out), *data, "--set", "data.strict=true", *SMALL_JOB, "--json"])
    assert r.exit_code == 0, r.output
    # the folder's cache key hashes an empty file's reason as worded before (a job embedded then resumes: a review)
    import hashlib

    from fedhype.data.images import EMPTY_FILE, NOT_AN_IMAGE, scan_image_folder
    from fedhype.encoders.cache import image_files_key

    source = scan_image_folder(root)
    assert {"file": "train/1/empty.png", "reason": EMPTY_FILE} in source.skipped
    lines = sorted(f"{x['file']}\t{NOT_AN_IMAGE if x['file'].endswith('empty.png') else x['reason']}"
                   for x in source.skipped)
    assert image_files_key(source)["skipped"] == hashlib.sha256("\n".join(lines).encode()).hexdigest()
    # `embed --strict` on a folder whose cached store skipped a file that failed to decode stops too (a review: the
    # cache hit skipped it silently)
    from fedhype.encoders import cache

    (root / "train" / "1" / "empty.png").unlink()
    (root / "train" / "2" / "cut.png").unlink()
    r = runner.invoke(app, ["embed", "--images", str(root), *enc, "--out", str(tmp_path / "a.safetensors"), "--json"])
    assert r.exit_code == 0, r.output
    hit = EmbeddingStore.load(tmp_path / "a.safetensors")
    hit.meta["skipped"] = [{"file": "train/0/x.png", "reason": "corrupt or truncated image (OSError: broken data)"}]
    with pytest.raises(Exception, match="cannot decode image train/0/x.png: corrupt or truncated"):
        cache.check_strict_hit(hit)
    for path in (tmp_path / "cache" / "embeddings").glob("*.safetensors"):  # the cache entry of this folder, edited
        if EmbeddingStore.load(path).meta.get("source", {}).get("root") == str(root):
            hit.meta["cache_key"] = EmbeddingStore.load(path).meta["cache_key"]
            hit.save(path)
    r = runner.invoke(app, ["embed", "--images", str(root), *enc, "--strict", "--out", str(tmp_path / "b.safetensors"),
                            "--json"])
    assert r.exit_code == 2 and "cannot decode image train/0/x.png" in _json(r)["error"], r.output


def test_a_one_class_folder_is_refused_before_any_epsilon_is_spent(tmp_path, enc, tiny_dinov2_dir):
    """A new user's finding: `run` on images of one class trained all its rounds (ε spent), then stopped in
    the evaluation ("y must hold at least two classes") on every rerun."""
    root = tmp_path / "one"
    for split, n in (("train", 30), ("test", 8)):
        for i in _rows(1, n, skip=0 if split == "train" else 30):
            _save(root, f"{split}/trouser/{i}.png", i)
    data = ["--set", f"data.images='{root}'", "--set", "data.device='cpu'", "--set", "partition.scheme='iid'",
            "--set", "partition.clients=2", "--set", f"data.encoder='hf:{tiny_dinov2_dir}'"]
    out = tmp_path / "job"
    r = runner.invoke(app, ["run", "--out", str(out), *data, *SMALL_JOB, "--json"])
    assert r.exit_code == 2, r.output
    err = _json(r)["error"]
    assert "hold 1 class(es) ('trouser')" in err and "at least two" in err and "nothing was trained" in err
    assert not (out / "run").exists() and not (out / "config.json").exists()


def test_byte_identical_image_files_are_warned_about_and_listed(tmp_path, enc):
    """One image stored twice is two records: protected only as a group of two. `fedhype embed` finds
    byte-identical files from the content hashes it computes for the cache (with --no-cache too), warns
    and lists them in --json (it had counted them silently; a new user's probe)."""
    import shutil

    root = patient_tree(tmp_path / "clinic")
    first = sorted((root / "benign").rglob("*.png"))[0]
    copy = first.parent / "copy-of-first.png"
    shutil.copyfile(first, copy)
    for extra in ([], ["--no-cache"]):
        r = runner.invoke(app, ["embed", "--images", str(root), "--layout", "class", *enc, *extra,
                                "--out", str(tmp_path / f"d{len(extra)}.safetensors"), "--json"])
        assert r.exit_code == 0, r.output
        got = _json(r)
        assert got["duplicates"] == [sorted([str(first.relative_to(root)), str(copy.relative_to(root))])]
        assert "1 image file(s) are byte-identical copies of others" in r.stderr and "group of k" in r.stderr
    clean = patient_tree(tmp_path / "clean")
    r = runner.invoke(app, ["embed", "--images", str(clean), "--layout", "class", *enc,
                            "--out", str(tmp_path / "c.safetensors"), "--json"])
    assert r.exit_code == 0 and _json(r)["duplicates"] == [] and "byte-identical" not in r.stderr


def test_synthesis_and_evaluation_settings_are_refused_before_any_epsilon_is_spent(tmp_path, enc, tiny_dinov2_dir):
    """A new user's probe: evaluate.k = 0, evaluate.max_samples = 0, evaluate.permutations = -1, a synthesis code
    naming no client and a negative mixture weight passed the up-front checks, trained (ε spent), failed in synthesis or
    evaluation, and the folder could then neither resume with the value fixed nor finish. Each is now refused, naming
    the key, before anything is written."""
    root = split_tree(tmp_path / "digits")
    data = ["--set", f"data.images='{root}'", "--set", "data.device='cpu'", "--set", "partition.scheme='iid'",
            "--set", "partition.clients=2", "--set", f"data.encoder='hf:{tiny_dinov2_dir}'"]
    for i, (setting, says) in enumerate((("evaluate.k=0", "evaluate.k must be an integer ≥ 1"),
                                         ("evaluate.max_samples=0", "evaluate.max_samples must be an integer ≥ 2"),
                                         ("evaluate.permutations=-1", "evaluate.permutations must be an integer ≥ 0"),
                                         ("synthesis.temperature=-1", "synthesis.temperature must be a finite number > 0"),
                                         ("synthesis.temperature=1e20", "≤ 100"),
                                         ("synthesis.code='client:nosuch'", "unknown client 'nosuch'"),
                                         ("synthesis.code='mix:0=-1'", "must be a finite number ≥ 0"),
                                         # a probe: 1e30 crashed in synthesis after the release, -1 passed
                                         ("synthesis.seed=1e30", "synthesis.seed must be a whole number ≥ 0"),
                                         ("synthesis.seed=-1", "synthesis.seed must be a whole number ≥ 0"),
                                         ("evaluate.seed=-1", "evaluate.seed must be a whole number ≥ 0"),
                                         # a probe: 1e9 per class filled the memory after the release
                                         ("synthesis.per_class=1000000000", "a job draws and evaluates at most 1,000,000"))):
        out = tmp_path / f"job{i}"
        r = runner.invoke(app, ["run", "--out", str(out), *data, *SMALL_JOB, "--set", setting, "--json"])
        assert r.exit_code == 2, (setting, r.output)
        err = _json(r)["error"]
        assert says in err and "nothing was trained" in err, (setting, err)
        assert not (out / "run").exists() and not (out / "config.json").exists(), setting
    # a valid client code passes the check (the partition's client ids)
    r = runner.invoke(app, ["run", "--out", str(tmp_path / "ok"), *data, *SMALL_JOB, "--set", "synthesis.code='client:0'",
                            "--json"])
    assert r.exit_code == 0, r.output
