from gpuq.cli import exit_fast, main

exit_fast(main())
