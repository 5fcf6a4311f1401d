"""``fedhype synthesize``: synthetic embeddings from a trained run (DP by post-processing)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from fedhype.cli.common import JsonOpt, console, kv_table, run_command


def _weights(text: Optional[str]) -> Optional[list[float]]:
    if text is None:
        return None
    from fedhype.errors import ValidationError

    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise ValidationError(f"--label-weights {text!r}: expected comma-separated numbers, one per class") from None


def register(app: typer.Typer) -> None:
    @app.command("synthesize")
    def synthesize_cmd(
        run: Path = typer.Option(..., "--run", help="Run directory (or its model.safetensors)."),
        out: Path = typer.Option(..., "--out", help="Synthetic embeddings store to write (.safetensors)."),
        code: str = typer.Option("neutral", "--code", help="client:<id> | neutral | mix:<id>=<w>,... | mixture:<id>=<w>,..."),
        per_class: Optional[int] = typer.Option(None, "--per-class", help="Samples per class."),
        n: Optional[int] = typer.Option(None, "--n", help="Total samples (split by --label-weights; uniform by default)."),
        label_weights: Optional[str] = typer.Option(None, "--label-weights", help="Comma-separated class weights for --n."),
        temperature: float = typer.Option(1.0, "--temperature", help="Scale of the prior's std (1 = model distribution)."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed (default: OS entropy)."),
        json_out: bool = JsonOpt,
    ) -> None:
        """Decode synthetic class-conditional embeddings from the DP hypernetwork and codes."""

        def body() -> dict:
            import time

            from fedhype.synthesis import synthesize

            t0 = time.perf_counter()
            store = synthesize(run, code, per_class=per_class if (per_class or n) else (None if n else 100), n=n,
                               label_weights=_weights(label_weights), seed=seed, temperature=temperature)
            secs = time.perf_counter() - t0
            store.save(out)
            m = store.meta
            if not m["private"]:
                console.print("[bold yellow]NON-PRIVATE: the run was trained with --no-dp[/]")
            return {"store": str(out), "n": len(store), "dim": store.dim, "code": m["code"], "epsilon": m["epsilon"],
                    "delta": m["delta"], "private": m["private"], "seed": m["seed"], "class_counts": store.class_counts(),
                    "embeddings_per_s": len(store) / max(secs, 1e-9)}

        run_command(body, json_out, lambda r: Console().print(kv_table("fedhype synthesize", {
            k: v for k, v in r.items() if k != "class_counts"})))
