"""The ``enrich`` step: each event's answer from an HTTP endpoint or a Redis hash, merged
into the event at ``into`` (EventBridge Pipes' enrichment; Redpanda Connect's ``branch`` with
a ``cached`` lookup).

How it runs: the step is ``blocking`` (as the ``model`` step, it waits on another service),
so a replica runs its batches on worker threads. Its I/O runs on one event loop of its own,
in a thread the step starts: :meth:`EnrichStep.process` hands the batch's calls to that loop
and waits. Everything shared lives on that loop, without locks: the connection pool, the
answer cache and its in-flight calls (concurrent misses of one key, from any batch, make one
call), the concurrency limit and the token bucket.

Per event: the request (the URL's placeholders and the body, or the Redis key) and the cache
key are evaluated; a fresh cached answer is used, else the target is called (``batch: true``:
one call per batch of misses), retried ``call_retries`` times with the project's backoff when
another try may help (a timeout, no connection, 408, 429, 5xx). Then:

- an answer: merged at ``into``; an empty one (no body, null, ``{}``, ``[]``, a missing hash)
  drops the event, counted as filtered, when ``drop_on_empty``;
- a failure: ``on_failure`` says: ``fail`` (the event fails in the step, dead-lettered with
  the status and reason once the pipeline's retries are spent), ``skip`` (it goes on as it
  came) or ``default`` (``default`` merged).

An event whose request cannot be evaluated (a missing field in the key) fails in the step.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import orjson

from eventbus import cel
from eventbus._internal.backoff import Backoff
from eventbus.errors import ConfigError
from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.eventing.sinks._http_exchange import safe_url
from eventbus.pipelines._activation import activation_builder
from eventbus.pipelines._step import Step, StepContext, StepResult
from eventbus.pipelines.steps._enrich_cache import AnswerCache, StepLoop, TokenBucket
from eventbus.pipelines.steps._enrich_config import EnrichConfig, expressions, url_parts
from eventbus.pipelines.steps._enrich_targets import EnrichCallError, HttpTarget, RedisTarget
from eventbus.pipelines.steps._values import compile_cel, json_value, set_path
from eventbus.registry import steps

__all__ = ["EnrichCallError", "EnrichStep"]

_MISS = object()
#: the figures of :meth:`EnrichStep.stats`
COUNTERS = (
    "calls",
    "cache_hits",
    "cache_misses",
    "coalesced",
    "failures",
    "retries",
    "rate_limited_waits",
    "skipped",
    "defaulted",
    "dropped_empty",
)


def _is_empty(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, (dict, list)) and not value)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return orjson.dumps(json_value(value), option=orjson.OPT_SORT_KEYS).decode()


def _hashable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return orjson.dumps(json_value(value), option=orjson.OPT_SORT_KEYS)


class EnrichStep(Step):
    """Runtime of an ``enrich`` step (see the module docstring).

    Args:
        step_id: the step id.
        config: its configuration.
        redis_url: the stack's Redis (a ``redis`` target without its own ``url`` reads it).
        clock: the cache's and the rate limit's clock (tests pass a manual one).
    """

    kind = "enrich"
    blocking = True

    def __init__(
        self,
        step_id: str,
        config: EnrichConfig,
        redis_url: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(step_id)
        self.config = config
        programs: list[cel.Program] = []

        def compiled(source: str) -> Any:
            program = compile_cel(source)
            programs.append(program)
            return program.evaluate

        self._url: list[tuple[bool, Any]] = []
        self._body: Any = None
        self._key: Any = None
        self.target: HttpTarget | RedisTarget
        if config.http is not None:
            self._url = [(c, compiled(t) if c else t) for c, t in url_parts(config.http.url)]
            body = config.http.body_source()
            self._body = compiled(body) if body is not None else None
            self.target = HttpTarget(
                config.http,
                timeout_s=config.timeout_s,
                max_bytes=config.max_answer_bytes,
                max_concurrency=config.max_concurrency,
            )
            self._batch = config.http.batch
            self._max_batch = config.http.max_batch
        else:
            assert config.redis is not None
            self._key = compiled(config.redis.key)
            url = config.redis.url or redis_url
            if url is None:
                msg = (
                    f"step {step_id!r}: enrich redis reads the stack's Redis, and this run has "
                    "none (eventbus test runs in process): give redis.url, or run it on the stack"
                )
                raise ConfigError(msg)
            self.target = RedisTarget(
                config.redis, url, timeout_s=config.timeout_s, max_bytes=config.max_answer_bytes
            )
            self._batch = config.redis.batch
            self._max_batch = 1000
        cache = config.cache
        self._cache_key = compiled(cache.key) if cache is not None and cache.key else None
        self._build = activation_builder(frozenset().union(*(p.variables for p in programs)))
        self._into = config.into.split(".")[1:]
        self._backoff = Backoff(
            config.backoff.initial_ms / 1000, config.backoff.max_ms / 1000, config.backoff.jitter
        )
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.cache = (
            AnswerCache(cache.ttl_s, cache.max_entries, clock) if cache is not None else None
        )
        self._bucket = (
            TokenBucket(config.max_rate, config.burst or max(1, int(config.max_rate)), clock)
            if config.max_rate is not None
            else None
        )
        self._io: StepLoop | None = None
        self._io_lock = threading.Lock()
        self._started: asyncio.Future[None] | None = None
        self._semaphore: asyncio.Semaphore | None = None

    # -- per batch ----------------------------------------------------------------------------
    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        if not events:
            return []
        with self._io_lock:
            if self._io is None:
                self._io = StepLoop(f"eventbus-enrich-{self.id}")
        return self._io.run(self._process(events))

    def close(self) -> None:
        """Close the connections and end the step's loop thread (tests, benchmarks)."""
        with self._io_lock:
            io, self._io = self._io, None
        if io is not None:
            io.run(self.target.close())
            io.stop()

    async def _process(self, events: list[CloudEvent]) -> list[StepResult]:
        await self._start()
        results: list[StepResult] = [None] * len(events)
        requests: dict[int, tuple[Any, Any]] = {}
        for i, e in enumerate(events):
            try:
                requests[i] = self._request(e)
            except (cel.CELError, ValueError, TypeError) as exc:
                self.errors += 1
                message = f"the request of event {e.attributes.get('id')!r} cannot be made: {exc}"
                results[i] = Failure(self.id, "EnrichInputError", message)
        answers = await self._answers(requests)
        for i, answer in answers.items():
            results[i] = self._settle(events[i], answer)
        return results

    async def _start(self) -> None:
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            self._semaphore = asyncio.Semaphore(self.config.max_concurrency)
            try:
                await self.target.start()
                self._started.set_result(None)
            except BaseException as exc:
                self._started.set_exception(exc)
                self._started.exception()
                self._started = None
                raise
        await self._started

    def _request(self, e: CloudEvent) -> tuple[Any, Any]:
        """The event's request for the target and its cache key."""
        act = self._build(e)
        if self._key is not None:
            key = self._key(act)
            if not isinstance(key, (str, int)) or isinstance(key, bool) or key == "":
                msg = f"the redis key expression gave {key!r}; it must give a non-empty string"
                raise ValueError(msg)
            request: Any = str(key)
        else:
            url = "".join(
                quote(_text(part(act)), safe="") if is_cel else part for is_cel, part in self._url
            )
            body = orjson.dumps(json_value(self._body(act))) if self._body is not None else None
            request = (url, body)
        cache_key = _hashable(self._cache_key(act)) if self._cache_key is not None else request
        return request, cache_key

    async def _answers(self, requests: dict[int, tuple[Any, Any]]) -> dict[int, Any]:
        """Each event's answer (or its EnrichCallError): cached, awaited from a call in
        flight, or called (one call per distinct key of the batch)."""
        cache = self.cache
        waits: dict[int, Any] = {}
        todo: list[tuple[Any, Any]] = []
        local: dict[Any, asyncio.Future[Any]] = {}
        for i, (request, key) in requests.items():
            if cache is not None:
                value = cache.get(key, _MISS)
                if value is not _MISS:
                    self.counters["cache_hits"] += 1
                    waits[i] = value
                    continue
                flight = local.get(key) or cache.flight(key)
                if flight is not None:
                    self.counters["coalesced"] += 1
                    waits[i] = flight
                    continue
                local[key] = cache.start(key)
                self.counters["cache_misses"] += 1
            else:
                local[(i,)] = asyncio.get_running_loop().create_future()
                key = (i,)
            waits[i] = local[key]
            todo.append((key, request))
        size = self._max_batch if self._batch else 1
        chunks = [todo[k : k + size] for k in range(0, len(todo), size)]
        await asyncio.gather(*(self._fetch(chunk, local) for chunk in chunks))
        out: dict[int, Any] = {}
        for i, wait in waits.items():
            if isinstance(wait, asyncio.Future):
                try:
                    out[i] = await asyncio.shield(wait)
                except EnrichCallError as exc:
                    out[i] = exc
            else:
                out[i] = wait
        return out

    async def _fetch(
        self, chunk: list[tuple[Any, Any]], futures: dict[Any, asyncio.Future[Any]]
    ) -> None:
        """Call the target for a chunk of keys; settle their futures (and the cache)."""
        try:
            if self._batch:
                answers = await self._call(self.target.call_many, [r for _, r in chunk])
            else:
                answers = [await self._call(self.target.call, chunk[0][1])]
            settled: list[tuple[Any, Any, EnrichCallError | None]] = [
                (key, None, a) if isinstance(a, EnrichCallError) else (key, a, None)
                for (key, _), a in zip(chunk, answers, strict=True)
            ]
        except EnrichCallError as exc:
            settled = [(key, None, exc) for key, _ in chunk]
        except Exception as exc:  # noqa: BLE001 - a bug or the unexpected: fail these events
            unexpected = EnrichCallError(f"{type(exc).__name__}: {exc}", "EnrichError")
            settled = [(key, None, unexpected) for key, _ in chunk]
        for key, value, error in settled:
            if self.cache is not None:
                self.cache.finish(key, value, error)  # errors are not cached
            fut = futures[key]
            if not fut.done():
                if error is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(error)
                    fut.exception()

    async def _call(self, fn: Any, arg: Any) -> Any:
        """``fn(arg)`` within the rate and concurrency limits, retried per the backoff."""
        attempt = 0
        while True:
            attempt += 1
            if self._bucket is not None and await self._bucket.acquire():
                self.counters["rate_limited_waits"] += 1
            assert self._semaphore is not None
            try:
                async with self._semaphore:
                    self.counters["calls"] += 1
                    return await fn(arg)
            except EnrichCallError as exc:
                if not exc.retryable or attempt > self.config.call_retries:
                    self.counters["failures"] += 1
                    raise
            self.counters["retries"] += 1
            await asyncio.sleep(self._backoff.delay(attempt))

    # -- one event's outcome ------------------------------------------------------------------
    def _settle(self, e: CloudEvent, answer: Any) -> StepResult:
        if isinstance(answer, EnrichCallError):
            policy = self.config.on_failure
            if policy == "skip":
                self.counters["skipped"] += 1
                return e
            if policy == "fail":
                self.errors += 1
                return Failure(self.id, answer.error_type, answer.message)
            self.counters["defaulted"] += 1
            answer = self.config.default
        elif self.config.drop_on_empty and _is_empty(answer):
            self.counters["dropped_empty"] += 1
            return None
        try:
            return self._merge(e, answer)
        except ValueError as exc:
            self.errors += 1
            return Failure(
                self.id, "EnrichMergeError", f"merging the answer at {self.config.into}: {exc}"
            )

    def _merge(self, e: CloudEvent, answer: Any) -> CloudEvent:
        data = answer if not self._into else set_path(e.data, self._into, answer, set(), e)
        attrs = e.attributes
        if "datacontenttype" not in attrs and data is not None:
            attrs = {**attrs, "datacontenttype": "application/json"}
        return CloudEvent(attrs, data)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        if self.cache is not None:
            out["cache_size"] = len(self.cache)
        return out


