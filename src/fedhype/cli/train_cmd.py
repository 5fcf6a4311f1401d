"""``fedhype train``: federated FedHypeVAE training under record-level DP."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from fedhype.cli.common import JsonOpt, console, kv_table, round_printer, run_command


def _render(res: dict) -> None:
    rows = {k: res[k] for k in ("run_dir", "epsilon", "delta", "noise_multiplier", "rounds", "private", "seed_secure")}
    rows["clients"] = ", ".join(res["clients"])
    rows["upload bytes/round/client"] = res["traffic"]["upload_bytes_per_round"]
    Console().print(kv_table("fedhype train", rows))
    if not res["private"]:
        console.print("[bold yellow]NON-PRIVATE run (--no-dp): no DP guarantee on any output[/]")


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        store: Path = typer.Option(..., "--store", help="Embeddings store (from `fedhype embed`)."),
        partition: Path = typer.Option(..., "--partition", help="Partition file (from `fedhype partition`)."),
        out: Path = typer.Option(..., "--out", help="Run directory to write."),
        epsilon: Optional[float] = typer.Option(1.0, "--epsilon", help="Target ε; σ is calibrated for the plan run."),
        delta: float = typer.Option(1e-4, "--delta", help="δ (must be < 1/n for every client)."),
        noise_multiplier: Optional[float] = typer.Option(None, "--noise-multiplier", help="Set σ directly (overrides --epsilon)."),
        no_dp: bool = typer.Option(False, "--no-dp", help="Explicitly NON-PRIVATE: no clipping, no noise; outputs marked non-private."),
        clip_norm: float = typer.Option(1.5, "--clip-norm", help="Per-example clipping norm C."),
        rounds: int = typer.Option(30, "--rounds", help="Federated rounds."),
        local_epochs: float = typer.Option(1.0, "--local-epochs", help="Local epochs per round (K_i = ceil(E·n_i/B))."),
        local_steps: Optional[int] = typer.Option(None, "--local-steps", help="Fixed local steps per round (overrides --local-epochs)."),
        batch_size: int = typer.Option(64, "--batch-size", help="Expected Poisson batch size B (q_i = B/n_i)."),
        participation: float = typer.Option(1.0, "--participation", help="Fraction of clients per round."),
        lr_local: float = typer.Option(1e-3, "--lr-local", help="Local Adam learning rate."),
        max_epsilon: Optional[float] = typer.Option(None, "--max-epsilon", help="Refuse (exit 3) before exceeding this ε."),
        method: str = typer.Option("fedhypevae", "--method", help="fedhypevae | dp-cvae | no-mmd | no-lipschitz | fixed-prior | shared-decoder."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Reproducible run (recorded as 'not secure')."),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out."),
        json_out: bool = JsonOpt,
    ) -> None:
        """Train the hypernetwork CVAE across clients; only clipped+noised updates leave a client."""

        def body() -> dict:
            from fedhype.data.partition import Partition
            from fedhype.data.store import EmbeddingStore
            from fedhype.federated.config import TrainConfig
            from fedhype.federated.engine import train

            cfg = TrainConfig(rounds=rounds, local_epochs=local_epochs, local_steps=local_steps, batch_size=batch_size,
                              participation=participation, lr_local=lr_local,
                              epsilon=None if (noise_multiplier is not None or no_dp) else epsilon, delta=delta,
                              noise_multiplier=noise_multiplier, clip_norm=clip_norm, no_dp=no_dp,
                              max_epsilon=max_epsilon, seed=seed, method=method)
            s = EmbeddingStore.load(store)
            p = Partition.load(partition)
            return train(s, p, cfg, out, resume=resume, progress=round_printer(rounds))

        run_command(body, json_out, _render)
