"""`fedhype embed` at the CLI: image trees made from real digits, exit codes, --json contract."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from fedhype.cli.main import app
from fedhype.data.store import EmbeddingStore

runner = CliRunner()


def _tree(root: Path, classes=("0", "1", "2"), per_class: int = 4) -> Path:
    """root/<class>/<i>.png: real UCI optdigits upscaled 4× (32 × 32 grey PNGs)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        rows = np.flatnonzero(d.target == int(c))[:per_class]
        for i in rows:
            px = np.kron(np.round(d.images[i] * 255 / 16), np.ones((4, 4))).astype(np.uint8)
            Image.fromarray(px, "L").save(root / c / f"{i:04d}.png")
    return root


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _embed(*args: str):
    return runner.invoke(app, ["embed", *args])


@pytest.fixture()
def tiny(tiny_dinov2_dir, tmp_path, monkeypatch) -> list[str]:
    # image folders are cached by content: keep the test's cache out of the user's ~/.cache (the hf: encoder
    # reads its own directory, not $FEDHYPE_CACHE)
    monkeypatch.setenv("FEDHYPE_CACHE", str(tmp_path / "cache"))
    return ["--encoder", f"hf:{tiny_dinov2_dir}", "--image-size", "28", "--device", "cpu", "--workers", "0"]


def test_folder_with_bad_files_is_embedded_and_they_are_listed(tmp_path, tiny):
    root = _tree(tmp_path / "imgs")
    victim = sorted((root / "1").iterdir())[0]
    _truncate(victim)
    (root / "2" / "notes.txt").write_text("not an image")
    out = tmp_path / "store.safetensors"
    res = _embed("--images", str(root), *tiny, "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert set(got) == {"store", "n", "dim", "encoder", "weights_hash", "class_counts", "domain_counts", "skipped",
                        "duplicates", "label_conflicts", "empty_classes", "small_images", "images_per_s", "from_cache",
                        "image_size", "layout", "splits"}
    assert got["label_conflicts"] == [] and got["empty_classes"] == [] and got["small_images"] is None
    assert got["image_size"] == 28 and got["layout"] == "class" and got["splits"] is None
    assert got["n"] == 11 and got["dim"] == 32 and got["class_counts"] == {"0": 4, "1": 3, "2": 4}
    assert got["domain_counts"] == {"imgs": 11}
    skipped = {s["file"]: s["reason"] for s in got["skipped"]}
    assert set(skipped) == {f"1/{victim.name}", "2/notes.txt"}
    assert "truncated" in skipped[f"1/{victim.name}"] and "not an image" in skipped["2/notes.txt"]
    store = EmbeddingStore.load(out)
    assert len(store) == 11 and store.meta["kind"] == "real" and store.meta["weights_hash"] == got["weights_hash"]
    assert store.meta["skipped"] == got["skipped"] and store.meta["source"]["root"] == str(root)
    for k in range(5):  # seven skipped files: the first five named on stderr, the other two in the summary, once each
        (root / "2" / f"notes{k}.txt").write_text("not an image")
    res = _embed("--images", str(root), *tiny, "--out", str(out), "--overwrite")
    assert res.exit_code == 0, res.output
    for name in ["1/" + victim.name, "2/notes.txt", *(f"2/notes{k}.txt" for k in range(5))]:
        assert (res.stdout + res.stderr).count(name + ":") == 1, (name, res.stdout, res.stderr)
    assert "│ 7 (the first 5 named on stderr" in res.stdout


def test_strict_refuses_a_truncated_file(tmp_path, tiny):
    root = _tree(tmp_path / "imgs")
    victim = sorted((root / "0").iterdir())[1]
    _truncate(victim)
    res = _embed("--images", str(root), *tiny, "--strict", "--out", str(tmp_path / "s.safetensors"), "--json")
    assert res.exit_code == 2
    assert victim.name in json.loads(res.stdout)["error"]
    assert not (tmp_path / "s.safetensors").exists()


