"""lingcode: a local, single-user coding-assistant backend (one model, concurrency 1)."""

__version__ = "0.1.0"
