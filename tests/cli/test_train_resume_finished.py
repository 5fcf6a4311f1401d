"""`fedhype train --resume` of a finished run: nothing is left to run, so it says so and exits 0 — with
--max-epsilon too, which a probe saw refused as "the planned run would reach ε = … stopped before spending"."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fedhype.cli.main import app

runner = CliRunner()


def test_resuming_a_finished_run_says_it_is_finished_and_spends_nothing(real_store, tmp_path):
    from fedhype.data.partition import make_partition

    real_store.save(tmp_path / "D.safetensors")
    make_partition(real_store, scheme="iid", n_clients=2, seed=0).save(tmp_path / "Dp.json")
    args = ["train", "--store", str(tmp_path / "D.safetensors"), "--partition", str(tmp_path / "Dp.json"), "--out",
            str(tmp_path / "run"), "--epsilon", "4", "--rounds", "1", "--local-steps", "1", "--batch-size", "100000",
            "--hidden", "16", "--latent", "4", "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    eps = json.loads(r.stdout)["epsilon"]
    assert "train: warning: --batch-size 100000 is at least" in r.stderr  # q = 1: the plan's advice, for a run that runs
    ledger = (tmp_path / "run" / "ledger.json").read_text()
    for extra in (["--max-epsilon", "0.1"], []):
        r = runner.invoke(app, [*args, "--resume", *extra])
        assert r.exit_code == 0, r.output
        got = json.loads(r.stdout)
        assert got["nothing_to_resume"] is True and got["epsilon"] == eps and got["rounds"] == 1
        err = " ".join(r.stderr.split())
        assert (f"train: the run in {tmp_path / 'run'} is finished (its 1 round, ε = {eps:.4g} at δ = 0.0001): nothing "
                "to resume, nothing is spent") in err, err
        assert ("--max-epsilon 0.1 has nothing to stop (the run's ε is above it already" in err) == bool(extra)
        assert "would reach" not in err and "stopped before spending" not in err
        assert "warning" not in err  # nothing runs: no advice on its plan (a probe was warned of its batch size)
        assert (tmp_path / "run" / "ledger.json").read_text() == ledger  # nothing charged
    # the recorded settings still decide: another --rounds is not this run (refused, as before)
    r = runner.invoke(app, [*args[:-1], "--rounds", "2", "--resume", "--json"])
    assert r.exit_code != 0 and "is finished" not in r.stderr
    # … with --max-epsilon too: the difference is named, not a budget refusal of a plan that is not this run's
    r = runner.invoke(app, [*args[:-1], "--rounds", "2", "--resume", "--max-epsilon", "0.1", "--json"])
    assert r.exit_code == 2 and "train.rounds: 1 → 2" in json.loads(r.stdout)["error"], r.output
    assert "would reach" not in r.output
    assert (tmp_path / "run" / "ledger.json").read_text() == ledger
