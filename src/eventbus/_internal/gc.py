"""Garbage-collector settings for the processes that run batches."""

from __future__ import annotations

import gc

__all__ = ["collect_periodically", "tune_gc"]


def tune_gc() -> None:
    """Collect less often and keep startup objects out of every collection.

    Batches allocate many short-lived containers; with the default generation-0 threshold
    (700) the collector costs ~25% of a source's time (measured here).

    Only the young generations are collected before the freeze: this runs in a replica's
    constructor, on a cold start's path, where a full collection walks every object the
    imports made (~150,000: Ray, Serve, pandas, EventBus) for 70-300 ms and finds a few
    dozen unreachable ones (40 measured); those few, if old, stay frozen for the process's life.
    """
    gc.collect(1)
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


async def collect_periodically(young_every_s: float = 5.0) -> None:
    """Run the cyclic collector on a timer instead of on allocation counts.

    For the process whose event loop runs batches: a collection triggered by allocation
    counts lands mid-batch and scans every live object of the batch (measured: ~9% of a
    replica's time, charged to one dict copy in the convert step). On a timer, the young
    generation is collected every ``young_every_s``, the middle one every 6 of those and
    everything every 60 (5 minutes at the default), so no single pause scans the whole heap
    often. Automatic collection is off for the process while this runs.

    A collection's cost is the objects alive at that moment (the in-flight batches: the
    garbage was freed by reference counting already), not the time since the last one: each
    young collection of a replica at ~60k events/s took ~50 ms, 5% of its samples at one per
    second (py-spy, kafka_pipeline benchmark), hence one per 5 s. What waits for it is cyclic
    garbage only, which the batch path does not make.
    """
    import asyncio

    gc.disable()
    ticks = 0
    try:
        while True:
            await asyncio.sleep(young_every_s)
            ticks += 1
            gc.collect(2 if ticks % 60 == 0 else 1 if ticks % 6 == 0 else 0)
    finally:
        gc.enable()
