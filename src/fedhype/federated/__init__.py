"""Stage 4: the in-process federation engine (server ⇄ clients) for FedHypeVAE.

* :class:`TrainConfig` — how a run trains and what privacy it buys (methods: :data:`METHODS`);
* :func:`train` — train a run directory in process on a pooled store and its partition (the Flower
  deployment reuses its round logic, :mod:`fedhype.federated.flower`);
* :func:`train_sites` — the same over independent sites, each with its own store and split
  (:mod:`fedhype.data.sites`); the server side is given their public cards only;
* :func:`plan_privacy` — σ, σ₀ and every client's (q, steps) for a configuration and client sizes.

The engine is imported on first use (it pulls torch and the privacy accountant).
"""

from fedhype.federated.config import METHODS, TrainConfig

__all__ = ["METHODS", "TrainConfig", "plan_privacy", "train", "train_sites"]


def __getattr__(name: str):
    if name in ("train", "train_sites", "plan_privacy"):
        from fedhype.federated import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'fedhype.federated' has no attribute {name!r}")
