"""What is left of a vLLM server whose worker is gone (daemon side). The worker kills vLLM's session when it stops
or when vLLM dies; a worker killed outright cannot, and the kernel's parent-death signal reaches vLLM's API server
only: its engine core and workers may live on, holding their memory."""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import psutil

log = logging.getLogger(__name__)


def kill_session(leader: int) -> list[int]:
    """SIGKILL every process of the vLLM session `leader` started (its pid is the session's process group), checked to
    be vLLM's first, so a reused pid is never hit; the pids killed."""
    left = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(proc.pid) == leader and _is_vllm(proc):
                left.append(proc.pid)
    if left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
        log.warning("killed what was left of vLLM session %d: pids %s", leader, left)
    return left


def _is_vllm(proc: psutil.Process) -> bool:
    name = proc.info.get("name") or ""
    return name.startswith("VLLM") or any("vllm" in part for part in proc.info.get("cmdline") or ())
