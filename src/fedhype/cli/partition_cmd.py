"""``fedhype partition``: split an embeddings store over clients (train/val/test sample ids)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from fedhype.cli.choices import SCHEMES, choice
from fedhype.cli.common import (JobDefaultsCommand, JsonOpt, check_out_file, config_default, console, existing,
                                renamed_option, run_command, seed_value)
from fedhype.errors import ArtifactError, FedhypeError, MinRecordsError, ValidationError
from fedhype.pipeline.config import DEFAULTS

#: Clients named in a "too few train records" refusal; the rest are counted.
SHOWN = 5

def _parse_split(text: str) -> tuple[float, float, float]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise ValidationError(f"--fractions must be three comma-separated fractions like 0.6,0.2,0.2, got {text!r}")
    return parts  # type: ignore[return-value]


def _advice(scheme: str, clients: int | None, n_domains: int, max_clients: int | None, tried: bool = False) -> str:
    """What to do about clients below --min-records, for ``scheme``; ``tried``: ``max_clients`` is a count the
    partition was tried with and fits (else a bound from the records' total, which a skew can lower)."""
    fewer = (f"--clients {max_clients} (the most that fit with these settings and --seed)"
             if tried and max_clients and clients and clients > max_clients else
             f"--clients ≤ {max_clients}" if max_clients and clients and clients > max_clients else "fewer --clients")
    if scheme == "domain" and clients is None:
        return ("with --scheme domain each domain is one client, so a small domain cannot be helped by client "
                "counts: lower --min-records, raise the train fraction of --fractions, pool the domains with "
                "--scheme iid or dirichlet, or leave the small domain out of the store")
    if scheme == "domain":
        return (f"use fewer --clients (at least {n_domains}: one per domain; omit --clients for exactly one per "
                "domain) or lower --min-records")
    if scheme == "dirichlet":
        return f"use {fewer}, a larger --alpha (less label skew) or lower --min-records"
    return f"use {fewer}, a larger or no --quantity-skew, or lower --min-records"


def _largest_fitting(attempt, upper: int, tries: int = 40) -> int | None:
    """The largest client count k ≤ ``upper`` for which ``attempt(k)`` (the partition with every other setting
    unchanged) raises no :class:`MinRecordsError`, trying downward from ``upper`` at most ``tries`` counts (each is
    one partition of the store: milliseconds to a second); None when none of them fits."""
    for k in range(upper, max(0, upper - tries), -1):
        try:
            attempt(k)
            return k
        except MinRecordsError:
            continue
        except ValidationError:
            return None
    return None


def _precheck(n: int, clients: int | None, train_fraction: float, min_train: int,
              attempt: "Callable[[int], Any] | None" = None) -> None:
    """Refuse a client count that cannot give every client ``min_train`` train records, before partitioning.

    A client's train split is within one record of its share, so the clients hold at most
    ``n·fraction + clients`` train records together; a count needing more is refused with the
    largest count that could fit — or, given ``attempt`` (the partition at a client count: a skewed scheme, where
    fewer fit), the largest count that does (:func:`_largest_fitting`). Borderline counts are left to
    :func:`make_partition`.
    """
    m = max(1, min_train)
    if clients is None or clients < 1 or (clients <= n and clients * (m - 1) <= n * train_fraction):
        return
    fit = int(n * train_fraction // m)
    found = _largest_fitting(attempt, min(fit, clients - 1)) if attempt is not None and fit >= 1 else None
    use = (f"use --clients {found} (the most that fit with these settings and --seed)" if found is not None else
           f"use --clients {fit} or fewer")
    raise ValidationError(
        f"--clients {clients} is too many for {n} records: a train fraction of {train_fraction:g} (--fractions) gives "
        f"about {round(n * train_fraction)} train records in all, fewer than the {clients} × {m} that --min-records "
        f"{min_train} asks for; " + (f"{use}, or lower --min-records" if fit >= 1
                                     else "lower --min-records or use a larger store"))


def _shorten(exc: ValidationError, scheme: str, clients: int | None, n_domains: int, max_clients: int,
             tried: bool = False) -> ValidationError:
    """A "clients below --min-records" refusal with at most :data:`SHOWN` clients named and advice for ``scheme``.

    Reads the fields of the :class:`~fedhype.errors.MinRecordsError` of
    :func:`fedhype.data.partition.make_partition` (every client below the minimum); any other
    refusal is returned unchanged. tests/cli/test_cli_usability.py pins the format.
    """
    if not isinstance(exc, MinRecordsError) or exc.stage != "partition":
        return exc
    shown = ", ".join(f"{name} ({tr} train / {tot} records)" for name, tr, tot in exc.clients[:SHOWN])
    rest = len(exc.clients) - min(len(exc.clients), SHOWN)
    more = f" and {rest} more" if rest > 0 else ""
    what = "domains are too small to be clients" if scheme == "domain" and clients is None else \
        f"clients have fewer than {exc.minimum} train records (--min-records)"
    return MinRecordsError(f"{len(exc.clients)} of {exc.n_clients} {what}: {shown}{more}; "
                           f"{_advice(scheme, clients, n_domains, max_clients, tried)}",
                           stage=exc.stage, minimum=exc.minimum, clients=exc.clients, n_clients=exc.n_clients)


def _render(result: dict[str, Any]) -> None:
    table = Table(title=f"partition {result['partition']} ({result['scheme']}, {len(result['clients'])} client{'' if len(result['clients']) == 1 else 's'})")
    for col in ("client", "name", "train", "val", "test", "classes"):
        table.add_column(col, justify="left" if col == "name" else "right")
    for c in result["clients"]:
        table.add_row(str(c["client"]), c["name"], str(c["train"]), str(c["val"]), str(c["test"]),
                      f"{c['classes_present']}/{result['n_classes']}")
    Console().print(table)


def partition(
    store: Path = typer.Option(..., "--store", help="Embeddings store (.safetensors) made by `fedhype embed`.",
                               callback=existing("embeddings store", "create it with `fedhype embed`")),
    scheme: str = typer.Option(..., "--scheme", help="domain | dirichlet | iid", click_type=choice(SCHEMES)),
    clients: int | None = typer.Option(None, "--clients", help="Number of clients (dirichlet/iid: required; domain: ≥ #domains)."),
    alpha: float | None = typer.Option(None, "--alpha", help="Dirichlet concentration α (dirichlet scheme only; default "
                                       f"{DEFAULTS['partition']['alpha']:g}; smaller = more label skew)."),
    quantity_skew: float | None = typer.Option(None, "--quantity-skew", help="iid only: client sizes ~ Dirichlet(S)."),
    split: str = renamed_option("0.6,0.2,0.2", "--fractions", "--split", help="train,val,test fractions of each client's records."),
    min_train: int = renamed_option(..., "--min-records", "--min-train", help="Refuse a partition in which a client has fewer "
                                    "training records (`fedhype train --min-records` checks the same at training time).",
                                    default_factory=config_default("partition", "min_records")),
    seed: int = typer.Option(0, "--seed", callback=seed_value, help="Seed of the partition."),
    draw_splits: bool = typer.Option(False, "--draw-splits", help="Draw every client's train/val/test from --fractions "
                                     "even when the store's image folders give splits (train/, val/, test/)."),
    out: Path = typer.Option(..., "--out", help="Partition JSON file to write; an existing file is refused unless "
                             "--overwrite."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out, if it is a partition (an "
                                   "embeddings store or any other file is never replaced)."),
    json_mode: bool = JsonOpt,
) -> None:
    """Partition a store over clients and write the partition (opaque record ids, no data).

    Private to the store's holder: a federation's server gets only its roster; real sites split with `fedhype site`."""

    def body() -> dict[str, Any]:
        from fedhype.data.partition import FORMAT, given_splits_line, make_partition
        from fedhype.data.store import EmbeddingStore

        check_out_file(out, overwrite, writes=FORMAT, command="partition")
        if alpha is not None and scheme != "dirichlet":  # a probe's --scheme domain --alpha 0.1 was taken silently
            raise ValidationError(f"--alpha applies to --scheme dirichlet only (the label skew of a Dirichlet partition); "
                                  f"--scheme {scheme} does not use it: leave it out"
                                  + (" (--quantity-skew sets unequal client sizes)" if scheme == "iid" else ""))
        splits = _parse_split(split)
        emb = EmbeddingStore.load(store)
        if emb.kind != "real":  # as `fedhype site` and `fedhype train`: a partition splits real records
            raise ArtifactError(f"--store {store} is a {emb.kind!r} store; `fedhype partition` splits the real "
                                "embeddings `fedhype embed` wrote (a synthetic store is drawn from a run, not a "
                                "client's data)")
        valid = min(splits) >= 0 and splits[0] > 0 and abs(sum(splits) - 1) <= 1e-6  # else make_partition says why
        fraction = splits[0] / sum(splits) if valid else 1.0
        def attempt(k: int | None):
            return make_partition(emb, scheme=scheme, n_clients=k,
                                  alpha=DEFAULTS["partition"]["alpha"] if alpha is None else alpha,
                                  quantity_skew=quantity_skew, splits=splits, min_train_per_client=min_train, seed=seed,
                                  use_given_splits=not draw_splits)

        # the records' total bounds the count, a skew lowers it (a probe's "use --clients ≤ 28", and then the
        # precheck's "18 or fewer", failed when followed): where it does, the largest count that fits, by trying
        skewed = scheme == "dirichlet" or (scheme == "iid" and bool(quantity_skew))
        if valid and min_train >= 0 and scheme in ("domain", "dirichlet", "iid"):
            _precheck(len(emb), clients, fraction, min_train, attempt if skewed else None)
        try:
            part = attempt(clients)
        except ValidationError as exc:
            fit, found = int(len(emb) * fraction // max(1, min_train)), None
            if isinstance(exc, MinRecordsError) and clients and scheme != "domain":
                found = _largest_fitting(attempt, min(fit, clients - 1))
            raise _shorten(exc, scheme, clients, len(emb.domain_names), found or fit, found is not None) from None
        given = part.params.get("given_splits")
        if given:
            console.print(given_splits_line(given, "--draw-splits draws every split instead"), highlight=False)
        replaced = None
        if overwrite and out.exists():  # each partition draws a new random key, and a run is bound to its partition's key
            from fedhype.data.partition import Partition

            try:
                replaced = Partition.load(out).data_key
            except FedhypeError:
                replaced = None
        part.save(out)
        if replaced is not None and replaced != part.data_key:  # a probe orphaned a finished run this way, silently
            console.print(f"warning: --overwrite replaced the partition {out} (key {replaced[:8]}…) with a new one (key "
                          f"{part.data_key[:8]}…): a run trained on the old one is bound to its key, so `evaluate` and "
                          "`audit --mia` of that run now need the old file — write a new partition to another --out "
                          "instead if a run used this one", highlight=False)
        labels = emb.labels.numpy()
        rows = []
        for c, size in zip(part.clients, part.sizes()):
            pos = emb.positions(c.train + c.val + c.test)
            rows.append({**size, "classes_present": int(np.unique(labels[pos]).size)})
        console.print(f"wrote {out}", highlight=False)
        # the option names (--fractions, --min-records); the partition file keeps its format's own keys
        names = {"splits": "fractions", "min_train_per_client": "min_records"}
        params = {names.get(k, k): v for k, v in part.params.items()}
        return {"partition": str(out), "scheme": part.scheme, "params": params, "seed": part.seed,
                "n_classes": emb.n_classes, "given_splits": given, "clients": rows}

    run_command(body, json_mode, _render)


def register(app: typer.Typer) -> None:
    app.command("partition", cls=JobDefaultsCommand)(partition)
