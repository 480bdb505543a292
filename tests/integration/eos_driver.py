"""A replica's Kafka path in a process of its own, for the exactly-once tests to kill -9 or
SIGSTOP: a :class:`KafkaSource` with ``exactly_once`` delivery running a filter + convert
pipeline (the replica's :class:`PipelineRunner`) into Kafka sinks, no Ray, no Redis.

    python -m tests.integration.eos_driver BOOTSTRAP SRC SINK DLQ GROUP [DELAY_S [INTERVAL_MS]]

With ``EOS_JOIN=REDIS_URL`` (and ``EOS_NAME``, the pipeline's name) the pipeline is
:func:`join_pipeline` instead, its join state in that Redis; with ``EOS_AGG=REDIS_URL``
:func:`aggregate_pipeline`, its aggregate state in that Redis; with ``EOS_OUTER=REDIS_URL``
:func:`outer_join_pipeline`.

``DELAY_S`` makes each batch's steps, and each acknowledged send to the sink, take that long
longer (the batch's transaction is open meanwhile, its records written), so that a SIGKILL or
SIGSTOP lands inside a transaction. ``INTERVAL_MS`` is the transactions' commit interval
(default 100).

Prints ``ready`` once its consumer joined, then its counters as JSON every half second.
SIGUSR2 makes it SIGKILL itself at the first moment an open transaction holds sent batches;
SIGTERM stops it gracefully (its open transactions commit, it leaves the group; exit 0).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

from eventbus.eventing.sinks._kafka import KafkaSink, KafkaSinkConfig
from eventbus.eventing.sources._kafka import (
    DeliveryPolicy,
    FetchSettings,
    KafkaSource,
    KafkaSourceConfig,
    SourceSinks,
)
from eventbus.pipelines import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner


class SlowSink(KafkaSink):
    """A Kafka sink whose acknowledgements come ``delay_s`` late (records already written)."""

    delay_s = 0.0

    async def send(self, items: Any) -> None:
        await super().send(items)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # a slow sink, not a wait for a condition


def pipeline(src: str, sink: str, dlq: str) -> PipelineConfig:
    """Drop odd ``n``; tag the rest; ``data.boom`` fails the convert (dead letters)."""
    return PipelineConfig.model_validate(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": "eos"},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [
                    {"id": "even", "filter": "data.n % 2 == 0"},
                    {
                        "id": "tag",
                        "convert": {
                            "set": {"data.half": "has(data.boom) ? data.n / 0 : data.n / 2"}
                        },
                    },
                ],
                "sink": {"kafka": {"topic": sink}},
                "dead_letter": {"kafka": {"topic": dlq}},
                "delivery": {"guarantee": "exactly_once"},
            },
        }
    )


def join_pipeline(name: str, src: str, sink: str, dlq: str) -> PipelineConfig:
    """``data.boom`` fails the convert (dead letters); an inner join (emit every) on event
    time pairs event ``n`` with ``n + 40`` (same Kafka key, so ``n`` comes first; 40 ms
    apart in event time, see ``eos_harness.event``) for even ``n // 40``: one output per
    pair, emitted by ``n + 40``'s batch, keyed by its key and carrying its seq. The windows
    (600 s) outlast the input's event time (100 s for 100,000 events): no event is late."""
    return PipelineConfig.model_validate(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [
                    {
                        "id": "tag",
                        "convert": {
                            "set": {"data.half": "has(data.boom) ? data.n / 0 : data.n / 2"}
                        },
                    },
                    {
                        "id": "pair",
                        "join": {
                            "sides": [
                                {"name": "a", "when": "data.n / 40 % 2 == 0", "key": "data.n"},
                                {"name": "b", "when": "data.n / 40 % 2 == 1", "key": "data.n - 40"},
                            ],
                            "time": "event",
                            "window_s": 600,
                            "output": {
                                "type": "paired",
                                "data": "{'key': b.data.key, 'seq': b.data.seq, 'a': a.data.n, 'b': b.data.n}",
                            },
                        },
                    },
                    {"id": "rekey", "convert": {"set": {"partitionkey": "data.key"}}},
                ],
                "sink": {"kafka": {"topic": sink}},
                "dead_letter": {"kafka": {"topic": dlq}},
                "delivery": {"guarantee": "exactly_once"},
            },
        }
    )


def aggregate_pipeline(name: str, src: str, sink: str, dlq: str) -> PipelineConfig:
    """A count and a sum of ``data.n`` per ``data.key`` over one-second tumbling windows of
    event time; the windows close as the consumed events move the watermark past them."""
    return PipelineConfig.model_validate(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [
                    {
                        "id": "per_key",
                        "aggregate": {
                            "key": "data.key",
                            "window": {"tumbling": {"size_s": 1}},
                            "aggregations": {"n": "count", "total": {"sum": "data.n"}},
                        },
                    }
                ],
                "sink": {"kafka": {"topic": sink}},
                "dead_letter": {"kafka": {"topic": dlq}},
                "delivery": {"guarantee": "exactly_once"},
            },
        }
    )


