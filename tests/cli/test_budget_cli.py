"""``fedhype budget``: values, the --json contract and exit codes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from fedhype.cli import budget_cmd
from fedhype.privacy.accountant import epsilon

MNIST = ["--noise-multiplier", "1.1", "--sample-rate", str(256 / 60000), "--steps", "10000", "--delta", "1e-5"]


@pytest.fixture(scope="module")
def app():
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test root"""

    budget_cmd.register(app)
    return app


def _run(app, *args):
    result = CliRunner().invoke(app, ["budget", *args])
    return result, (json.loads(result.stdout) if "--json" in args and result.stdout.strip() else None)


def test_single_mechanism_known_values(app):
    result, out = _run(app, *MNIST, "--json")
    assert result.exit_code == 0, result.output
    assert out["accountant"] == "prv" and out["epsilon"] == out["epsilon_prv"] == pytest.approx(1.99, rel=0.01)
    assert out["epsilon_rdp"] == pytest.approx(2.16, rel=0.01)
    assert out["epsilon_pld"] is None or out["epsilon_pld"] == pytest.approx(1.98, rel=0.01)
    assert (out["noise_multiplier"], out["steps"], out["delta"]) == (1.1, 10_000, 1e-5)
    assert out["sample_rate"] == pytest.approx(256 / 60000)


def test_single_mechanism_table(app):
    result, _ = _run(app, *MNIST)
    assert result.exit_code == 0
    assert "epsilon_rdp" in result.stdout and "1.988" in result.stdout


def test_target_epsilon_gives_sigma_within_it(app):
    result, out = _run(app, "--epsilon", "1.0", "--sample-rate", "0.05", "--steps", "300", "--delta", "1e-5", "--json")
    assert result.exit_code == 0, result.output
    assert out["target_epsilon"] == 1.0 and 0.97 <= out["epsilon"] <= 1.0
    assert epsilon([(out["noise_multiplier"], 0.05, 300)], 1e-5) == out["epsilon"]


def test_epsilon_alone_names_both_ways_to_say_what_is_accounted(app):
    """A probe's `budget --epsilon 1` was sent to --rounds, which then asked for the sizes: one message names both."""
    result, out = _run(app, "--epsilon", "1", "--json")
    assert result.exit_code == 2 and "--sample-rate and --steps" in out["error"] and "--client-sizes" in out["error"]
    result, out = _run(app, "--epsilon", "1", "--client-sizes", "600,480", "--json")  # the sizes alone are enough
    assert result.exit_code == 0, result.output
    assert out["epsilon"] <= 1.0 + 1e-9


def test_federated_plan_from_client_sizes(app):
    # --class-stats-share 0: the DP-SGD steps alone (as for dp-cvae); the default composes the
    # class-statistics release first (tests/federated/test_refusals.py checks it against the engine)
    result, out = _run(app, "--rounds", "3", "--local-epochs", "2", "--batch-size", "32", "--client-sizes", "2000,800,250",
                       "--noise-multiplier", "1.5", "--delta", "1e-4", "--class-stats-share", "0", "--json")
    assert result.exit_code == 0, result.output
    assert out["class_stats_noise_multiplier"] is None and out["class_stats_epsilon"] == 0.0
    rows = out["clients"]
    assert [r["n"] for r in rows] == [2000, 800, 250]
    # the engine's rule: R · ⌈E·n/B⌉ (not R · E · ⌈n/B⌉, which counted 378 for n = 2000)
    assert [r["steps"] for r in rows] == [3 * math.ceil(2 * n / 32) for n in (2000, 800, 250)] == [375, 150, 48]
    assert [r["sample_rate"] for r in rows] == [32 / 2000, 32 / 800, 32 / 250]
    for r in rows:
        assert r["epsilon"] == epsilon([(1.5, r["sample_rate"], r["steps"])], 1e-4)
    assert out["worst_client"] == "2" and out["epsilon"] == max(r["epsilon"] for r in rows)
    assert (out["sample_rate"], out["steps"]) == (32 / 250, 48)


