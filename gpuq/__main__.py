import sys

from gpuq.cli import main

sys.exit(main())
