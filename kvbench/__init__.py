"""kvbench: measure where KV-cache memory goes, and what paging buys."""

__version__ = "0.1.0"
