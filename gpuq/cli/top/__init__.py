"""`gpuq top`: the GPUs and the queue, live, full screen; imported only when `top` runs."""
