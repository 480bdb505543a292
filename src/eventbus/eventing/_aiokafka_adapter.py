"""The one place EventBus reaches past aiokafka's public API, each use named, for the version
pinned in ``pyproject.toml`` (``aiokafka==0.14.0``);
``tests/unit/eventing/test_aiokafka_adapter.py`` fails on an upgrade that renames any of them.

* :func:`refresh_metadata`: a group-less consumer learns a topic's partitions. Its bootstrap
  asks Metadata for no topic (Apache Kafka then answers with none: Tansu with all), and the
  public ``topics()`` returns names from a metadata copy the consumer does not keep, so
  ``partitions_for_topic()`` stays None until the client's metadata is refreshed.
* :func:`set_fetch_wait`, :func:`quiet_fetch_routine`: Tansu only. Tansu holds a waiting fetch
  for its whole ``fetch_max_wait_ms``, so a busy source fetches with a short wait and an idle one
  long-polls, switched while the consumer runs; a parked source (paused partitions) keeps
  aiokafka's fetch routine from waking every 0.2 s. Apache Kafka answers a waiting fetch as soon
  as records arrive: there sources fetch with the long wait from the start and never switch.

* :func:`set_sasl_password`, :func:`on_login_refused`: a rotated SASL password without a
  restart (``_kafka_live_password``). aiokafka's client reads ``_sasl_plain_password`` each time
  it opens a connection (a login) and calls ``_on_connection_closed`` with
  ``CloseReason.AUTH_FAILURE`` when the broker refuses one; aiokafka has no public way to
  change the password of a running client.

Each function degrades to doing nothing when the attribute is gone (the unit test is what fails
loudly), so a rename costs idle CPU on Tansu, never an event.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "kafka_client_of",
    "on_login_refused",
    "quiet_fetch_routine",
    "refresh_metadata",
    "set_fetch_wait",
    "set_sasl_password",
]


async def refresh_metadata(consumer: Any) -> None:
    """Refresh ``consumer``'s cluster metadata (every topic, for a consumer that tracks none)."""
    client = getattr(consumer, "_client", None)
    if client is not None:
        await client.force_metadata_update()


def set_fetch_wait(consumer: Any, wait_ms: int) -> bool:
    """Make the consumer's next fetch requests wait up to ``wait_ms`` at the broker (aiokafka
    reads it as it builds each request). Whether it could."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not hasattr(fetcher, "_fetch_max_wait_ms"):
        return False
    fetcher._fetch_max_wait_ms = wait_ms
    return True


@contextlib.contextmanager
def quiet_fetch_routine(consumer: Any, timeout_s: float) -> Iterator[None]:
    """While inside, aiokafka's fetch routine (which wakes every 0.2 s to find paused
    partitions with nothing to fetch) sleeps up to ``timeout_s``; a resume wakes it at once."""
    routine = getattr(consumer, "_fetcher", None)
    if routine is None or not hasattr(routine, "_fetcher_timeout"):
        yield
        return
    saved, routine._fetcher_timeout = routine._fetcher_timeout, timeout_s
    try:
        yield
    finally:
        routine._fetcher_timeout = saved


def kafka_client_of(owner: Any) -> Any:
    """The ``AIOKafkaClient`` of a consumer (``_client``), producer (``client``) or admin
    client (``_client``), or ``owner`` itself when it is one; None when none is found."""
    from aiokafka import AIOKafkaClient

    if isinstance(owner, AIOKafkaClient):
        return owner
    for name in ("_client", "client"):
        client = getattr(owner, name, None)
        if isinstance(client, AIOKafkaClient):
            return client
    return None


def set_sasl_password(client: Any, password: str) -> bool:
    """Make ``client``'s next logins (new connections) use ``password``. Whether it could."""
    if client is None or not hasattr(client, "_sasl_plain_password"):
        return False
    client._sasl_plain_password = password
    return True


def on_login_refused(client: Any, callback: Callable[[], None]) -> bool:
    """Call ``callback`` (on the client's loop) each time the broker refuses one of
    ``client``'s logins to a broker node. Whether it could."""
    from aiokafka.conn import CloseReason

    original = getattr(client, "_on_connection_closed", None)
    if original is None:
        return False

    def closed(conn: Any, reason: Any) -> Any:
        if reason == CloseReason.AUTH_FAILURE:
            callback()
        return original(conn, reason)

    client._on_connection_closed = closed
    return True
