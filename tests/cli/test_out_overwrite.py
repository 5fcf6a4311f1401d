"""One overwrite rule for the --out of `fedhype embed`, `synthesize` and `partition`; train/run --out is a folder.

An existing --out is refused (exit 2, naming it) unless --overwrite; even with --overwrite a file is
replaced only by the command kind that wrote it (a synthetic store never replaces a real one, …).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedhype.cli.main import app
from fedhype.data.partition import Partition
from fedhype.data.store import EmbeddingStore
from fedhype.io import artifact_format

runner = CliRunner()


def _invoke(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r, (json.loads(r.stdout) if "--json" in args and r.stdout.strip() else None)


@pytest.fixture(scope="module")
def files(audit_run, real_store, tmp_path_factory):
    """A trained run, its real store and partition, a synthetic store drawn from it, and a non-fedhype file."""
    from fedhype.synthesis import synthesize

    run_dir, part = audit_run
    d = tmp_path_factory.mktemp("overwrite")
    real_store.save(d / "real.safetensors")
    part.save(d / "part.json")
    synthesize(run_dir, "neutral", per_class=2, seed=0).save(d / "syn.safetensors")
    (d / "notes.txt").write_text("my notes\n")
    return {"run": run_dir, "dir": d}


@pytest.fixture
def copy(files, tmp_path):
    """Copy one of the module's files into this test's folder (so a test may overwrite it)."""
    def make(name: str) -> Path:
        return Path(shutil.copy(files["dir"] / name, tmp_path / name))
    return make


def test_artifact_format_reads_headers_only(files):
    d = files["dir"]
    assert artifact_format(d / "real.safetensors") == "fedhype-embeddings/1 (real)"
    assert artifact_format(d / "syn.safetensors") == "fedhype-embeddings/1 (synthetic)"
    assert artifact_format(d / "part.json") == "fedhype-partition/1"
    assert artifact_format(files["run"] / "model.safetensors") == "fedhype-model/1"
    assert artifact_format(files["run"] / "ledger.json") == "fedhype-ledger/1"
    assert artifact_format(d / "notes.txt") is None


# ----------------------------------------------------------------------------- synthesize
def _synthesize(files, out, *extra):
    return _invoke("synthesize", "--run", files["run"], "--per-class", 3, "--seed", 1, "--out", out, *extra, "--json")


def test_synthesize_refuses_an_existing_out_without_overwrite(files, copy):
    out = copy("syn.safetensors")
    before = out.read_bytes()
    r, obj = _synthesize(files, out)
    assert r.exit_code == 2 and obj["kind"] == "usage"
    assert obj["error"] == (f"--out {out} already exists (a synthetic embeddings store (written by `fedhype "
                            "synthesize`)); choose another --out, or pass --overwrite to replace it")
    assert out.read_bytes() == before
    r, obj = _synthesize(files, out, "--overwrite")  # the same kind: replaced
    assert r.exit_code == 0, r.output
    assert len(EmbeddingStore.load(out)) == obj["n"] == 3 * EmbeddingStore.load(files["dir"] / "real.safetensors").n_classes


@pytest.mark.parametrize("name, what", [
    ("real.safetensors", "a real embeddings store (written by `fedhype embed`)"),
    ("part.json", "a partition (written by `fedhype partition`)"),
    ("notes.txt", "a file that is not a readable fedhype artifact"),
])
def test_synthesize_never_replaces_another_kind_even_with_overwrite(files, copy, name, what):
    out = copy(name)
    before = out.read_bytes()
    r, obj = _synthesize(files, out, "--overwrite")
    assert r.exit_code == 2, r.output
    assert obj["error"].startswith(f"--out {out} is {what}, not a synthetic embeddings store")
    assert "does not replace it, even with --overwrite" in obj["error"]
    assert out.read_bytes() == before


def test_synthesize_onto_the_runs_model_is_refused(files, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(files["run"], run)
    before = (run / "model.safetensors").read_bytes()
    r, obj = _invoke("synthesize", "--run", run, "--out", run / "model.safetensors", "--overwrite", "--json")
    assert r.exit_code == 2 and "is a trained model (written by `fedhype train`)" in obj["error"]
    assert (run / "model.safetensors").read_bytes() == before


def test_synthesize_into_a_release_folder_is_refused_even_with_overwrite(files, tmp_path):
    """A release's files are hashed in its privacy.json: replacing one broke `audit --release` (a new
    user's probe). Nor is a new file written beside them: the folder is what leaves the site, and a file its
    privacy.json does not list is outside the claim (the audit now fails on it: a later probe)."""
    from fedhype.pipeline.release import check_release, write_release

    rel = tmp_path / "rel"
    write_release(files["run"], rel, synthetic=files["dir"] / "syn.safetensors")
    before = (rel / "synthetic.safetensors").read_bytes()
    r, obj = _invoke("synthesize", "--run", files["run"], "--out", rel / "synthetic.safetensors", "--overwrite",
                     "--per-class", 2, "--json")
    assert r.exit_code == 2 and "is a file of the release folder" in obj["error"], r.output
    assert (rel / "synthetic.safetensors").read_bytes() == before and all(row["ok"] for row in check_release(rel))
    r, obj = _invoke("synthesize", "--run", files["run"], "--out", rel / "more.safetensors", "--per-class", 2, "--json")
    assert r.exit_code == 2 and "inside the release folder" in obj["error"] and not (rel / "more.safetensors").exists()
    # nor into a folder below it: a nested release, a hyper-prototype model, a run (a recipient's probe wrote the first
    # two into a received release, whose audit then failed)
    for args in (["synthesize", "--run", files["run"], "--out", tmp_path / "s.safetensors", "--release", rel / "sub",
                  "--per-class", 2],
                 ["prototypes", "train", "--synthetic", rel / "synthetic.safetensors", "--out", rel / "proto"],
                 ["train", "--store", files["dir"] / "real.safetensors", "--partition", files["dir"] / "part.json",
                  "--out", rel / "deeper" / "run"],
                 # a helper's site.json (private record ids) and a DP linear model (its own ε) went into a release
                 ["site", "--store", files["dir"] / "real.safetensors", "--name", "zz", "--out", rel / "site"],
                 ["prototypes", "dp-linear", "--store", files["dir"] / "real.safetensors", "--partition",
                  files["dir"] / "part.json", "--epsilon", 1, "--out", rel / "dplin"]):
        r, obj = _invoke(*args, "--json")
        assert r.exit_code == 2 and f"is inside the release folder {rel}" in obj["error"], (args, r.output)
    # and from Python: a partition (record ids), a store, a run folder (client state), a saved model
    import fedhype
    from fedhype.data.partition import Partition
    from fedhype.data.store import EmbeddingStore
    from fedhype.errors import ValidationError

    for write in (lambda: Partition.load(files["dir"] / "part.json").save(rel / "p.json"),
                  lambda: EmbeddingStore.load(files["dir"] / "syn.safetensors").save(rel / "x" / "s.safetensors"),
                  lambda: fedhype.FedHypeVAE(epsilon=1.0, out=rel / "apirun").fit(
                      EmbeddingStore.load(files["dir"] / "real.safetensors"), Partition.load(files["dir"] / "part.json")),
                  lambda: fedhype.FedHypeVAE.load(files["run"]).save(rel / "saved")):
        with pytest.raises(ValidationError, match=f"inside the release folder {rel}"):
            write()
    assert sorted(p.name for p in rel.iterdir()) == sorted(["README.md", "checkpoint.json", "config.json",
                                                             "ledger.json", "model.safetensors", "privacy.json",
                                                             "synthetic.safetensors"])
    assert not (tmp_path / "s.safetensors").exists()
    # --out inside a --release still to be written: refused before either folder is made (a probe's release_x was
    # made for the store, then refused as existing, and left behind)
    r, obj = _invoke("synthesize", "--run", files["run"], "--out", tmp_path / "new_rel" / "s.safetensors", "--release",
                     tmp_path / "new_rel", "--per-class", 2, "--json")
    assert r.exit_code == 2 and "is inside --release" in obj["error"] and not (tmp_path / "new_rel").exists(), r.output
    # a second `synthesize` into an --out (or --release) another one is writing is refused, naming its pid (two both
    # said they wrote the same release, one store silently replacing the other: a probe); the lock file goes away
    import subprocess
    import sys

    hold = ("import sys, time; from fedhype.io import exclusive_lock\n"
            "with exclusive_lock(sys.argv[1], 'busy {pid}'):\n    print('locked', flush=True); time.sleep(600)")
    for target, flag in ((tmp_path / "busy.safetensors", "--out"), (tmp_path / "busy_rel", "--release")):
        holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / f".{target.name}.lock")],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "locked"  # waits on the condition, not on a timer
            extra = ["--out", target] if flag == "--out" else ["--out", tmp_path / "free.safetensors", "--release", target]
            r, obj = _invoke("synthesize", "--run", files["run"], *extra, "--per-class", 2, "--json")
            assert r.exit_code == 2 and f"is being written by another `fedhype synthesize` (pid {holder.pid})" in \
                obj["error"] and not target.exists(), r.output
        finally:
            holder.kill()
            holder.wait()
    (tmp_path / ".busy.safetensors.x1y2.tmp").write_bytes(b"0" * 64)  # what a SIGKILL left (a probe: 1.2 GB of them)
    r, obj = _invoke("synthesize", "--run", files["run"], "--out", tmp_path / "busy.safetensors", "--per-class", 2,
                     "--json")
    assert r.exit_code == 0 and not (tmp_path / ".busy.safetensors.lock").exists(), r.output
    assert "1 temporary file(s) of an earlier write that was killed" in r.stderr and ".busy.safetensors.x1y2.tmp" in \
        r.stderr
    # a file copied in by hand (here: the real store) fails the audit of the folder, named
    shutil.copy(files["dir"] / "real.safetensors", rel / "real.safetensors")
    (rel / "notes").mkdir()
    (rel / "notes" / "site.json").write_text("{}")
    bad = {row["name"]: row for row in check_release(rel) if not row["ok"]}
    assert set(bad) == {"release folder: real.safetensors", "release folder: notes/site.json"}
    assert "no privacy claim covers it" in bad["release folder: real.safetensors"]["reason"]
    assert "the folder differs from what was released" in bad["release folder: real.safetensors"]["reason"]


# ----------------------------------------------------------------------------- partition
def _partition(files, out, *extra):
    return _invoke("partition", "--store", files["dir"] / "real.safetensors", "--scheme", "iid", "--clients", 3,
                   "--out", out, *extra, "--json")


def test_partition_overwrite_rule(files, copy):
    out = copy("part.json")
    r, obj = _partition(files, out)
    assert r.exit_code == 2 and obj["error"].startswith(f"--out {out} already exists (a partition")
    assert len(Partition.load(out).clients) == 2  # untouched
    r, _ = _partition(files, out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert len(Partition.load(out).clients) == 3
    store = copy("real.safetensors")  # a partition --out onto the store it reads: never
    before = store.read_bytes()
    r, obj = _partition(files, store, "--overwrite")
    assert r.exit_code == 2 and f"--out {store} is a real embeddings store" in obj["error"]
    assert store.read_bytes() == before


# ----------------------------------------------------------------------------- embed
def test_embed_overwrite_rule(files, copy, tmp_path, tiny_dinov2_dir, monkeypatch):
    from PIL import Image

    monkeypatch.setenv("FEDHYPE_CACHE", str(tmp_path / "cache"))  # image folders are cached: not in ~/.cache

    for c in ("a", "b"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (28, 28), (40 * i, 90 if c == "a" else 180, 30)).save(tmp_path / "imgs" / c / f"{i}.png")
    args = ["embed", "--images", tmp_path / "imgs", "--encoder", f"hf:{tiny_dinov2_dir}", "--image-size", 28,
            "--device", "cpu", "--workers", 0]
    out = copy("real.safetensors")
    r, obj = _invoke(*args, "--out", out, "--json")
    assert r.exit_code == 2 and obj["error"].startswith(f"--out {out} already exists (a real embeddings store")
    r, obj = _invoke(*args, "--out", out, "--overwrite", "--json")
    assert r.exit_code == 0, r.output
    assert len(EmbeddingStore.load(out)) == obj["n"] == 4
    syn = copy("syn.safetensors")
    before = syn.read_bytes()
    r, obj = _invoke(*args, "--out", syn, "--overwrite", "--json")
    assert r.exit_code == 2 and f"--out {syn} is a synthetic embeddings store" in obj["error"]
    assert syn.read_bytes() == before
    # a second `embed` into an --out another one is writing is refused, naming its pid (a helper's two embeds into one
    # path both said they wrote it, the first store silently replaced); the lock file goes away with the writer
    import subprocess
    import sys

    hold = ("import sys, time; from fedhype.io import exclusive_lock\n"
            "with exclusive_lock(sys.argv[1], 'busy {pid}'):\n    print('locked', flush=True); time.sleep(600)")
    busy = tmp_path / "busy.safetensors"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / ".busy.safetensors.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"  # waits on the condition, not on a timer
        for extra in ([], ["--overwrite"]):
            r, obj = _invoke(*args, "--out", busy, *extra, "--json")
            assert r.exit_code == 2 and f"{busy} is being written by another `fedhype embed` (pid {holder.pid})" in \
                obj["error"] and not busy.exists(), r.output
    finally:
        holder.kill()
        holder.wait()
    r, obj = _invoke(*args, "--out", busy, "--json")
    assert r.exit_code == 0 and busy.exists() and not (tmp_path / ".busy.safetensors.lock").exists(), r.output


# ----------------------------------------------------------------------------- train / run: --out is a folder
def test_train_and_run_out_pointing_at_a_file_is_a_usage_error(files, copy):
    out = copy("notes.txt")
    r, obj = _invoke("train", "--store", files["dir"] / "real.safetensors", "--partition", files["dir"] / "part.json",
                     "--out", out, "--rounds", 1, "--json")
    assert r.exit_code == 2, r.output
    assert obj["error"].startswith(f"--out {out} is a file, not a folder: `fedhype train` writes a folder there")
    r, obj = _invoke("run", "--out", out, "--json")
    assert r.exit_code == 2 and obj["error"].startswith(f"--out {out} is a file, not a folder: `fedhype run`")
    # prototypes train too, with --overwrite (was: internal error NotADirectoryError; a new user's probe)
    r, obj = _invoke("prototypes", "train", "--data", files["dir"] / "syn.safetensors", "--out", out, "--overwrite", "--json")
    assert r.exit_code == 2 and obj["error"].startswith(f"--out {out} is a file, not a folder: `fedhype prototypes train`")
    assert out.read_text() == "my notes\n"


def test_an_interrupted_synthesize_release_leaves_nothing_and_the_same_command_runs_again(files, tmp_path, monkeypatch):
    """A probe interrupted `synthesize --release`: the store was written, the release folder not, and running the
    same command again was refused (--out exists). Now the store goes with the release: both or neither."""
    import fedhype.pipeline.release as rel_mod

    out, rel = tmp_path / "syn.safetensors", tmp_path / "release"
    args = ("synthesize", "--run", files["run"], "--out", out, "--per-class", 2, "--seed", 0, "--release", rel, "--json")
    real = rel_mod.write_release

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(rel_mod, "write_release", interrupted)
    r, _ = _invoke(*args)
    assert r.exit_code != 0 and not out.exists() and not rel.exists()
    monkeypatch.setattr(rel_mod, "write_release", real)
    r, obj = _invoke(*args)
    assert r.exit_code == 0, r.output
    assert out.exists() and (rel / "synthetic.safetensors").read_bytes() == out.read_bytes()


def test_an_out_file_under_a_file_is_refused_naming_it(files, tmp_path):
    """A probe wrote --out emb.safetensors/s.safetensors and read "File exists: emb.safetensors"."""
    r, obj = _invoke("synthesize", "--run", files["run"], "--out", files["dir"] / "real.safetensors" / "s.safetensors",
                     "--per-class", 2, "--json")
    assert r.exit_code == 2 and obj["error"] == (f"--out {files['dir'] / 'real.safetensors' / 's.safetensors'}: "
                                                 f"{files['dir'] / 'real.safetensors'} is a file, not a folder; give a "
                                                 "path in a folder (nothing was done)")


def test_an_out_that_cannot_be_written_is_refused_before_any_work(files, tmp_path, monkeypatch):
    """A probe's `embed --out` into a read-only folder embedded every image and only then failed. The folder an --out
    is written into is now tried first (a file created and removed there): /proc takes no new file; a read-only mount
    (simulated here: the tests may run as root, for whom permission bits do not stop a write) says so."""
    from read_only import simulate_read_only  # tests/read_only.py

    r, obj = _invoke("synthesize", "--run", files["run"], "--out", "/proc/fedhype-syn.safetensors", "--json")
    assert r.exit_code == 2 and "cannot write into /proc" in obj["error"] and "nothing was done" in obj["error"]

    simulate_read_only(monkeypatch, tmp_path)
    r, obj = _invoke("partition", "--store", files["dir"] / "real.safetensors", "--scheme", "iid", "--clients", 2,
                     "--out", tmp_path / "sub" / "p.json", "--json")
    assert r.exit_code == 2 and f"cannot write into {tmp_path} (Read-only file system)" in obj["error"]
    assert not (tmp_path / "sub").exists()


def test_an_out_that_is_no_regular_file_is_refused_before_it_is_opened(files, tmp_path, monkeypatch):
    """A new user's probe: ``embed --out /dev/full`` read the device as JSON until the machine ran out of memory, and
    ``partition --out`` a named pipe waited forever in open(). Refused at once, naming the path (exit 2)."""
    import os

    import fedhype.io as fio

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: (opened.append(str(p)), real_open(p, *a, **k))[1])
    assert fio.artifact_format(fifo) is None and fio.artifact_format("/dev/zero") is None
    assert not [p for p in opened if p in (str(fifo), "/dev/zero")]  # neither was opened
    monkeypatch.undo()
    for out in (fifo, Path("/dev/null")):
        r, js = _invoke("partition", "--store", files["dir"] / "real.safetensors", "--scheme", "domain", "--out", out,
                        "--overwrite", "--json")
        assert r.exit_code == 2 and f"--out {out} is not a regular file (a device, pipe or socket)" in js["error"]


def test_a_large_json_out_is_sniffed_from_its_head(files, tmp_path, monkeypatch):
    """A JSON file above the whole-parse limit is classified from its first 64 KiB (fedhype writes "format" among its leading keys)
    instead of being parsed whole (a probe's 300 MB file took 1.1 GB to refuse)."""
    import fedhype.io as fio

    part = json.loads((files["dir"] / "part.json").read_text())
    assert list(part)[:2] == ["private", "format"]  # among the leading keys: what the sniff reads
    big = tmp_path / "big.json"
    big.write_text(json.dumps(part))
    other = tmp_path / "other.json"
    other.write_text('{"x": "' + "y" * 70000 + '", "format": "fedhype-partition/1"}')  # past the first 64 KiB
    monkeypatch.setattr(fio, "SNIFF_JSON_BYTES", 1000)
    assert fio.artifact_format(big) == "fedhype-partition/1"  # replaced by `partition --overwrite`, as before
    assert fio.artifact_format(other) is None  # not one fedhype wrote: not replaced
    monkeypatch.setattr(fio, "SNIFF_JSON_BYTES", 10**9)
    assert fio.artifact_format(other) == "fedhype-partition/1"  # the whole-parse path is unchanged


def test_an_interrupt_after_the_output_is_written_exits_0_with_it(files, tmp_path, monkeypatch):
    """A new user's `synthesize` stopped 3.6 s in (timeout -s INT) exited 130 saying nothing was half-written, beside
    the complete store it had just written; with --overwrite the old file was already replaced. An interrupt after the
    last rename is noted and dropped; one before it still stops the command (130, no --out)."""
    import os
    import signal

    from fedhype.cli import synthesize_cmd

    real = synthesize_cmd.output_committed

    def committed_then_signalled(sig):
        def mark():
            real()
            os.kill(os.getpid(), sig)  # delivered to the main thread before the next line runs
        return mark

    for i, (sig, release) in enumerate(((signal.SIGINT, False), (signal.SIGTERM, True))):
        monkeypatch.setattr(synthesize_cmd, "output_committed", committed_then_signalled(sig))
        out = tmp_path / f"late{i}.safetensors"
        extra = ["--release", tmp_path / f"late_rel{i}"] if release else []
        r, obj = _invoke("synthesize", "--run", files["run"], "--out", out, *extra, "--per-class", 2, "--json")
        assert r.exit_code == 0 and obj["store"] == str(out) and obj["n"] == len(EmbeddingStore.load(out)), r.output
        assert "the interrupt came after the output was written; it is complete" in r.stderr
        assert not release or (tmp_path / f"late_rel{i}" / "privacy.json").is_file()
    # before the output is in place: still an interrupt
    monkeypatch.setattr(synthesize_cmd, "output_committed", real)
    monkeypatch.setattr(EmbeddingStore, "save", lambda self, path: os.kill(os.getpid(), signal.SIGTERM))
    out = tmp_path / "early.safetensors"
    r, obj = _invoke("synthesize", "--run", files["run"], "--out", out, "--per-class", 2, "--json")
    assert r.exit_code == 130 and obj["kind"] == "interrupted" and not out.exists(), r.output
