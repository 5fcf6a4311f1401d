"""One writer per run folder: a second training process is refused, and a killed one leaves no stale lock."""

import os
import signal
import subprocess
import sys
import time

import pytest

from fedhype.data.partition import make_partition
from fedhype.errors import ValidationError
from fedhype.federated.config import TrainConfig
from fedhype.federated.engine import train
from fedhype.federated.rundir import RunDir
from fedhype.privacy.ledger import PrivacyLedger

SMALL = {"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}
HOLD = """
import sys, time
from fedhype.federated.rundir import RunDir
with RunDir(sys.argv[1]).writer_lock():
    print("locked", flush=True)
    time.sleep(600)
"""


def _holder(path):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"  # waits on the condition, not on a timer
    return p


def test_second_writer_is_refused_before_touching_the_ledger(real_store, tmp_path):
    part = make_partition(real_store, scheme="domain", seed=0)
    cfg = TrainConfig(rounds=2, local_steps=1, batch_size=32, epsilon=2.0, seed=0, model=SMALL)
    train(real_store, part, cfg, tmp_path / "run", diagnostics=False, stop_after=1)
    before = len(PrivacyLedger.load(tmp_path / "run" / "ledger.json"))
    holder = _holder(tmp_path / "run")  # e.g. another `fedhype train --resume` on the same folder
    try:
        with pytest.raises(ValidationError, match=f"another process \\(pid {holder.pid}\\)"):
            train(real_store, part, cfg, tmp_path / "run", diagnostics=False, resume=True)
        assert len(PrivacyLedger.load(tmp_path / "run" / "ledger.json")) == before  # nothing charged
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the kernel released the killed holder's lock: the run resumes
    res = train(real_store, part, cfg, tmp_path / "run", diagnostics=False, resume=True)
    assert res["complete"] and res["rounds"] == 2


def test_lock_is_exclusive_within_one_process_too(tmp_path):
    run = RunDir(tmp_path / "r")
    with run.writer_lock():
        with pytest.raises(ValidationError, match=f"pid {os.getpid()}"):
            with RunDir(tmp_path / "r").writer_lock():
                pass
    with run.writer_lock():  # released on exit
        pass
