"""Stage 5: synthetic embeddings from a trained run (post-processing of DP outputs only)."""

from fedhype.synthesis.codes import CodeSpec, parse_code_spec
from fedhype.synthesis.sample import AUTO_PER_CLASS, auto_per_class, synthesize

__all__ = ["AUTO_PER_CLASS", "CodeSpec", "auto_per_class", "parse_code_spec", "synthesize"]
