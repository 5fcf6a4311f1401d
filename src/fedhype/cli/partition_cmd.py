"""``fedhype partition``: split an embeddings store over clients (train/val/test sample ids)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from fedhype.cli.common import JsonOpt, console, run_command
from fedhype.errors import ValidationError


def _parse_split(text: str) -> tuple[float, float, float]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise ValidationError(f"--split must be three comma-separated fractions like 0.6,0.2,0.2, got {text!r}")
    return parts  # type: ignore[return-value]


def _render(result: dict[str, Any]) -> None:
    table = Table(title=f"partition {result['partition']} ({result['scheme']}, {len(result['clients'])} clients)")
    for col in ("client", "name", "train", "val", "test", "classes"):
        table.add_column(col, justify="left" if col == "name" else "right")
    for c in result["clients"]:
        table.add_row(str(c["client"]), c["name"], str(c["train"]), str(c["val"]), str(c["test"]),
                      f"{c['classes_present']}/{result['n_classes']}")
    Console().print(table)


def partition(
    store: Path = typer.Option(..., "--store", help="Embeddings store (.safetensors) made by `fedhype embed`."),
    scheme: str = typer.Option(..., "--scheme", help="domain | dirichlet | iid"),
    clients: int | None = typer.Option(None, "--clients", help="Number of clients (dirichlet/iid: required; domain: ≥ #domains)."),
    alpha: float = typer.Option(0.3, "--alpha", help="Dirichlet concentration α (dirichlet scheme; smaller = more label skew)."),
    quantity_skew: float | None = typer.Option(None, "--quantity-skew", help="iid only: client sizes ~ Dirichlet(S)."),
    split: str = typer.Option("0.6,0.2,0.2", "--split", help="train,val,test fractions per client."),
    min_train: int = typer.Option(20, "--min-train", help="Refuse clients with fewer train records."),
    seed: int = typer.Option(0, "--seed", help="Seed of the partition."),
    out: Path = typer.Option(..., "--out", help="Partition JSON file to write."),
    json_mode: bool = JsonOpt,
) -> None:
    """Partition a store over clients and write the partition (sample ids only, no data)."""

    def body() -> dict[str, Any]:
        from fedhype.data.partition import make_partition
        from fedhype.data.store import EmbeddingStore

        splits = _parse_split(split)
        emb = EmbeddingStore.load(store)
        part = make_partition(emb, scheme=scheme, n_clients=clients, alpha=alpha, quantity_skew=quantity_skew,
                              splits=splits, min_train_per_client=min_train, seed=seed)
        part.save(out)
        labels = emb.labels.numpy()
        rows = []
        for c, size in zip(part.clients, part.sizes()):
            pos = emb.positions(c.train + c.val + c.test)
            rows.append({**size, "classes_present": int(np.unique(labels[pos]).size)})
        console.print(f"wrote {out}", highlight=False)
        return {"partition": str(out), "scheme": part.scheme, "params": part.params, "seed": part.seed,
                "n_classes": emb.n_classes, "clients": rows}

    run_command(body, json_mode, _render)


def register(app: typer.Typer) -> None:
    app.command("partition")(partition)
