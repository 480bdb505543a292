"""What every Kafka sink format of the Confluent wire format shares (Avro, JSON Schema): its
schema id learnt from the registry once (the subject's pinned ``version``, or the inline
schema looked up under the subject and registered when missing), the 5-byte header
(a zero byte, the 4-byte big-endian id), the event framed as Kafka binary mode.

A format's subclass names its ``schema_type`` and ``content_type``, loads the registry's
schema (:meth:`SubjectEncoder.load`) and encodes a datum (:meth:`SubjectEncoder.encode_datum`).
A registry that cannot be reached raises ``RegistryUnavailableError`` (the batch waits and
is retried); a subject, version or schema the registry refuses raises
:class:`SinkSchemaError` (a configuration error); data that does not fit raises
:class:`SinkEncodeError` (its event is dead-lettered with the reason).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple
from urllib.parse import quote

from eventbus.errors import ConfigError, EventBusError
from eventbus.eventing._confluent_avro import RegistryClient

__all__ = ["MAX_SCHEMA_ID", "SinkEncodeError", "SinkSchemaError", "SubjectEncoder"]

#: Confluent clients (Java) read the id as a signed 32-bit int: larger ids cannot be framed.
MAX_SCHEMA_ID = 2**31 - 1
_MAX_REASON = 1000  # characters of a dead letter's reason (a 10 MB string value is cut)


class SinkEncodeError(EventBusError, ValueError):
    """An event's data does not fit the sink's schema (its dead letter names why)."""


class SinkSchemaError(ConfigError):
    """The registry refused the sink's subject, version or schema."""


