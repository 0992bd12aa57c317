"""A supervisor's room: blocks set aside in tmp/ for recording its job's pid and end, so that a
job that fills the disk cannot lose its end (spool_layout.md, section 14). The blocks themselves
are spool/files.py's reservations; this module says how many, how big and for how long they
serve.
"""

from __future__ import annotations

import os
import time

from gpuq.spool import Spool, SpoolFull
from gpuq.spool.files import Reservation

RESERVE_MIN = 64 * 1024  # blocks set aside per job write (a job file is a few KiB)
# A spare supervisor sets its job's room aside while it waits (two files written and fsynced: a few
# ms less between a job's turn and its start). Room older than this is set aside again at the start,
# well before tmp/'s cleaner could take it for a dead writer's (spool/files.py, STALE_TMP_SECONDS).
FRESH_ROOM_SECONDS = 60.0


def set_aside(spool: Spool) -> list[Reservation]:
    """A spare supervisor's room for its future job, set aside while nobody waits; none on a full
    disk (the job's start then sets it aside, or finds there is no room)."""
    room: list[Reservation] = []
    try:
        for _ in range(2):
            room.append(spool.files.reserve(RESERVE_MIN))
    except (OSError, SpoolFull):
        for reservation in room:
            reservation.release()
        return []
    return room


KEEP_FRESH_SECONDS = FRESH_ROOM_SECONDS / 2  # how often a waiting spare's room is made fresh again


def keep_fresh(room: list[Reservation]) -> None:
    """A waiting spare's room made fresh again: its files' time set to now. Its blocks were
    written and fsynced when it was set aside and stay allocated while its descriptor is open;
    what ages is only the time by which a cleaner tells a room from a dead writer's, so a spare
    idle for an hour starts its job with no room to write either (two fsyncs less before it)."""
    for reservation in room:
        try:
            os.utime(reservation.fd)
        except OSError:
            pass  # gone (an older gpuq's cleaner): room_for sets it aside again at the start


def room_for(spool: Spool, room: list[Reservation], size: int) -> list[Reservation]:
    """Two reservations of `size` bytes at least: those of `room` still there, recent and big
    enough (the others released), and new ones for the rest. SpoolFull if there is no room; what
    was set aside is then in `room`, for the caller to release."""
    now = time.time()
    kept = [r for r in room if usable(r, size, now)]
    for reservation in room:
        if reservation not in kept:
            reservation.release()
    room[:] = kept
    while len(room) < 2:
        room.append(spool.files.reserve(size))
    return room


def usable(reservation: Reservation, size: int, now: float) -> bool:
    try:
        fresh = now - os.stat(reservation.path).st_mtime < FRESH_ROOM_SECONDS
    except OSError:
        return False
    return fresh and reservation.size >= size and reservation.fd >= 0


def released(room: list[Reservation]) -> None:
    for reservation in room:
        reservation.release()
