"""``--code`` parsing: the grammar, normalised weights and every refusal (no model needed)."""

from __future__ import annotations

import pytest
import torch

from fedhype.errors import ValidationError
from fedhype.synthesis.codes import parse_code_spec

CLIENTS, NAMES, SIZES = ["0", "1", "2"], ["mnist", "optdigits", "mnist-m"], [600, 200, 200]


def test_neutral_is_the_size_weighted_mean_of_the_codes():
    codes = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    spec = parse_code_spec("neutral", CLIENTS, NAMES, SIZES)
    assert torch.allclose(spec.code(codes, SIZES), torch.tensor([0.6, 0.2]))


def test_mix_and_mixture_normalise_weights_and_accept_names():
    spec = parse_code_spec("mix:0=1,optdigits=3", CLIENTS, NAMES, SIZES)
    assert spec.kind == "mix" and spec.indices == (0, 1) and spec.weights == (0.25, 0.75)
    bare = parse_code_spec("mixture", CLIENTS, NAMES, SIZES)
    assert bare.indices == (0, 1, 2) and bare.weights == pytest.approx((0.6, 0.2, 0.2))
    assert parse_code_spec("client:mnist-m", CLIENTS, NAMES).indices == (2,)


@pytest.mark.parametrize("spec, needle", [
    ("mix:0=nan", "must be a finite number ≥ 0"),
    ("mix:0=inf,1=1", "must be a finite number ≥ 0"),
    ("mix:0=-1,1=2", "must be a finite number ≥ 0"),
    ("mix:0=0,1=0", "positive sum"),
    ("mix:0=abc", "is not a number"),
    ("mix:0", "expected <id>=<weight>"),
    ("client:7", "unknown client '7'"),
    ("mixture:0=1,9=1", "unknown client '9'"),
    ("banana", "use client:<id>, neutral"),
])
def test_bad_specs_name_the_flag_and_the_problem(spec, needle):
    with pytest.raises(ValidationError) as e:
        parse_code_spec(spec, CLIENTS, NAMES, SIZES)
    assert str(e.value).startswith(f"--code {spec!r}") and needle in str(e.value)


def test_a_bare_mixture_needs_the_public_sizes():
    with pytest.raises(ValidationError, match="needs the run's public client sizes"):
        parse_code_spec("mixture", CLIENTS, NAMES)
