import sys

from gpuq.cli import run

sys.exit(run())
