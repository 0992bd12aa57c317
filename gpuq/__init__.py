"""gpuq: a GPU job queue for one machine, kept in a spool directory."""

__version__ = "0.1.0"
