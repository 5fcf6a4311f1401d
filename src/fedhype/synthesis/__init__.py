"""Stage 5: synthetic embeddings from a trained run (post-processing of DP outputs only)."""

from fedhype.synthesis.codes import CodeSpec, parse_code_spec
from fedhype.synthesis.sample import synthesize

__all__ = ["CodeSpec", "parse_code_spec", "synthesize"]
