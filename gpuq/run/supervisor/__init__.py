"""The per-job supervisor: a small process that owns one job from start to finish.

The worker claims a job and hands the claim's descriptor to a supervisor with a start order
(`order.py`; run/launcher.py). The supervisor moves the job to running/ and starts it in its own
session (`start.py`), records its pid and waits for it (`wait.py`), ends what is left of its
process group, and records the real exit code as it moves the job on (`end.py`, through
engine/lifecycle/ending.py). `main.py` is the process: a spare that waits for its order, runs the job, and
may go on with the next job the worker named for its slot (run/successor.py). It lives in its own
session, so the worker can die, be stopped or lose its terminal without the job losing its result
(this is how nq and conmon keep exit codes). While it lives, its flock on the claim lock tells
everyone the job is supervised.
"""
