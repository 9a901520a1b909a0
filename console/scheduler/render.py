"""A Plan as the dry-run output document (JSON-ready dict) or as plain-text tables for a terminal."""

from __future__ import annotations

from console.scheduler.types import Plan


def plan_to_json(plan: Plan) -> dict:
    """The output document: replicas (all but refused ones), unplaced, moves, scale, ledger and totals."""
    return {
        "strategy": plan.strategy,
        "replicas": [
            {"deployment": r.deployment, "index": r.index, "gpus": list(r.gpus), "reason": r.reason,
             "state": r.state, "action": r.action, "host": r.host, "reserved_bytes": r.reserved_bytes,
             "mps_percentage": r.mps_percentage, "from_gpus": list(r.from_gpus), "preempted_by": r.preempted_by}
            for r in plan.replicas if r.action != "refuse"
        ],
        "unplaced": [{"deployment": u.deployment, "index": u.index, "reason": u.reason} for u in plan.unplaced],
        "moves": [{"deployment": m.deployment, "index": m.index, "from_gpus": list(m.from_gpus),
                   "to_gpus": list(m.to_gpus), "reason": m.reason} for m in plan.moves],
        "scale": [{"deployment": s.deployment, "current": s.current, "target": s.target, "reason": s.reason}
                  for s in plan.scale],
        "ledger": [{"gpu": b.gpu, "host": b.host, "total_bytes": b.total_bytes, "foreign_bytes": b.foreign_bytes,
                    "reserved_bytes": b.reserved_bytes, "buffer_bytes": b.buffer_bytes, "free_bytes": b.free_bytes}
                   for b in plan.ledger],
        "gpus_used": plan.gpus_used,
        "memory_utilization": plan.memory_utilization,
        "elapsed_ms": plan.elapsed_ms,
        "search": None if plan.search is None else {
            "iterations": plan.search.iterations, "placed_extra": plan.search.placed_extra,
            "stopped_by": plan.search.stopped_by},
    }


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return out


def plan_to_text(plan: Plan) -> str:
    """Plain-text tables: a summary line, the replicas with their reasons, the refusals, the scale decisions."""
    ready = sum(1 for r in plan.replicas if r.state == "ready")
    lines = [
        f"strategy {plan.strategy}: {ready} replicas ready on {plan.gpus_used} GPUs "
        f"(memory utilization {100 * plan.memory_utilization:.1f}% of the GPUs in use), "
        f"{len(plan.unplaced)} unplaced, {len(plan.moves)} moves, {plan.elapsed_ms:.1f} ms",
        "",
    ]
    rows = [[r.deployment, str(r.index), r.action, r.state, ",".join(r.gpus) or (r.host or "-"),
             "-" if r.mps_percentage is None else f"{r.mps_percentage}%", r.reason]
            for r in plan.replicas if r.action != "refuse"]
    lines += _table(["DEPLOYMENT", "#", "ACTION", "STATE", "GPUS", "MPS", "REASON"], rows)
    if plan.unplaced:
        lines += ["", "unplaced:"]
        lines += _table(["DEPLOYMENT", "#", "REASON"], [[u.deployment, str(u.index), u.reason] for u in plan.unplaced])
    changed = [s for s in plan.scale if s.current != s.target]
    if changed:
        lines += ["", "scale:"]
        lines += _table(["DEPLOYMENT", "NOW", "TARGET", "REASON"],
                        [[s.deployment, str(s.current), str(s.target), s.reason] for s in changed])
    return "\n".join(lines) + "\n"
