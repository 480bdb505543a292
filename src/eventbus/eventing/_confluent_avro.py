"""Avro in the Confluent wire format: a zero byte, the 4-byte big-endian schema id, the Avro
binary body; the writer schemas fetched from a Confluent-compatible registry and cached.

A record that cannot be decoded (another magic byte, a schema id the registry does not know,
a truncated or overlong body) raises :class:`EventDecodeError` naming why, for its
dead letter. A registry that cannot be reached raises :class:`RegistryUnavailableError`
instead: the records wait and are tried again, they are not dead-lettered for an outage.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from eventbus.errors import EventBusError, EventDecodeError

__all__ = ["AvroWireDecoder", "RegistryUnavailableError", "avro_to_json"]

_MAGIC = 0
_HEADER = 5
_MAX_UNKNOWN = 10_000  # ids remembered as unknown to the registry


class RegistryUnavailableError(EventBusError):
    """The schema registry did not answer (or answered 5xx); try again later."""


class AvroWireDecoder:
    """Decode Confluent-framed Avro values with writer schemas from a registry.

    Args:
        registry_url: the registry's base URL (``http://127.0.0.1:8080/registry``).
        headers: sent with each request (``Authorization`` for a registry that needs it).
        timeout_s: one request's limit.

    Example:
        >>> AvroWireDecoder("http://127.0.0.1:8081").schema_id(b"\\x00\\x00\\x00\\x00\\x07\\x02")
        7
    """

    def __init__(
        self, registry_url: str, *, headers: dict[str, str] | None = None, timeout_s: float = 10.0
    ) -> None:
        self.registry_url = registry_url.rstrip("/")
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self._schemas: dict[int, Any] = {}  # id -> parsed writer schema
        self._unknown: dict[int, str] = {}  # id -> why the registry has none
        self._client: Any = None

    @staticmethod
    def schema_id(value: bytes | None) -> int:
        """The schema id of a framed value.

        Raises:
            EventDecodeError: no value, too short, or not magic byte 0.
        """
        if value is None:
            raise EventDecodeError("the record has no value (a tombstone); Avro needs a body")
        if len(value) < _HEADER:
            msg = f"the value is {len(value)} bytes, shorter than the 5-byte Confluent header"
            raise EventDecodeError(msg)
        if value[0] != _MAGIC:
            msg = (
                f"magic byte {value[0]} is not the Confluent wire format's 0; was the topic "
                "written by a Confluent Avro serializer?"
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
            await self._fetch(sid)

    async def _fetch(self, sid: int) -> None:
        import fastavro
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers)
        url = f"{self.registry_url}/schemas/ids/{sid}"
        try:
            response = await self._client.get(url)
        except httpx.HTTPError as e:
            msg = f"the schema registry at {self.registry_url} did not answer ({e}); retrying"
            raise RegistryUnavailableError(msg) from e
        if response.status_code >= 500 or response.status_code in (401, 403, 429):
            msg = (
                f"the schema registry at {self.registry_url} answered {response.status_code} "
                f"for schema id {sid}: {response.text[:300]}"
            )
            raise RegistryUnavailableError(msg)
        if response.status_code != 200:
            if len(self._unknown) >= _MAX_UNKNOWN:  # random ids in a topic: bounded memory
                self._unknown.clear()
            self._unknown[sid] = f"{response.status_code} {response.text[:300]}"
            return
        try:
            body = response.json()
            schema = fastavro.parse_schema(json.loads(body["schema"]))
        except Exception as e:  # noqa: BLE001 - a schema this decoder cannot use: its records are dead letters
            self._unknown[sid] = f"unusable schema: {type(e).__name__}: {e}"
            return
        self._schemas[sid] = schema

    def decode(self, value: bytes | None) -> Any:
        """The Avro datum of a framed value (its schema fetched by :meth:`prepare` first).

        Raises:
            EventDecodeError: naming the problem (header, unknown id, truncated, overlong).
        """
        import fastavro

        sid = self.schema_id(value)
        assert value is not None
        schema = self._schemas.get(sid)
        if schema is None:
            why = self._unknown.get(sid, "not fetched")
            msg = f"schema id {sid} is not in the registry at {self.registry_url} ({why})"
            raise EventDecodeError(msg)
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

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


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
