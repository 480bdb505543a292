"""aiokafka's private attributes that ``eventing/_aiokafka_adapter.py`` uses still exist: this
fails loudly on an aiokafka upgrade that renames one (the adapter itself then does nothing)."""

from __future__ import annotations

import inspect
from importlib.metadata import version

from aiokafka import AIOKafkaConsumer

from eventbus.eventing._aiokafka_adapter import quiet_fetch_routine, set_fetch_wait


def test_the_pinned_version_is_installed() -> None:
    assert version("aiokafka") == "0.14.0", (
        "aiokafka was upgraded: check each private use in eventing/_aiokafka_adapter.py "
        "against the new version, then update this pin and pyproject's"
    )


async def test_the_attributes_the_adapter_uses_exist() -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", fetch_max_wait_ms=10)
    try:
        assert callable(consumer._client.force_metadata_update)
        # the fetcher exists once the consumer started; its class reads both per round
        from aiokafka.consumer.fetcher import Fetcher

        source = inspect.getsource(Fetcher)
        assert "self._fetch_max_wait_ms" in source
        assert "self._fetcher_timeout" in source
    finally:
        await consumer.stop()


class _Routine:
    _fetcher_timeout = 0.2
    _fetch_max_wait_ms = 10


class _Consumer:
    _fetcher = _Routine()


def test_fetch_wait_and_quiet_routine_set_and_restore() -> None:
    consumer = _Consumer()
    assert set_fetch_wait(consumer, 500)
    assert consumer._fetcher._fetch_max_wait_ms == 500
    with quiet_fetch_routine(consumer, 20.0):
        assert consumer._fetcher._fetcher_timeout == 20.0
    assert consumer._fetcher._fetcher_timeout == 0.2
    # gone (a rename): nothing is done, nothing raised
    assert not set_fetch_wait(object(), 500)
    with quiet_fetch_routine(object(), 20.0):
        pass
