"""Micro-batching of concurrent requests."""

from __future__ import annotations

import asyncio

import pytest

from eventbus.gateway._batcher import MicroBatcher


async def test_concurrent_submissions_share_flushes_and_get_their_own_results() -> None:
    calls: list[int] = []

    async def flush(xs: list[int]) -> list[int]:
        calls.append(len(xs))
        await asyncio.sleep(0.01)
        return [x * 10 for x in xs]

    b = MicroBatcher(flush, max_size=1000, max_in_flight=1)
    results = await asyncio.gather(*(b.submit([i, i + 1000]) for i in range(100)))
    assert results == [[i * 10, (i + 1000) * 10] for i in range(100)]
    assert sum(calls) == 200
    assert len(calls) < 10  # batched, not one call per submission


async def test_max_size_bounds_a_flush() -> None:
    sizes: list[int] = []

    async def flush(xs: list[int]) -> list[int]:
        sizes.append(len(xs))
        return xs

    b = MicroBatcher(flush, max_size=10)
    await asyncio.gather(*(b.submit([i, i]) for i in range(50)))
    assert max(sizes) <= 10 and sum(sizes) == 100


async def test_a_failed_flush_fails_only_its_batch() -> None:
    async def flush(xs: list[int]) -> list[int]:
        if 13 in xs:
            raise RuntimeError("boom")
        return xs

    b = MicroBatcher(flush, max_size=1, max_in_flight=4)
    good, bad = await asyncio.gather(b.submit([1]), b.submit([13]), return_exceptions=True)
    assert good == [1]
    assert isinstance(bad, RuntimeError)


async def test_wrong_result_count_is_an_error() -> None:
    async def flush(xs: list[int]) -> list[int]:
        return xs[:-1]

    with pytest.raises(RuntimeError, match="flush returned 1 results for 2 items"):
        await MicroBatcher(flush).submit([1, 2])
