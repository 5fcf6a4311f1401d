"""Stage 1: real datasets, image loading, embedding stores, client partitions and sites.

* :class:`EmbeddingStore` — embeddings, labels, domains, sample ids (:mod:`fedhype.data.store`);
* :mod:`fedhype.data.partition` — a pooled store's clients and splits (private to the store's holder);
* :mod:`fedhype.data.sites` — one site's own store and split (private) and its public card;
* :mod:`fedhype.data.roster` — the public roster a federation's server is given (names, sizes, keys).
"""

from fedhype.data.store import EmbeddingStore

__all__ = ["EmbeddingStore"]
