"""tffleet's version, in a module of its own: the client sends it (its User-Agent) without
importing the package's `__init__`, which imports the client."""

__version__ = "0.1.0"
