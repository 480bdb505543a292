"""What the ``enrich`` step calls: an HTTP endpoint (the HTTP sink's auth and TLS settings) or
a Redis hash. Each target answers :meth:`call` (one request) and :meth:`call_many` (a batch of
them in one round trip) on the step's event loop, and raises :class:`EnrichCallError` saying
what went wrong and whether trying again may help."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from eventbus.errors import ConfigError
from eventbus.eventing._standard_webhooks import message_id
from eventbus.eventing.sinks._http_auth import HttpAuth, open_client, resolve_auth, stored_secret
from eventbus.eventing.sinks._http_exchange import RETRYABLE, safe_url
from eventbus.pipelines.steps._enrich_config import EnrichHttpConfig, EnrichRedisConfig

__all__ = ["EnrichCallError", "HttpTarget", "RedisTarget"]

#: How often a target whose auth secret is stored on the stack re-reads it (as the HTTP sink).
_ROTATE_S = 2.0
#: Bytes of a refusing answer quoted in the failure's message.
_QUOTED = 200


class EnrichCallError(Exception):
    """A call of the target failed.

    Args:
        message: what happened, naming the target.
        error_type: the failure's type in the dead letter (``EnrichHttpError``...).
        status: the HTTP status, when one came.
        retryable: a timeout, no connection, 408, 429 or 5xx: another try may succeed.
    """

    def __init__(
        self, message: str, error_type: str, status: int | None = None, retryable: bool = False
    ) -> None:
        super().__init__(message, error_type, status, retryable)
        self.message = message
        self.error_type = error_type
        self.status = status
        self.retryable = retryable

    def __str__(self) -> str:
        return self.message


def parse_answer(body: bytes, where: str) -> Any:
    """A JSON answer (an empty body: None)."""
    if not body.strip():
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        start = body[:80].decode(errors="replace")
        msg = f"{where} answered something that is not JSON ({e}); it starts {start!r}"
        raise EnrichCallError(msg, "EnrichAnswerError") from None


class HttpTarget:
    """An HTTP endpoint: one request per call (``call``), or one POST of a JSON array per batch
    (``call_many``)."""

    def __init__(
        self, config: EnrichHttpConfig, *, timeout_s: float, max_bytes: int, max_concurrency: int
    ) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_concurrency = max_concurrency
        self.where = f"enrich endpoint {safe_url(config.url)}"
        self._client: Any = None
        self._auth = HttpAuth()
        self._stored = stored_secret(config.auth)
        self._auth_at = 0.0

    async def start(self) -> None:
        """Resolve the auth secret and open the connection pool.

        Raises:
            ConfigError: a secret reference does not resolve (named, never its value).
        """
        await asyncio.to_thread(self._resolve_auth)
        self._client = open_client(self.max_concurrency, self.timeout_s, self.config.verify_tls)

    def _resolve_auth(self) -> None:
        self._auth = resolve_auth(self.config.auth, self.where)
        self._auth_at = time.monotonic()

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def call(self, request: tuple[str, bytes | None]) -> Any:
        """The answer to one request (URL, JSON body or None)."""
        url, body = request
        return parse_answer(await self._exchange(self.config.method, url, body), self.where)

    async def call_many(self, requests: list[tuple[str, bytes | None]]) -> list[Any]:
        """One POST of the bodies as a JSON array; the answer is as many answers, in order."""
        body = b"[" + b",".join(b if b is not None else b"null" for _, b in requests) + b"]"
        answer = parse_answer(await self._exchange("POST", self.config.url, body), self.where)
        if not isinstance(answer, list) or len(answer) != len(requests):
            got = f"a list of {len(answer)}" if isinstance(answer, list) else type(answer).__name__
            msg = (
                f"{self.where} (batch: true) answered {got} for {len(requests)} requests; a batch "
                "endpoint answers a JSON array with one answer per request, in order"
            )
            raise EnrichCallError(msg, "EnrichAnswerError")
        return answer

    async def _exchange(self, method: str, url: str, body: bytes | None) -> bytes:
        import httpx

        if self._stored and time.monotonic() - self._auth_at >= _ROTATE_S:
            try:
                await asyncio.to_thread(self._resolve_auth)
            except ConfigError:
                self._auth_at = time.monotonic()  # keep the secret in use
        headers = dict(self.config.headers)
        headers["accept"] = "application/json"
        if body is not None:
            headers["content-type"] = "application/json"
        self._auth.add_headers(
            headers,
            method,
            url,
            body or b"",
            lambda: message_id([method, url, (body or b"").decode(errors="replace")]),
        )
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._read(method, url, headers, body)
        except TimeoutError:
            msg = f"{self.where}: no complete answer within timeout_s={self.timeout_s:g}"
            raise EnrichCallError(msg, "EnrichTimeout", retryable=True) from None
        except httpx.TransportError as e:
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            msg = f"{self.where}: {detail}"
            raise EnrichCallError(msg, "EnrichConnectError", retryable=True) from None

    async def _read(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None
    ) -> bytes:
        assert self._client is not None, "start() the target first"
        async with self._client.stream(method, url, headers=headers, content=body) as r:
            status = r.status_code
            length = r.headers.get("content-length", "")
            too_big = (
                f"{self.where} answered more than max_answer_bytes={self.max_bytes} bytes; "
                "raise max_answer_bytes or make the endpoint answer less"
            )
            if length.isdigit() and int(length) > self.max_bytes and 200 <= status < 300:
                raise EnrichCallError(too_big, "EnrichAnswerTooLarge", status)
            answer = bytearray()
            async for chunk in r.aiter_bytes():
                answer += chunk
                if len(answer) > self.max_bytes:
                    if 200 <= status < 300:
                        raise EnrichCallError(too_big, "EnrichAnswerTooLarge", status)
                    break  # a refusal's body: only its start is quoted
            if 200 <= status < 300:
                return bytes(answer)
            quoted = bytes(answer[:_QUOTED]).decode(errors="replace")
            detail = f"{status} {r.reason_phrase}".strip()
            if 300 <= status < 400:
                detail += " (redirects are not followed; set url to the final location)"
            msg = f"{self.where} answered {detail}" + (f": {quoted}" if quoted else "")
            retry = status >= 500 or status in RETRYABLE
            raise EnrichCallError(msg, "EnrichHttpError", status, retry)


class RedisTarget:
    """A Redis hash per request (its key): HGETALL, or HGET of the configured field."""

    def __init__(
        self, config: EnrichRedisConfig, url: str, *, timeout_s: float, max_bytes: int
    ) -> None:
        from eventbus._internal.redis_client import redact

        self.config = config
        self.url = url
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.where = f"enrich redis {redact(url)}"
        self._redis: Any = None

    async def start(self) -> None:
        from eventbus._internal.redis_client import connect_async

        self._redis = connect_async(
            self.url,
            decode_responses=True,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
        )

    async def close(self) -> None:
        redis, self._redis = self._redis, None
        if redis is not None:
            await redis.aclose()

    async def call(self, key: str) -> Any:
        return (await self.call_many([key]))[0]

    async def call_many(self, keys: list[str]) -> list[Any]:
        """The hashes (or fields) of ``keys`` in one pipelined round trip."""
        import redis

        field = self.config.field
        try:
            async with asyncio.timeout(self.timeout_s):
                pipe = self._redis.pipeline(transaction=False)
                for key in keys:
                    if field is None:
                        pipe.hgetall(key)
                    else:
                        pipe.hget(key, field)
                replies = await pipe.execute(raise_on_error=False)
        except (TimeoutError, redis.ConnectionError, redis.TimeoutError) as e:
            msg = f"{self.where}: {type(e).__name__}: {e}" if str(e) else f"{self.where}: timed out"
            raise EnrichCallError(msg, "EnrichRedisError", retryable=True) from None
        out: list[Any] = []
        for key, reply in zip(keys, replies, strict=True):
            if isinstance(reply, Exception):  # WRONGTYPE and such: this key only
                msg = f"{self.where}: key {key!r}: {reply}"
                out.append(EnrichCallError(msg, "EnrichRedisError"))
            elif _size(reply) > self.max_bytes:
                msg = f"{self.where}: key {key!r} holds more than max_answer_bytes={self.max_bytes}; raise max_answer_bytes"
                out.append(EnrichCallError(msg, "EnrichAnswerTooLarge"))
            else:
                out.append(_field_value(reply) if isinstance(reply, str) else reply)
        return out


def _size(reply: Any) -> int:
    if isinstance(reply, str):
        return len(reply)
    return sum(len(k) + len(v) for k, v in (reply or {}).items())


def _field_value(text: str) -> Any:
    """A hash field's value: its JSON where it is JSON, else the text."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
