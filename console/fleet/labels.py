"""The labels a GPU carries for deployment selectors: its host's labels plus its product name (and the engines its
host runs: console/scheduler/engines.py)."""

from __future__ import annotations

import re

_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}


def product_label(name: str) -> str:
    """A short product label from an NVML device name: "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA A100-SXM4-80GB" -> "a100", "NVIDIA GeForce RTX 3090" -> "rtx3090"."""
    words = [w for w in re.split(r"[\s_]+", name.strip()) if w and w.lower() not in _VENDOR_WORDS]
    if not words:
        return "unknown"
    label = words[0].split("-")[0].lower()
    if label in ("rtx", "gtx") and len(words) > 1:
        label += words[1].split("-")[0].lower()
    return label


def gpu_labels(gpu) -> dict[str, str]:
    return labels_of(gpu.name, gpu.host.labels)


def labels_of(gpu_name: str, host_labels: dict | None) -> dict[str, str]:
    """Host labels (set from the host's page or PATCH /api/hosts/NAME) win over the derived `gpu` label."""
    return {"gpu": product_label(gpu_name), **(host_labels or {})}
