"""Broker faults under load, on the three-node Apache Kafka cluster (issue 35, item 4).

100,000 keyed events (each with its key's sequence number) flow through a filter + convert +
join pipeline (acks=all, replication 3, ``min.insync.replicas`` 2), run in process as a replica
runs it (``broker_faults.InProcessPipeline``: the real KafkaSource, steps and KafkaSinks; the
session's Ray stack is bound to the single-node broker). Two copies of the pipeline read the
same input at once, one with the Redis dedupe (``delivery.dedupe``) and one without, so one
fault hits both. Once a fifth of the dedupe copy's outputs are out, one fault per run:

* ``input_leader_kill``: kill -9 the leader of input partition 0;
* ``output_leader_kill``: kill -9 the leader of output partition 0;
* ``broker_restart``: SIGTERM a broker leading input partition 0 and output partition 1, then
  start it again;
* ``controller_kill``: kill -9 the active KRaft controller (found with DescribeQuorum); it
  leads no partition of these topics and coordinates neither group: the controller's failover
  alone;
* ``slow_broker``: SIGSTOP a broker leading input partition 0 and output partition 1 for 10 s,
  then SIGCONT.

Partition leaders are placed by replica assignment, and the consumer groups picked by their
coordinator, so that each fault hits what it names; but for the controller's, the victim also
coordinates both groups where it can (``victim_coordinates`` in the figures): its fault then
moves their heartbeats and commits too, the hardest case.
Each run checks, reading the output topics ``read_committed`` from the beginning: nothing lost,
nothing unexpected, each key's outputs in its seq order on each partition, nothing
dead-lettered; with dedupe, nothing duplicated; without, duplicates at most the events one
source holds in flight (``max_in_flight`` x ``max_batch``), plus, for a paused coordinator, the
outputs delivered while it could take no commit. How long output took to flow again
(see ``broker_faults.outage``) is printed (``-s``) and written to ``broker_faults.json`` in the
test's tmp dir and, one line per run, in the session's base temp.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eventbus._internal.kafka_broker import KafkaCluster
from tests.integration.broker_fault_checks import cpu_seconds, judge, outage, read_topic
from tests.integration.broker_faults import (
    MAX_BATCH,
    MAX_IN_FLIGHT,
    PARTITIONS,
    InProcessPipeline,
    forget_state,
    pipeline_yaml,
    produce,
    wait_until,
    workload,
)
from tests.integration.kafka3 import (
    cluster_healthy,
    coordinators,
    create_topics,
    groups_coordinated,
    placement,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kafka,
    pytest.mark.kafka_only,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

#: The issue's size.
EVENTS = 100_000
KEYS = 500
#: The fault comes once this share of the dedupe pipeline's outputs are out.
FAULT_AT = 0.2
#: How long the slow broker is stopped.
SLOW_S = 10.0
FAULTS = (
    "input_leader_kill",
    "output_leader_kill",
    "broker_restart",
    "controller_kill",
    "slow_broker",
)


def leads(fault: str, victim: int) -> tuple[dict[int, int], dict[int, int]]:
    """Input and output partition -> leader node: the victim leads what its fault names, the
    other two nodes the rest."""
    others = [n for n in (1, 2, 3) if n != victim]
    base = {p: others[p % 2] for p in range(PARTITIONS)}
    inputs, outputs = dict(base), dict(base)
    if fault in ("input_leader_kill", "broker_restart", "slow_broker"):
        inputs[0] = victim
    if fault == "output_leader_kill":
        outputs[0] = victim
    if fault in ("broker_restart", "slow_broker"):
        outputs[1] = victim
    return inputs, outputs


async def inject(
    fault: str,
    cluster: KafkaCluster,
    victim: int,
    figures: dict[str, Any],
    outputs: Callable[[], dict[bool, int]],
    committed: Callable[[], dict[bool, int]],
) -> None:
    """The fault (blocking work on threads: the pipelines run on this loop meanwhile);
    ``outputs``: each copy's outputs so far (recorded once a commit landed after a paused
    broker resumed); ``committed``: each copy's committed records so far."""
    node = cluster.nodes[victim - 1]
    t0 = time.monotonic()
    if fault == "broker_restart":
        await asyncio.to_thread(cluster.stop_node, node)
        figures["stopped_after_s"] = round(time.monotonic() - t0, 2)
        await asyncio.to_thread(cluster.start_node, node)
        figures["started_again_after_s"] = round(time.monotonic() - t0, 2)
    elif fault == "slow_broker":
        node.signal(signal.SIGSTOP)
        await asyncio.sleep(SLOW_S)  # the fault's length, not a wait for a condition
        before = committed()
        node.signal(signal.SIGCONT)
        # the resumed coordinator drops the member (no heartbeat came) as it runs again: what
        # was delivered until the first commit that lands after the resume is read again too
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and committed()[False] <= before[False]:
            await asyncio.sleep(0.05)  # polling the condition
        figures["outputs_at_resume"] = outputs()
    else:
        await asyncio.to_thread(node.signal, signal.SIGKILL)
        if fault == "controller_kill":
            new = await asyncio.to_thread(cluster.active_controller, 30.0)
            figures["new_controller"] = new.node_id
            figures["new_controller_after_s"] = round(time.monotonic() - t0, 2)


