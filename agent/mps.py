"""The CUDA MPS control daemon, started and stopped by the agent with `--mps` (no torch, no NVML).

With MPS, the workers of one GPU share its SMs at once instead of taking turns; each worker's
share is CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, set from its replica's `mps_percentage` before CUDA
initialises (agent.workers.limits). The agent stops only a daemon it started itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil

log = logging.getLogger(__name__)

BINARY = "nvidia-cuda-mps-control"
_TIMEOUT_S = 15.0


class MpsUnavailable(RuntimeError):
    """MPS cannot be started here; the message says why and what to do."""


class MpsControl:
    """Start (`nvidia-cuda-mps-control -d`) and stop (`echo quit | nvidia-cuda-mps-control`) the daemon."""

    def __init__(self, binary: str = BINARY, env: dict[str, str] | None = None) -> None:
        self.binary = binary
        self.env = env  # None: the agent's environment (CUDA_MPS_PIPE_DIRECTORY and friends pass through)
        self.started = False

    def path(self) -> str:
        """The control binary; MpsUnavailable when it is not installed."""
        found = shutil.which(self.binary, path=(self.env or os.environ).get("PATH"))
        if found is None:
            raise MpsUnavailable(
                f"--mps needs the CUDA MPS control daemon, but {self.binary} is not on PATH; it ships with the "
                "NVIDIA driver utilities (nvidia-utils). Install them, or run the agent without --mps"
            )
        return found

    async def start(self) -> None:
        """Start the control daemon; an instance already running is used as it is (and left running)."""
        code, output = await self._run(self.path(), "-d")
        if code == 0:
            self.started = True
            log.info("started the CUDA MPS control daemon")
        elif "already running" in output.lower():
            log.info("a CUDA MPS control daemon is already running: using it (it stays when the agent stops)")
        else:
            raise MpsUnavailable(f"{self.binary} -d failed (exit status {code}): {output.strip() or 'no output'}")

    async def stop(self) -> None:
        """Ask the daemon this agent started to quit (workers should be stopped first)."""
        if not self.started:
            return
        code, output = await self._run(self.path(), stdin="quit\n")
        self.started = False
        if code != 0:
            log.warning("stopping the CUDA MPS control daemon failed (exit status %s): %s", code, output.strip())
        else:
            log.info("stopped the CUDA MPS control daemon")

    async def _run(self, *argv: str, stdin: str | None = None) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
        )
        try:
            out, _ = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), _TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            return -1, f"no answer within {_TIMEOUT_S:g} s"
        return process.returncode or 0, out.decode(errors="replace")
