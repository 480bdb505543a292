"""The timers' sweeper (``serving._outputs.sweep_forever``) fires a timer at once when the
timer asks (``Timer.wake_with``: an aggregate step whose batch made windows due), at most
every ``interval_s / 10``, instead of at its next tick."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._step import Fired, Timer
from eventbus.serving._outputs import sweep_forever


class Clocked(Timer):
    """Notes when it fires; returns nothing to deliver."""

    interval_s = 5.0

    def __init__(self) -> None:
        self.fired: list[float] = []
        self.wake: Callable[[], None] | None = None
        self.changed = threading.Event()

    def fire(self) -> Fired | None:
        self.fired.append(time.monotonic())
        self.changed.set()
        return None

    def wake_with(self, wake: Callable[[], None]) -> None:
        self.wake = wake


def wait_fires(timer: Clocked, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(timer.fired) < n:
        timer.changed.clear()
        assert timer.changed.wait(max(0.0, deadline - time.monotonic())), (
            f"the timer fired {len(timer.fired)} times, not {n}, within {timeout_s} s"
        )


@pytest.mark.kafka
def test_a_woken_timer_fires_before_its_tick_but_not_sooner_than_a_tenth_of_it(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    config = PipelineConfig.model_validate(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": "sweepwake"},
            "spec": {
                "sources": [{"kafka": {"topic": topic_factory("in")}}],
                "steps": [],
                "sink": {"kafka": {"topic": topic_factory("out")}},
            },
        }
    )
    timer = Clocked()

    async def main() -> None:
        sweeper = asyncio.create_task(sweep_forever([timer], config, kafka_bootstrap))
        try:
            await asyncio.to_thread(wait_fires, timer, 1, 30)  # the first tick (about 1 s)
            assert timer.wake is not None
            # from another thread, as the steps' worker thread calls it after a batch
            await asyncio.to_thread(timer.wake)
            await asyncio.to_thread(wait_fires, timer, 2, 30)
            gap = timer.fired[1] - timer.fired[0]
            # not at the next tick (5 s on), and not sooner than interval_s / 10 after the last
            assert 0.45 <= gap < 4.0, gap
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)

    asyncio.run(main())