def test_empty_class_folder_is_a_clear_error(tmp_path, tiny):
    root = _tree(tmp_path / "imgs")
    (root / "3").mkdir()
    res = _embed("--images", str(root), *tiny, "--out", str(tmp_path / "s.safetensors"), "--json")
    assert res.exit_code == 2 and "class folder" in res.stdout and "is empty" in res.stdout


def test_empty_input_folder_is_a_clear_error(tmp_path, tiny):
    (tmp_path / "empty").mkdir()
    res = _embed("--images", str(tmp_path / "empty"), *tiny, "--out", str(tmp_path / "s.safetensors"), "--json")
    assert res.exit_code == 2 and "no usable image" in json.loads(res.stdout)["error"]


def test_only_non_image_files_is_a_clear_error(tmp_path, tiny):
    (tmp_path / "imgs" / "cats").mkdir(parents=True)
    (tmp_path / "imgs" / "cats" / "readme.md").write_text("# nothing here")
    res = _embed("--images", str(tmp_path / "imgs"), *tiny, "--out", str(tmp_path / "s.safetensors"), "--json")
    assert res.exit_code == 2 and "no usable image" in json.loads(res.stdout)["error"]


@pytest.mark.parametrize("args", [[], ["--images", "{tmp}", "--dataset", "digits-domains"]])
def test_exactly_one_input(tmp_path, args):
    args = [str(tmp_path) if a == "{tmp}" else a for a in args]
    res = _embed(*args, "--out", str(tmp_path / "s.safetensors"), "--json")
    assert res.exit_code == 2 and "exactly one of --images DIR or --dataset NAME" in res.stdout


def test_unknown_dataset_lists_the_builtin_ones(tmp_path):
    res = _embed("--dataset", "cifar-10", "--out", str(tmp_path / "s.safetensors"), "--json")
    assert res.exit_code == 2
    err = json.loads(res.stdout)["error"]
    assert "cifar-10" in err and "digits-domains" in err and "fashion-mnist" in err


def test_unknown_encoder_lists_the_known_ones(tmp_path):
    root = _tree(tmp_path / "imgs", per_class=1)
    res = _embed("--images", str(root), "--encoder", "resnet-9000", "--out", str(tmp_path / "s.safetensors"), "--json")
    assert res.exit_code == 2
    err = json.loads(res.stdout)["error"]
    assert "resnet-9000" in err and "dinov2-vits14" in err and "hf:<hub-id-or-local-dir>" in err


def test_hub_id_without_network_says_to_pass_a_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = _tree(tmp_path / "imgs", per_class=1)
    res = _embed("--images", str(root), "--encoder", "hf:facebook/dinov2-base", "--out", str(tmp_path / "s.st"))
    assert res.exit_code == 2 and "local directory" in res.output


