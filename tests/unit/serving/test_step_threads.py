"""Where a replica's sources run the steps (``serving._step_threads``): an aggregate step's
batches go to one worker thread, one at a time in fetch order, while the loop keeps turning."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from eventbus.pipelines.steps._aggregate import AggregateStep
from eventbus.pipelines.steps._aggregate_config import AggregateConfig
from eventbus.serving._step_threads import StepThreads


class Flags:
    def __init__(self, blocking: bool = False, offload: bool = False) -> None:
        self.blocking, self.offload = blocking, offload


def aggregate_step() -> AggregateStep:
    config = AggregateConfig.model_validate(
        {"key": "data.k", "window": {"tumbling": {"size_s": 1}}, "aggregations": {"n": "count"}}
    )
    return AggregateStep("agg", config, pipeline="p")


def test_the_mode_follows_the_steps_flags() -> None:
    assert StepThreads([Flags()]).mode == "loop"
    assert StepThreads([Flags(), Flags(offload=True)]).mode == "ordered"
    # a blocking step (a model) wants its batches to overlap: that wins
    assert StepThreads([Flags(offload=True), Flags(blocking=True)]).mode == "threads"
    assert StepThreads([aggregate_step()]).mode == "ordered"


def test_ordered_calls_run_one_at_a_time_in_submission_order_off_the_loop() -> None:
    threads = StepThreads([Flags(offload=True)])
    ran: list[int] = []
    running = 0
    most = 0
    where: set[int] = set()
    lock = threading.Lock()

    def work(n: int, wait_s: float) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        where.add(threading.get_ident())
        time.sleep(wait_s)  # a Redis reply being waited on: the GIL is free meanwhile
        ran.append(n)
        with lock:
            running -= 1
        return n * 10

    async def main() -> tuple[list[int], int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        # the first call waits longest: were calls concurrent, the later ones would finish first
        calls = [asyncio.create_task(threads.call(work, n, 0.05 - n * 0.01)) for n in range(5)]
        got = await asyncio.gather(*calls)
        ticker.cancel()
        return got, ticks

    got, ticks = asyncio.run(main())
    threads.close()
    assert got == [0, 10, 20, 30, 40]
    assert ran == [0, 1, 2, 3, 4]
    assert most == 1
    assert len(where) == 1 and threading.get_ident() not in where
    assert ticks > 10  # the loop turned while the calls waited


def test_loop_mode_runs_in_place_and_errors_come_back() -> None:
    threads = StepThreads([Flags()])

    def boom() -> None:
        msg = "step failed"
        raise ValueError(msg)

    async def main() -> Any:
        here = await threads.call(threading.get_ident)
        try:
            await threads.call(boom)
        except ValueError as e:
            return here, str(e)
        return here, None

    assert asyncio.run(main()) == (threading.get_ident(), "step failed")


def test_ordered_errors_come_back_and_later_calls_still_run() -> None:
    threads = StepThreads([Flags(offload=True)])

    def boom() -> None:
        msg = "Redis went away"
        raise ConnectionError(msg)

    async def main() -> list[Any]:
        first = asyncio.create_task(threads.call(boom))
        second = asyncio.create_task(threads.call(lambda: "next"))
        return await asyncio.gather(first, second, return_exceptions=True)

    first, second = asyncio.run(main())
    threads.close()
    assert isinstance(first, ConnectionError) and str(first) == "Redis went away"
    assert second == "next"


def test_threads_mode_overlaps_calls() -> None:
    threads = StepThreads([Flags(blocking=True)])
    inside = threading.Barrier(3, timeout=10)

    def meet() -> bool:
        inside.wait()  # three calls at once, or a BrokenBarrierError after 10 s
        return True

    async def main() -> list[bool]:
        return await asyncio.gather(*(threads.call(meet) for _ in range(3)))

    assert asyncio.run(main()) == [True, True, True]


def test_worker_threads_shorten_the_gil_switch_interval_and_the_loop_leaves_it() -> None:
    import sys

    from eventbus.serving._step_threads import SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        StepThreads([Flags()]).tune_switching()
        assert sys.getswitchinterval() == 0.005  # steps on the loop: nothing waits for the GIL
        for flags in (Flags(offload=True), Flags(blocking=True)):
            sys.setswitchinterval(0.005)
            StepThreads([flags]).tune_switching()
            assert abs(sys.getswitchinterval() - SWITCH_INTERVAL_S) < 1e-9
        sys.setswitchinterval(0.0002)  # shorter already (set by the user): kept
        StepThreads([Flags(offload=True)]).tune_switching()
        assert abs(sys.getswitchinterval() - 0.0002) < 1e-9
    finally:
        sys.setswitchinterval(before)
