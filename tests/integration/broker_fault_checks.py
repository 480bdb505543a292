"""The figures and checks of ``test_broker_faults.py``: how long output stopped after a
fault, what the output topics hold, and the verdict (lost, duplicated, out of order)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.integration.broker_faults import PARTITIONS, InProcessPipeline, partition_of

__all__ = ["Delivered", "Verdict", "cpu_seconds", "judge", "outage", "read_topic"]


def _resumed(
    log: list[tuple[float, dict[int, int]]], fault_at: float, before: dict[int, int]
) -> dict[int, float]:
    """Per partition, seconds from the fault to the first entry of ``log`` past ``before``."""
    out: dict[int, float] = {}
    for t, tops in log:
        if t < fault_at:
            continue
        for p, offset in tops.items():
            if p not in out and offset > before.get(p, -1):
                out[p] = t - fault_at
    return out


def outage(
    pipe: InProcessPipeline, fault_at: float, before: dict[int, int], ends: dict[int, int]
) -> dict[str, float]:
    """How long a pipeline's output stopped after the fault at ``fault_at``.

    Per input partition with records left, the time from the fault until the sink
    acknowledged an output of a record dispatched after the fault (past ``before``, the
    highest offsets dispatched before it): the partition's records flow end to end again.
    ``resume_s``: the slowest partition's (the one the fault hit); ``resume_min_s``: the
    fastest's (the batches queued before it, the machine's load). ``fetch_resume_s``: the
    slowest partition's time until a record past ``before`` was dispatched (the consumer's
    part). ``stall_s``: the longest time after the fault without any acknowledged output."""
    acked = pipe.sink.acked if pipe.sink is not None else []
    left = [p for p, end in ends.items() if before.get(p, -1) < end - 1]
    nan = float("nan")
    out_at = _resumed(acked, fault_at, before)
    in_at = _resumed(pipe.dispatch_log, fault_at, before)
    prev, stall = fault_at, 0.0
    for t, _ in acked:
        if t >= fault_at:
            stall, prev = max(stall, t - prev), t

    def worst(at: dict[int, float], pick: Any = max) -> float:
        return round(pick(at.get(p, nan) for p in left), 3) if left else 0.0

    return {
        "resume_s": worst(out_at),
        "resume_min_s": worst(out_at, min),
        "fetch_resume_s": worst(in_at),
        "stall_s": round(stall, 3),
    }


def cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of processes so far, by pid (from ``/proc``; gone ones left
    out: compare only the pids both readings have)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


@dataclass
class Delivered:
    """What an output topic holds: per partition, the (key, seq) of each record in order."""

    by_partition: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    #: records whose partition is not their record key's (as the sink partitions keyed records)
    misplaced: int = 0
    ids: Counter[bytes] = field(default_factory=Counter)

    def counts(self) -> Counter[tuple[str, int]]:
        return Counter(x for recs in self.by_partition.values() for x in recs)


async def read_topic(bootstrap: str, topic: str, timeout_s: float = 120.0) -> Delivered:
    """Read ``topic`` from the beginning to its end as it is now, ``read_committed``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    out = Delivered()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        todo = {tp for tp in tps if ends[tp] > 0}
        for tp in tps:
            out.by_partition[tp.partition] = []
        deadline = time.monotonic() + timeout_s
        while todo:
            assert time.monotonic() < deadline, f"{topic}: not read to {ends} in {timeout_s} s"
            data = await consumer.getmany(*todo, timeout_ms=200, max_records=20_000)
            for tp, records in data.items():
                got = out.by_partition[tp.partition]
                for r in records:
                    d = orjson.loads(r.value)
                    got.append((d["k"], d["seq"]))
                    if r.key is None or partition_of(r.key) != tp.partition:
                        out.misplaced += 1
                    for name, value in r.headers:
                        if name == "ce_id":
                            out.ids[value] += 1
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await consumer.stop()
    return out


@dataclass
class Verdict:
    lost: int
    unexpected: int
    duplicates: int
    order_breaks: list[str]
    misplaced: int
    #: distinct CloudEvent ids and distinct (key, seq) delivered: equal when each output's id
    #: stands for its (key, seq), as the dedupe (by source + id) assumes
    ids_vs_pairs: tuple[int, int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "lost": self.lost,
            "unexpected": self.unexpected,
            "duplicates": self.duplicates,
            "order_breaks": len(self.order_breaks),
            "misplaced": self.misplaced,
        }


def judge(out: Delivered, expected: set[tuple[str, int]]) -> Verdict:
    """Lost, unexpected and duplicated outputs; per key, whether the first delivery of each
    seq came in seq order on each partition (a redelivered range comes again after, as
    duplicates).

    A key's ticks go to its partition (the record key is the input's); its joined events go
    where their join key (the order id, the join's ``partitionkey``) hashes: on each
    partition a key's outputs must still be in seq order (the sink writes batches in order).
    """
    counts = out.counts()
    got = set(counts)
    breaks: list[str] = []
    for p, recs in out.by_partition.items():
        last: dict[str, int] = {}
        first: set[tuple[str, int]] = set()
        for key, seq in recs:
            if (key, seq) in first:  # a duplicate: order is judged on first deliveries
                continue
            first.add((key, seq))
            prev = last.get(key, 0)
            if seq <= prev:
                breaks.append(f"{key}: {seq} after {prev} on partition {p}")
            last[key] = max(seq, prev)
    return Verdict(
        lost=len(expected - got),
        unexpected=len(got - expected),
        duplicates=sum(counts.values()) - len(got),
        order_breaks=breaks,
        misplaced=out.misplaced,
        ids_vs_pairs=(len(out.ids), len(got)),
    )