def test_a_delta_below_1_over_n_but_not_well_below_it_is_warned_about(app):
    """δ < 1/n is enforced; δ ≪ 1/n is advised: n·δ above 0.1 (the largest client) is a warning, naming it."""
    args = ["--rounds", "1", "--local-steps", "1", "--batch-size", "32", "--client-sizes", "2000,250", "-s", "2"]
    _, loose = _run(app, *args, "--delta", "1e-4", "--json")  # n·δ = 0.2 for the client of 2,000
    (w,) = [w for w in loose["warnings"] if "n·delta" in w]
    assert "reaches 0.2 ('client 0', n = 2000)" in w and "≤ 5e-05" in w
    _, tight = _run(app, *args, "--delta", "5e-5", "--json")  # n·δ = 0.1: the advice met
    assert not [w for w in tight["warnings"] if "n·delta" in w]
    assert loose["noise_multiplier"] == tight["noise_multiplier"] == 2  # advice only: the plan is the same


def test_a_batch_at_least_a_clients_size_is_warned_about(app):
    """q = min(1, B/n) = 1 gets no amplification by subsampling; a new user's plan (B = 256, n = 180) had no word of it."""
    args = ["--rounds", "1", "--local-steps", "1", "--client-sizes", "2000,180", "-s", "2", "--delta", "1e-5", "--json"]
    _, big = _run(app, *args, "--batch-size", "256")
    (w,) = [w for w in big["warnings"] if "q = 1" in w]
    assert "training-set size of client 1 (180)" in w and "client 0" not in w
    _, small = _run(app, *args, "--batch-size", "32")
    assert not [w for w in small["warnings"] if "q = 1" in w]


def test_a_plan_without_local_epochs_or_steps_takes_trains_default(app):
    """The README's consortium command (`--rounds 8 --batch-size 256 --card …`, no --local-epochs) exited 2 (a new
    user's probe): like `fedhype train`, the plan now takes train's default local epochs (2)."""
    from fedhype.federated.config import TrainConfig

    args = ["--rounds", "2", "--batch-size", "10", "--client-sizes", "600,90", "--noise-multiplier", "1", "--delta", "1e-5"]
    result, out = _run(app, *args, "--json")
    assert result.exit_code == 0, result.output
    assert TrainConfig().local_epochs == 2.0 and out["local_epochs"] == 2.0
    _, explicit = _run(app, *args, "--local-epochs", "2", "--json")
    assert [r["steps"] for r in out["clients"]] == [r["steps"] for r in explicit["clients"]] == [2 * 120, 2 * 18]
    assert out["epsilon"] == explicit["epsilon"]


def test_a_plan_without_delta_rounds_or_batch_size_is_trains_plan(app):
    """`budget` needed --delta and --batch-size where `train` has defaults (a new user's probe): now a plan
    takes train's δ, rounds and batch size, so its σ is the one `fedhype train --epsilon` calibrates."""
    from fedhype.federated.config import TrainConfig

    d = TrainConfig()
    assert (d.delta, d.rounds, d.batch_size) == (1e-4, 8, 256)
    _, bare = _run(app, "--client-sizes", "1000,600", "--epsilon", "2", "--json")
    _, explicit = _run(app, "--client-sizes", "1000,600", "--epsilon", "2", "--delta", "1e-4", "--rounds", "8",
                       "--batch-size", "256", "--json")
    assert bare["noise_multiplier"] == explicit["noise_multiplier"] > 0
    assert bare["delta"] == 1e-4 and bare["rounds"] == 8
    assert [r["sample_rate"] for r in bare["clients"]] == [256 / 1000, 256 / 600]
    _, other = _run(app, "--client-sizes", "1000,600", "--epsilon", "2", "--batch-size", "128", "--json")
    assert other["noise_multiplier"] != bare["noise_multiplier"]  # the flag still counts


def test_federated_plan_calibration_and_local_steps(app):
    result, out = _run(app, "--rounds", "4", "--local-steps", "10", "--batch-size", "50", "--client-sizes", "1000,400",
                       "--participation", "0.5", "--epsilon", "2", "--delta", "1e-4", "--json")
    assert result.exit_code == 0, result.output
    # calibrated as train does: a client may be drawn in all 4 rounds (about 2 at P = 0.5)
    assert out["rounds_per_client"] == 4 and out["expected_rounds_per_client"] == 2
    assert [r["steps"] for r in out["clients"]] == [40, 40]
    assert out["worst_client"] == "1" and 0.97 * 2 <= out["epsilon"] <= 2.0
    assert all(r["epsilon"] <= 2.0 for r in out["clients"])


