"""The privacy core: every mechanism on private records, the accountant and the ledger.

* :mod:`.dp_step` — the privacy boundary: DP-SGD (:class:`LocalDPSession` → :class:`PrivatizedUpdate`,
  the only message that leaves a client) and the one-shot statistics release
  (:func:`privatize_class_sums`, weights :class:`ReleaseWeights`);
* :mod:`.secure_agg` — secure aggregation with distributed noise for that release
  (:class:`DistributedNoise`, :func:`secure_sum` → :class:`PrivatizedAggregate`);
* :mod:`.centring` — the centred statistics release: a DP centre, then clipped deviations
  (:class:`Centring`, :func:`privatize_centre`, :func:`release_steps`);
* :mod:`.accountant` — ε for a history of subsampled Gaussian steps (Opacus PRV and RDP,
  dp-accounting PLD cross-check) and σ calibration;
* :mod:`.ledger` — the hash-chained, append-only record of every mechanism run (:class:`PrivacyLedger`);
* :mod:`.site_ledger` — a site's ledger across runs and its lifetime cap (:class:`SiteCharger`).

Everything is loaded on first use (torch, Opacus): ``import fedhype.privacy`` is cheap.
"""

_LAZY = {"DPConfig": "dp_step", "LocalDPSession": "dp_step", "PrivatizedUpdate": "dp_step", "ReleaseWeights": "dp_step",
         "privatize_class_sums": "dp_step", "DistributedNoise": "secure_agg", "PrivatizedAggregate": "secure_agg",
         "SecureShare": "secure_agg", "secure_sum": "secure_agg", "Centring": "centring", "privatize_centre": "centring",
         "release_steps": "centring", "calibrate_noise": "accountant", "epsilon": "accountant",
         "LedgerEvent": "ledger", "PrivacyLedger": "ledger", "SiteCharger": "site_ledger"}

__all__ = ["DPConfig", "DistributedNoise", "LedgerEvent", "LocalDPSession", "PrivacyLedger", "PrivatizedAggregate",
           "PrivatizedUpdate", "ReleaseWeights", "SecureShare", "calibrate_noise", "epsilon", "privatize_class_sums",
           "secure_sum", "Centring", "privatize_centre", "release_steps", "SiteCharger"]


def __getattr__(name: str):  # torch- and Opacus-backed pieces on first use (`--help` reads defaults without them)
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"fedhype.privacy.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'fedhype.privacy' has no attribute {name!r}")
