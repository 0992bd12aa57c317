"""Layer 4, engine: scheduling, recovery, intake, progress and the action behind each command.
Imports gpuq.core, gpuq.system and gpuq.spool."""
