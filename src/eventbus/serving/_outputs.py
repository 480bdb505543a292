"""Where a pipeline's outputs go at run time: its sinks built from the config (the single
``sink`` or the routed named ``sinks``, and the dead-letter sink), and the steps' timers
(join and aggregate windows closing), whose outputs go out the same way as the sources'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._outcome import Failure, Outcome
from eventbus.eventing.sources._kafka_settings import DeliveryPolicy
from eventbus.pipelines._config import PipelineConfig, SinkConfig
from eventbus.pipelines._step import Fired, Timer

__all__ = ["delivery_policy", "make_sink", "send_deduped", "source_sinks", "sweep_forever"]

log = logging.getLogger("eventbus.serving.sources")

#: Runs a timer's outputs through the steps after the timer's step (see :func:`sweep_forever`).
Follow = Callable[[int, list[CloudEvent]], Awaitable[list[Outcome]]]


def delivery_policy(config: PipelineConfig, redis_url: str | None) -> DeliveryPolicy:
    """The delivery policy (event retries, dedupe, backoff) of a pipeline's Kafka sources.

    Raises:
        ValueError: dedupe is configured but no Redis is known.
    """
    from eventbus.eventing._delivery import RedisDeduper, RetryPolicy

    spec = config.spec
    dedupe = None
    if spec.delivery.dedupe is not None:
        if not redis_url:
            msg = f"pipeline {config.name!r} sets delivery.dedupe but the runtime has no Redis; start EventBus with a Redis URL"
            raise ValueError(msg)
        dedupe = RedisDeduper(redis_url, config.name, spec.delivery.dedupe.window_s)
    d = spec.delivery
    # The pipeline's backoff paces retried dispatches and sends too, and its retries bound the
    # tries of a batch whose dispatch raises deterministically (then its poison is isolated
    # and dead-lettered). Infrastructure failures stop after DeliveryPolicy.give_up_s.
    return DeliveryPolicy(
        retry=RetryPolicy.from_config(spec),
        dedupe=dedupe,
        retry_initial_s=d.backoff.initial_ms / 1000,
        retry_max_s=d.backoff.max_ms / 1000,
        retry_jitter=d.backoff.jitter,
        dispatch_retries=d.retries,
        exactly_once=d.guarantee == "exactly_once",
        commit_interval_s=d.commit_interval() / 1000,
    )


async def sweep_forever(
    timers: list[Timer],
    config: PipelineConfig,
    bootstrap: str,
    redis_url: str | None = None,
    every_s: float = 1.0,
    kafka_client: KafkaClientConfig | None = None,
    follow: Follow | None = None,
) -> None:
    """Fire the steps' timers until cancelled, each every its own ``interval_s`` (at most
    ``every_s``), delivering what they return (routed, and through the pipeline's dedupe when
    it has one, like the sources' outputs).

    ``follow(step_index, events)`` runs a timer's outputs through the steps after the
    timer's step (one outcome per event): what they emit goes to the sinks, what fails to
    the dead-letter sink; it is called when the timer's step is the last too (no step runs
    then), so that the runner counts what the timer emitted and what the pipeline delivered.
    Without it the outputs go to the sinks as they are.
    """
    dedupe = delivery_policy(config, redis_url).dedupe if redis_url else None
    sinks = source_sinks(
        config,
        lambda cfg: make_sink(cfg, default_bootstrap=bootstrap, default_client=kafka_client),
    )
    outs = sinks.routing.sinks if sinks.routing is not None else {None: sinks.sink}
    dlq = sinks.dead_letter

    async def deliver(timer: Timer, fired: Fired) -> None:
        outputs, dead = list(fired.outputs), list(fired.dead)
        if outputs and follow is not None:
            outputs, failed = _followed(
                config.name, outputs, await follow(timer.step_index, outputs)
            )
            dead += failed
        shares: dict[str | None, list[CloudEvent]] = {None: outputs}
        if sinks.routing is not None:  # a step's timer's outputs are routed too
            plan = sinks.routing.plan(outputs)
            shares = {n: [outputs[i] for i, _ in v] for n, v in plan.by_sink.items()}
            dead += [
                e.replace(ebpipeline=config.name, ebstep=err.route, eberror=str(err))
                for i, err in plan.errors.items()
                for e in (outputs[i],)
            ]
            if plan.unrouted:
                log.info(
                    "pipeline %r: %d timer outputs matched no route (no default route)",
                    config.name,
                    len(plan.unrouted),
                )
        for name, share in shares.items():
            await send_deduped(outs[name], name, share, dedupe)
        if dead:
            if dlq is not None:
                await dlq.send([(e, None) for e in dead])
            else:
                log.error(
                    "pipeline %r: %d events of a step's timer dead-lettered and no dead_letter sink is configured",
                    config.name,
                    len(dead),
                )
        await asyncio.to_thread(timer.ack, fired)

    for sink in outs.values():
        await sink.start()
    if dlq is not None:
        await dlq.start()
    woken, asked = _wakes(timers)
    try:
        # each timer every its own interval_s (an aggregate's 0.5 s, others' 1 s), and at
        # once when it asks (Timer.wake_with), at most every interval_s / 10; a timer that
        # stopped at its limit (``Fired.more``) fires again at once
        period = min([every_s, *(t.interval_s for t in timers)])
        due = [0.0] * len(timers)
        last = [0.0] * len(timers)
        while True:
            now = time.monotonic()
            soonest = min((last[k] + timers[k].interval_s / 10 for k in asked), default=None)
            wait = period if soonest is None else min(period, max(0.0, soonest - now))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), wait)
            woken.clear()
            for k, timer in enumerate(timers):
                now = time.monotonic()
                early = k in asked and now >= last[k] + timer.interval_s / 10
                if now < due[k] and not early:
                    continue
                asked.discard(k)
                due[k] = now + timer.interval_s - period / 2
                last[k] = now
                try:
                    while True:
                        fired = await asyncio.to_thread(timer.fire)
                        if fired is None:
                            break
                        await deliver(timer, fired)
                        if not fired.more:
                            break
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - the claims' leases expire: retried later
                    log.warning("pipeline %r: a step's timer failed: %s", config.name, e)
    finally:
        for sink in outs.values():
            await sink.stop()
        if dlq is not None:
            await dlq.stop()
        if dedupe is not None:
            await dedupe.close()


def _wakes(timers: list[Timer]) -> tuple[asyncio.Event, set[int]]:
    """Give each timer a wake (:meth:`Timer.wake_with`), callable from any thread: it adds
    the timer's index to the returned set and sets the event, on this loop."""
    loop = asyncio.get_running_loop()
    woken, asked = asyncio.Event(), set()

    def waker(k: int) -> Callable[[], None]:
        def note() -> None:
            asked.add(k)
            woken.set()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the replica stopped
                loop.call_soon_threadsafe(note)

        return wake

    for k, timer in enumerate(timers):
        timer.wake_with(waker(k))
    return woken, asked


