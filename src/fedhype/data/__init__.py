"""Stage 1: real datasets, image loading, embedding stores and client partitions."""

from fedhype.data.store import EmbeddingStore

__all__ = ["EmbeddingStore"]
