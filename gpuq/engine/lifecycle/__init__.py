"""Changing jobs: queueing, taking in dropped files, the actions, preemption, repairs, Slurm hand-over."""
