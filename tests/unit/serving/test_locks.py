"""One lock per pipeline (``serving._locks``): the same lock for a name, whoever asks and
however many ask at once; another name's lock is another lock; nothing kept once unused."""

from __future__ import annotations

import gc
import threading

from eventbus.serving._locks import PipelineLocks


def test_one_lock_per_name_and_another_for_another_name() -> None:
    locks = PipelineLocks()
    a = locks.of("a")
    assert locks.of("a") is a
    assert locks.of("b") is not a
    with a:
        # re-entrant: a rollback deploys under the lock it holds
        with locks.of("a"):
            pass
        # another pipeline's lock is free while a's is held (held by a reference: a lock
        # nobody refers to is gone, as `with locks.of(name):` refers to it until its end)
        b = locks.of("b")
        assert b.acquire(blocking=False)
        b.release()


def test_many_threads_asking_at_once_get_one_lock() -> None:
    locks = PipelineLocks()
    go = threading.Barrier(32)
    got: list[object] = []

    def ask() -> None:
        go.wait(30)
        got.append(locks.of("orders"))

    threads = [threading.Thread(target=ask) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 32
    assert all(lock is got[0] for lock in got)


def test_unused_locks_are_not_kept() -> None:
    locks = PipelineLocks()
    for i in range(1000):  # deployed and deleted pipelines leave nothing behind
        with locks.of(f"p{i}"):
            pass
    held = locks.of("held")
    gc.collect()
    assert len(locks) == 1
    with held:
        assert locks.of("held") is held
