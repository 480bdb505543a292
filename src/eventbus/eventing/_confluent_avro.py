"""Avro in the Confluent wire format: a zero byte, the 4-byte big-endian schema id, the Avro
binary body; the writer schemas fetched from a Confluent-compatible registry and cached.

A record that cannot be decoded (another magic byte, a schema id the registry does not know,
a truncated or overlong body) raises :class:`EventDecodeError` naming why, for its
dead letter. A registry that cannot be reached raises :class:`RegistryUnavailableError`
instead: the records wait and are tried again, they are not dead-lettered for an outage.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Iterable
from decimal import Decimal
from typing import Annotated, Any

from pydantic import Field

from eventbus.errors import EventBusError, EventDecodeError

__all__ = [
    "AvroWireDecoder",
    "RegistryClient",
    "RegistryUnavailableError",
    "SchemaRegistryUrl",
    "WireDecoder",
    "avro_to_json",
]

#: The ``schema_registry_url`` field of the Kafka source and sink configs.
SchemaRegistryUrl = Annotated[
    str | None,
    Field(
        pattern=r"^https?://",
        description="The Confluent-compatible schema registry of value_format avro and json_schema: EventBus's "
        "own (`eventbus url registry`; http://127.0.0.1:8080/registry with `eventbus up`) or "
        "any other.",
    ),
]


_MAGIC = 0
_HEADER = 5
_MAX_UNKNOWN = 10_000  # ids remembered as unknown to the registry


class RegistryUnavailableError(EventBusError):
    """The schema registry did not answer (or answered 5xx); try again later."""

    #: an infrastructure error: a dispatch or a sink send that raises it is retried, its
    #: events wait (never dead-lettered for an outage); also through Ray's RayTaskError
    retriable = True


class RegistryClient:
    """The HTTP calls both sides make to a Confluent-compatible registry (the source's
    decoder and the sink's encoder): one async and one sync client, made on first use; a
    transport error, 5xx, 401, 403 or 429 raises :class:`RegistryUnavailableError`, any
    other answer is returned.

    Args:
        registry_url: the registry's base URL (``http://127.0.0.1:8080/registry``).
        headers: sent with each request (``Authorization`` for a registry that needs it).
        timeout_s: one request's limit.
        transport: an httpx transport for the async client (tests: an ASGI app).
    """

    def __init__(
        self,
        registry_url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float = 10.0,
        transport: Any = None,
    ) -> None:
        self.registry_url = registry_url.rstrip("/")
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self._transport = transport
        self._async: Any = None

    def _checked(self, response: Any, what: str) -> Any:
        if response.status_code >= 500 or response.status_code in (401, 403, 429):
            msg = (
                f"the schema registry at {self.registry_url} answered {response.status_code} "
                f"for {what}: {response.text[:300]}"
            )
            raise RegistryUnavailableError(msg)
        return response

    def _unreachable(self, e: Exception) -> RegistryUnavailableError:
        msg = f"the schema registry at {self.registry_url} did not answer ({e}); retrying"
        return RegistryUnavailableError(msg)

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """``method`` ``path`` (under the base URL), JSON ``body``; the httpx response."""
        import httpx

        if self._async is None:
            self._async = httpx.AsyncClient(
                timeout=self.timeout_s, headers=self.headers, transport=self._transport
            )
        try:
            response = await self._async.request(method, self.registry_url + path, json=body)
        except httpx.HTTPError as e:
            raise self._unreachable(e) from e
        return self._checked(response, f"{method} {path}")

    def request_sync(self, method: str, path: str, body: Any = None) -> Any:
        """:meth:`request` from synchronous code (a replica's encoding, a deploy's check)."""
        import httpx

        try:
            with httpx.Client(timeout=self.timeout_s, headers=self.headers) as client:
                response = client.request(method, self.registry_url + path, json=body)
        except httpx.HTTPError as e:
            raise self._unreachable(e) from e
        return self._checked(response, f"{method} {path}")

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None


class WireDecoder:
    """Confluent-framed values with writer schemas from a registry, fetched once per id (a
    fetch already under way is awaited, not repeated); a format's subclass parses a fetched
    schema (:meth:`parse`) and decodes a body (:meth:`decode_body`).

    Args:
        registry_url: the registry's base URL (``http://127.0.0.1:8080/registry``).
        headers: sent with each request (``Authorization`` for a registry that needs it).
        timeout_s: one request's limit.
        transport: an httpx transport (tests: an ASGI app).
    """

    #: the format, named in errors ("Avro", "JSON Schema")
    kind = "Avro"

    def __init__(
        self,
        registry_url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float = 10.0,
        transport: Any = None,
    ) -> None:
        self.http = RegistryClient(
            registry_url, headers=headers, timeout_s=timeout_s, transport=transport
        )
        self.registry_url = self.http.registry_url
        self._schemas: dict[int, Any] = {}  # id -> parsed writer schema
        self._unknown: dict[int, str] = {}  # id -> why the registry has none
        self._fetching: dict[int, asyncio.Future[None]] = {}  # id -> its fetch under way
        self.fetches = 0  # registry requests made for schemas

    @staticmethod
    def schema_id(value: bytes | None) -> int:
        """The schema id of a framed value.

        Raises:
            EventDecodeError: no value, too short, or not magic byte 0.
        """
        if value is None:
            msg = "the record has no value (a tombstone); the Confluent wire format needs a body"
            raise EventDecodeError(msg)
        if len(value) < _HEADER:
            msg = f"the value is {len(value)} bytes, shorter than the 5-byte Confluent header"
            raise EventDecodeError(msg)
        if value[0] != _MAGIC:
            msg = (
                f"magic byte {value[0]} is not the Confluent wire format's 0; was the topic "
                "written by a Confluent serializer (Avro, JSON Schema)?"
            )
            raise EventDecodeError(msg)
        return int.from_bytes(value[1:_HEADER], "big")

    async def prepare(self, values: Iterable[bytes | None]) -> None:
        """Fetch the writer schemas of ``values`` not cached yet.

        Raises:
            RegistryUnavailableError: the registry cannot be reached or failed (5xx).
        """
        wanted: set[int] = set()
        for value in values:
            try:
                sid = self.schema_id(value)
            except EventDecodeError:
                continue  # decode() names the problem
            if sid not in self._schemas and sid not in self._unknown:
                wanted.add(sid)
        for sid in sorted(wanted):
            await self._fetch_once(sid)

    async def _fetch_once(self, sid: int) -> None:
        while sid not in self._schemas and sid not in self._unknown:
            running = self._fetching.get(sid)
            if running is not None:  # another batch's fetch of this id: share its answer
                await asyncio.shield(running)  # its outage raises here too
                continue  # fetched; or its fetcher was cancelled: fetch here then
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._fetching[sid] = done
            try:
                await self._fetch(sid)
                done.set_result(None)
            except asyncio.CancelledError:
                done.set_result(None)  # the waiters fetch for themselves
                raise
            except BaseException as e:
                done.set_exception(e)
                done.exception()  # retrieved: a fetch nobody shared logs nothing
                raise
            finally:
                del self._fetching[sid]

    async def _fetch(self, sid: int) -> None:
        self.fetches += 1
        response = await self.http.request("GET", f"/schemas/ids/{sid}")
        if response.status_code != 200:
            if len(self._unknown) >= _MAX_UNKNOWN:  # random ids in a topic: bounded memory
                self._unknown.clear()
            self._unknown[sid] = f"{response.status_code} {response.text[:300]}"
            return
        try:
            body = response.json()
            schema = self.parse(body)
        except Exception as e:  # noqa: BLE001 - a schema this decoder cannot use: its records are dead letters
            self._unknown[sid] = f"unusable schema: {type(e).__name__}: {e}"
            return
        self._schemas[sid] = schema

    def parse(self, body: dict[str, Any]) -> Any:
        """The usable form of a ``GET /schemas/ids/{id}`` answer (raises when unusable)."""
        import fastavro

        return fastavro.parse_schema(json.loads(body["schema"]))

    def decode(self, value: bytes | None) -> Any:
        """The datum of a framed value (its schema fetched by :meth:`prepare` first).

        Raises:
            EventDecodeError: naming the problem (header, unknown id, a body that does not fit).
        """
        sid = self.schema_id(value)
        assert value is not None
        schema = self._schemas.get(sid)
        if schema is None:
            why = self._unknown.get(sid, "not fetched")
            msg = f"schema id {sid} is not in the registry at {self.registry_url} ({why})"
            raise EventDecodeError(msg)
        return self.decode_body(sid, schema, value)

    def decode_body(self, sid: int, schema: Any, value: bytes) -> Any:
        raise NotImplementedError

    def json_value(self, value: bytes | None) -> bytes:
        """The record's value as the JSON a pipeline's ``data`` then holds (raises as
        :meth:`decode`; TypeError: a datum JSON cannot hold)."""
        return avro_to_json(self.decode(value))

    async def aclose(self) -> None:
        await self.http.aclose()


class AvroWireDecoder(WireDecoder):
    """Decode Confluent-framed Avro values with writer schemas from a registry.

    Example:
        >>> AvroWireDecoder("http://127.0.0.1:8081").schema_id(b"\\x00\\x00\\x00\\x00\\x07\\x02")
        7
    """

    def decode_body(self, sid: int, schema: Any, value: bytes) -> Any:
        import fastavro

        body = io.BytesIO(value)
        body.seek(_HEADER)
        try:
            datum = fastavro.schemaless_reader(body, schema, None)
        except Exception as e:  # EOFError, struct errors, bad unicode: a broken body
            msg = f"the Avro body does not match schema id {sid}: {type(e).__name__}: {e}"
            raise EventDecodeError(msg) from e
        if body.tell() != len(value):
            msg = (
                f"the Avro body of schema id {sid} ends after {body.tell()} of "
                f"{len(value)} bytes; the rest is not a datum of that schema"
            )
            raise EventDecodeError(msg)
        return datum


def avro_to_json(datum: Any) -> bytes:
    """A decoded datum as JSON (bytes and fixed as base64, decimals as strings, times in
    RFC 3339), what a pipeline's ``data`` then holds.

    Example:
        >>> avro_to_json({"a": b"\\x01", "n": 2})
        b'{"a":"AQ==","n":2}'
    """
    import orjson

    def default(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray)):
            return base64.b64encode(value).decode()
        if isinstance(value, Decimal):
            return str(value)
        raise TypeError(type(value).__name__)

    return orjson.dumps(datum, default=default)
