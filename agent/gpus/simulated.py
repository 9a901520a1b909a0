"""Simulated GPUs for hosts without any: sizes come from a spec like `sim:1x80GiB,2x24GiB`.

Workers run on the CPU; the memory a simulated GPU reports as used is what its workers measured.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from agent.protocol import GpuInfo

_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text: str) -> int:
    """Bytes from "64GiB", "512 MiB", "2GB" or a plain number of bytes; ValueError when it is none of those."""
    number = text.strip().rstrip("BbIiKkMmGgTt ")
    unit = text.strip()[len(number):].strip().lower() or "b"
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise ValueError(f"{text!r} is not a size like 64GiB, 512MiB or a number of bytes") from None
    if value < 0:
        raise ValueError(f"{text!r} is not a size like 64GiB, 512MiB or a number of bytes")
    return int(value)
_GROUP = re.compile(r"^(?:(\d+)\s*[x×]\s*)?(\d+(?:\.\d+)?)\s*([a-z]+)$", re.IGNORECASE)
_MAX_GPUS = 64


@dataclass(frozen=True)
class SimulatedGpu:
    total_bytes: int


def parse_sim_spec(spec: str) -> list[SimulatedGpu]:
    """Parse `sim:2x24GiB` or `sim:1x80GiB,2x24GiB` (GiB, MiB, TiB, GB, MB, TB); ValueError says what is wrong."""
    if not spec.startswith("sim:"):
        raise ValueError(f"GPU spec {spec!r} must start with 'sim:' (for example sim:2x24GiB)")
    body = spec[len("sim:") :].strip()
    if not body:
        raise ValueError(f"GPU spec {spec!r} names no GPUs (for example sim:2x24GiB)")
    gpus: list[SimulatedGpu] = []
    for group in body.split(","):
        group = group.strip()
        match = _GROUP.match(group)
        if not match:
            raise ValueError(f"GPU spec {spec!r}: {group!r} is not COUNTxSIZE like 2x24GiB")
        count_text, size_text, unit = match.groups()
        count = int(count_text) if count_text else 1
        if count < 1:
            raise ValueError(f"GPU spec {spec!r}: {group!r} asks for {count} GPUs; the count must be at least 1")
        if unit.lower() not in _UNITS:
            raise ValueError(f"GPU spec {spec!r}: unknown size unit {unit!r} in {group!r} (use GiB, MiB, GB or MB)")
        size = int(float(size_text) * _UNITS[unit.lower()])
        if size <= 0:
            raise ValueError(f"GPU spec {spec!r}: {group!r} has no memory; the size must be above zero")
        gpus.extend(SimulatedGpu(size) for _ in range(count))
    if len(gpus) > _MAX_GPUS:
        raise ValueError(f"GPU spec {spec!r} asks for {len(gpus)} GPUs; at most {_MAX_GPUS} can be simulated")
    return gpus


class SimulatedBackend:
    """GPUs that exist only on paper; models are loaded on the CPU."""

    device_kind = "cpu"

    def __init__(self, spec: str, host: str | None = None) -> None:
        self.gpus = parse_sim_spec(spec)
        self.host = host or socket.gethostname()

    def is_available(self) -> bool:
        """Always true: simulation needs no hardware."""
        return True

    def process_memory(self, pid: int) -> int | None:
        """Simulated GPUs hold no process memory: workers run on the CPU and measure themselves."""
        return None

    def collect(self, used_by_workers: dict[int, int]) -> list[GpuInfo]:
        """Each GPU's used bytes is the sum its workers measured (not clamped, so an overcommit shows)."""
        return [
            GpuInfo(
                index=index,
                uuid=f"SIM-{self.host}-{index}",
                name=f"Simulated GPU {_human(gpu.total_bytes)}",
                total_bytes=gpu.total_bytes,
                used_bytes=max(used_by_workers.get(index, 0), 0),
                utilization=None,
                simulated=True,
            )
            for index, gpu in enumerate(self.gpus)
        ]


def _human(size: int) -> str:
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if size >= factor:
            value = size / factor
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"
