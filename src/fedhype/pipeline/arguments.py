"""Argument checks of the Python API (:mod:`fedhype.pipeline.api`): a wrong type or value is refused at the
boundary with a :class:`~fedhype.errors.ValidationError` naming the argument, what was given and what to give,
instead of a traceback from deep inside (a new user's probe: ``fit(clients, store)``, ``partition(None)``,
``sample(temperature=-1)``, ``evaluate(syn, test)``, …)."""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedhype.data.store import EmbeddingStore
from fedhype.errors import ValidationError

#: sampling seeds are below this (what torch.Generator.manual_seed keeps; train.seed's bound too)
MAX_SEED = 2 ** 63


def shown(value: Any) -> str:
    """How an argument is shown in a refusal: a short scalar as its repr, anything else by its type's name."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "…"
    return type(value).__name__


def is_whole(value: Any) -> bool:
    """A whole number: an int (numpy's too), or a float without a fractional part; never a bool."""
    if isinstance(value, bool):
        return False
    return isinstance(value, numbers.Integral) or (isinstance(value, float) and value.is_integer())


def is_number(value: Any) -> bool:
    """A real number (numpy's too), never a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_whole(where: str, name: str, value: Any, minimum: int, *, what: str = "") -> int:
    """``int(value)``, or a ValidationError ``{where}: {name} must be a whole number ≥ {minimum}{what}, got …``."""
    if not is_whole(value) or value < minimum:
        raise ValidationError(f"{where}: {name} must be a whole number ≥ {minimum}{what}, got {shown(value)}")
    return int(value)


def check_store(where: str, name: str, value: Any, hint: str) -> EmbeddingStore:
    """``value`` if it is an EmbeddingStore, else a ValidationError naming the argument and ``hint``."""
    if isinstance(value, EmbeddingStore):
        return value
    extra = ""
    if isinstance(value, (str, os.PathLike)):
        extra = (" (a name or path: make the store first with fedhype.embed(...), or read a saved one with "
                 "fedhype.data.store.EmbeddingStore.load(path))")
    raise ValidationError(f"{where}: {name} must be an EmbeddingStore ({hint}), got {shown(value)}{extra}")


def parse_fractions(value: Any, name: str = "fractions") -> tuple[float, float, float]:
    """``partition``'s train/val/test fractions as three floats: a sequence of three numbers, or the CLI's
    ``"0.6,0.2,0.2"`` (exactly three comma-separated numbers); their range and sum are
    :func:`~fedhype.data.partition.check_partition_args`'s to check."""
    given = repr(value)[:80] if isinstance(value, (list, tuple)) else shown(value)
    bad = ValidationError(f"partition: {name} must be a sequence of three numbers, train, val and test, e.g. "
                          f"(0.6, 0.2, 0.2), got {given}")
    if isinstance(value, str):
        try:
            parts = [float(x) for x in value.split(",")]
        except ValueError:
            raise bad from None
    elif isinstance(value, (bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise bad
    else:
        parts = list(value)
        if not all(is_number(x) for x in parts):
            raise bad
    if len(parts) != 3:
        raise bad
    return tuple(float(x) for x in parts)  # type: ignore[return-value]


def same_value(a: Any, b: Any) -> bool:
    """Whether two settings are the same value (1 and 1.0 are; True and 1 are not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    try:
        return bool(a == b)
    except Exception:  # an array or another value without a plain truth value
        return False


def in_api_words(text: str, n: int | None) -> ValidationError | None:
    """A refusal of :func:`fedhype.synthesis.synthesize` in :meth:`FedHypeVAE.sample`'s words: its ``--n`` and
    ``--code`` are ``n=`` and ``code=`` here, and ``sample`` has no ``--label-weights``."""
    few = re.match(r"--n (\d+) is fewer than the (\d+) classes", text)
    if few and n is not None:
        k = int(few.group(2))
        return ValidationError(f"sample: n={n} is fewer than the {k} classes: n is the total number of synthetic "
                               f"embeddings, split evenly between the classes, so {k - n} class(es) would get none; "
                               f"give n={k} or more, or per_class=N for N of every class")
    if text.startswith("--code "):
        return ValidationError("sample: code=" + text[len("--code "):])
    return None


def evaluate_store(name: str, value: Any, hint: str) -> EmbeddingStore:
    """An :func:`evaluate` store argument: an EmbeddingStore, or a store file's path (``EmbeddingStore.load``)."""
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if not path.is_file():
            raise ValidationError(f"evaluate: {name}= {str(path)!r}: no such store file; give an EmbeddingStore "
                                  f"({hint}) or the path of one saved with .save(path)")
        return EmbeddingStore.load(path)
    if isinstance(value, EmbeddingStore):
        return value
    raise ValidationError(f"evaluate: {name} must be an EmbeddingStore ({hint}) or the path of a saved store file, "
                          f"got {shown(value)}")
