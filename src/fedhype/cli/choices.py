"""The closed sets of option values, checked by the parser before any heavy import.

Each tuple mirrors the library constant named beside it (``tests/cli/test_cli_usability.py`` holds them
equal), so the parser refuses a bad value in well under a second instead of after torch has loaded.
"""

from __future__ import annotations

import click

SCHEMES = ("domain", "dirichlet", "iid")  # fedhype.data.partition.SCHEMES
SPLITS = ("train", "val", "test")  # fedhype.data.partition.SPLITS
POOLINGS = ("cls", "mean")  # fedhype.encoders.registry.POOLINGS
LAYOUTS = ("auto", "class", "domain/class")  # fedhype.data.layout.LAYOUTS
DTYPES = ("auto", "float32", "bfloat16", "float16")  # "auto" + fedhype.encoders.base._DTYPES
SPACES = ("l2", "raw")  # fedhype.eval.inputs.SPACES
HEADS = ("prototype", "linear", "both")  # fedhype.prototypes.classifier.HEADS
MATCHINGS = ("none", "synthetic", "dp")  # fedhype prototypes train --matching
CANARIES = ("white-box", "black-box")  # fedhype audit --canaries


def choice(values: tuple[str, ...]) -> click.Choice:
    """A parser-level choice (exit 2 with the allowed values listed)."""
    return click.Choice(list(values), case_sensitive=True)
