"""Stage 2: frozen pretrained image encoders and the embedding pipeline.

``create_encoder("dinov2-vits14" | "efficientnet-lite0" | "hf:<id-or-dir>" | "timm:<name>")``
builds a frozen :class:`Encoder`; :func:`embed_source` turns an
:class:`~fedhype.data.sources.ImageSource` into an :class:`~fedhype.data.store.EmbeddingStore`;
:func:`cached_embed` reuses a store whose provenance matches.
"""

from fedhype.encoders.base import Encoder
from fedhype.encoders.registry import DEFAULT_ENCODER, create_encoder, list_encoders, register_encoder

__all__ = ["DEFAULT_ENCODER", "Encoder", "cached_embed", "create_encoder", "embed_source", "list_encoders",
           "register_encoder"]


def __getattr__(name: str):  # heavy pieces on first use
    if name == "embed_source":
        from fedhype.encoders.embed import embed_source

        return embed_source
    if name == "cached_embed":
        from fedhype.encoders.cache import cached_embed

        return cached_embed
    raise AttributeError(name)
