"""The package version, in a module of its own so that modules below the package root can read it."""

__version__ = "0.1.0"
