"""The device kinds an engine's capability check judges: where a limit depends on the device (an engine's CPU build
against its CUDA build), the check is asked per kind."""

from __future__ import annotations

from typing import Literal

Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = ("cpu", "cuda")


def device_kind(device: str) -> Device:
    """A worker's device ("cpu", "cuda:1") as the kind the checks judge."""
    return "cuda" if device.startswith("cuda") else "cpu"
