"""The torch model built from an ``ArchConfig`` (``Transformer``) and its CPU kernels."""

from nas.model.transformer import Transformer

__all__ = ["Transformer"]
