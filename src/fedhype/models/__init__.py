"""Stage 3: the hypernetwork CVAE (FedHypeVAE) — hypernetwork, functional CVAE, losses."""

from fedhype.models.config import ModelConfig
from fedhype.models.hypernet import HyperNetwork

__all__ = ["ModelConfig", "HyperNetwork"]
