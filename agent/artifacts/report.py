"""The estimate as a plain-text table, shared by `python -m agent estimate` and `manage.py estimate`."""

from __future__ import annotations

from agent.artifacts.estimate import Estimate

_TERMS = (
    ("weights", "weights_bytes"),
    ("kv cache", "kv_cache_bytes"),
    ("activations", "activation_bytes"),
    ("adapter pool", "adapter_pool_bytes"),
    ("overhead", "overhead_bytes"),
    ("total", "total_bytes"),
)


def format_estimate(est: Estimate, extra: tuple[str, ...] = ()) -> str:
    """A header line, one line per term (bytes and MiB), then `extra` lines and the notes."""
    lines = [
        f"{est.architecture} ({est.family}), {est.parameters:,} parameters, {est.dtype}, "
        f"batch {est.batch}, seq {est.seq}, {est.device}"
    ]
    for label, attr in _TERMS:
        value = getattr(est, attr)
        if attr == "adapter_pool_bytes" and not value:
            continue
        lines.append(f"  {label:<12} {value:>16,} B  {value / 2**20:>12,.1f} MiB")
    lines += [f"  {line}" for line in extra]
    lines += [f"  note: {note}" for note in est.notes]
    return "\n".join(lines)
