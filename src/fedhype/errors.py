"""Errors with the CLI exit code they map to.

Exit codes (documented in the README):

* 0 — success
* 1 — runtime error (:class:`FedhypeError`)
* 2 — usage or validation error (:class:`ValidationError`)
* 3 — the privacy budget would be exceeded (:class:`BudgetExceededError`)
* 4 — a corrupt or mismatched artifact (:class:`ArtifactError`)

Messages name the file or field at fault and say what to do; they never contain embeddings.
"""

from __future__ import annotations


class FedhypeError(Exception):
    """Base class; a runtime failure (exit code 1)."""

    exit_code = 1


class ValidationError(FedhypeError, ValueError):
    """Bad input: a wrong flag, file, field or value (exit code 2)."""

    exit_code = 2


class MinRecordsError(ValidationError):
    """A client's training set is smaller than the smallest one accepted (exit code 2).

    Raised by the partitioner (:func:`fedhype.data.partition.make_partition`, every client below the
    minimum) and by the engine (:func:`fedhype.federated.engine.check_client_sizes`, the first one);
    the CLI words its own advice from these fields, never from the message.

    Attributes:
        stage: which check refused: ``"partition"`` (the partitioner's minimum: ``fedhype partition
            --min-records``, ``partition.min_records``) or ``"train"`` (the engine's: ``fedhype train
            --min-records``, ``train.min_records``).
        minimum: the smallest training set asked for.
        clients: every client below it, in partition order, as ``(name, n_train, n_records)``:
            its name, its training records and all its records (train + val + test; None when unknown).
        n_clients: how many clients the partition has (None when unknown).
        client: the name of the first client below the minimum.
        n: its training records.
    """

    def __init__(self, message: str, *, stage: str, minimum: int, clients: list[tuple[str, int, int | None]],
                 n_clients: int | None = None):
        super().__init__(message)
        if stage not in ("partition", "train") or not clients:
            raise ValueError(f"MinRecordsError: stage must be 'partition' or 'train' and clients not empty, got "
                             f"{stage!r}, {clients!r}")
        self.stage = stage
        self.minimum = int(minimum)
        self.clients = [(str(name), int(n), None if total is None else int(total)) for name, n, total in clients]
        self.n_clients = None if n_clients is None else int(n_clients)

    @property
    def client(self) -> str:
        return self.clients[0][0]

    @property
    def n(self) -> int:
        return self.clients[0][1]


class BudgetExceededError(FedhypeError):
    """The planned or next step would take a client over its privacy budget (exit code 3).

    Attributes:
        epsilon: the ε (at the run's δ) that would have been reached.
        limit: the ε limit that was asked for.
    """

    exit_code = 3

    def __init__(self, message: str, *, epsilon: float | None = None, limit: float | None = None):
        super().__init__(message)
        self.epsilon = epsilon
        self.limit = limit


class ArtifactError(FedhypeError):
    """A corrupt, truncated, tampered or mismatched artifact (exit code 4)."""

    exit_code = 4


class FedhypeWarning(UserWarning):
    """What the CLI prints as ``warning:`` lines, raised by the Python API with :func:`warnings.warn`: the privacy
    advice (δ against 1/n, a batch at or above a client's training set), an ε above its target after a resume, and
    the notes of a synthetic store (classes the release cannot tell from absent, …). Silence them with
    ``warnings.simplefilter("ignore", fedhype.errors.FedhypeWarning)``."""


def listed(items, shown: int = 5) -> str:
    """``"a, b, c, d, e and 95 more"``: the first ``shown`` of ``items`` (strings), then how many are left, for messages
    that name clients (a probe's warnings and errors over 100 clients listed every one of them)."""
    items = [str(i) for i in items]
    head = ", ".join(items[:shown])
    return head + (f" and {len(items) - shown} more" if len(items) > shown else "")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``"1 client"``, ``"4 clients"``: ``n`` and ``noun`` in the number ``n`` takes (a probe read "1 clients")."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"
