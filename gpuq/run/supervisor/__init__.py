"""The per-job supervisor, one module per phase (order, start, wait, end); `main.py` is the process.

Why a process per job, and why a spare: ARCHITECTURE.md.
"""
