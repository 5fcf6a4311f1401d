"""``fedhype run``: the main job, embed → partition → train → synthesize → evaluate → report."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from fedhype.cli.common import JsonOpt, console, kv_table, run_command


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
            rounds = conf["train"]["rounds"]

            def on_round(m: dict) -> None:
                eps = m.get("epsilon")
                d = m.get("diagnostics_not_dp", {})
                console.print(f"train: round {m['round'] + 1}/{rounds}  ε={'–' if eps is None else f'{eps:.3f}'}  "
                              f"val −ELBO={d.get('val_neg_elbo', float('nan')):.1f}  "
                              f"val MMD²={d.get('val_mmd2', float('nan')):.4f}  ({m['seconds']:.1f}s)", highlight=False)

            return run_job(conf, out, log=lambda s: console.print(s, highlight=False), on_round=on_round)

        run_command(body, json_out, _render)
