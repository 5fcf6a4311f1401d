"""The privacy core: every mechanism on private records, the accountant and the ledger.

* :mod:`.dp_step` — the privacy boundary: DP-SGD (:class:`LocalDPSession` → :class:`PrivatizedUpdate`,
  the only message that leaves a client) and the one-shot statistics release
  (:func:`privatize_class_sums`, weights :class:`ReleaseWeights`);
* :mod:`.secure_agg` — secure aggregation with distributed noise for that release
  (:class:`DistributedNoise`, :func:`secure_sum` → :class:`PrivatizedAggregate`);
* :mod:`.accountant` — ε for a history of subsampled Gaussian steps (Opacus PRV and RDP,
  dp-accounting PLD cross-check) and σ calibration;
* :mod:`.ledger` — the hash-chained, append-only record of every mechanism run (:class:`PrivacyLedger`).

The accountant and the ledger import Opacus; they are loaded on first use.
"""

from fedhype.privacy.dp_step import DPConfig, LocalDPSession, PrivatizedUpdate, ReleaseWeights, privatize_class_sums
from fedhype.privacy.secure_agg import DistributedNoise, PrivatizedAggregate, SecureShare, secure_sum

__all__ = ["DPConfig", "DistributedNoise", "LedgerEvent", "LocalDPSession", "PrivacyLedger", "PrivatizedAggregate",
           "PrivatizedUpdate", "ReleaseWeights", "SecureShare", "calibrate_noise", "epsilon", "privatize_class_sums",
           "secure_sum"]


def __getattr__(name: str):  # Opacus-backed pieces on first use
    if name in ("calibrate_noise", "epsilon"):
        from fedhype.privacy import accountant

        return getattr(accountant, name)
    if name in ("LedgerEvent", "PrivacyLedger"):
        from fedhype.privacy import ledger

        return getattr(ledger, name)
    raise AttributeError(f"module 'fedhype.privacy' has no attribute {name!r}")
