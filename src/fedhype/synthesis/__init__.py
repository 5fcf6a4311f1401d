"""Stage 5: synthetic embeddings from a trained run (post-processing of DP outputs only).

The names below are imported on first use (they pull torch); :mod:`fedhype.synthesis.defaults` does not.
"""

from fedhype.synthesis.defaults import DEFAULT_ANCHOR

__all__ = ["AUTO_PER_CLASS", "CodeSpec", "DEFAULT_ANCHOR", "auto_per_class", "parse_code_spec", "synthesize"]

_LAZY = {"CodeSpec": "codes", "parse_code_spec": "codes", "AUTO_PER_CLASS": "sample", "auto_per_class": "sample",
         "synthesize": "sample"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"fedhype.synthesis.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'fedhype.synthesis' has no attribute {name!r}")
