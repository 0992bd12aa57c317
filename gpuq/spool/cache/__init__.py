"""cache/: data gpuq derives from job files and can always rebuild (ARCHITECTURE.md, "Caches").

The finished jobs' rows of `gpuq status -a` are kept here as data, never as text (cli/render.py
makes their cells): journal.py is what a finished job's row holds and cache/finished-journal,
appended as jobs finish; finished.py is cache/finished-view, the rows of every finished job.
Reading and writing a cache file is `spool.files.Caches`: a plain `gpuq status` reads the
finished index through it and imports nothing of this package (a package directory is one more
lookup on every start-up).
"""
