"""Following a job: progress readings, checkpoints, how it continues, ETAs."""
