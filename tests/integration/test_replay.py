"""Replay: a topic range re-run through a deployed pipeline, with and without dedupe."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import pytest

from eventbus import CloudEvent
from eventbus.errors import ConfigError
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._replay import ReplayRange, replay
from tests.integration.kafka_helpers import collect, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

N = 1000


async def test_replay_with_and_without_dedupe(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, redis_url: str
) -> None:
    from ray import serve

    src, sink = topic_factory("rp-in", partitions=2), topic_factory("rp-out")
    name = f"replay-{uuid.uuid4().hex[:6]}"
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": [{"id": "even", "filter": "data.n % 2 == 0"}],
            "sink": {"kafka": {"topic": sink}},
            "delivery": {"dedupe": {"window_s": 600}},
        },
    }
    deploy_pipeline(doc)
    t0 = int(time.time() * 1000)
    await produce(
        kafka_bootstrap,
        src,
        [
            CloudEvent.create(
                type="t", source="/rp", id=f"r{i}", data={"n": i}, partitionkey=f"k{i % 2}"
            )
            for i in range(N)
        ],
    )
    first = await collect(kafka_bootstrap, sink, N // 2)
    assert len(first) == N // 2
    config = PipelineConfig.model_validate(doc)
    handle = serve.get_app_handle(f"eventbus-{name}")

    async def dispatch(events: list[CloudEvent]) -> Any:
        return await handle.process.remote(events)

    # Everything again, with dedupe: the sink already has every output.
    stats = await replay(
        config,
        src,
        ReplayRange(from_offset=0),
        bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        dispatch=dispatch,
    )
    assert (stats.replayed, stats.outputs, stats.duplicates, stats.dropped) == (
        N,
        0,
        N // 2,
        N // 2,
    )
    busiest = max(stats.per_partition, key=stats.per_partition.__getitem__)
    # A time range on one partition, without dedupe: those outputs again.
    stats = await replay(
        config,
        src,
        ReplayRange(from_time_ms=t0, partitions=[busiest], to_offset=100),
        bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        dispatch=dispatch,
        dedupe=False,
    )
    assert stats.replayed == 100 and stats.per_partition == {busiest: 100}
    assert stats.outputs + stats.dropped == 100 and stats.outputs > 0
    out = await collect(kafka_bootstrap, sink, N // 2 + stats.outputs)
    counts = Counter(e.id for e in out)
    assert sum(c == 2 for c in counts.values()) == stats.outputs
    assert set(counts) == {f"r{i}" for i in range(0, N, 2)}


def test_replay_range_errors() -> None:
    with pytest.raises(ConfigError, match="give where to start"):
        ReplayRange().check()
    with pytest.raises(ConfigError, match="not both"):
        ReplayRange(from_offset=1, from_time_ms=5).check()
    with pytest.raises(ConfigError, match="is not after"):
        ReplayRange(from_offset=5, to_offset=5).check()
