"""The package's version: one place, read by the package and by what compares nodes' versions."""

__version__ = "0.1.0"