def test_federated_plan_from_partition_file(app, tmp_path):
    clients = [{"id": i, "name": f"site-{i}", "train": [f"s{i}-{j}" for j in range(n)],
                "val": [f"v{i}-{j}" for j in range(5)], "test": []} for i, n in enumerate((300, 120))]
    part = {"format": "fedhype-partition/1", "scheme": "iid", "params": {}, "seed": 0, "store_digest": "x" * 64,
            "store_n": 430, "class_names": ["a", "b"], "clients": clients}
    (tmp_path / "part.json").write_text(json.dumps(part))
    result, out = _run(app, "--rounds", "2", "--local-epochs", "1", "--batch-size", "30", "--partition",
                       str(tmp_path / "part.json"), "--noise-multiplier", "1.0", "--delta", "1e-3", "--json")
    assert result.exit_code == 0, result.output
    assert [(r["name"], r["n"], r["steps"]) for r in out["clients"]] == [("site-0", 300, 20), ("site-1", 120, 8)]
    # the text names the worst client by id and name, as train and audit do; so does a δ refusal
    human, _ = _run(app, "--rounds", "2", "--local-epochs", "1", "--batch-size", "30", "--partition",
                    str(tmp_path / "part.json"), "--noise-multiplier", "1.0", "--delta", "1e-3")
    assert human.exit_code == 0 and "worst client: 1 (site-1)" in human.stdout
    bad, _ = _run(app, "--rounds", "2", "--local-epochs", "1", "--batch-size", "30", "--partition",
                  str(tmp_path / "part.json"), "--noise-multiplier", "1.0", "--delta", "0.5")
    assert bad.exit_code != 0 and "client 0 ('site-0', 300 training records)" in " ".join(bad.output.replace("│", " ").split())
    result, _ = _run(app, "--rounds", "2", "--local-epochs", "1", "--batch-size", "30", "--partition",
                     str(tmp_path / "missing.json"), "--noise-multiplier", "1.0", "--delta", "1e-3")
    flat = " ".join(result.output.replace("│", " ").split())  # Typer's boxed message, unwrapped
    assert result.exit_code == 2 and "missing.json: no such file" in flat  # a usage error, not an artifact


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1"], "--delta"),
        (["--noise-multiplier", "1", "--sample-rate", "1.5", "--steps", "10", "--delta", "1e-5"], "--sample-rate"),
        (["--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "-1", "--delta", "1e-5"], "--steps"),
        (["--noise-multiplier", "1", "--epsilon", "1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5"],
         "exactly one"),
        (["--noise-multiplier", "1", "--sample-rate", "0.1", "--delta", "1e-5"], "--steps"),
        (["--rounds", "2", "--local-epochs", "1", "--batch-size", "10", "--client-sizes", "60,900",
          "--noise-multiplier", "1", "--delta", "0.005"], "client 1 (900 training records): delta = 0.005 is not below"),
        (["--rounds", "2", "--local-steps", "5", "--batch-size", "10", "--client-sizes", "600,x",
          "--noise-multiplier", "1", "--delta", "1e-5"], "--client-sizes"),
        # no round, no step: named as such (it used to blame a target ε nobody gave)
        (["-s", "1", "--rounds", "0", "--local-steps", "2", "--batch-size", "32", "--client-sizes", "600,480",
          "--delta", "1e-5"], "--rounds must be ≥ 1, got 0"),
        (["-s", "1", "--rounds", "-3", "--local-steps", "2", "--batch-size", "32", "--client-sizes", "600,480",
          "--delta", "1e-5"], "--rounds must be ≥ 1, got -3"),  # one message below 1 (was "an integer ≥ 0")
        (["-s", "1", "--rounds", "2", "--local-steps", "0", "--batch-size", "32", "--client-sizes", "600,480",
          "--delta", "1e-5"], "--local-steps must be ≥ 1, got 0"),
        (["-s", "1", "--rounds", "2", "--local-epochs", "0", "--batch-size", "32", "--client-sizes", "600,480",
          "--delta", "1e-5"], "--local-epochs must be a number > 0, got 0"),
    ],
)
def test_invalid_values_exit_2_with_json_error(app, args, message):
    result, out = _run(app, *args, "--json")
    assert result.exit_code == 2, result.output
    assert out["exit_code"] == 2 and message in out["error"]


