"""The HTTP sink: events POSTed to a subscriber URL (CloudEvents HTTP binding).

Each answer settles its events: 2xx acknowledges; 408, 429, 5xx, connection errors and
timeouts leave them pending (sent again by the source after its backoff or the subscriber's
``Retry-After``); any other status (3xx: redirects are not followed, 4xx) refuses them for
good, and the source dead-letters their inputs with ``ebhttpstatus`` and ``ebhttpbody`` (the
first bytes of the answer). A send with anything pending or refused raises
:class:`~eventbus.eventing.sinks.SinkPartialError` naming which.

With ``reply: true``, a 2xx answer that is a CloudEvent (binary ``ce-`` headers, or
structured ``application/cloudevents+json``) is kept as the event's reply: the source takes it
(:meth:`HttpSink.take_replies`) and sends it on to the next sink of the route.

Requests share one connection pool (``httpx.AsyncClient``); at most ``max_concurrency`` are
in flight and ``max_rate`` events/s start. Events with the same key go one after another.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from eventbus.eventing._codecs import KafkaRecord
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._http_codec import (
    decode_http,
    encode_http_batch,
    encode_http_binary,
    encode_http_structured,
)
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._routing import as_event
from eventbus.eventing._standard_webhooks import message_id
from eventbus.eventing.sinks._base import Sink, SinkEncodeError, SinkPartialError
from eventbus.eventing.sinks._http_auth import HttpAuth, open_client, resolve_auth, stored_secret
from eventbus.eventing.sinks._http_config import HttpSinkConfig
from eventbus.eventing.sinks._http_exchange import (
    BODY_ATTRIBUTE_BYTES,
    MAX_ANSWER_BYTES,
    RETRYABLE,
    Answer,
    ReplyError,
    Request,
    parse_retry_after,
    safe_url,
)
from eventbus.registry import sinks

__all__ = ["HttpSink", "ReplyError", "safe_url"]

log = logging.getLogger(__name__)

#: How often a sink whose auth secret is stored on the stack re-reads it (a rotation takes
#: effect within this long plus the resolver's cache, without a restart).
_ROTATE_S = 2.0


class HttpSink(Sink):
    """POSTs events to a subscriber URL; see the module docstring for what answers mean.

    Args:
        config: the sink configuration.

    Example:
        >>> sink = HttpSink(HttpSinkConfig(url="http://127.0.0.1:8080/hook"))
        >>> # await sink.start(); await sink.send([(event, None)]); await sink.stop()
    """

    def __init__(self, config: HttpSinkConfig) -> None:
        self.config = config
        self.target = f"http sink {safe_url(config.url)}"
        self._client: Any = None
        self._auth = HttpAuth()
        self._semaphore: asyncio.Semaphore | None = None
        self._next_start = 0.0  # the rate limit: when the next event may go
        # reply: true: per item sent (by identity), the subscriber's reply, until taken
        self._replies: dict[int, CloudEvent | ReplyError] = {}
        #: the auth secret is stored on the stack ({secret: NAME}): re-read every _ROTATE_S
        self._stored_auth = stored_secret(config.auth)
        self._auth_at = 0.0

    async def start(self) -> None:
        """Resolve the auth secret and open the connection pool (idempotent).

        Raises:
            ConfigError: the auth secret's reference cannot be resolved (the message names the
                reference, never the value).
        """
        if self._client is not None:
            return
        self._resolve_auth()
        n = self.config.max_concurrency
        self._semaphore = asyncio.Semaphore(n)
        self._client = open_client(n, self.config.timeout_s, self.config.verify_tls)

    def _resolve_auth(self) -> None:
        self._auth = resolve_auth(self.config.auth, self.target)
        self._auth_at = time.monotonic()

    def _rotate_auth(self) -> None:
        # a {secret: NAME} reference: the stack's secret may have been rotated (``eventbus
        # secret set``); a failure keeps the value in use (the reason logged, never a value)
        try:
            self._resolve_auth()
        except Exception as e:  # noqa: BLE001 - keep sending with the current secret
            self._auth_at = time.monotonic()
            log.warning(
                "%s: re-reading its secret failed, the current one stays: %s", self.target, e
            )

    def take_replies(self, items: Sequence[Any]) -> list[CloudEvent | ReplyError | None]:
        """With ``reply: true``: per item of earlier :meth:`send` calls (the same objects),
        the reply its subscriber answered with (a CloudEvent), the reason it was unusable
        (:class:`ReplyError`), or None (no reply, or not acknowledged); forgotten once taken."""
        return [self._replies.pop(id(item), None) for item in items]

    async def stop(self) -> None:
        """Close the connection pool (idempotent)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def send(self, items: Sequence[tuple[CloudEvent | KafkaRecord, bytes | None]]) -> None:
        """POST the events; return once the subscriber acknowledged (2xx) every one.

        Raises:
            SinkEncodeError: some events cannot be encoded; nothing was sent.
            SinkPartialError: some events were refused (3xx, 4xx other than 408/429) or not
                acknowledged (408, 429, 5xx, no answer within ``timeout_s``).
            RuntimeError: the sink was not started.
        """
        if not items:
            return
        if self._client is None:
            msg = f"{self.target} is not started; await start() first"
            raise RuntimeError(msg)
        if self._stored_auth and time.monotonic() - self._auth_at >= _ROTATE_S:
            await asyncio.to_thread(self._rotate_auth)
        lanes, failures = self._plan(items)
        if failures:
            raise SinkEncodeError(self.target, failures)
        results = await asyncio.gather(*(self._run_lane(lane) for lane in lanes))
        refused: dict[int, tuple[str, str]] = {}
        attributes: dict[int, dict[str, Any]] = {}
        pending: list[int] = []
        last: Answer | None = None
        for lane_refused, lane_pending, lane_last in results:
            for answer, indexes in lane_refused:
                body = answer.body[:BODY_ATTRIBUTE_BYTES].decode(errors="replace")
                for i in indexes:
                    refused[i] = ("HttpStatusError", f"{self.target} answered {answer.detail}")
                    attributes[i] = {"ebhttpstatus": answer.status, "ebhttpbody": body}
            pending.extend(lane_pending)
            last = lane_last or last
        if refused or pending:
            pending.sort()
            retry_after = last.retry_after_s if last is not None else None
            detail = last.detail if last is not None else "refused"
            raise SinkPartialError(self.target, refused, pending, detail, retry_after, attributes)

    def _plan(
        self, items: Sequence[tuple[CloudEvent | KafkaRecord, bytes | None]]
    ) -> tuple[list[list[Request]], dict[int, tuple[str, str]]]:
        """Encode-check every event and group the requests into lanes (sent in order)."""
        events: list[CloudEvent] = []
        encoded: list[tuple[list[tuple[str, str]], bytes] | None] = []
        failures: dict[int, tuple[str, str]] = {}
        keys: list[Any] = []
        originals: list[Any] = []
        binary = self.config.mode == "binary"
        encode = encode_http_binary if binary else encode_http_structured
        for i, (item, key) in enumerate(items):
            try:
                event = as_event(item)
                encoded.append(encode(event))  # before anything is sent
            except Exception as e:  # noqa: BLE001 - reported per item
                failures[i] = (type(e).__name__, str(e))
                event = CloudEvent({}, None)
                encoded.append(None)
            events.append(event)
            originals.append(item)
            pkey = event.attributes.get("partitionkey")
            keys.append(key if pkey is None else str(pkey))
        if self.config.mode == "batch":
            size = self.config.max_batch
            chunks = [
                list(range(s, min(s + size, len(events)))) for s in range(0, len(events), size)
            ]
            lanes = [[Request(c, [events[i] for i in c]) for c in chunks]]
        elif self.config.max_concurrency == 1:
            lanes = [[Request([i], [e], encoded[i], originals[i]) for i, e in enumerate(events)]]
        else:
            by_key: dict[Any, list[Request]] = {}
            lanes = []
            for i, (event, key) in enumerate(zip(events, keys)):
                request = Request([i], [event], encoded[i], originals[i])
                if key is None:
                    lanes.append([request])
                else:
                    by_key.setdefault(key, []).append(request)
            lanes.extend(by_key.values())
        return lanes, failures

    async def _run_lane(
        self, lane: list[Request]
    ) -> tuple[list[tuple[Answer, list[int]]], list[int], Answer | None]:
        """Send a lane's requests in order; after one that is not acknowledged, the rest of
        the lane stays pending (unsent), keeping per-key order."""
        refused: list[tuple[Answer, list[int]]] = []
        todo = list(lane)
        while todo:
            request = todo.pop(0)
            answer = await self._post(request)
            status = answer.status
            if status is not None and 200 <= status < 300:
                if answer.reply is not None and request.item is not None:
                    self._replies[id(request.item)] = answer.reply
                continue
            if status == 413 and len(request.events) > 1:  # a batch too large: halves
                half = len(request.events) // 2
                todo[:0] = [
                    Request(request.indexes[:half], request.events[:half]),
                    Request(request.indexes[half:], request.events[half:]),
                ]
                continue
            if status is None or status >= 500 or status in RETRYABLE:
                rest = [i for r in [request, *todo] for i in r.indexes]
                return refused, rest, answer
            refused.append((answer, request.indexes))
        return refused, [], None

    async def _post(self, request: Request) -> Answer:
        import httpx

        config = self.config
        events = request.events
        pairs, body = request.encoded or encode_http_batch(events)
        headers = dict(config.headers)
        headers.update(pairs)
        self._auth.add_headers(
            headers,
            "POST",
            config.url,
            body,
            lambda: message_id(f"{e.source}\x00{e.id}" for e in events),
        )
        await self._pace(len(events))
        assert self._semaphore is not None
        async with self._semaphore:
            try:
                async with asyncio.timeout(config.timeout_s):
                    return await self._exchange(headers, body)
            except TimeoutError:
                return Answer(None, f"no complete answer within timeout_s={config.timeout_s:g}")
            except httpx.TransportError as e:
                return Answer(None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)

    async def _exchange(self, headers: dict[str, str], body: bytes) -> Answer:
        client = self._client
        async with client.stream("POST", self.config.url, headers=headers, content=body) as r:
            answer = bytearray()
            status = r.status_code
            replying = self.config.reply and 200 <= status < 300
            cap = self.config.max_reply_bytes + 1 if replying else MAX_ANSWER_BYTES
            async for chunk in r.aiter_raw():
                answer += chunk
                if len(answer) >= cap:
                    break  # a huge answer: the connection is dropped, not read to the end
            detail = f"{status} {r.reason_phrase}".strip()
            if 300 <= status < 400:
                location = safe_url(r.headers.get("location", "")) or "none"
                detail += (
                    f" (redirects are not followed; set url to the final location: {location})"
                )
            raw_after = r.headers.get("retry-after")
            after = parse_retry_after(raw_after, self.config.max_retry_after_s)
            if raw_after is not None and after is None:
                detail += f" (Retry-After {raw_after[:40]!r} is malformed; the backoff applies)"
            reply = self._reply(r.headers, bytes(answer)) if replying else None
            return Answer(status, detail, bytes(answer), after, reply)

    def _reply(self, headers: Any, body: bytes) -> CloudEvent | ReplyError | None:
        """The CloudEvent a 2xx answer carries (reply: true), or None when it carries none."""
        wanted = {k.lower(): v for k, v in headers.items()}
        ctype = wanted.get("content-type", "").split(";")[0].strip().lower()
        if "ce-id" not in wanted and ctype != "application/cloudevents+json":
            return None  # an acknowledgement without a reply
        if len(body) > self.config.max_reply_bytes:
            limit = self.config.max_reply_bytes
            return ReplyError(self.target, f"larger than max_reply_bytes={limit}")
        try:
            events, _ = decode_http(
                wanted, body, default_type="eventbus.reply", default_source=self.target
            )
        except Exception as e:  # noqa: BLE001 - the event's input is dead-lettered with it
            return ReplyError(self.target, f"{type(e).__name__}: {e}")
        if len(events) != 1:
            return ReplyError(self.target, f"{len(events)} events; a reply is one event")
        return events[0]

    async def _pace(self, n: int) -> None:
        rate = self.config.max_rate
        if rate is None:
            return
        now = time.monotonic()
        start = max(now, self._next_start)
        self._next_start = start + n / rate
        if start > now:
            await asyncio.sleep(start - now)


@sinks.register(
    "http",
    config=HttpSinkConfig,
    description="POST to a subscriber URL (CloudEvents HTTP binding).",
    describe=lambda raw: safe_url(str(raw.get("url") or "")),
)
def http_sink(
    config: HttpSinkConfig,
    *,
    default_bootstrap: str,
    default_client: KafkaClientConfig | None = None,
) -> HttpSink:
    """An HTTP sink (the runtime's Kafka settings do not apply to it)."""
    return HttpSink(config)
