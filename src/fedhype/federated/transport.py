"""How the server reaches its clients: a round's DP work, wherever the clients run.

The round logic — sample clients with public randomness, write the ledger ahead of spending,
hand θ_i to each sampled client, aggregate the returned updates, commit a checkpoint — is
:func:`fedhype.federated.engine.run_federation`, the same for every deployment. A *transport* only
carries one :class:`RoundTask` per sampled client to that client and brings back its
:class:`~fedhype.privacy.dp_step.PrivatizedUpdate`:

* :class:`InProcessTransport` — the clients are :class:`~fedhype.federated.client.Client` objects
  in this process (``fedhype train``);
* :class:`fedhype.federated.flower.grid_transport.FlowerTransport` — each client is a Flower
  SuperNode on its institution's machine (optional extra ``fedhype[flower]``).

A transport either returns one update per task or raises: a round with a missing update is
never aggregated (the engine then stops before its commit; ``resume`` reruns it). Where some clients
refused the request explicitly, before touching their records (a Flower node's refusal), the error
names them in its :data:`REFUSED` attribute and the engine voids their write-ahead charges for it
(:func:`void_refused`); a missing reply, a time-out or any other error keeps the charge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol, runtime_checkable

import torch

from fedhype.federated.diagnostics import round_diagnostics
from fedhype.io import atomic_save_tensors, load_tensors
from fedhype.models.config import ModelConfig
from fedhype.privacy.dp_step import DPConfig, PrivatizedUpdate


@dataclass(frozen=True)
class RoundTask:
    """What one sampled client is asked to run in one round: public values only, no data.

    Attributes:
        round: r, 0-based.
        index: the client's position in the partition (its code row on the server).
        client: the client's public id (str).
        theta: θ_i^0 = h_Φ(c_i), name → float32 tensor of the generated parameter's shape, or a
            zero-argument callable returning it (the engine's tasks: θ_i is then built when the
            transport reaches the task and dropped after, so a round's memory does not grow with the
            number of clients); read it through :meth:`theta_tensors`.
        model: the run's :class:`~fedhype.models.config.ModelConfig`.
        dp: σ and C of the DP-SGD steps (:class:`~fedhype.privacy.dp_step.DPConfig`).
        batch_size: expected Poisson batch size B (the client samples with q_i = min(1, B / n_i)).
        steps: K_i, the number of local DP-SGD steps.
        lr: learning rate of the local Adam steps.
    """

    round: int
    index: int
    client: str
    theta: "dict[str, torch.Tensor] | Callable[[], dict[str, torch.Tensor]]"
    model: ModelConfig
    dp: DPConfig
    batch_size: int
    steps: int
    lr: float

    def theta_tensors(self) -> dict[str, torch.Tensor]:
        """θ_i^0 as tensors (calls :attr:`theta` when it is a callable)."""
        return self.theta() if callable(self.theta) else self.theta


class ClientHandle(Protocol):
    """The server's handle of one client: public values and the DP releases before round 0, no data.

    A :class:`~fedhype.federated.client.Client` in process, a
    :class:`~fedhype.federated.flower.grid_transport.RemoteClient` for a SuperNode. (In-process
    clients also take ``distributed=`` in both releases: secure aggregation runs in process only.)

    Attributes:
        id: the client's public id (str).
        index: its position in the partition (its code row on the server).
        n: its training-set size n_i (public, as the dataset size is in DP-SGD).
    """

    id: str
    index: int

    @property
    def n(self) -> int: ...

    def release_centre(self, noise_multiplier: float | None) -> PrivatizedUpdate:
        """The client's DP sum and count of its unit records (the centred release's first step)."""

    def release_class_stats(self, n_classes: int, dp: DPConfig, weights=None, *, centring=None) -> PrivatizedUpdate:
        """The client's DP class statistics (sums, counts, second moments), around ``centring`` if given."""

    def set_space(self, space: tuple[torch.Tensor, torch.Tensor]) -> None:
        """The public model space ``(m [D], s [])`` the client trains in (DP outputs of the release)."""


class ClientTransport(Protocol):
    """The server's only channel to the clients (see the module docstring).

    Attributes:
        clients: one :class:`ClientHandle` per client in partition order.
    """

    clients: list[ClientHandle]

    def run_round(self, round_idx: int, tasks: list[RoundTask]) -> Iterable[PrivatizedUpdate]:
        """Run every task of round ``round_idx``; one PrivatizedUpdate per task, in task order (a list,
        or an iterator that runs each task when the engine asks for its update).

        Raises:
            FedhypeError (or a subclass): a client failed or did not answer; nothing is returned.
        """

    def replays_noise(self, index: int) -> bool:
        """True if a rerun of an interrupted round reproduces client ``index``'s noise exactly
        (seeded noise restored from its private state), so the rerun is not charged again."""

    def enforces_plan_cap(self, index: int) -> bool:
        """True if client ``index`` itself refuses requests past the ε of the published plan
        (:func:`fedhype.federated.run_plan.planned_epsilon_caps`; a Flower site node). The engine then prices
        the rounds still to run against that cap before the first, as it does against ``train.max_epsilon``.
        Optional: a transport without it counts as False."""

    def diagnostics(self, server, rounds_done: int, model: ModelConfig) -> dict[str, float] | None:
        """Held-out diagnostics NOT covered by DP (``None``: not computed by this transport)."""

    def after_commit(self, rounds_done: int) -> None:
        """Called once round ``rounds_done`` is committed (clients may drop older private state)."""


