"""fedhype: differentially private synthetic embeddings from a federated hypernetwork CVAE.

The notebook surface (imported on first use, so ``import fedhype`` stays light)::

    import fedhype
    store = fedhype.embed("digits-domains")          # frozen-encoder embeddings of real images
    clients = fedhype.partition(store)                 # clients with train/val/test splits
    gen = fedhype.FedHypeVAE(epsilon=4.0, seed=0).fit(store, clients)
    syn = gen.sample(per_class=300)                    # DP synthetic embeddings
    print(gen.privacy_spent(), fedhype.evaluate(clients.split_store(store, "test"), syn))

* :func:`embed`, :func:`partition`, :class:`FedHypeVAE`, :func:`evaluate`, :class:`PrivacySpent`,
  :class:`Evaluation`: :mod:`fedhype.pipeline.api`;
* :class:`EmbeddingStore` (embeddings + labels + domains, safetensors), :class:`Partition`.

Stages (data flows one way): ``data`` → ``encoders`` → ``models`` / ``privacy`` →
``federated`` → ``synthesis`` → ``eval`` / ``prototypes`` → ``pipeline``; ``cli`` sits on top.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "FedHypeVAE": "fedhype.pipeline.api", "PrivacySpent": "fedhype.pipeline.api", "embed": "fedhype.pipeline.api",
    "partition": "fedhype.pipeline.api", "evaluate": "fedhype.pipeline.api", "Evaluation": "fedhype.eval.result",
    "EmbeddingStore": "fedhype.data.store", "Partition": "fedhype.data.partition",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fedhype' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
