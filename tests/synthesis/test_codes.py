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
    ("mix:0=1,0=2", "client '0' is listed twice"),
    ("mixture:0=1,mnist=1", "client '0' is listed twice"),  # by id and by name
])
def test_bad_specs_name_the_flag_and_the_problem(spec, needle):
    with pytest.raises(ValidationError) as e:
        parse_code_spec(spec, CLIENTS, NAMES, SIZES)
    assert str(e.value).startswith(f"--code {spec!r}") and needle in str(e.value)


def test_an_unknown_client_among_many_names_five_and_counts_the_rest():
    """A probe's 100-client model listed every id and name in the error."""
    ids, names = [str(i) for i in range(100)], [f"site-{i}" for i in range(100)]
    with pytest.raises(ValidationError) as e:
        parse_code_spec("client:nosuch", ids, names)
    assert str(e.value) == ("--code 'client:nosuch': unknown client 'nosuch'; the 100 clients have ids '0', '1', "
                            "'2', '3', '4' and 95 more and names 'site-0', 'site-1', 'site-2', 'site-3', 'site-4' and 95 more")


def test_a_bare_mixture_needs_the_public_sizes():
    with pytest.raises(ValidationError, match="needs the run's public client sizes"):
        parse_code_spec("mixture", CLIENTS, NAMES)


def test_client_codes_of_a_pooled_model_come_with_a_note(real_store, tmp_path):
    """dp-gaussian has one pooled decoder: a client or mixture code samples the pooled model, and the
    synthetic store says so (the CLI prints it) instead of labelling the samples as the client's."""
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import train
    from fedhype.synthesis import synthesize

    part = make_partition(real_store, scheme="domain", seed=0)
    train(real_store, part, TrainConfig(method="dp-gaussian", epsilon=4.0, seed=0,
                                        model={"hidden": 32, "latent": 8, "hyper_hidden": 16, "code_dim": 8}),
          tmp_path / "g", diagnostics=False)
    syn = synthesize(tmp_path / "g", "mixture", per_class=5, seed=0)
    assert "one pooled decoder" in syn.meta["codes_note"]
    assert "codes_note" not in synthesize(tmp_path / "g", "neutral", per_class=5, seed=0).meta


def test_a_token_that_is_one_clients_id_and_anothers_name_is_refused():
    # sites named "1" and "0" trained as clients 0 and 1 (a new user's probe): client:1 drew the wrong site
    with pytest.raises(ValidationError, match=r"'1' is the id of client 1 \(named '0'\) and the name of client 0"):
        parse_code_spec("client:1", ["0", "1"], ["1", "0"])
    # a name equal to its own id is no ambiguity
    assert parse_code_spec("client:1", ["0", "1"], ["a", "1"]).indices == (1,)


def test_site_names_that_are_numbers_are_refused():
    from fedhype.data.sites import make_site

    with pytest.raises(ValidationError, match="not a number alone"):
        make_site(None, None, "12")
