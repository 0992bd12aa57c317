"""Deciding what runs where: the scheduler's pure decisions, the planner, GPU placement, reading the queue."""
