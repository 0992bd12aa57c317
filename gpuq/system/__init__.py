"""Layer 2, system: files, processes, GPUs and other facts of the machine. Imports gpuq.core only."""
