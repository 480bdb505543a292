"""The join's Redis state under ``exactly_once``: a batch whose transaction aborted after the
state took its events is consumed again, cut into other batches, and emits exactly what its
first attempt emitted (same ids, same data), while another partition's events paired with
the aborted attempt's state meanwhile. What the first attempt emitted is never visible (its
transaction aborted): the committed outputs are the events before the abort, the other
partition's, and the replay's, and they hold every combination once: as a run without the
abort. On the real Redis scripts, each ``emit``, without Kafka (the transaction is the
caller's bookkeeping here; ``test_exactly_once_join`` runs it on Kafka).
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from eventbus.eventing._event import CloudEvent
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner

pytestmark = [pytest.mark.integration, pytest.mark.redis]

KEYS = 30
T0 = 1_700_000_000_000  # the first event's time (ms)


def runner(redis_url: str, emit: str) -> PipelineRunner:
    name = f"replay-{uuid.uuid4().hex[:8]}"
    config = PipelineConfig.model_validate(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": "in"}}],
                "steps": [
                    {
                        "id": "pair",
                        "join": {
                            "sides": [
                                {"name": "o", "when": "type == 'o'", "key": "data.k"},
                                {"name": "p", "when": "type == 'p'", "key": "data.k"},
                            ],
                            "emit": emit,
                            "time": "event",  # exactly_once refuses processing time
                            "window_s": 600,
                        },
                    }
                ],
                "sink": {"kafka": {"topic": "out"}},
                "dead_letter": {"kafka": {"topic": "dlq"}},
                "delivery": {"guarantee": "exactly_once"},
            },
        }
    )
    return PipelineRunner(config, redis_url=redis_url)


def events(side: str, n: int) -> list[CloudEvent]:
    """``n`` events of one side (one input partition), keys cycling over ``KEYS``, event
    ``i`` at ``T0 + i`` ms: the windows (600 s) outlast them all, no event is late."""
    return [
        CloudEvent.create(
            type=side,
            source="/r",
            id=f"{side}{i}",
            time=datetime.fromtimestamp((T0 + i) / 1000, tz=UTC),
            data={"k": i % KEYS, "i": i},
        )
        for i in range(n)
    ]


def run(r: PipelineRunner, batch: list[CloudEvent]) -> list[list[tuple[str, Any]]]:
    """Per event its outputs as (id, data)."""
    return [[(e.id, e.data) for e in outcome] for outcome in r.run(batch)]


def cut(evs: list[CloudEvent], sizes: tuple[int, ...]) -> list[list[CloudEvent]]:
    out, i, k = [], 0, 0
    while i < len(evs):
        size = sizes[k % len(sizes)]
        out.append(evs[i : i + size])
        i, k = i + size, k + 1
    return out


def combos(outputs: list[tuple[str, Any]]) -> Counter[str]:
    """The joined events by their sides' events (ids differ between runs: the window's first
    arrival is in them)."""
    return Counter(f"{d['o']['i']}+{d['p']['i']}" for _, d in outputs)


@pytest.mark.parametrize("emit", ["every", "first", "latest"])
def test_an_aborted_batch_consumed_again_emits_the_same(redis_url: str, emit: str) -> None:
    orders, pays = events("o", 240), events("p", 240)
    r = runner(redis_url, emit)
    committed: list[tuple[str, Any]] = []
    first_attempt: dict[int, list[tuple[str, Any]]] = {}
    for batch in cut(orders[:200], (37, 63)):  # partition O, committed
        committed += [x for outs in run(r, batch) for x in outs]
    # partition P: 0..9 committed; 10..159 in a transaction that aborts after the state took
    # them (most keys complete in it); partition O meanwhile, committed, pairing with them
    for batch in cut(pays[:10], (10,)):
        committed += [x for outs in run(r, batch) for x in outs]
    for batch in cut(pays[10:160], (50,)):
        for e, outs in zip(batch, run(r, batch), strict=True):
            first_attempt[int(e.data["i"])] = outs
    for batch in cut(orders[200:], (40,)):
        committed += [x for outs in run(r, batch) for x in outs]
    # the next owner (another replica: another runner on the same state) consumes P again
    # from its committed offset, cut otherwise, and goes on
    heir = PipelineRunner(r.config, redis_url=redis_url)
    for batch in cut(pays[10:], (7, 91, 13)):
        for e, outs in zip(batch, run(heir, batch), strict=True):
            i = int(e.data["i"])
            if i in first_attempt:
                assert outs == first_attempt[i], f"p{i} emitted otherwise when consumed again"
            committed += outs
    assert sum(map(len, first_attempt.values())) > 0, "the aborted attempt emitted nothing"
    ids = Counter(i for i, _ in committed)
    assert max(ids.values()) == 1, ids.most_common(3)
    # the same combinations as a run without the abort
    clean: list[tuple[str, Any]] = []
    r2 = runner(redis_url, emit)
    for batch in cut(orders[:200], (37, 63)) + cut(pays[:160], (40,)):
        clean += [x for outs in run(r2, batch) for x in outs]
    for batch in cut(orders[200:], (40,)) + cut(pays[160:], (80,)):
        clean += [x for outs in run(r2, batch) for x in outs]
    assert combos(committed) == combos(clean)
    assert max(combos(committed).values()) == 1
