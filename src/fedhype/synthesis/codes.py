"""Code specifications: which (meta-)code a synthetic set is drawn from.

Grammar (``--code``):

* ``client:<id>`` — that client's DP code c_i (id or client name);
* ``neutral`` — the neutral meta-code c̄ = Σ_i n_i c_i / Σ_i n_i, the data-size-weighted mean of
  the DP client codes with public client sizes n_i (docs/method.md, decision 6);
* ``mix:<id>=<w>,<id>=<w>,...`` — a convex combination in code space c = Σ w_i c_i;
* ``mixture:<id>=<w>,...`` — a mixture of the per-code distributions: each sample first draws a
  client with probability w_i, then decodes with θ_i = h(c_i);
* ``mixture`` — the mixture over all clients with w_i ∝ n_i (public client sizes): the
  distribution-space counterpart of ``neutral``, and the only all-client spec of a ``local-cvae``
  run, which has no shared code space (:mod:`fedhype.federated.baselines`).

Weights are normalised to sum to 1; they must be ≥ 0 with a positive sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedhype.errors import ValidationError, counted, listed


@dataclass(frozen=True)
class CodeSpec:
    """A parsed ``--code``: ``kind`` in {client, neutral, mix, mixture}, client indices and weights."""

    kind: str
    indices: tuple[int, ...]
    weights: tuple[float, ...]
    text: str

    def code(self, codes: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """The single code for ``client`` / ``neutral`` / ``mix`` (``[code_dim]``)."""
        if self.kind == "neutral":
            w = torch.tensor(sizes, dtype=codes.dtype)
            return (w[:, None] * codes).sum(0) / w.sum()
        if self.kind == "mixture":
            raise ValueError("a mixture has no single code")
        w = torch.tensor(self.weights, dtype=codes.dtype)
        return (w[:, None] * codes[list(self.indices)]).sum(0)


def _resolve(token: str, clients: list[str], names: list[str], spec: str) -> int:
    token = token.strip()
    by_id = clients.index(token) if token in clients else None
    by_name = names.index(token) if token in names else None
    if by_id is not None and by_name is not None and by_id != by_name:  # e.g. sites named "0" and "1"
        raise ValidationError(f"--code {spec!r}: {token!r} is the id of client {by_id} (named {names[by_id]!r}) and the "
                              f"name of client {by_name} (id {clients[by_name]!r}); names that are also ids cannot be told "
                              "apart: give the sites names that are not numbers (`fedhype site --name`) and train again")
    for found in (by_id, by_name):
        if found is not None:
            return found
    raise ValidationError(f"--code {spec!r}: unknown client {token!r}; the {counted(len(clients), 'client')} {'has' if len(clients) == 1 else 'have'} ids "
                          f"{listed(repr(c) for c in clients)} and names {listed(repr(n) for n in names)}")


def parse_code_spec(spec: str, clients: list[str], names: list[str] | None = None,
                    sizes: list[int] | None = None) -> CodeSpec:
    """Parse ``spec`` against the run's client ids (and names, and public sizes for ``mixture``).

    Raises:
        ValidationError: malformed spec, unknown or repeated client, negative or all-zero weights, or a bare
            ``mixture`` without ``sizes``.
    """
    names = names or clients
    s = spec.strip()
    if s == "neutral":
        return CodeSpec("neutral", tuple(range(len(clients))), (), s)
    if s == "mixture":
        if sizes is None or len(sizes) != len(clients) or sum(sizes) <= 0:
            raise ValidationError(f"--code {spec!r}: a bare mixture needs the run's public client sizes; "
                                  "use mixture:<id>=<w>,...")
        total = float(sum(sizes))
        return CodeSpec("mixture", tuple(range(len(clients))), tuple(n / total for n in sizes), s)
    kind, _, rest = s.partition(":")
    if kind == "client" and rest:
        return CodeSpec("client", (_resolve(rest, clients, names, spec),), (1.0,), s)
    if kind in ("mix", "mixture") and rest:
        idx, w = [], []
        for part in rest.split(","):
            key, eq, val = part.partition("=")
            if not eq:
                raise ValidationError(f"--code {spec!r}: expected <id>=<weight>, got {part!r}")
            try:
                weight = float(val)
            except ValueError:
                raise ValidationError(f"--code {spec!r}: weight {val!r} is not a number") from None
            if not math.isfinite(weight) or weight < 0:
                raise ValidationError(f"--code {spec!r}: weight {val!r} must be a finite number ≥ 0")
            i = _resolve(key, clients, names, spec)
            if i in idx:  # by id and by name alike (a probe's "mix:0=1,0=2" was taken silently)
                raise ValidationError(f"--code {spec!r}: client {clients[i]!r} is listed twice; give each client "
                                      "once, with its total weight")
            idx.append(i)
            w.append(weight)
        total = sum(w)
        if total <= 0:
            raise ValidationError(f"--code {spec!r}: weights must have a positive sum")
        return CodeSpec(kind, tuple(idx), tuple(x / total for x in w), s)
    raise ValidationError(f"--code {spec!r}: use client:<id>, neutral, mix:<id>=<w>,..., mixture or "
                          "mixture:<id>=<w>,...")
