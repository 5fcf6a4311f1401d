"""Structured errors: the CLI words its advice from an error's fields, never by parsing its message."""

from __future__ import annotations

import pytest

from fedhype.errors import MinRecordsError, ValidationError


def test_partition_refusal_carries_every_small_client(real_store):
    from fedhype.data.partition import make_partition

    with pytest.raises(MinRecordsError) as info:
        make_partition(real_store, scheme="iid", n_clients=8, min_train_per_client=70, seed=0)
    exc = info.value
    assert isinstance(exc, ValidationError) and exc.exit_code == 2
    assert exc.stage == "partition" and exc.minimum == 70 and exc.n_clients == 8
    assert len(exc.clients) == 8 and all(n < 70 and total >= n for _, n, total in exc.clients)
    assert (exc.client, exc.n) == exc.clients[0][:2]
    assert f"{exc.client} ({exc.n} train / {exc.clients[0][2]} records)" in str(exc)


def test_engine_refusal_names_the_first_small_client_and_the_cli_rewords_it_from_the_fields(real_store):
    from fedhype.cli.partition_cmd import _shorten
    from fedhype.cli.train_cmd import explain_min_records
    from fedhype.data.partition import make_partition
    from fedhype.federated.config import TrainConfig
    from fedhype.federated.engine import check_client_sizes

    part = make_partition(real_store, scheme="domain", seed=0)
    sizes = {c.name: len(c.train) for c in part.clients}
    with pytest.raises(MinRecordsError) as info:
        check_client_sizes(part, TrainConfig(min_records=10_000))
    exc = info.value
    assert exc.stage == "train" and exc.minimum == 10_000 and exc.n_clients == len(part.clients)
    assert exc.client == part.clients[0].name and exc.n == sizes[exc.client]
    worded = explain_min_records(exc, records="--min-records", partition="`fedhype partition --min-records {need}`")
    assert isinstance(worded, MinRecordsError) and (worded.client, worded.n, worded.minimum) == (exc.client, exc.n, 10_000)
    assert str(worded).startswith(f"client {exc.client!r} has {exc.n} training records, fewer than --min-records 10000")
    assert "`fedhype partition --min-records 10000`" in str(worded)
    # each command rewords only its own stage's refusal; anything else passes through unchanged
    assert _shorten(exc, "domain", None, 4, 10) is exc
    other = ValidationError("client 'x' has 3 training records (< min_records=5)")  # the words alone mean nothing
    assert explain_min_records(other, records="--min-records", partition="") is other
    with pytest.raises(MinRecordsError) as small:
        make_partition(real_store, scheme="iid", n_clients=8, min_train_per_client=70, seed=0)
    assert explain_min_records(small.value, records="--min-records", partition="") is small.value


def test_min_records_error_needs_a_stage_and_a_client():
    with pytest.raises(ValueError):
        MinRecordsError("x", stage="embed", minimum=1, clients=[("a", 0, 0)])
    with pytest.raises(ValueError):
        MinRecordsError("x", stage="train", minimum=1, clients=[])
