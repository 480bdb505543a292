"""What the Kafka client costs per record: aiokafka (the replicas' client) against
librdkafka (confluent-kafka), consuming and producing the peers' events on the same broker.

Issue 24 asks to try librdkafka for the replicas' consumers and producers where the Kafka
client is the limit. This measures the ceiling of that change before it is built: the CPU
each client spends per record, in the whole process and in the main thread (the thread that
holds the GIL, which is what bounds a replica: everything else it does, decoding, the steps,
encoding, runs there too). ``peer_apps/client_cost.py`` does the work, once per client and
round with that client's interpreter (aiokafka: the project's; confluent-kafka:
``.venv-bench/confluent``), alternating, so the machine's noise spreads over both.

Last line: one JSON object with the medians (µs per record) and confluent/aiokafka ratios.

Run: ``.venv/bin/python benchmarks/kafka_clients.py [--events 200000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import PARTITIONS, produce_all

from eventbus._internal.services import create_topics, start_tansu

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "benchmarks" / "peer_apps" / "client_cost.py"
PYTHONS = {
    "aiokafka": Path(sys.executable),
    "confluent": ROOT / ".venv-bench" / "confluent" / "bin" / "python",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not PYTHONS["confluent"].exists():
        sys.exit(f"{PYTHONS['confluent']} is missing: `make bench-peers` makes it")
    work = Path(tempfile.mkdtemp(prefix="eb-clients-"))
    tansu = start_tansu(log_dir=work)
    n = args.events
    per: dict[str, dict[str, list[float]]] = {c: {} for c in PYTHONS}
    loads = [round(os.getloadavg()[0], 1)]
    try:
        src = "clients-in"
        asyncio.run(create_topics(tansu.address, [src], partitions=PARTITIONS))
        asyncio.run(produce_all(tansu.address, src, n))
        for rnd in range(args.rounds):
            for client, python in PYTHONS.items():
                sink = f"clients-out-{client}-{rnd}"
                asyncio.run(create_topics(tansu.address, [sink], partitions=PARTITIONS))
                done = subprocess.run(
                    [str(python), str(APP), client, tansu.address, src, sink, str(n)],
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=True,
                )
                out = json.loads(done.stdout.strip().splitlines()[-1])
                for phase, figures in out.items():
                    for what, seconds in figures.items():
                        key = f"{phase}_{what.removesuffix('_s')}_us"
                        per[client].setdefault(key, []).append(seconds / n * 1e6)
                print(f"round {rnd} {client}: {out}", flush=True)
            loads.append(round(os.getloadavg()[0], 1))
    finally:
        tansu.stop()
    med = {
        c: {k: round(statistics.median(v), 2) for k, v in figs.items()} for c, figs in per.items()
    }
    ratios = {
        f"confluent_vs_aiokafka_{k}": round(med["confluent"][k] / med["aiokafka"][k], 3)
        for k in med["aiokafka"]
        if med["aiokafka"][k]
    }
    print(
        json.dumps(
            {
                "benchmark": "kafka_clients",
                "events": n,
                "rounds": args.rounds,
                "medians_us_per_record": med,
                "ratios": ratios,
                "load_average_1m": loads,
            }
        )
    )


if __name__ == "__main__":
    main()
