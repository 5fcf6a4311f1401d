"""The ``fedhype`` command: one Typer app, one module per subcommand."""

from __future__ import annotations

import typer

from fedhype import __version__
from fedhype.cli.common import JsonUsageGroup

#: The root group prints parser errors (unknown option, missing option, bad value) as one JSON
#: object when ``--json`` is among the arguments (see :class:`~fedhype.cli.common.JsonUsageGroup`).
app = typer.Typer(
    cls=JsonUsageGroup,
    name="fedhype",
    help="Differentially private synthetic embeddings from a federated hypernetwork CVAE.",
    pretty_exceptions_show_locals=False,
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fedhype {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """fedhype: DP synthetic embeddings (FedHypeVAE), privacy budgets, fidelity and utility."""


#: Subcommand modules under ``fedhype.cli``, in help order; each exposes ``register(app)``.
_COMMANDS: list[str] = ["embed_cmd", "partition_cmd", "site_cmd", "train_cmd", "synthesize_cmd", "evaluate_cmd", "budget_cmd", "audit_cmd", "prototypes_cmd", "run_cmd"]


def _register() -> None:
    # Each subcommand module exposes ``register(app)``. Add one line per command.
    import importlib

    for name in _COMMANDS:
        importlib.import_module(f"fedhype.cli.{name}").register(app)


_register()


def main() -> None:
    """Console-script entry point (``[project.scripts] fedhype``): the Typer app, whose root group
    also turns parser errors into the ``--json`` error object."""
    app()


if __name__ == "__main__":
    main()
