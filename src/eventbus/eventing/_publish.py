"""Publishing and tailing CloudEvents on Kafka topics (``eventbus publish`` / ``tail``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from eventbus.errors import ConfigError, EventDecodeError
from eventbus.eventing._codecs import (
    decode_kafka,
    encode_kafka_binary,
    encode_kafka_structured,
    event_to_json,
)
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._kafka_client import (
    KafkaClientConfig,
    kafka_client_kwargs,
    kafka_connect_error,
)

__all__ = ["build_events", "publish_events", "tail_events"]


def build_events(
    *, type_: str | None, source: str, data: str | None, file: Path | None, count: int = 1
) -> list[CloudEvent]:
    """Events from ``--data`` (with ``--type``) or a JSON-lines file.

    A file line is either a CloudEvent in structured form (it has ``specversion``) or an
    object with ``type``/``source``/``id``/``subject``/extensions and ``data``, or plain data
    (then ``--type`` is required).

    Raises:
        ConfigError: naming the line and the problem.
    """
    if (data is None) == (file is None):
        msg = "give exactly one of --data JSON or --file events.jsonl"
        raise ConfigError(msg)
    if data is not None:
        if not type_:
            msg = "--type is required with --data (the CloudEvent type, e.g. payment.created)"
            raise ConfigError(msg)
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            msg = f"--data is not JSON ({exc}); quote it, e.g. --data '{{\"amount\": 5}}'"
            raise ConfigError(msg) from None
        return [CloudEvent.create(type=type_, source=source, data=value) for _ in range(count)]
    assert file is not None
    events = []
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        msg = f"--file {file}: cannot read ({exc.strerror})"
        raise ConfigError(msg) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            msg = f"{file}:{n}: not JSON ({exc})"
            raise ConfigError(msg) from None
        events.append(_line_event(obj, type_, source, f"{file}:{n}"))
    return events


def _line_event(obj: Any, type_: str | None, source: str, where: str) -> CloudEvent:
    from eventbus.eventing._codecs import event_from_json

    if isinstance(obj, dict) and "specversion" in obj:
        try:
            return event_from_json(obj)
        except EventDecodeError as exc:
            msg = f"{where}: {exc}"
            raise ConfigError(msg) from None
    if (
        isinstance(obj, dict)
        and ("type" in obj or "data" in obj)
        and set(obj) - {"data"} <= _LINE_KEYS | set(obj)
    ):
        attrs = {k: v for k, v in obj.items() if k != "data"}
        t = attrs.pop("type", type_)
        if not t:
            msg = f"{where}: the event has no 'type'; add one or pass --type"
            raise ConfigError(msg)
        return CloudEvent.create(
            type=t,
            source=attrs.pop("source", source),
            id=attrs.pop("id", None),
            data=obj.get("data"),
            **attrs,
        )
    if not type_:
        msg = f"{where}: a plain data line needs --type"
        raise ConfigError(msg)
    return CloudEvent.create(type=type_, source=source, data=obj)


_LINE_KEYS = {"type", "source", "id", "subject", "time"}


async def publish_events(
    bootstrap: str,
    topic: str,
    events: list[CloudEvent],
    *,
    mode: str = "binary",
    key: str | None = None,
    client: KafkaClientConfig | None = None,
) -> int:
    """Produce events and wait for every ack; returns how many were sent.

    ``client``: the connection settings (TLS, SASL); None: plaintext.
    """
    from aiokafka import AIOKafkaProducer

    encode = encode_kafka_binary if mode == "binary" else encode_kafka_structured
    from eventbus.eventing._broker import is_tansu

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        enable_idempotence=not await is_tansu(bootstrap, client),  # see KafkaSink.start
        **kafka_client_kwargs(client),
    )
    await _start(producer, f"publishing to topic {topic!r}", bootstrap, client)
    try:
        futures = []
        for e in events:
            headers, value = encode(e)
            k = key if key is not None else e.attributes.get("partitionkey")
            kb = k.encode() if isinstance(k, str) else k
            futures.append(await producer.send(topic, value=value, key=kb, headers=headers))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(events)


async def tail_events(
    bootstrap: str,
    topic: str,
    show: Callable[[str], None],
    *,
    from_beginning: bool = False,
    max_events: int | None = None,
    idle_timeout_s: float | None = None,
    client: KafkaClientConfig | None = None,
) -> int:
    """Consume a topic and hand each event, as structured JSON text, to ``show``.

    Records that are not CloudEvents are shown wrapped (plain messages), with decode errors
    reported in the ``ebdecodeerror`` attribute instead of stopping the tail. ``client``: the
    connection settings (TLS, SASL); None: plaintext.
    """
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest" if from_beginning else "latest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        **kafka_client_kwargs(client),
    )
    await _start(consumer, f"tailing topic {topic!r}", bootstrap, client)
    from eventbus.eventing._broker import gap_wait_s
    from eventbus.eventing.sources._kafka_gaps import OffsetGaps

    # Tansu may store concurrent batches out of order; Apache Kafka's gaps are real
    gaps = OffsetGaps(await gap_wait_s(None, bootstrap, client), f"tail of {topic}")
    seen = 0
    last = time.monotonic()
    try:
        while max_events is None or seen < max_events:
            batch, _ = gaps.take(consumer, await consumer.getmany(timeout_ms=200), time.monotonic())
            if not batch:
                if idle_timeout_s is not None and time.monotonic() - last > idle_timeout_s:
                    break
                continue
            last = time.monotonic()
            for tp, records in batch.items():
                for r in records:
                    try:
                        e = decode_kafka(
                            r.value,
                            list(r.headers or ()),
                            key=r.key,
                            topic=tp.topic,
                            partition=tp.partition,
                            offset=r.offset,
                            default_type="eventbus.message",
                            default_source=f"kafka://{tp.topic}",
                        )
                    except EventDecodeError as exc:
                        e = CloudEvent.create(
                            type="eventbus.undecodable",
                            source=f"kafka://{tp.topic}",
                            id=str(uuid.uuid4()),
                            ebdecodeerror=str(exc),
                        )
                    show(event_to_json(e).decode())
                    seen += 1
                    if max_events is not None and seen >= max_events:
                        return seen
    finally:
        await consumer.stop()
    return seen


async def _start(client: Any, what: str, servers: str, config: KafkaClientConfig | None) -> None:
    """Start an aiokafka client; a failure becomes an error that names its cause."""
    from aiokafka.errors import KafkaError

    try:
        await client.start()
    except (KafkaError, KeyError) as e:  # KeyError: aiokafka's SCRAM client, login refused
        await client.stop()
        raise await kafka_connect_error(what, servers, config, e) from e