def test_builtin_dataset_with_the_default_bundled_encoder(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHYPE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "digits.safetensors"
    args = ["--dataset", "digits-domains", "--limit", "40", "--image-size", "28", "--device", "cpu", "--workers", "1"]
    res = _embed(*args, "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["encoder"] == "dinov2-vits14" and got["dim"] == 384 and got["n"] == 40 and got["from_cache"] is False
    assert list(got["domain_counts"]) == ["mnist", "optdigits", "mnist-m", "rotated-mnist"]
    assert sum(got["class_counts"].values()) == 40 and got["skipped"] == []
    store = EmbeddingStore.load(out)
    assert store.meta["source"]["dataset"] == "digits-domains" and store.meta["preprocess"]["crop"] == 28
    # the same request again is served from the embedding cache (the one `fedhype run` uses) …
    (cached,) = (tmp_path / "cache" / "embeddings").iterdir()
    res = _embed(*args, "--out", str(tmp_path / "again.safetensors"), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["from_cache"] is True
    assert EmbeddingStore.load(tmp_path / "again.safetensors").digest() == store.digest()
    # … unless --no-cache; another subset is a miss
    res = _embed(*args, "--no-cache", "--out", str(tmp_path / "fresh.safetensors"), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["from_cache"] is False
    res = _embed(*args[:2], "--limit", "20", *args[4:], "--out", str(tmp_path / "other.safetensors"), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["from_cache"] is False and json.loads(res.stdout)["n"] == 20
    assert len(list((tmp_path / "cache" / "embeddings").iterdir())) == 2 and cached.exists()


def test_a_limit_that_leaves_classes_without_a_record_is_warned_about(tmp_path, tiny):
    """A probe's `embed --limit 3` on 5 class folders wrote a store listing 2 classes with no record, silently."""
    root = _tree(tmp_path / "imgs", classes=("0", "1", "2", "3", "4"), per_class=2)
    r = _embed("--images", str(root), *tiny, "--limit", "3", "--out", str(tmp_path / "s.safetensors"), "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert sum(v > 0 for v in got["class_counts"].values()) == 3
    empty = sorted(k for k, v in got["class_counts"].items() if v == 0)
    assert got["empty_classes"] == empty and len(empty) == 2
    err = " ".join(r.stderr.split())
    assert f"warning: classes {', '.join(empty)} have no record in {tmp_path / 's.safetensors'}: a class with no " \
           "record cannot be trained on (--limit 3 keeps 3 image(s) of 5 classes; give a larger --limit" in err, err
    r = _embed("--images", str(root), *tiny, "--limit", "5", "--out", str(tmp_path / "t.safetensors"), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["empty_classes"] == [] and "no record" not in r.stderr


def test_tiny_images_are_warned_about_once_with_a_count_and_examples(tmp_path, tiny):
    """1×1 and 2×2 images were upscaled to the encoder's input without a word (a probe)."""
    root = _tree(tmp_path / "imgs")
    Image.new("L", (1, 1), 200).save(root / "0" / "dot.png")
    Image.new("L", (2, 2), 90).save(root / "1" / "speck.png")
    Image.new("L", (3, 40), 90).save(root / "2" / "sliver.png")  # 3 px < 28 / 8 on one side
    Image.new("L", (4, 4), 90).save(root / "2" / "four.png")  # 4 px ≥ 3.5: kept quiet
    for extra in ([], []):  # the second embed comes from the cache: the same warning
        r = _embed("--images", str(root), *tiny, "--out", str(tmp_path / "s.safetensors"), "--overwrite", "--json",
                   *extra)
        assert r.exit_code == 0, r.output
        got = json.loads(r.stdout)
        assert got["small_images"] == {"n": 3, "below_px": 3.5, "input_px": 28,
                                       "examples": ["0/dot.png (1×1)", "1/speck.png (2×2)", "2/sliver.png (3×40)"]}
        err = " ".join(r.stderr.split())
        assert err.count("have a side below") == 1 and ("3 image(s) have a side below 3.5 px, 1/8 of the encoder's 28 px "
                                                         "input (e.g. 0/dot.png (1×1), 1/speck.png (2×2)") in err, err
    assert got["from_cache"] is True
    assert EmbeddingStore.load(tmp_path / "s.safetensors").meta["small_images"]["n"] == 3


def test_a_byte_identical_image_under_two_classes_is_a_label_conflict(tmp_path, tiny):
    """A probe's image copied into two class folders was reported only as a duplicate."""
    import shutil

    root = _tree(tmp_path / "imgs")
    first = sorted((root / "0").iterdir())[0]
    shutil.copyfile(first, root / "2" / "also.png")
    shutil.copyfile(sorted((root / "1").iterdir())[0], root / "1" / "same-class-copy.png")  # a duplicate only
    r = _embed("--images", str(root), *tiny, "--out", str(tmp_path / "s.safetensors"), "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert len(got["duplicates"]) == 2
    assert got["label_conflicts"] == [{"files": [f"0/{first.name}", "2/also.png"], "classes": ["0", "2"]}]
    err = " ".join(r.stderr.split())
    assert "2 image file(s) are byte-identical copies of others" in err
    assert (f"1 image(s) are stored byte-identical under different classes, so their labels conflict (e.g. 0/{first.name} "
            "(class 0) = 2/also.png (class 2)): one image cannot be of two classes") in err, err


def test_the_python_api_and_the_job_warn_as_embed_does(tmp_path, tiny, tiny_dinov2_dir):
    """A probe: `fedhype embed` warned of byte-identical copies, label conflicts and unreadable files, while
    `fedhype.embed` and `fedhype run` said nothing (the README: the API raises what the CLI prints as warnings)."""
    import shutil
    import warnings

    import fedhype
    from fedhype.errors import FedhypeWarning
    from fedhype.pipeline.config import DEFAULTS
    from fedhype.pipeline.job import embed_store

    root = _tree(tmp_path / "imgs")
    first = sorted((root / "0").iterdir())[0]
    shutil.copyfile(first, root / "2" / "also.png")
    _truncate(sorted((root / "1").iterdir())[0])
    for attempt in ("embedded", "from the cache"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store = fedhype.embed(root, encoder=f"hf:{tiny_dinov2_dir}", image_size=28, layout="class", device="cpu",
                                  progress=False)
        said = [str(w.message) for w in caught if issubclass(w.category, FedhypeWarning)]
        assert len(store) == 12 and len(said) == 3, (attempt, said)
        assert said[0].startswith("embed: 1 image file(s) are byte-identical copies of others (e.g. 0/")
        assert said[1].startswith("embed: 1 image(s) are stored byte-identical under different classes")
        assert said[2].startswith("embed: 1 image file(s) could not be read and were skipped (e.g. 1/")
        assert caught[0].filename == __file__  # raised at the caller's line
    # the job's embed stage logs the same texts, naming its own key for the subset
    d = {**DEFAULTS["data"], "images": str(root), "dataset": "", "encoder": f"hf:{tiny_dinov2_dir}", "image_size": 28,
         "layout": "class", "device": "cpu", "limit": 0, "cache_dir": ""}
    lines: list[str] = []
    embed_store(d, progress=False, warn=lines.append)
    assert ["embed: " + x for x in lines] == said
    lines = []
    embed_store({**d, "limit": 2}, progress=False, warn=lines.append)
    assert any("has no record in the store" in x and "(data.limit 2 keeps 2 image(s) of 3 classes" in x for x in lines)


def test_more_than_five_skipped_files_are_counted_on_stderr(tmp_path, tiny):
    """A helper's `embed --json` listed 14 skipped files in the JSON and 5 `skipped:` lines on stderr, with no word of
    the other 9 (the README promises a count): a line now says how many more, and where they are listed."""
    root = _tree(tmp_path / "imgs")
    for i in range(8):
        (root / "2" / f"notes-{i}.txt").write_text("not an image")
    res = _embed("--images", str(root), *tiny, "--out", str(tmp_path / "s.safetensors"), "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert len(got["skipped"]) == 8
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("skipped:")]
    assert len(lines) == 6 and "… and 3 more file(s) (8 in all" in lines[-1], res.stderr


def test_file_names_with_control_characters_print_on_one_line_without_escapes(tmp_path, tiny):
    """A helper's file named "bad\\nskipped: nothing to see.png" printed as two skipped files, one with ESC[31m in its
    name turned the terminal red, and a copied image named "dup\\ncopy.png" broke the duplicate warning across lines."""
    import shutil

    root = _tree(tmp_path / "imgs")
    (root / "1" / "bad\nskipped: nothing to see.png").write_bytes(b"")
    (root / "1" / "esc\x1b[31mRED.png").write_bytes(b"not a png")
    shutil.copyfile(sorted((root / "0").iterdir())[0], root / "0" / "dup\ncopy.png")
    for json_mode in ([], ["--json"]):
        res = _embed("--images", str(root), *tiny, "--out", str(tmp_path / "s.safetensors"), "--overwrite", *json_mode)
        assert res.exit_code == 0, res.output
        text = res.stderr + ("" if json_mode else res.stdout)
        assert "\x1b[31m" not in text and "\\x1b[31mRED.png" in text
        assert "bad\\nskipped: nothing to see.png" in text
        assert not any(ln.startswith("skipped: nothing to see") for ln in text.splitlines())
        assert any("dup\\ncopy.png" in ln and "0000" in ln for ln in text.splitlines()), text
