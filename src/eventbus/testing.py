"""Public test doubles: an in-memory source and sink, and a pipeline run in process.

For users' tests and ours: no Ray, no broker, no Redis (stateful steps keep their state in
memory). A pipeline run here goes through the same step runner the replicas use.

Example:
    >>> from eventbus import CloudEvent
    >>> from eventbus.testing import run_pipeline
    >>> result = run_pipeline('''
    ... apiVersion: eventbus/v1
    ... kind: Pipeline
    ... metadata: {name: large}
    ... spec:
    ...   sources: [{kafka: {topic: payments}}]
    ...   steps: [{id: big, filter: "data.amount > 100"}]
    ...   sink: {kafka: {topic: large}}
    ... ''', [CloudEvent.create(type="t", source="/s", data={"amount": 150}),
    ...       CloudEvent.create(type="t", source="/s", data={"amount": 5})])
    >>> [e.data for e in result.outputs], result.dropped
    ([{'amount': 150}], 1)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Dispatch, Failure, Outcome
from eventbus.eventing.sinks._base import Sink
from eventbus.eventing.sources._base import Source

__all__ = ["ListSink", "MemorySource", "PipelineResult", "passthrough", "run_pipeline"]


class ListSink(Sink):
    """A sink that keeps what it was sent, in order, in :attr:`events`.

    Args:
        fail_times: the first ``fail_times`` calls of :meth:`send` raise ``ConnectionError``
            (nothing kept), to test retries.
    """

    def __init__(self, *, fail_times: int = 0) -> None:
        self.events: list[CloudEvent] = []
        self.keys: list[bytes | None] = []
        self.calls = 0
        self.started = self.stopped = False
        self._fail_times = fail_times

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, items: Sequence[tuple[CloudEvent, bytes | None]]) -> None:
        self.calls += 1
        if self.calls <= self._fail_times:
            msg = f"ListSink: send {self.calls} fails on purpose (fail_times={self._fail_times})"
            raise ConnectionError(msg)
        for event, key in items:
            self.events.append(event)
            self.keys.append(key)


class MemorySource(Source):
    """A source over a list of events: feeds them in batches of ``max_batch`` to ``dispatch``,
    sends outputs to ``sink`` and failures (with the error attributes a dead letter carries) to
    ``dead_letter``, and only then acknowledges the batch (:attr:`acked` counts events).

    Args:
        events: the input.
        dispatch: a batch in, one outcome per event out.
        sink: where outputs go.
        dead_letter: where failed events go (None: they are counted in ``stats()`` only).
        max_batch: most events per dispatch.
        pipeline: the name written into dead letters' ``ebpipeline``.
    """

    def __init__(
        self,
        events: Sequence[CloudEvent],
        dispatch: Dispatch,
        sink: Sink,
        *,
        dead_letter: Sink | None = None,
        max_batch: int = 500,
        pipeline: str = "memory",
    ) -> None:
        if max_batch < 1:
            msg = f"max_batch must be at least 1; got {max_batch}"
            raise ValueError(msg)
        self._events = list(events)
        self._dispatch = dispatch
        self._sink = sink
        self._dead_letter = dead_letter
        self._max_batch = max_batch
        self._pipeline = pipeline
        self._stopping = False
        self.acked = 0
        self._stats = {"consumed": 0, "outputs": 0, "dropped": 0, "failed": 0, "batches": 0}

    async def start(self) -> None:
        await self._sink.start()
        if self._dead_letter is not None:
            await self._dead_letter.start()

    async def run(self) -> None:
        while not self._stopping and self.acked < len(self._events):
            batch = self._events[self.acked : self.acked + self._max_batch]
            outcomes = await self._dispatch(batch)
            if len(outcomes) != len(batch):
                msg = f"dispatch returned {len(outcomes)} outcomes for {len(batch)} events"
                raise RuntimeError(msg)
            outputs: list[tuple[CloudEvent, bytes | None]] = []
            dead: list[tuple[CloudEvent, bytes | None]] = []
            for event, outcome in zip(batch, outcomes):
                if isinstance(outcome, Failure):
                    self._stats["failed"] += 1
                    dead.append((_dead_letter(event, outcome, self._pipeline), None))
                elif not outcome:
                    self._stats["dropped"] += 1
                else:
                    outputs.extend((e, None) for e in outcome)
            if outputs:
                await self._sink.send(outputs)
            if dead and self._dead_letter is not None:
                await self._dead_letter.send(dead)
            self._stats["consumed"] += len(batch)
            self._stats["outputs"] += len(outputs)
            self._stats["batches"] += 1
            self.acked += len(batch)  # acknowledged only after both sinks took the batch

    async def stop(self, drain: bool = True) -> None:
        self._stopping = True
        await self._sink.stop()
        if self._dead_letter is not None:
            await self._dead_letter.stop()

    def stats(self) -> dict[str, int]:
        return dict(self._stats, acked=self.acked)


def _dead_letter(event: CloudEvent, failure: Failure, pipeline: str) -> CloudEvent:
    return event.replace(
        ebpipeline=pipeline,
        ebstep=failure.step,
        eberrortype=failure.error_type,
        eberror=failure.message,
        ebattempts=failure.attempts,
    )


@dataclass
class PipelineResult:
    """What a pipeline made of its input.

    Attributes:
        outputs: the events for the sink, in order.
        dead_letters: failed events, as the dead-letter sink gets them (``eb*`` attributes).
        dropped: input events that gave no output and did not fail (filtered).
        outcomes: one outcome per input event (its outputs, or its :class:`~eventbus.Failure`).
    """

    outputs: list[CloudEvent] = field(default_factory=list)
    dead_letters: list[CloudEvent] = field(default_factory=list)
    dropped: int = 0
    outcomes: list[Outcome] = field(default_factory=list)


def run_pipeline(
    pipeline: str | Path | object,
    events: Sequence[CloudEvent],
    *,
    max_batch: int = 500,
    base_dirs: list[str] | None = None,
) -> PipelineResult:
    """Run a pipeline's steps over ``events`` in process, through :class:`MemorySource` and
    :class:`ListSink` sinks.

    Args:
        pipeline: a :class:`~eventbus.pipelines.PipelineConfig`, a pipeline file's path, or
            pipeline YAML text.
        events: the input events.
        max_batch: events per batch.
        base_dirs: where relative data files are read (default: the pipeline file's folder).

    Returns:
        The outputs, dead letters and the count of dropped events.

    Raises:
        PipelineConfigError: the pipeline is not valid (every problem listed).
    """
    from eventbus.pipelines import PipelineConfig, PipelineRunner, load_pipeline, load_pipeline_text

    if isinstance(pipeline, PipelineConfig):
        config = pipeline
    elif isinstance(pipeline, Path) or (
        isinstance(pipeline, str)
        and "\n" not in pipeline
        and (pipeline.endswith((".yaml", ".yml")) or Path(pipeline).exists())
    ):
        path = Path(pipeline)
        config = load_pipeline(path)
        base_dirs = base_dirs if base_dirs is not None else [str(path.resolve().parent)]
    elif isinstance(pipeline, str):
        config = load_pipeline_text(pipeline)
    else:
        msg = f"run_pipeline takes a PipelineConfig, a path or YAML text; got {type(pipeline).__name__}"
        raise TypeError(msg)
    runner = PipelineRunner(config, base_dirs=base_dirs)
    result = PipelineResult()

    async def dispatch(batch: list[CloudEvent]) -> list[Outcome]:
        outcomes = runner.run(batch)
        result.outcomes.extend(outcomes)
        return outcomes

    sink, dead = ListSink(), ListSink()
    source = MemorySource(
        events, dispatch, sink, dead_letter=dead, max_batch=max_batch, pipeline=config.name
    )

    async def main() -> None:
        await source.start()
        try:
            await source.run()
            closing = runner.flush()  # end of input: open aggregate windows close
            if closing:
                await sink.send([(e, None) for e in closing])
        finally:
            await source.stop()

    asyncio.run(main())
    result.outputs = sink.events
    result.dead_letters = dead.events
    result.dropped = source.stats()["dropped"]
    return result


def passthrough(event: CloudEvent) -> CloudEvent:
    """A per-event function that returns its event unchanged (``function:
    eventbus.testing:passthrough``), for tests of pipelines' plumbing."""
    return event
