"""Parts of the command line's table kept beside cli/commands.py and cli/options.py (which hold
the rest) to keep each of them readable: `gpuq run`'s entry (run.py), and a command line built
from plain values (words.py)."""
