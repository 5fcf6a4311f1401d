"""What a training run returns (:func:`fedhype.federated.engine.train`, :func:`~fedhype.federated.engine.run_federation`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, eq=False)
class TrainResult(Mapping):
    """What a call of :func:`~fedhype.federated.engine.train` / :func:`~fedhype.federated.engine.run_federation` returns.

    Also a read-only mapping of its fields (``res["epsilon"]``, ``res.get(...)``, ``dict(res)``, in this
    order; :meth:`to_dict`), so code written for the dictionary this used to be keeps working.

    Attributes:
        run_dir: the run directory.
        epsilon: the worst client's ε at ``delta``, recomputed from the ledger (None without DP).
        delta: δ.
        rounds: rounds committed so far; rounds_planned: rounds the run trains in all (0: statistics only).
        clients: the clients' public ids, in partition order.
        noise_multiplier: σ of the DP-SGD steps (None without DP or rounds).
        private: False for an explicitly non-private run.
        class_stats_noise_multiplier: σ₀ of the statistics release before round 0 (None without one).
        epsilon_per_client: client id → ε ({} without DP).
        clip_norm: C of the DP-SGD rounds; None for a run that trains no round (``rounds_planned`` 0: ``dp-gaussian``,
            ``no-dp-sgd``, ``fedhypevae`` whose stage the client-size rule switched off: C clips nothing there) and
            for a non-private run (``no_dp``: nothing is clipped).
        seed: the run seed (None: OS-entropy noise); noise_seeded: ``seed is not None``.
        traffic: parameter and message sizes (:meth:`fedhype.models.hypernet.HyperNetwork.traffic`); for a run that
            trains no round the per-round bytes are 0, with :data:`NO_ROUND_TRAFFIC` as ``note``
            (:func:`without_rounds`).
        secure_aggregation: ``{"clients", "dropout_tolerance", "min_contributions"}``, or None.
        complete: every planned round is committed.
        client_names: the clients' names (a partition's or the sites'), in the order of ``clients``; the
            ids key the ledger and ``epsilon_per_client``, the names are what a report and privacy.json show.
        method: the method the run trained: ``no-dp-sgd`` where ``fedhypevae``'s DP-SGD stage was off for its client
            sizes (:meth:`fedhype.federated.config.TrainConfig.for_clients`, docs/method.md decision 22).
    """

    run_dir: str
    epsilon: float | None
    delta: float
    rounds: int
    rounds_planned: int
    clients: list[str]
    noise_multiplier: float | None
    private: bool
    class_stats_noise_multiplier: float | None
    epsilon_per_client: dict[str, float]
    clip_norm: float | None
    seed: int | None
    noise_seeded: bool
    traffic: dict[str, Any]
    secure_aggregation: dict[str, int] | None
    complete: bool
    client_names: list[str]
    method: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of the fields (the keys train returned before it returned this class)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __getitem__(self, key: str) -> Any:
        if key not in _RESULT_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_RESULT_KEYS)

    def __len__(self) -> int:
        return len(_RESULT_KEYS)


_RESULT_KEYS = tuple(f.name for f in fields(TrainResult))

#: ``TrainResult.traffic["note"]`` (and report.json's) of a run that trains no DP-SGD round
NO_ROUND_TRAFFIC = ("no DP-SGD round ran: no per-round traffic (the statistics release before round 0 is not counted "
                    "here)")


def without_rounds(traffic: dict[str, Any] | None) -> dict[str, Any] | None:
    """``traffic`` (:meth:`fedhype.models.hypernet.HyperNetwork.traffic`) of a run that trains no DP-SGD round: the
    per-round bytes 0 with :data:`NO_ROUND_TRAFFIC` as ``note``, the parameter counts kept (the model's size); a
    new dict (None stays None)."""
    if traffic is None:
        return None
    return {**traffic, "download_bytes_per_round": 0, "upload_bytes_per_round": 0, "note": NO_ROUND_TRAFFIC}