#: the attribute of an error a transport raises where some clients refused the request explicitly, before touching
#: their records: ``{client id: the refusal's text}`` (those clients ran nothing for it). A missing reply, a time-out
#: or any other error is no refusal: the client may have run its mechanism.
REFUSED = "refused"


def void_refused(ledger, charged, exc: BaseException, path) -> list:
    """Void (:func:`fedhype.privacy.ledger.void`, saved to ``path``) the write-ahead charges ``charged`` (the events
    charged for the request that failed with ``exc``) of the clients that ``exc`` names as having refused it
    (:data:`REFUSED`); nothing for any other error, nor for a client whose charges also go to a site's ledger across
    runs (:attr:`~fedhype.privacy.ledger.PrivacyLedger.mirrors`). Returns the void events recorded."""
    from fedhype.privacy.ledger import void

    refused = getattr(exc, REFUSED, None) or {}
    # a client mirrored to a site's ledger across runs keeps its charge there and here (never raised over the
    # original error: :func:`void` refuses mirrored clients)
    mine = [e for e in charged if e.client in refused and e.client not in getattr(ledger, "mirrors", {})]
    if not getattr(ledger, "takes_voids", False):  # a ledger started before voids existed: the charge stays (safe side)
        return []
    if not mine:
        return []

    def why(e) -> str:
        text = " ".join(str(refused[e.client]).split())
        return ("its node refused the request before running anything, so nothing was released: "
                + (text if len(text) <= 240 else text[:239] + "…"))

    return void(ledger, mine, why, path)


@runtime_checkable
class SupportsPreflight(Protocol):
    """A transport that can read the chosen clients' private state before a round is charged
    (:meth:`InProcessTransport.preflight`); a transport without it fails inside the round instead."""

    def preflight(self, round_idx: int, indices: list[int], model: ModelConfig) -> None:
        """Raise ArtifactError for a corrupt or truncated state file; nothing is spent."""


class InProcessTransport:
    """Clients as objects in this process (the simulation behind ``fedhype train``).

    Args:
        clients: every client, in partition order.
        val: per client ``(x_val [n, D] float32, y_val [n] int64)`` for the non-DP held-out
            diagnostics, or ``None`` to skip them.
    """

    def __init__(self, clients: list, val: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
        self.clients = clients
        self.val = val

    def preflight(self, round_idx: int, indices: list[int], model: ModelConfig) -> None:
        """Read the chosen clients' private state for ``round_idx`` before anything is charged.

        Raises:
            ArtifactError: a corrupt or truncated state file (nothing was spent).
        """
        for i in indices:
            self.clients[i].load_state(round_idx, model)

    def run_round(self, round_idx: int, tasks: list[RoundTask]) -> Iterator[PrivatizedUpdate]:
        """One client after the other, each update handed to the engine (and folded into the server's
        pseudo-gradient) before the next client runs: memory stays flat in the number of clients."""
        for t in tasks:
            yield self.clients[t.index].run_round(t.round, t.theta_tensors(), t.model, t.dp, batch_size=t.batch_size,
                                                  steps=t.steps, lr=t.lr)
        chosen = {t.index for t in tasks}
        for i, c in enumerate(self.clients):  # carry the others' private state forward unchanged
            if i not in chosen:
                carry_state(c.state_dir, round_idx)

    def replays_noise(self, index: int) -> bool:
        return self.clients[index].seed is not None

    def enforces_plan_cap(self, index: int) -> bool:
        return False  # the clients are this process's objects: train.max_epsilon is the only cap

    def diagnostics(self, server, rounds_done: int, model: ModelConfig) -> dict[str, float] | None:
        if self.val is None:
            return None
        return round_diagnostics(server, self.clients, self.val, rounds_done, model)

    def after_commit(self, rounds_done: int) -> None:
        for c in self.clients:
            c.drop_state_before(rounds_done)


def carry_state(state_dir: str | Path, round_idx: int) -> None:
    """Copy a client's private state of round ``round_idx`` to ``round_idx + 1`` (not sampled)."""
    src = Path(state_dir) / f"state-r{round_idx}.safetensors"
    if src.exists():
        atomic_save_tensors(Path(state_dir) / f"state-r{round_idx + 1}.safetensors", load_tensors(src))