class SubjectEncoder:
    """Encode event data, Confluent-framed, under a registry subject (a format's base).

    Args:
        registry_url: the registry's base URL.
        subject: the subject the schema is (or is registered) under, e.g. ``orders-value``.
        schema: the writer schema (JSON text or parsed), looked up and registered when
            missing; or None with ``version``.
        version: a pinned version of ``subject`` (a number or ``"latest"``); or None with
            ``schema``.
        headers: sent with each registry request.
        transport: an httpx transport for the async client (tests).
    """

    #: the registry's schemaType ("AVRO", "JSON") and the format's name in messages
    schema_type = "AVRO"
    kind = "Avro"
    content_type = b"application/avro"
    encode_error: type[SinkEncodeError] = SinkEncodeError
    schema_error: type[SinkSchemaError] = SinkSchemaError

    def __init__(
        self,
        registry_url: str,
        subject: str,
        *,
        schema: Any = None,
        version: int | str | None = None,
        headers: dict[str, str] | None = None,
        transport: Any = None,
    ) -> None:
        if (schema is None) == (version is None):
            msg = (
                f"{self.kind} subject {subject!r}: give either a schema or a pinned version, "
                "not both"
            )
            raise ConfigError(msg)
        self.http = RegistryClient(registry_url, headers=headers, transport=transport)
        self.subject = subject
        self.version = version
        self.schema_text = (
            None if schema is None else schema if isinstance(schema, str) else json.dumps(schema)
        )
        self.schema_id: int | None = None
        self.header = b""

    @property
    def ready(self) -> bool:
        """Whether the schema id is known (:meth:`resolve` done)."""
        return self.schema_id is not None

    def body(self) -> dict[str, Any]:
        """The registry request body of the inline schema."""
        out: dict[str, Any] = {"schema": self.schema_text}
        if self.schema_type != "AVRO":
            out["schemaType"] = self.schema_type
        return out

    def _path(self, tail: str = "") -> str:
        return f"/subjects/{quote(self.subject, safe='')}{tail}"

    def _first(self) -> tuple[str, str, Any]:
        if self.version is not None:
            return "GET", self._path(f"/versions/{self.version}"), None
        return "POST", self._path(), self.body()  # lookup: a read

    def _after(self, call: tuple[str, str, Any], response: Any) -> tuple[str, str, Any] | None:
        """Take the answer to ``call``; the next call, or None when the id is known."""
        where = f"the schema registry at {self.http.registry_url}"
        try:
            body = response.json()
        except ValueError:
            body = {}
        code = body.get("error_code") if isinstance(body, dict) else None
        told = f"{response.status_code} {code or ''} {str(body.get('message', ''))[:300]}"
        if self.version is not None:
            if response.status_code != 200:
                msg = (
                    f"subject {self.subject!r} version {self.version!r} is not in {where} "
                    f"({told.strip()}); pin a version `eventbus registry get {self.subject}` "
                    "lists, or give the schema instead to register it"
                )
                raise self.schema_error(msg)
            if (body.get("schemaType") or "AVRO") != self.schema_type:
                msg = (
                    f"subject {self.subject!r} version {self.version!r} is a "
                    f"{body.get('schemaType') or 'AVRO'} schema, not {self.schema_type}; pin a "
                    f"{self.schema_type} version or change value_format"
                )
                raise self.schema_error(msg)
            self._take(body.get("id"), body.get("schema"))
            return None
        if call[1].endswith("/versions"):  # registered
            if response.status_code != 200:
                fix = (
                    "make the change compatible with the subject's level, or change the level"
                    if response.status_code == 409
                    else "fix the schema"
                )
                msg = f"{where} refused the schema for {self.subject!r} ({told.strip()}); {fix}"
                raise self.schema_error(msg)
            self._take(body.get("id"), self.schema_text)
            return None
        if response.status_code == 404:  # not registered under the subject yet
            return "POST", self._path("/versions"), self.body()
        if response.status_code != 200:
            msg = f"{where} refused the schema of {self.subject!r} ({told.strip()}); fix it"
            raise self.schema_error(msg)
        self._take(body.get("id"), self.schema_text)
        return None

    def _take(self, sid: Any, schema: Any) -> None:
        if not isinstance(sid, int) or isinstance(sid, bool) or not 0 <= sid <= MAX_SCHEMA_ID:
            msg = (
                f"the schema registry at {self.http.registry_url} gave schema id {sid!r} for "
                f"{self.subject!r}; the wire format holds ids 0..{MAX_SCHEMA_ID} (a signed "
                "32-bit int): fix the registry"
            )
            raise self.schema_error(msg)
        try:
            self.load(schema)
        except Exception as e:  # noqa: BLE001 - the registry's schema: a configuration error
            msg = f"schema id {sid} of {self.subject!r} is not a usable {self.kind} schema: {e}"
            raise self.schema_error(msg) from None
        self.header = b"\x00" + sid.to_bytes(4, "big")
        self.schema_id = sid

    def load(self, schema: Any) -> None:
        """Take the registry's schema text (raises when it is unusable)."""
        raise NotImplementedError

    async def resolve(self) -> None:
        """Learn the schema id (idempotent).

        Raises:
            RegistryUnavailableError: the registry cannot be reached; try again later.
            SinkSchemaError: the registry refused the subject, version or schema.
        """
        call: tuple[str, str, Any] | None = None if self.ready else self._first()
        while call is not None:
            call = self._after(call, await self.http.request(*call))

    def resolve_sync(self) -> None:
        """:meth:`resolve` from synchronous code (a replica encoding its outputs)."""
        call: tuple[str, str, Any] | None = None if self.ready else self._first()
        while call is not None:
            call = self._after(call, self.http.request_sync(*call))

    def encode_datum(self, datum: Any) -> bytes:
        """``datum`` framed: magic byte, schema id, body (raises ``encode_error``)."""
        raise NotImplementedError

    def error(self, reason: str) -> SinkEncodeError:
        msg = (
            f"data does not fit the {self.kind} schema of subject {self.subject!r} "
            f"(id {self.schema_id}): {reason}"
        )
        return self.encode_error(msg[:_MAX_REASON])

    def encode_event(self, event: Any) -> tuple[list[tuple[str, bytes]], bytes | None]:
        """``(headers, value)`` of an event in Kafka binary mode: its attributes as ``ce_``
        headers, the format's ``content-type``."""
        from eventbus.eventing._codecs import encode_kafka_binary

        value = self.encode_datum(event.data)
        bare: Any = _Attributes(event.attributes)  # the headers alone: no data to dump
        headers, _ = encode_kafka_binary(bare)
        headers = [h for h in headers if h[0] != "content-type"]
        headers.append(("content-type", self.content_type))
        return headers, value

    async def aclose(self) -> None:
        await self.http.aclose()


class _Attributes(NamedTuple):
    """An event's attributes without its data, for the header encoder."""

    attributes: dict[str, Any]
    data: None = None
