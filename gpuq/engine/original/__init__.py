"""The original single-file gpuq's queue: finding it, reading it, importing it."""
