"""prism-nas: neural-architecture search for the shape of decoder-only Transformers."""

__version__ = "0.1.0"
