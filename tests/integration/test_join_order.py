"""A partition's events reach a join's state in order, also when a dispatch fails and is retried.

The interleaving that lost ``emit: first`` pairs in ``test_join_faults`` (one pipeline, three
join steps, a Redis restart mid-run): the batch holding an order's first payment failed its
dispatch (Redis away: ``StateUnavailableError``) and slept its backoff, while the next batch
of the same partition, holding the second payment, was dispatched beside it and ran once
Redis was back. ``emit: first`` then paired the order with its second payment (with the id of
the key's one joined event, so the sink's dedupe could not tell), and the first payment,
retried later, was absorbed as ``after_match``. Here on the real broker and the real Redis
scripts, without Ray: the source dispatches the runner's batches (one record each), and the
first dispatch of the batch with the first payment fails as a Redis restart makes it fail;
also under ``exactly_once``, whose fetches share one dispatch each.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest

from eventbus.errors import StateUnavailableError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Outcome
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner
from tests.integration.test_kafka_source import (
    decode_record,
    make_source,
    produce,
    read_all,
    run_until_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.redis]

MODES = ("every", "first", "latest")


def runner(redis_url: str, exactly_once: bool) -> PipelineRunner:
    """One pipeline with a join step per emit mode (each passes the others' events on);
    ``exactly_once``: the pipeline's guarantee, its joins on event time (the batches close
    their windows; processing time is refused there)."""
    steps = [
        {
            "id": f"j_{m}",
            "join": {
                "emit": m,
                "sides": [
                    {"name": "order", "when": f"type == 'o.{m}'", "key": "data.id"},
                    {"name": "payment", "when": f"type == 'p.{m}'", "key": "data.id"},
                ],
                "window_s": 600,
            }
            | ({"time": "event"} if exactly_once else {}),
        }
        for m in MODES
    ]
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": f"jo{uuid.uuid4().hex[:8]}"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": steps,
            "sink": {"kafka": {"topic": "out"}},
        }
        | ({"delivery": {"guarantee": "exactly_once"}} if exactly_once else {}),
    }
    return PipelineRunner(PipelineConfig.model_validate(doc), redis_url=redis_url)


def record(kind: str, m: str, n: int) -> Any:
    ce = [
        ("ce_specversion", b"1.0"),
        ("ce_source", b"/shop"),
        ("ce_type", f"{kind}.{m}".encode()),
        ("ce_id", f"{kind}{n}.{m}".encode()),
        ("ce_time", f"2023-11-14T22:1{n}:00Z".encode()),  # a minute apart, in partition order
    ]
    return (0, b"A-1", orjson.dumps({"id": "A-1", "n": n}), ce)


@pytest.mark.parametrize(
    ("in_order", "exactly_once"),
    [(True, False), (False, False), (True, True)],
    ids=["in_order", "unordered", "exactly_once"],
)
async def test_a_retried_dispatch_keeps_the_partitions_order_in_the_join_state(
    kafka_bootstrap: str,
    topic_factory: Any,
    redis_url: str,
    in_order: bool,
    exactly_once: bool,
    broker_kind: str,
) -> None:
    if exactly_once and broker_kind != "kafka":
        pytest.skip("Tansu delivers aborted transactions' records to read_committed readers")
    src = topic_factory("in")
    out = topic_factory("out")
    # one partition: the order, then its payments 1, 2, 3 (one batch each), per emit mode
    await produce(
        kafka_bootstrap,
        src,
        [record(k, m, n) for k, n in (("o", 0), ("p", 1), ("p", 2), ("p", 3)) for m in MODES],
    )
    run = runner(redis_url, exactly_once)
    assert run.config.spec.delivery.guarantee == (
        "exactly_once" if exactly_once else "at_least_once"
    )
    assert run.in_order  # joins ask their sources for ordered dispatch
    failed: list[int] = []

    async def dispatch(events: list[CloudEvent]) -> list[Outcome]:
        if not failed and any(e.id == "p1.first" for e in events):
            failed.append(1)  # Redis restarting: this batch is dispatched again after a backoff
            msg = "join state in Redis is unavailable (ConnectionError); the batch will be retried"
            raise StateUnavailableError(msg)
        return run.run(events)

    source = make_source(
        kafka_bootstrap,
        src,
        dispatch,
        out,
        None,
        pipeline=f"p-{src}",
        fetch={"max_batch": 1, "in_order": in_order},
        retry_initial_s=1.0,  # the batches after it are fetched and dispatched meanwhile
        retry_jitter=0,  # ... for the whole second, not a random part of it
        exactly_once=exactly_once,  # the fetches' shared dispatches in order too
    )
    await run_until_committed(source, 12)
    assert failed and source.stats()["dispatch_retries"] == 1
    got = [decode_record(r) for r in await read_all(kafka_bootstrap, out, 7, timeout_s=10)]
    by_step: dict[str, list[tuple[int, int]]] = {m: [] for m in MODES}
    for e in got:
        by_step[e.source.rsplit("/j_", 1)[1]].append((e.data["order"]["n"], e.data["payment"]["n"]))
    assert sorted(by_step["every"]) == [(0, 1), (0, 2), (0, 3)]
    assert sorted(by_step["latest"]) == [(0, 1), (0, 2), (0, 3)]
    first = run.stats()["j_first"]
    if in_order:
        # the first payment pairs with the order; the later two are counted, not lost
        assert by_step["first"] == [(0, 1)]
    else:
        # without ordered dispatch the batch after the failed one wins: the bug this fixed
        assert by_step["first"] == [(0, 2)]
    assert (first["absorbed_after_match"], first["absorbed_waiting"]) == (2, 1)