def test_real_process_prints_one_json_object_and_exit_codes():
    script = ("import typer\nfrom fedhype.cli import budget_cmd\napp = typer.Typer()\n"
              "@app.callback()\ndef _r():\n    pass\nbudget_cmd.register(app)\napp()\n")
    ok = subprocess.run([sys.executable, "-c", script, "budget", "--noise-multiplier", "2", "--sample-rate", "0.01",
                         "--steps", "100", "--delta", "1e-5", "--json"], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["epsilon"] == epsilon([(2.0, 0.01, 100)], 1e-5)
    bad = subprocess.run([sys.executable, "-c", script, "budget", "--noise-multiplier", "2", "--sample-rate", "0.01",
                          "--steps", "100", "--delta", "2"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "delta" in bad.stderr and bad.stdout == ""


# ----------------------------------------------------------------------------- the reported ε: min(PRV, RDP)
ISSUE = ["-s", "4", "--sample-rate", "0.00033", "--steps", "10000"]


@pytest.fixture
def glitchy_prv(monkeypatch):
    """PRV as on the machine of issue #17: 0.4767 at δ = 1e-12 (where RDP gives 0.365), Opacus's value elsewhere."""
    from fedhype.privacy import accountant

    real = accountant._ACCOUNTANT_FNS["prv"]
    monkeypatch.setitem(accountant._ACCOUNTANT_FNS, "prv", lambda h, d: 0.4767 if d == 1e-12 else real(h, d))
    accountant._epsilon_cached.cache_clear()
    yield
    accountant._epsilon_cached.cache_clear()


def test_prv_glitch_reports_rdp_and_warns(app, glitchy_prv):
    outs = [_run(app, *ISSUE, "--delta", d, "--json")[1] for d in ("1.1e-12", "1e-12", "9e-13")]
    before, glitch, after = outs
    assert glitch["epsilon"] == glitch["epsilon_rdp"] == pytest.approx(0.36505, abs=1e-4)
    assert glitch["accountant"] == "rdp" and glitch["epsilon_prv"] == 0.4767
    assert glitch["warnings"][0].startswith("PRV ε 0.4767 is above the RDP bound 0.3651 at δ = 1e-12")
    for out in (before, after):
        assert out["accountant"] == "prv" and out["warnings"] == []
        assert out["epsilon"] == out["epsilon_prv"] == pytest.approx(0.0615, abs=0.001)
    human, _ = _run(app, *ISSUE, "--delta", "1e-12")
    assert human.exit_code == 0 and "rdp" in human.stdout and "0.3651" in human.stdout
    assert "warning: PRV ε 0.4767 is above the RDP bound 0.3651" in human.output


def test_plan_rows_carry_the_accountant_and_the_warnings(app, glitchy_prv):
    result, out = _run(app, "--rounds", "1", "--local-steps", "3", "--batch-size", "32", "--client-sizes", "600,480",
                       "-s", "8", "--delta", "1e-12", "--class-stats-share", "0", "--json")
    assert result.exit_code == 0, result.output
    for r in out["clients"]:
        assert r["accountant"] == "rdp" and r["epsilon"] == r["epsilon_rdp"] < r["epsilon_prv"] == 0.4767
        assert r["warnings"][0].startswith("PRV ε 0.4767 is above the RDP bound")
    assert out["accountant"] == "rdp" and out["epsilon"] == max(r["epsilon_rdp"] for r in out["clients"])
    assert out["warnings"][0].startswith("client 0: PRV ε 0.4767 is above the RDP bound")
    assert any(w.startswith("client 1: PRV ε 0.4767 is above the RDP bound") for w in out["warnings"])


@pytest.mark.parametrize("seed", range(4))
def test_budget_plans_the_steps_and_sigma_that_train_runs(seed):
    """Property (issue #14): for random client sizes, batch sizes, fractional epochs and participation,
    `fedhype budget`'s per-client (q, steps) and σ equal the engine's plan (fedhype.federated.engine.plan_privacy)."""
    import random

    from fedhype.cli.budget_cmd import budget_plan
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import plan_privacy

    rng = random.Random(seed)
    for _ in range(3):
        sizes = [rng.randint(30, 3000) for _ in range(rng.randint(2, 5))]
        b = rng.choice([8, 32, 64, 256, 512, 4000])  # also larger than a client (q = 1)
        e = rng.choice([0.5, 1.0, 1.5, 2.0, 3.0])
        r = rng.randint(1, 6)
        part = rng.choice([1.0, 0.5, 0.3])  # participation < 1 too: train calibrates for every round
        cfg = TrainConfig(rounds=r, local_epochs=e, batch_size=b, epsilon=2.0, delta=1e-5, class_stats_share=0.5,
                          participation=part, model={"hidden": 8, "latent": 4})
        engine = plan_privacy(cfg, sizes)
        plan = budget_plan(1e-5, r, b, [(str(i), str(i), n) for i, n in enumerate(sizes)], local_epochs=e,
                           participation=part, target_epsilon=2.0, class_stats_share=0.5)
        assert [(row["sample_rate"], row["steps"]) for row in plan["clients"]] == engine["plan"]
        assert plan["noise_multiplier"] == pytest.approx(engine["noise_multiplier"], rel=1e-9)
        assert plan["class_stats_noise_multiplier"] == pytest.approx(engine["class_stats_noise_multiplier"], rel=1e-9)


def test_a_single_mechanism_with_a_large_delta_is_warned_about(app):
    """An auditor's probe: --delta 0.5 printed ε = 0 without a word."""
    result, out = _run(app, "--noise-multiplier", "1.1", "--sample-rate", "0.01", "--steps", "100", "--delta", "0.5",
                       "--json")
    assert result.exit_code == 0 and any(w.startswith("δ = 0.5 is no meaningful guarantee") for w in out["warnings"])
    result, out = _run(app, *MNIST, "--json")
    assert not any("no meaningful guarantee" in w for w in out.get("warnings") or [])


def test_class_stats_noise_multiplier_previews_trains_explicit_release(app):
    """budget's own note says "pass --noise-multiplier and --class-stats-noise-multiplier", which budget refused (a
    probe): σ₀ given beside σ is the release's Gaussian step(s), composed first, as train runs it."""
    from fedhype.privacy.centring import DEFAULT_CENTRE_SHARE

    s = DEFAULT_CENTRE_SHARE
    result, out = _run(app, "--noise-multiplier", "5", "--class-stats-noise-multiplier", "2", "--client-sizes",
                       "2000,2000", "--rounds", "2", "--local-steps", "3", "--batch-size", "64", "--json")
    assert result.exit_code == 0, result.output
    assert out["class_stats_noise_multiplier"] == 2.0 and out["noise_multiplier"] == 5.0
    # the centred release: σ₀/√s and σ₀/√(1 − s), one un-subsampled step each
    assert [x for st in out["release_steps"] for x in st] == pytest.approx([2 / math.sqrt(s), 1.0, 1,
                                                                          2 / math.sqrt(1 - s), 1.0, 1])
    q = 64 / 2000
    assert out["epsilon"] == pytest.approx(epsilon([*map(tuple, out["release_steps"]), (5.0, q, 6)], 1e-4), rel=1e-9)
    assert out["class_stats_epsilon"] == pytest.approx(epsilon([*map(tuple, out["release_steps"])], 1e-4), rel=1e-9)
    for args, msg in ((["--epsilon", "2"], "with --epsilon both are calibrated"),
                      (["--noise-multiplier", "5", "--class-stats-noise-multiplier", "0"], "finite number > 0"),
                      (["--noise-multiplier", "5", "--sample-rate", "0.1", "--steps", "3"], "a single mechanism has none")):
        extra = [] if "--sample-rate" in args else ["--client-sizes", "2000,2000"]
        result, out = _run(app, *args, *(["--class-stats-noise-multiplier", "2"] if "--class-stats-noise-multiplier"
                                          not in args else []), *extra, "--json")
        assert result.exit_code == 2 and msg in out["error"], (args, result.output)
