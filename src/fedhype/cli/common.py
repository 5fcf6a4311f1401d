"""Shared CLI plumbing: stderr console, ``--json`` output and error → exit-code mapping.

Contract (README, "CLI contract"): with ``--json`` a command prints exactly one JSON object on
stdout; progress and logs go to stderr. Exit codes: 0 ok, 1 runtime error, 2 usage/validation
error, 3 privacy budget would be exceeded, 4 corrupt or mismatched artifact.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Callable

import typer
from rich.console import Console
from rich.table import Table

from fedhype.errors import FedhypeError

#: All human output and progress goes to stderr; stdout carries results only.
console = Console(stderr=True)

JsonOpt = typer.Option(False, "--json", help="Print exactly one JSON object on stdout (logs go to stderr).")


def _clean(obj: Any) -> Any:
    """Make ``obj`` strict-JSON: NaN/Inf become null, tensors/arrays become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _clean(obj.tolist())
    if hasattr(obj, "__fspath__"):
        return os.fspath(obj)
    return obj


def emit_json(result: dict[str, Any]) -> None:
    """Print one JSON object on stdout."""
    sys.stdout.write(json.dumps(_clean(result), allow_nan=False) + "\n")
    sys.stdout.flush()


def kv_table(title: str, rows: dict[str, Any]) -> Table:
    """A two-column rich table of ``rows`` (floats shown with 4 significant digits)."""
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for k, v in rows.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        table.add_row(str(k), str(v))
    return table


def run_command(
    body: Callable[[], dict[str, Any]],
    json_mode: bool,
    render: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Run a command body and map its outcome to output and exit code.

    ``body`` returns the result object. With ``json_mode`` it is printed as one JSON object on
    stdout; otherwise ``render`` (or a key/value table) prints it to stdout for humans.
    A :class:`FedhypeError` exits with its ``exit_code`` after a one-line message on stderr (and,
    with ``--json``, ``{"error", "exit_code"}`` on stdout). Any other exception exits 1 without a
    traceback (set ``FEDHYPE_DEBUG=1`` to see one); locals are never printed.
    """
    try:
        result = body()
    except FedhypeError as exc:
        _fail(str(exc), exc.exit_code, json_mode, extra=_error_extra(exc))
    except KeyboardInterrupt:
        _fail("interrupted; rerun the same command to resume from the last checkpoint", 1, json_mode)
    except Exception as exc:  # noqa: BLE001 - the CLI boundary
        if os.environ.get("FEDHYPE_DEBUG"):
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc} (set FEDHYPE_DEBUG=1 for a traceback)", 1, json_mode)
    else:
        if json_mode:
            emit_json(result)
        elif render is not None:
            render(result)
        else:
            Console().print(kv_table("result", {k: v for k, v in result.items() if not isinstance(v, (dict, list))}))


def _error_extra(exc: FedhypeError) -> dict[str, Any]:
    extra = {}
    for key in ("epsilon", "limit"):
        if getattr(exc, key, None) is not None:
            extra[key] = getattr(exc, key)
    return extra


def _fail(message: str, code: int, json_mode: bool, extra: dict[str, Any] | None = None) -> None:
    console.print(f"[bold red]error[/]: {message}", highlight=False, markup=True, soft_wrap=True)
    if json_mode:
        emit_json({"error": message, "exit_code": code, **(extra or {})})
    raise typer.Exit(code)


def round_printer(rounds: int) -> Callable[[dict], None]:
    """A progress callback printing one stderr line per training round (ε and held-out diagnostics)."""

    def show(m: dict) -> None:
        eps = m.get("epsilon")
        d = m.get("diagnostics_not_dp", {})
        console.print(f"train: round {m['round'] + 1}/{rounds}  ε={'–' if eps is None else f'{eps:.3f}'}  "
                      f"val −ELBO={d.get('val_neg_elbo', float('nan')):.1f}  "
                      f"val MMD²={d.get('val_mmd2', float('nan')):.4f}  ({m['seconds']:.1f}s)", highlight=False)

    return show
