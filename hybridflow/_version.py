"""Package version: 0.1.0a<date of the alpha build>."""

__version__ = "0.1.0a20261129"
