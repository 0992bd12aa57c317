from gpuq.cli import main

raise SystemExit(main())