def _describe(raw: Any) -> str:
    """The dashboard's short label of an enrich step: its target and where the answer goes."""
    if not isinstance(raw, dict):
        return ""
    into = f" -> {raw['into']}" if raw.get("into") else ""
    http, redis = raw.get("http"), raw.get("redis")
    if isinstance(http, dict):
        return f"{http.get('method', 'GET')} {safe_url(str(http.get('url') or ''))}{into}"[:160]
    if isinstance(redis, dict):
        return f"redis {redis.get('key', '')}{into}"[:160]
    return into.strip()


@steps.register(
    "enrich",
    config=EnrichConfig,
    description="Merge each event's answer from an HTTP endpoint or a Redis hash (cached, rate limited).",
    expressions=expressions,
    describe=_describe,
    example={
        "http": {"url": "http://127.0.0.1:9/customers/{data.id}"},
        "into": "data.customer",
        "cache": {"key": "data.id", "ttl_s": 60},
        "call_retries": 0,
        "on_failure": "default",
        "default": {},
    },
)
def build_enrich(step_id: str, config: EnrichConfig, context: StepContext) -> EnrichStep:
    """An enrich step (a ``redis`` target without ``url`` reads the stack's Redis)."""
    return EnrichStep(step_id, config, redis_url=context.redis_url)
