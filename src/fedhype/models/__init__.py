"""Stage 3: the hypernetwork CVAE (FedHypeVAE) — hypernetwork, functional CVAE, losses.

:class:`HyperNetwork` is imported on first use (it pulls torch; :class:`ModelConfig` does not).
"""

from fedhype.models.config import ModelConfig

__all__ = ["ModelConfig", "HyperNetwork"]


def __getattr__(name: str):
    if name == "HyperNetwork":
        from fedhype.models.hypernet import HyperNetwork

        return HyperNetwork
    raise AttributeError(f"module 'fedhype.models' has no attribute {name!r}")
