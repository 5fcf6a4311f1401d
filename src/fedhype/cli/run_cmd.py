"""``fedhype run``: the main job, embed → partition → train → synthesize → evaluate → report."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from fedhype.cli.common import JsonOpt, check_out_dir, check_out_kind, console, existing, kv_table, log_line, print_above_target, round_printer, run_command, INTERRUPTED_TRAINING
from fedhype.cli.choices import choice
from fedhype.cli.train_cmd import _METHOD_HELP, explain_min_records
from fedhype.federated.config import METHODS
from fedhype.errors import ValidationError


def _render(r: dict) -> None:
    keys = ("epsilon", "delta", "private", "mmd2", "mmd2_p_value", "fd", "precision", "recall", "coverage",
            "tstr_accuracy", "trtr_accuracy", "interpolation_mean_accuracy", "dp_fedavg_linear_accuracy",
            "dp_fedavg_linear_epsilon", "report")
    Console().print(kv_table("fedhype run", {k: r.get(k) for k in keys}))
    if r.get("above_target"):
        print_above_target(r)




#: what an interrupted non-private job says (INTERRUPTED_TRAINING speaks of the ledger and of rounds charged again)
INTERRUPTED_NON_PRIVATE = (
    "interrupted (Ctrl-C or SIGTERM); nothing was half-written. Rerun the same command: it reuses what finished (the "
    "cached embeddings and partition) and, if training had started, continues from the last completed round "
    "(a NON-PRIVATE job, train.no_dp: nothing is charged)")


def _interrupted_text(config: Optional[Path], sets: list[str]) -> str:
    """The interruption message for this job: :data:`INTERRUPTED_NON_PRIVATE` for a ``train.no_dp`` job, else
    INTERRUPTED_TRAINING. Resolved quietly (the command resolves again and reports any error)."""
    from fedhype.pipeline.config import resolve

    try:
        no_dp = bool(resolve(config, sets, warn=lambda m: None)["train"]["no_dp"])
    except Exception:  # noqa: BLE001 - the body reports it
        no_dp = False
    return INTERRUPTED_NON_PRIVATE if no_dp else INTERRUPTED_TRAINING


def _refuse_shortcut_contradictions(sets: list[str], secure_aggregation: Optional[bool],
                                    dropout_tolerance: Optional[int], method: Optional[str],
                                    epsilon: Optional[float] = None) -> None:
    """Refuse a shortcut flag of ``fedhype run`` and a ``--set`` of the same ``train.*`` key with another value.

    The flags are appended after the ``--set`` items, so the flag won silently whichever came last (a probe:
    ``--no-secure-aggregation --set train.secure_aggregation=true`` released per client, the server seeing each
    client's statistics). The same value twice is accepted.

    Raises:
        ValidationError: naming both spellings.
    """
    from fedhype.pipeline.config import _parse_value

    given = {"secure_aggregation": (secure_aggregation, "--secure-aggregation" if secure_aggregation
                                    else "--no-secure-aggregation"),
             "dropout_tolerance": (dropout_tolerance, f"--dropout-tolerance {dropout_tolerance}"),
             "method": (method, f"--method {method}"),
             "epsilon": (epsilon, f"--epsilon {epsilon:g}" if epsilon is not None else "")}
    for item in sets:
        key, eq, value = item.partition("=")
        section, _, name = key.strip().partition(".")
        if not eq or section != "train" or given.get(name, (None,))[0] is None:
            continue
        flag_value, flag = given[name]
        if _parse_value(value.strip()) != flag_value:
            raise ValidationError(f"--set {item} and {flag} contradict each other (only one would be used): give it "
                                  "once")


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run_cmd(
        config: Optional[Path] = typer.Option(None, "--config", help="TOML job configuration (see configs/).",
                                              callback=existing("job configuration (TOML)", "see configs/ for examples")),
        set_: List[str] = typer.Option([], "--set", help="Override: section.key=value (repeatable), e.g. train.epsilon=4."),
        out: Path = typer.Option(Path("runs/main"), "--out", help="Output directory (rerun the same command to resume; a job that trained "
                                                     "may change only its synthesis.* and evaluate.* keys, which reruns "
                                                     "those stages and spends no ε)."),
        secure_aggregation: Optional[bool] = typer.Option(
            None, "--secure-aggregation/--no-secure-aggregation",
            help="Shortcut for --set train.secure_aggregation=true|false: release the statistics under secure "
                 "aggregation with distributed noise (as `fedhype train --secure-aggregation`)."),
        dropout_tolerance: Optional[int] = typer.Option(
            None, "--dropout-tolerance", help="Shortcut for --set train.dropout_tolerance=t (with --secure-aggregation)."),
        method: Optional[str] = typer.Option(
            None, "--method", click_type=choice(METHODS),
            help="Shortcut for --set train.method=NAME (as `fedhype train --method`): " + _METHOD_HELP),
        epsilon: Optional[float] = typer.Option(
            None, "--epsilon", help="Shortcut for --set train.epsilon=E (as `fedhype train --epsilon`): the job's "
                                    "target ε; σ is calibrated for the plan run."),
        json_out: bool = JsonOpt,
    ) -> None:
        """Run the whole job on real data and write report.json, report.md and plots."""

        flags = ([f"train.secure_aggregation={str(secure_aggregation).lower()}"] if secure_aggregation is not None else []) + (
            [f"train.dropout_tolerance={dropout_tolerance}"] if dropout_tolerance is not None else []) + (
            [f'train.method="{method}"'] if method is not None else []) + (
            [f"train.epsilon={epsilon!r}"] if epsilon is not None else [])

        def body() -> dict:
            from fedhype.pipeline.config import resolve
            from fedhype.pipeline.job import run_job

            _refuse_shortcut_contradictions(set_, secure_aggregation, dropout_tolerance, method, epsilon)
            check_out_dir(out, "run", "give a new folder, or the folder of the job to resume")
            check_out_kind(out, "run", ("job",))  # never into a training run, a model or a folder of other files
            conf = resolve(config, [*set_, *flags], warn=lambda m: typer.echo(f"warning: {m}", err=True))
            from fedhype.federated.config import get_method

            n = conf["train"]["rounds"]  # a statistics-only method runs none (a probe: "train (5 rounds)" ran 0)
            what = ("the statistics release, no DP-SGD round" if get_method(conf["train"]["method"]).statistics_only
                    else f"{n} round{'s' if n != 1 else ''}")
            from fedhype.pipeline.config import train_config

            cfg = train_config(conf)
            if cfg.stage_rule_applies() and cfg.no_dp:  # without DP no round (docs/method.md, decision 25)
                what = "the exact statistics, no training round"
            elif cfg.stage_rule_applies():  # the sizes decide once the partition is known (decision 22)
                what += (f" if the median client has ≥ {cfg.dp_sgd_min_records:,} training records, else the "
                         "statistics release alone")
            log_line(f"run: embed → partition → train ({what}) → synthesize → evaluate → report, into {out}")
            try:
                res = run_job(conf, out, log=log_line, on_round=round_printer(conf["train"]["rounds"]))
            except ValidationError as exc:
                raise explain_min_records(
                    exc, records="train.min_records",
                    partition="set partition.min_records = {need} (fewer partition.clients, or another partition.scheme) "
                              "in a new --out") from None
            if json_out and res.get("above_target"):  # stdout is the JSON object: say it on stderr too
                print_above_target(res)
            return res

        run_command(body, json_out, _render, interrupted=_interrupted_text(config, [*set_, *flags]))
