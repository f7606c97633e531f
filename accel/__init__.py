"""accel: make language models cheaper and faster to serve, and prove it with numbers."""

__version__ = "0.1.0"
