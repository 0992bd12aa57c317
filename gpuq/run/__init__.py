"""Layer 5, run: the supervisor, the worker and starting workers. Imports every layer below."""