def _followed(
    pipeline: str, fired: list[CloudEvent], outcomes: list[Outcome]
) -> tuple[list[CloudEvent], list[CloudEvent]]:
    """The later steps' outputs of a timer's events, and its events they failed (as dead
    letters with the ``eb*`` attributes of the failure)."""
    outputs: list[CloudEvent] = []
    dead: list[CloudEvent] = []
    for e, outcome in zip(fired, outcomes, strict=True):
        if isinstance(outcome, Failure):
            dead.append(
                e.replace(
                    ebpipeline=pipeline,
                    ebstep=outcome.step,
                    eberrortype=outcome.error_type,
                    eberror=outcome.message,
                    ebattempts=outcome.attempts,
                )
            )
        else:
            outputs.extend(outcome)
    return outputs, dead


async def send_deduped(sink: Any, name: str | None, outputs: list[Any], dedupe: Any) -> int:
    """Send outputs (events, or ``(event, key)`` pairs) to one sink, through the pipeline's
    dedupe when it has one (keys of a named sink carry its name, as the sources' do); return
    how many were skipped as delivered already."""
    from eventbus.eventing._delivery import dedupe_key

    if not outputs:
        return 0
    pairs = [o if isinstance(o, tuple) else (o, None) for o in outputs]
    digests: list[str | None] = []
    skipped = 0
    if dedupe is not None:
        raw = [dedupe_key(e) for e, _ in pairs]
        if name is not None:
            raw = [None if k is None else f"{name}\x00{k}" for k in raw]
        digests = dedupe.digests(raw)
        seen = await dedupe.claim(digests, sink)
        skipped = sum(seen)
        pairs = [e for e, s in zip(pairs, seen) if not s]
        digests = [d for d, s in zip(digests, seen) if not s]
    if pairs:
        await sink.send(pairs)
        if dedupe is not None:
            await dedupe.mark(digests, hashed=True)
        take = getattr(sink, "take_replies", None)
        replies = take([e for e, _ in pairs]) if take is not None else []
        if any(r is not None for r in replies):
            log.warning(
                "sink %r: %d replies to events of a step's timer or a replay are not sent on "
                "(replies continue from the sources' deliveries only)",
                name,
                sum(r is not None for r in replies),
            )
    return skipped


def source_sinks(config: PipelineConfig, make: Callable[[SinkConfig], Any]) -> Any:
    """A Kafka source's sinks (a new set per source: each source owns their lifecycle): the
    single sink or the routed named sinks, and the dead-letter sink."""
    from eventbus.eventing.sources._kafka_settings import SourceSinks
    from eventbus.pipelines._routes import build_routing

    spec = config.spec
    routing = build_routing(config, make)
    if routing is not None:
        sink = next(iter(routing.sinks.values()))
    else:
        assert spec.sink is not None  # validated: sink or sinks
        sink = make(spec.sink)
    dead_letter = make(spec.dead_letter) if spec.dead_letter else None
    return SourceSinks(sink=sink, dead_letter=dead_letter, routing=routing)


def make_sink(
    config: SinkConfig, *, default_bootstrap: str, default_client: KafkaClientConfig | None = None
) -> Any:
    """Build the runtime sink of a sink config (its kind's factory).

    ``default_client`` (the stack's Kafka TLS/SASL settings) goes to factories that take a
    ``default_client`` argument (the kafka sink's); factories written before it existed
    (``(config, *, default_bootstrap)``) keep working.
    """
    import inspect

    from eventbus.registry import sinks

    factory = sinks.get(config.kind).factory
    if "default_client" in inspect.signature(factory).parameters:
        return factory(
            config.options, default_bootstrap=default_bootstrap, default_client=default_client
        )
    return factory(config.options, default_bootstrap=default_bootstrap)
