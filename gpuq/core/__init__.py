"""Layer 1, core: what a job is and how it may change, as plain data and pure functions.
Imports nothing from gpuq outside gpuq.core."""
