"""A daemon's /proc/PID files (its environment, memory and open files) readable by root only, not by every process
of its user. Engines run as that user, and the daemon's environment holds secrets: the agent's token, and in
`manage.py up` the console's own. PR_SET_DUMPABLE does it (core dumps go too); a child gets it back at exec, so
workers and engines stay as they were. Linux only: elsewhere nothing changes."""

from __future__ import annotations

import ctypes

PR_SET_DUMPABLE = 4


def keep_private() -> bool:
    """Make this process's /proc files root's; whether that was done."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return False
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
