"""``tune_gc``: what a replica's constructor does to the collector, on a cold start's path.

Each case runs in a fresh interpreter: freezing and thresholds are process-wide.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"

PROBE = """
import gc, json, sys, weakref
sys.path.insert(0, sys.argv[1])
from eventbus._internal.gc import tune_gc

class Node:
    pass

# an old cycle, garbage since before the call (in the oldest generation)
old = Node(); old.self = old; old_ref = weakref.ref(old); del old
gc.collect()  # the interpreter's own start-up garbage goes; the cycle above is now old
old2 = Node(); old2.self = old2
gc.collect(); gc.collect()  # promoted to the oldest generation
old2_ref = weakref.ref(old2); del old2
young = Node(); young.self = young; young_ref = weakref.ref(young); del young
generations = []
gc.callbacks.append(lambda phase, info: generations.append(info["generation"]) if phase == "start" else None)
tune_gc()
gc.callbacks.clear()
print(json.dumps({
    "generations": generations,
    "young_collected": young_ref() is None,
    "old_kept": old2_ref() is not None,
    "frozen": gc.get_freeze_count(),
    "threshold": list(gc.get_threshold()),
}))
"""


def run_probe() -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(SRC)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_tune_gc_collects_the_young_generations_only_then_freezes() -> None:
    out = run_probe()
    # no full collection (generation 2 walks every object the imports made)
    assert out["generations"] == [1]
    assert out["young_collected"] is True  # garbage made since the last collection goes
    assert out["old_kept"] is True  # old garbage is frozen with the rest: a bounded one-off
    assert isinstance(out["frozen"], int) and out["frozen"] > 0
    assert out["threshold"] == [20_000, 20, 20]