@pytest.mark.parametrize("fault", FAULTS)
async def test_broker_fault_under_load(
    fault: str,
    kafka_cluster3: KafkaCluster,
    redis_url: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    cluster = kafka_cluster3
    t_start = time.monotonic()
    await cluster_healthy(cluster)
    boot = cluster.bootstrap
    controller = (await asyncio.to_thread(cluster.active_controller)).node_id
    led = await coordinators(boot)
    if fault == "controller_kill":
        victim = controller
    else:  # the node that can coordinate the most groups, but the controller
        victim = max(sorted({1, 2, 3} - {controller}), key=lambda n: led[n])
    in_leads, out_leads = leads(fault, victim)
    tag = uuid.uuid4().hex[:6]
    source = f"bf-in-{fault}-{tag}"
    topics = {source: placement(in_leads)}
    # The victim coordinates both consumer groups too (its fault hits their heartbeats and
    # commits), but for the controller's: that one is the controller's failover alone. (After
    # earlier kills the brokers but the controller may lead no __consumer_offsets partition:
    # leaders move back only with the broker's periodic rebalance, every 5 minutes.)
    hit = fault != "controller_kill" and led[victim] > 0
    groups = await groups_coordinated(boot, f"bf-{tag}", 2, lambda n: (n == victim) == hit)
    yamls = {}
    for dedupe, group in zip((True, False), groups, strict=True):
        name = f"bf-{fault.replace('_', '-')}-{'on' if dedupe else 'off'}-{tag}"
        out, dlq = f"{name}-out", f"{name}-dlq"
        topics[out] = placement(out_leads)
        topics[dlq] = placement(out_leads)
        yamls[dedupe] = (pipeline_yaml(name, group, source, out, dlq, dedupe), out, dlq)
    await create_topics(boot, topics)
    work = workload(EVENTS, KEYS, seed=35)
    pipes = {
        d: InProcessPipeline.from_yaml(y, boot, redis_url, work.where)
        for d, (y, _, _) in yamls.items()
    }
    figures: dict[str, Any] = {
        "fault": fault,
        "victim": victim,
        "controller": controller,
        "victim_coordinates": hit,
    }
    jvms = [n.pid for n in cluster.nodes]
    cpu0 = (time.process_time(), cpu_seconds(jvms))
    faulting: asyncio.Task[None] | None = None
    try:
        for pipe in pipes.values():
            await pipe.start()
        t0 = time.monotonic()
        await produce(boot, source, work.parts)
        figures["produce_s"] = round(time.monotonic() - t0, 2)
        ends = {p: len(r) for p, r in work.parts.items()}
        on = pipes[True]
        await wait_until(
            lambda: on.source.stats()["outputs"] >= FAULT_AT * len(work.expected),
            f"{FAULT_AT:.0%} of the outputs",
            120,
        )
        fault_at = time.monotonic()
        figures["outputs_at_fault"] = {d: p.source.stats()["outputs"] for d, p in pipes.items()}
        dispatched = {d: dict(p.dispatched) for d, p in pipes.items()}
        faulting = asyncio.create_task(
            inject(
                fault,
                cluster,
                victim,
                figures,
                lambda: {d: p.source.stats()["outputs"] for d, p in pipes.items()},
                lambda: {d: p.source.stats()["committed"] for d, p in pipes.items()},
            )
        )
        await wait_until(lambda: all(p.done(ends) for p in pipes.values()), "every commit", 240)
        await faulting
        figures["run_s"] = round(time.monotonic() - t0, 2)
        figures["cpu_s"] = {  # this process (pipelines, producer), the brokers that lived on
            "test": round(time.process_time() - cpu0[0], 1),
            "brokers": round(sum(t - cpu0[1][pid] for pid, t in cpu_seconds(jvms).items()), 1),
        }
        for d, pipe in pipes.items():
            await pipe.stop()
            figures[f"dedupe_{'on' if d else 'off'}"] = {
                **outage(pipe, fault_at, dispatched[d], ends),
                "stats": {
                    k: v
                    for k, v in pipe.source.stats().items()
                    if v and k in ("outputs", "duplicates", "dispatch_retries", "revoke_timeouts")
                },
            }
    finally:
        if faulting is not None:  # a failure mid-fault: let it end (a stopped broker resumes)
            await asyncio.gather(faulting, return_exceptions=True)
        for pipe in pipes.values():
            await pipe.stop()
        await forget_state(redis_url, [p.config.name for p in pipes.values()])
        await cluster_healthy(cluster)  # the next test gets three nodes
    verdicts = {}
    for d, (_, out, dlq) in yamls.items():
        delivered = await read_topic(boot, out)
        verdicts[d] = judge(delivered, work.expected)
        figures[f"dedupe_{'on' if d else 'off'}"].update(verdicts[d].as_dict())
        dead = await read_topic(boot, dlq)
        figures[f"dedupe_{'on' if d else 'off'}"]["dead_lettered"] = sum(
            len(r) for r in dead.by_partition.values()
        )
    figures["events"] = work.count
    figures["expected_outputs"] = len(work.expected)
    figures["test_s"] = round(time.monotonic() - t_start, 1)
    line = json.dumps(figures, sort_keys=True)
    print(f"broker fault {fault}: {line}")
    (tmp_path / "broker_faults.json").write_text(line + "\n")
    with (tmp_path_factory.getbasetemp() / "broker_faults.json").open("a") as f:
        f.write(line + "\n")

    assert all(n < len(work.expected) for n in figures["outputs_at_fault"].values()), (
        "a pipeline had finished before the fault: not under load"
    )
    for d, v in verdicts.items():
        mode = "dedupe on" if d else "dedupe off"
        assert v.lost == 0, f"{mode}: {v.lost} outputs lost"
        assert v.unexpected == 0, f"{mode}: {v.unexpected} unexpected outputs"
        assert not v.order_breaks, f"{mode}: order broken: {v.order_breaks[:5]}"
        assert v.misplaced == 0, f"{mode}: {v.misplaced} outputs off their key's partition"
        assert figures[f"dedupe_{'on' if d else 'off'}"]["dead_lettered"] == 0, mode
    assert verdicts[True].duplicates == 0, "dedupe on: outputs delivered twice"
    assert verdicts[True].ids_vs_pairs[0] == verdicts[True].ids_vs_pairs[1]
    # Without dedupe, outputs go out again when the source reads again records it delivered
    # but did not commit: after a rebalance (the victim coordinated the group), from the
    # group's last commit. The source commits every delivered batch (one commit at a time, the
    # batches delivered meanwhile in the next) and its revocation finishes the batches in
    # flight and commits them, so it reads again at most the batches in flight: max_in_flight
    # x max_batch events, at most one output each here. (aiokafka's producer resends a request
    # whose answer was lost, without idempotence: a few records more at worst; none seen.)
    # A paused broker that coordinates the group takes no commit while paused, and on resume
    # drops the member (no heartbeat came): its partitions are read again from the last commit
    # that landed, so the batches in flight at the pause and every output delivered from the
    # pause until a commit landed again (``outputs_at_resume``: an upper bound, as it counts
    # the re-deliveries before that commit too; counted up to SIGCONT only, a CI run found
    # ~155 more duplicates than the bound: outputs delivered after SIGCONT, before the member
    # was dropped. Counting up to that drop instead would be the tight bound.)
    bound = MAX_IN_FLIGHT * MAX_BATCH
    during = 0
    if "outputs_at_resume" in figures:
        during = figures["outputs_at_resume"][False] - figures["outputs_at_fault"][False]
    assert verdicts[False].duplicates <= bound + during, (
        f"dedupe off: {verdicts[False].duplicates} duplicates > {bound} (in flight) + "
        f"{during} (delivered from the pause until a commit landed again)"
    )
