"""Evaluation of synthetic embeddings against held-out real ones.

Fidelity (MMD², Fréchet distance, PRDC), utility (TSTR / TRTR, the predecessor's λ-interpolation
protocol, the per-client downstream table) and privacy (membership-inference attacks). :func:`evaluate` is the one call the run
pipeline makes; :func:`mia_report` is used by ``fedhype audit``.
"""

from fedhype.eval.attacks import mia_report
from fedhype.eval.client_downstream import REAL_SHARES, augmentation_weights, client_downstream, union_store
from fedhype.eval.evaluate import HEADLINE_KEYS, evaluate
from fedhype.eval.frechet import fd_from_moments, frechet_distance
from fedhype.eval.interpolation import LAMBDA_GRID, ClientSplits, interpolation_protocol
from fedhype.eval.mmd import mmd2_unbiased, mmd_report
from fedhype.eval.prdc import prdc
from fedhype.eval.utility import Probe, utility_report

__all__ = [
    "ClientSplits",
    "HEADLINE_KEYS",
    "LAMBDA_GRID",
    "Probe",
    "REAL_SHARES",
    "augmentation_weights",
    "client_downstream",
    "evaluate",
    "fd_from_moments",
    "frechet_distance",
    "interpolation_protocol",
    "mia_report",
    "mmd2_unbiased",
    "mmd_report",
    "prdc",
    "union_store",
    "utility_report",
]
