"""queryserve: serve Transformer models for search, fast and cheap, on CPU first."""

__version__ = "0.1.0"