def outer_join_pipeline(name: str, src: str, sink: str, dlq: str) -> PipelineConfig:
    """An outer join on event time (one-second windows): event ``n`` is side ``a`` (even
    ``n``) or ``b`` (odd), keyed ``n / 2``, except that ``b``'s key is moved away when
    ``n / 2 % 3 == 0``: both of those events stay alone, emitted when their window closes.
    ``EOS_EMIT`` sets its ``emit`` (default every; one event a side per key: the same outputs)."""
    return PipelineConfig.model_validate(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [
                    {
                        "id": "pair",
                        "join": {
                            "mode": "outer",
                            "time": "event",
                            "window_s": 1,
                            "emit": os.environ.get("EOS_EMIT", "every"),
                            "sides": [
                                {"name": "a", "when": "data.n % 2 == 0", "key": "data.n / 2"},
                                {
                                    "name": "b",
                                    "when": "data.n % 2 == 1",
                                    "key": "data.n / 2 % 3 == 0 ? -1 - data.n / 2 : data.n / 2",
                                },
                            ],
                        },
                    }
                ],
                "sink": {"kafka": {"topic": sink}},
                "dead_letter": {"kafka": {"topic": dlq}},
                "delivery": {"guarantee": "exactly_once"},
            },
        }
    )


async def main(
    bootstrap: str,
    src: str,
    sink: str,
    dlq: str,
    group: str,
    delay_s: str = "0",
    interval_ms: str = "100",
) -> None:
    join_redis, agg_redis = os.environ.get("EOS_JOIN"), os.environ.get("EOS_AGG")
    outer_redis = os.environ.get("EOS_OUTER")
    name = os.environ.get("EOS_NAME", "eosj")
    if outer_redis:
        runner = PipelineRunner(outer_join_pipeline(name, src, sink, dlq), redis_url=outer_redis)
    elif join_redis:
        runner = PipelineRunner(join_pipeline(name, src, sink, dlq), redis_url=join_redis)
    elif agg_redis:
        runner = PipelineRunner(aggregate_pipeline(name, src, sink, dlq), redis_url=agg_redis)
    else:
        runner = PipelineRunner(pipeline(src, sink, dlq))
    SlowSink.delay_s = float(delay_s)

    async def dispatch(events: list) -> list:  # type: ignore[type-arg]
        if float(delay_s):
            await asyncio.sleep(float(delay_s))  # a slow step, not a wait for a condition
        return runner.run(events)  # type: ignore[no-any-return]

    source = KafkaSource(
        KafkaSourceConfig(topic=src, group=group, session_timeout_ms=6000),
        pipeline="eos",
        bootstrap_servers=bootstrap,
        dispatch=dispatch,
        sinks=SourceSinks(
            SlowSink(KafkaSinkConfig(topic=sink), bootstrap_servers=bootstrap),
            KafkaSink(KafkaSinkConfig(topic=dlq), bootstrap_servers=bootstrap),
        ),
        fetch=FetchSettings(
            max_batch=500,
            linger_ms=5,
            heartbeat_interval_ms=1000,
            in_order=runner.config.in_order,  # as a replica (a join: in order)
        ),
        delivery=DeliveryPolicy(exactly_once=True, commit_interval_s=float(interval_ms) / 1000),
    )
    await source.start()

    def dump() -> None:  # SIGUSR1: every task's stack to stderr (debugging a stall)
        for task in asyncio.all_tasks():
            task.print_stack(file=sys.stderr)

    # EOS_KILL_AT=WAITING:COMMITS[:open] (default 1:0): SIGUSR2 kills at the first moment an
    # open transaction holds WAITING sent batches after COMMITS transactions committed; with
    # ":open", only batches whose transaction's commit is not under way count (a kill during
    # the commit may let it commit: nothing aborted; without it, a pipeline whose every batch
    # commits at once, the partition idle after it, can still be killed in a transaction)
    kill_at = os.environ.get("EOS_KILL_AT", "1:0").split(":")
    waiting, commits, outside_commits = int(kill_at[0]), int(kill_at[1]), "open" in kill_at[2:]

    async def die_inside_a_transaction() -> None:
        # SIGUSR2: SIGKILL itself inside an open transaction (a kill from outside, or one timed
        # by the half-second counters, could land between two transactions)
        while True:
            now = source.stats()
            held = now["txn_waiting"] - (now["txn_committing"] if outside_commits else 0)
            if held >= waiting and now["txn_commits"] >= commits:
                break
            await asyncio.sleep(0.001)  # polling the condition the kill waits for
        os.kill(os.getpid(), signal.SIGKILL)

    armed: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, dump)
    loop.add_signal_handler(
        signal.SIGUSR2, lambda: armed.append(asyncio.create_task(die_inside_a_transaction()))
    )
    # SIGTERM: a graceful stop (the open transactions commit, the group is left), exit 0
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    print("ready", flush=True)
    run = asyncio.create_task(source.run())
    while not run.done() and not stopping.is_set():
        print(json.dumps(source.stats()), flush=True)
        await asyncio.wait([run], timeout=0.5)
    if stopping.is_set():
        logging.getLogger("eos_driver").info("SIGTERM: stopping gracefully")
    await source.stop()
    await run
    logging.getLogger("eos_driver").info("stopped")
    print(json.dumps(source.stats()), flush=True)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(process)d %(levelname)s %(message)s"
    )
    logging.getLogger("eventbus.eventing.sources._kafka").setLevel(logging.INFO)
    logging.getLogger("eos_driver").setLevel(logging.INFO)
    asyncio.run(main(*sys.argv[1:8]))
