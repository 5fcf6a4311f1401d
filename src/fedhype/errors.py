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
