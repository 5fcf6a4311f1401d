"""Evaluation of synthetic embeddings against held-out real ones.

Fidelity (MMD², Fréchet distance, PRDC), utility (TSTR / TRTR, the predecessor's λ-interpolation
protocol) and privacy (membership-inference attacks). :func:`evaluate` is the one call the run
pipeline makes; :func:`mia_report` is used by ``fedhype audit``.
"""

from fedhype.eval.attacks import mia_report
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
    "evaluate",
    "fd_from_moments",
    "frechet_distance",
    "interpolation_protocol",
    "mia_report",
    "mmd2_unbiased",
    "mmd_report",
    "prdc",
    "utility_report",
]
