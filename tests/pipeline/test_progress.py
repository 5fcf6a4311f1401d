"""No silent stretches: every stage of `fedhype run` announces itself and long ones send heartbeat lines."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from conftest import REAL_STORE, TEST_CACHE

from fedhype.pipeline.progress import Heartbeat


def test_heartbeat_names_the_stage_while_it_is_quiet_and_stays_quiet_otherwise():
    lines: list[str] = []
    with Heartbeat(lines.append, quiet=0.3) as log:
        log.stage("evaluate", "evaluate: starting")
        deadline = time.monotonic() + 30
        while sum("still working" in ln for ln in lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # a long stage that prints nothing itself
        beats = [ln for ln in lines if "still working" in ln]
        assert len(beats) >= 2 and all(ln.startswith("evaluate: still working (") for ln in beats)
        n = len(lines)
        for _ in range(10):  # a stage that logs every 0.1 s gets no heartbeat between its lines
            log("evaluate: busy")
            time.sleep(0.1)
        assert not any("still working" in ln for ln in lines[n:])
    n = len(lines)
    time.sleep(0.8)
    assert len(lines) == n  # stopped with the context


def test_fedhype_run_with_stderr_piped_is_never_silent_for_more_than_5_s(real_store, tmp_path):
    sets = [f"data.limit={REAL_STORE['limit']}", f"data.image_size={REAL_STORE['image_size']}",
            f"data.cache_dir=\"{TEST_CACHE / 'embeddings'}\"", "train.rounds=2", "train.seed=0",
            "evaluate.permutations=20", "train.dp_sgd_min_records=0"]  # the DP-SGD stage on these small clients
    argv = [sys.executable, "-m", "fedhype.cli.main", "run", "--out", str(tmp_path / "job"), "--json"]
    for s in sets:
        argv += ["--set", s]
    stamps: list[tuple[float, str]] = []
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})

    def read() -> None:
        for line in p.stderr:
            stamps.append((time.monotonic(), line.rstrip()))

    reader = threading.Thread(target=read)
    reader.start()
    out = p.stdout.read()
    p.wait(timeout=900)
    reader.join()
    assert p.returncode == 0, "\n".join(s for _, s in stamps)[-3000:]
    assert '"tstr_accuracy"' in out
    times = [t0] + [t for t, _ in stamps]
    gaps = [(b - a, stamps[i][1]) for i, (a, b) in enumerate(zip(times, times[1:]))]
    worst = max(gaps)
    # the interpreter and torch start before the first line; after it, no stage stays silent
    assert max(g for g, _ in gaps[1:]) <= 5.0, worst
    text = "\n".join(s for _, s in stamps)
    for stage in ("embed:", "partition:", "train: round 2/2", "synthesize:", "evaluate: MMD²", "dp linear:", "report:"):
        assert stage in text, stage
