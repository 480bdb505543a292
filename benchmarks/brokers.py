"""The Kafka benchmarks on both brokers in one run: ``kafka_pipeline.py``, ``peers.py``,
``latency.py`` and ``idle.py``, each with ``--broker kafka`` (Apache Kafka, first) and then
``--broker tansu``, one after the other on the same machine. Every benchmark measures its own
baseline in its run; this collects each one's last line (its JSON figures) and prints them
side by side.

Run: ``.venv/bin/python benchmarks/brokers.py [--only kafka_pipeline,peers] [--quick] [--record]``
(``--quick``: smaller sizes, minutes instead of the better part of an hour; ``--record``: each
run's figures appended to ``benchmarks/results/`` by ``record.py``, where the performance page
reads them).

Last line: one JSON object, ``{benchmark: {broker: figures}}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from record import RecordError, append_record, last_json, make_record

HERE = Path(__file__).resolve().parent

#: benchmark -> (full arguments, --quick arguments)
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "kafka_pipeline": ([], ["--events", "100000", "--latency-seconds", "5"]),
    "peers": ([], ["--events", "50000", "--latency-seconds", "4"]),
    "latency": ([], ["--events", "50000", "--latency-seconds", "4"]),
    "idle": (
        ["--doorbell", "both"],
        [
            "--doorbell",
            "both",
            "--window-s",
            "15",
            "--settle-s",
            "8",
            "--idle-s",
            "8",
            "--rounds",
            "3",
            "--cold-rounds",
            "2",
        ],
    ),
}
BROKERS = ("kafka", "tansu")


def record(name: str, broker: str, figures: dict[str, object], command: str, note: str) -> None:
    """Keep one run's figures in ``benchmarks/results/`` (``record.py``)."""
    try:
        path = append_record(
            make_record(figures, benchmark=name, broker=broker, command=command, note=note)
        )
    except RecordError as e:
        print(f"not recorded: {e}", flush=True)
        return
    print(f"recorded in {path}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(RUNS)}")
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument(
        "--record", action="store_true", help="append each run's figures to benchmarks/results/"
    )
    ap.add_argument("--note", default="", help="with --record: what a reader must know")
    args = ap.parse_args()
    only = [b for b in args.only.split(",") if b] or list(RUNS)
    unknown = sorted(set(only) - set(RUNS))
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    results: dict[str, dict[str, object]] = {}
    for name in only:
        full, quick = RUNS[name]
        for broker in BROKERS:
            argv = [sys.executable, str(HERE / f"{name}.py"), "--broker", broker]
            argv += quick if args.quick else full
            started = time.monotonic()
            print(f"== {name} on {broker}: {' '.join(argv[1:])}", flush=True)
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            figures = last_json(proc.stdout)
            took = round(time.monotonic() - started, 1)
            if proc.returncode != 0 or figures is None:
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", flush=True)
                figures = {"error": f"exit {proc.returncode}", "took_s": took}
            else:
                print(json.dumps(figures), flush=True)
                figures["took_s"] = took
                if args.record:
                    command = " ".join(["benchmarks/brokers.py", *sys.argv[1:]])
                    record(
                        name,
                        broker,
                        figures,
                        f"{command} (this run: benchmarks/{name}.py {' '.join(argv[2:])})",
                        args.note,
                    )
            results.setdefault(name, {})[broker] = figures
    print(json.dumps(results))


if __name__ == "__main__":
    main()
