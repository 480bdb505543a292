"""Every fault of issue 36's exactly-once tests in one run on the three-node Apache Kafka
cluster (fixture ``kafka_cluster3``; replication 3, ``min.insync.replicas`` 2, the
transaction log likewise), for any ``eos_driver`` pipeline: :func:`every_fault`.

Events are produced, paced, while the drivers (replicas' Kafka paths) go through, in order:
kill -9 of the only replica inside an open transaction (a new one replaces it); scale
1 -> 3; kill -9 of one of the three inside an open transaction (replaced); SIGKILL of the
broker leading output partition 0, started again once commits went on without it; SIGKILL
and restart of the broker coordinating the drivers' group (and some of their transactions);
scale 3 -> 1 (SIGTERM: graceful). Each fault is triggered at a share of the input, and the
producer runs ahead of it by :data:`AHEAD` of the input at most: events flow through every
fault, however long a step takes on a loaded machine, and nothing waits on the clock.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from eventbus.eventing.sources._kafka_txn import transactional_id
from tests.integration.broker_faults import wait_until
from tests.integration.eos_harness import Driver, produce
from tests.integration.kafka3 import cluster_healthy, create_topics, leaders, placement

#: The shares of the input at which the six faults are triggered.
MARKS = (0.1, 0.22, 0.36, 0.5, 0.64, 0.8)
#: How far (a share of the input) the producer may run ahead of the fault being run.
AHEAD = 0.1
#: The seconds the whole input takes to produce, the time held at a fault not counted.
SECONDS = 40.0


@dataclass
class FaultRun:
    """What :func:`every_fault` ran: the topics (input, output, dead letters), the group,
    every driver started (the killed ones too: their counters and logs explain a failure)."""

    bootstrap: str
    topics: tuple[str, str, str]
    group: str
    everyone: list[Driver] = field(default_factory=list)


async def coordinated_group(
    bootstrap: str, source: str, partitions: int, controller: int
) -> tuple[str, int, list[int]]:
    """A consumer group for ``source`` whose coordinator also coordinates the transactions of
    some of its input partitions (FindCoordinator of the group and of each partition's
    transactional id): the group, that node and those partitions. A node but the active KRaft
    controller where one can (its fault is then not the controller's failover too)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    fallback: tuple[str, int, list[int]] | None = None
    try:
        deadline = time.monotonic() + 60
        for i in range(100):
            group = f"eosc-{source}-{i}"
            ids = [transactional_id(group, TopicPartition(source, p)) for p in range(partitions)]
            while True:
                try:  # (the coordinators' internal topics may be being created)
                    node = await admin.find_coordinator(group)
                    txns = [await admin.find_coordinator(t, 1) for t in ids]
                    break
                except KafkaError:
                    assert time.monotonic() < deadline, "no group or transaction coordinator"
                    await asyncio.sleep(0.1)
            shared = [p for p, c in enumerate(txns) if c == node]
            if shared and node != controller:
                return group, node, shared
            fallback = fallback or ((group, node, shared) if shared else None)
    finally:
        await admin.close()
    assert fallback is not None, "no group whose coordinator coordinates a transaction of it"
    return fallback


async def _kill_9(
    drivers: list[Driver], everyone: list[Driver], start: Callable[[], Driver]
) -> None:
    """The oldest driver kills itself (SIGKILL) at the first moment an open transaction of it
    holds sent batches; a new one takes its place."""
    victim = drivers.pop(0)
    await asyncio.to_thread(victim.wait_ready)  # its SIGUSR2 handler is installed
    victim.signal(signal.SIGUSR2)
    died = await asyncio.to_thread(victim.wait_dead, 60)
    assert died == -signal.SIGKILL, f"the victim did not die by SIGKILL: {died}"
    victim.stop()
    drivers.append(start())
    everyone.append(drivers[-1])
    await asyncio.to_thread(drivers[-1].wait_ready)


@asynccontextmanager
async def every_fault(
    cluster: Any, prefix: str, n: int, extra_env: dict[str, str] | None = None
) -> AsyncIterator[FaultRun]:
    """Produce ``n`` events through the faults (module docstring), then yield the run with
    its drivers still consuming (the caller reads and checks the outputs); stop them and
    bring the cluster back to three nodes after."""
    await cluster_healthy(cluster)
    boot = cluster.bootstrap
    controller = (await asyncio.to_thread(cluster.active_controller)).node_id
    tag = uuid.uuid4().hex[:6]
    topics = (f"{prefix}-in-{tag}", f"{prefix}-out-{tag}", f"{prefix}-dlq-{tag}")
    group, coordinator, shared = await coordinated_group(boot, topics[0], 4, controller)
    others = [x for x in (1, 2, 3) if x != coordinator]
    # the output's leader to kill: neither the coordinator nor, where one can, the controller
    leader = max(set(others) - {controller} or set(others))
    third = next(x for x in others if x != leader)  # leads the input: up all along
    await create_topics(
        boot,
        {
            topics[0]: placement(dict.fromkeys(range(4), third)),
            topics[1]: placement({p: (leader, third)[p % 2] for p in range(4)}),
            topics[2]: placement({0: third}),
        },
    )
    run = FaultRun(boot, topics, group)

    def start() -> Driver:
        # SIGUSR2: killed holding a sent batch outside a commit (its transaction aborts)
        return Driver(boot, topics, group, 0.02, kill_at="1:0:open", extra_env=extra_env)

    def committed() -> int:
        return sum(d.stats.get("committed", 0) for d in run.everyone)

    async def goes_on(what: str) -> None:  # the producer goes on, and so do the commits
        mark = committed()
        cap[0] = after
        await wait_until(lambda: committed() > mark + 1000, f"commits after {what}", 120)

    drivers = [start()]
    run.everyone += drivers
    done, cap = [0], [int(n * (MARKS[0] + AHEAD))]
    producing: asyncio.Task[None] | None = None
    try:
        await asyncio.to_thread(drivers[0].wait_ready)
        producing = asyncio.create_task(produce(boot, topics[0], n, SECONDS, done, cap=cap))
        for step, mark in enumerate(MARKS):
            # the producer holds at the cap until the fault ran (then at the next one's)
            after = int(n * (MARKS[step + 1] + AHEAD)) if step + 1 < len(MARKS) else n
            await wait_until(lambda m=mark: done[0] >= n * m, f"{mark:.0%} of the input", 120)
            if step in (0, 2):  # kill -9 a replica mid-transaction
                await _kill_9(drivers, run.everyone, start)
                cap[0] = after
            elif step == 1:  # scale 1 -> 3
                joined = [start() for _ in range(2)]
                drivers += joined
                run.everyone += joined
                for d in joined:
                    await asyncio.to_thread(d.wait_ready)
                cap[0] = after
                await wait_until(
                    lambda j=joined: all(d.stats.get("committed", 0) for d in j),
                    "the joined drivers' first commits (they own partitions)",
                    120,
                )
            elif step == 3:  # the output partition's leader
                assert (await leaders(boot, topics[1]))[0] == leader, "the leader moved"
                node = cluster.nodes[leader - 1]
                await asyncio.to_thread(node.signal, signal.SIGKILL)
                await goes_on(f"the kill of node {leader}, output partition 0's leader")
                await asyncio.to_thread(cluster.start_node, node)
                await cluster_healthy(cluster)
            elif step == 4:  # the group coordinator's broker
                admin = AIOKafkaAdminClient(bootstrap_servers=boot, request_timeout_ms=10_000)
                await admin.start()
                try:
                    now = await admin.find_coordinator(group)
                finally:
                    await admin.close()
                print(f"node {now} coordinates the group (at first {coordinator}, with {shared})")
                node = cluster.nodes[now - 1]
                await asyncio.to_thread(node.signal, signal.SIGKILL)
                await asyncio.to_thread(cluster.start_node, node)
                await goes_on(f"the restart of node {now}, the group coordinator")
            else:  # scale 3 -> 1, gracefully
                leaving, drivers[:] = drivers[:-1], drivers[-1:]
                for d in leaving:
                    d.signal(signal.SIGTERM)
                for d in leaving:
                    assert await asyncio.to_thread(d.wait_dead, 60) == 0, "a graceful stop failed"
                await goes_on("the scale-in")
        await producing
        yield run
    finally:
        if producing is not None:
            cap[0] = n
            producing.cancel()
            await asyncio.gather(producing, return_exceptions=True)
        for d in run.everyone:
            d.stop()
        await cluster_healthy(cluster)  # the next test gets three nodes
