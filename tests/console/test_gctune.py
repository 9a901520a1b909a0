"""console/gctune.py: a console process's collector skips full collections through a rollout's burst of
long-lived objects, and still frees cyclic garbage. Each case runs in a fresh interpreter (the collector's
settings are process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from console.gctune import GEN0, GEN1, GEN2

ROOT = Path(__file__).resolve().parents[2]

# A rollout in miniature: 3,000,000 small containers that stay (a pass's plan, stored desired states), and meanwhile
# 30,000 objects that each reference themselves and are dropped at once (garbage only the collector can free).
BURST = """
import gc, json, sys, weakref
sys.path.insert(0, sys.argv[1])
if sys.argv[2] != "default":
    from console import gctune
    gctune.GEN2 = int(sys.argv[3])  # the test's own check that its burst is big enough (see below)
    gctune.tune()
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
class Node:
    pass
freed = []
kept = []
for i in range(3000):
    kept.append([[j] for j in range(1000)])
    for _ in range(10):
        n = Node()
        n.me = n
        weakref.finalize(n, freed.append, 1)
        del n
print(json.dumps({"full": len(full), "freed": len(freed), "threshold": gc.get_threshold(),
                  "frozen": gc.get_freeze_count()}))
"""


def _burst(mode: str, gen2: int = GEN2) -> dict:
    out = subprocess.run([sys.executable, "-c", BURST, str(ROOT), mode, str(gen2)], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def test_a_burst_of_long_lived_objects_runs_no_full_collection_and_cycles_are_still_freed():
    default, tuned, sooner = _burst("default"), _burst("tuned"), _burst("tuned", gen2=10)
    assert default["full"] >= 2, default  # the control: CPython's defaults walk everything again and again
    assert sooner["full"] >= 1, sooner  # and the burst is big enough that CPython's own GEN2 (10) would run one
    assert tuned["full"] == 0 and tuned["threshold"] == [GEN0, GEN1, GEN2], tuned
    assert tuned["frozen"] > 0, tuned  # start-up's objects are out of every collection's walk
    assert tuned["freed"] >= 15000, tuned  # the young collections still free cycles: most of the 30,000 dropped

