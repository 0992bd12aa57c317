"""Data gpuq derives and can always rebuild: index.py, the one index of finished jobs
(cache/finished-jobs); runs.py, what the ETA and history read of a job, as that index holds it."""
