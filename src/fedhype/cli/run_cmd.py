"""``fedhype run``: the main job, embed → partition → train → synthesize → evaluate → report."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from fedhype.cli.common import JsonOpt, console, kv_table, round_printer, run_command


def _render(r: dict) -> None:
    keys = ("epsilon", "delta", "private", "mmd2", "mmd2_p_value", "fd", "precision", "recall", "coverage",
            "tstr_accuracy", "trtr_accuracy", "interpolation_mean_accuracy", "report")
    Console().print(kv_table("fedhype run", {k: r.get(k) for k in keys}))


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run_cmd(
        config: Optional[Path] = typer.Option(None, "--config", help="TOML job configuration (see configs/)."),
        set_: List[str] = typer.Option([], "--set", help="Override: section.key=value (repeatable), e.g. train.epsilon=4."),
        out: Path = typer.Option(Path("runs/main"), "--out", help="Output directory (rerun the same command to resume)."),
        json_out: bool = JsonOpt,
    ) -> None:
        """Run the whole job on real data and write report.json, report.md and plots."""

        def body() -> dict:
            from fedhype.pipeline.config import resolve
            from fedhype.pipeline.job import run_job

            conf = resolve(config, set_)
            return run_job(conf, out, log=lambda s: console.print(s, highlight=False), on_round=round_printer(conf["train"]["rounds"]))

        run_command(body, json_out, _render)
