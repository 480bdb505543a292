"""benchmarks/aggregate_cpu.py runs on the aggregate step's own internals: a small run on the
session's Redis keeps it working when they change (no broker, no Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.redis
@pytest.mark.parametrize("dedupe", [False, True], ids=["plain", "dedupe"])
def test_aggregate_cpu_benchmark_runs_and_closes_every_window(redis_url: str, dedupe: bool) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "aggregate_cpu.py"), "--events", "4000"]
    cmd += ["--windows", "4", "--rounds", "1", "--redis-url", redis_url]
    done = subprocess.run(
        [*cmd, *(["--dedupe"] if dedupe else [])],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # both sides closed every (key, window) of the first three windows (the benchmark checks
    # each side's count against the events' own): 1,000 events each, over 1,000 keys
    keys_per_window = [
        len({(i * 7919) % 1000 for i in range(w * 1000, (w + 1) * 1000)}) for w in range(3)
    ]
    assert result["windows_closed"] == sum(keys_per_window)
    assert result["dedupe"] is dedupe
    for side in ("baseline_us_per_event", "eventbus_us_per_event"):
        assert result[side]["client"] > 0 and result[side]["redis"] > 0
    assert set(result["eventbus_us_per_event"]) == {
        "decode",
        "step",
        "close",
        "client",
        "redis",
        "total",
    }
    assert 0 < result["ratio"] < 10
