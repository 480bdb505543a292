"""benchmarks/kafka_path_cpu.py runs on the replica's own internals: a small run keeps it
working when they change (it starts nothing: no broker, no Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_kafka_path_cpu_benchmark_runs_and_counts_every_output() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "kafka_path_cpu.py"),
            "--events",
            "3000",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The benchmark asserts that EventBus delivered as many outputs as the loop made; both
    # must be what the filter keeps of kafka_pipeline.py's events.
    currencies = ["CNY", "USD", "EUR", "CNY", "USD"]
    kept = sum(
        1
        for i in range(3000)
        if i % 10 and (i * 37) % 400 > 100 and currencies[i % 5] in ("CNY", "USD")
    )
    assert result["outputs"] == kept
    assert result["baseline_us_per_event"] > 0 and result["eventbus_us_per_event"] > 0
    assert set(result["eventbus_stages_us_per_event"]) == {"batch_and_decode", "steps", "deliver"}
    assert 0 < result["ratio"] < 10
