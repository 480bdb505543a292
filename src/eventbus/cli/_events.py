"""Events on topics: ``eventbus publish``, ``tail``, ``replay``, ``redrive``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import typer

from eventbus.cli._common import (
    EXIT_USAGE,
    Addresses,
    KafkaConfigOpt,
    KafkaOpt,
    RayOpt,
    RedisOpt,
    controller_client,
    err,
    fail,
    out,
    plain,
)
from eventbus.errors import EventBusError

__all__ = ["register"]

# attributes `tail` shows in the head line or as the body; the rest go on one line below it
_SHOWN = {"specversion", "id", "source", "type", "data", "data_base64", "datacontenttype"}


def register(app: typer.Typer) -> None:
    """Add this group's commands to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.command()(publish)
    app.command()(tail)
    app.command()(replay)
    app.command()(redrive)


def publish(
    topic: str = typer.Argument(..., help="Kafka topic."),
    type_: str | None = typer.Option(None, "--type", help="CloudEvent type."),
    source: str = typer.Option("eventbus-cli", "--source", help="CloudEvent source."),
    data: str | None = typer.Option(None, "--data", help="JSON data."),
    file: Path | None = typer.Option(
        None, "--file", help="JSON lines: one event (attributes + data) or data object per line."
    ),
    mode: str = typer.Option("binary", "--mode", help="binary or structured."),
    key: str | None = typer.Option(None, "--key", help="Kafka record key (partition key)."),
    count: int = typer.Option(
        1, "--count", min=1, help="Send the --data event this many times (fresh ids)."
    ),
    kafka_bootstrap: str | None = KafkaOpt,
    kafka_config: Path | None = KafkaConfigOpt,
) -> None:
    """Publish CloudEvents to a topic over the Kafka protocol binding."""
    from eventbus.eventing._publish import build_events, publish_events

    if mode not in ("binary", "structured"):
        fail(f"--mode must be binary or structured; got {mode!r}", EXIT_USAGE)
    addr = Addresses(None, kafka_bootstrap, None, kafka_config)
    addr.fill_from_stack(("kafka",))
    try:
        events = build_events(type_=type_, source=source, data=data, file=file, count=count)
    except EventBusError as exc:
        fail(str(exc))
    _require_topic(addr, topic)
    try:
        n = asyncio.run(
            publish_events(
                addr.kafka or "", topic, events, mode=mode, key=key, client=addr.kafka_client
            )
        )
    except EventBusError as exc:
        fail(str(exc))
    out.print(f"published {n} event(s) to {topic}")


def tail(
    topic: str = typer.Argument(..., help="Kafka topic."),
    from_beginning: bool = typer.Option(
        False, "--from-beginning", help="Start at the earliest offset."
    ),
    max_events: int | None = typer.Option(None, "--max", help="Stop after this many events."),
    timeout_s: float | None = typer.Option(
        None, "--timeout", help="Stop after this many seconds without events."
    ),
    as_json: bool = typer.Option(False, "--json", help="One structured-mode JSON object per line."),
    kafka_bootstrap: str | None = KafkaOpt,
    kafka_config: Path | None = KafkaConfigOpt,
) -> None:
    """Print CloudEvents as they arrive on a topic."""
    from eventbus.eventing._publish import tail_events

    addr = Addresses(None, kafka_bootstrap, None, kafka_config)
    addr.fill_from_stack(("kafka",))

    _require_topic(addr, topic)

    def show(line: str) -> None:
        if as_json:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        else:
            obj = json.loads(line)
            head = f"[cyan]{obj.get('type')}[/cyan] [dim]{obj.get('source')} {obj.get('id')}[/dim]"
            out.print(head, highlight=False)
            extra = {k: v for k, v in obj.items() if k not in _SHOWN}
            if extra:
                plain(out, "  " + ", ".join(f"{k}={v}" for k, v in extra.items()))
            if "data" in obj:
                out.print_json(data=obj["data"])

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a tail without --max ends
        _run_or_fail(
            lambda: asyncio.run(
                tail_events(
                    addr.kafka or "",
                    topic,
                    show,
                    from_beginning=from_beginning,
                    max_events=max_events,
                    idle_timeout_s=timeout_s,
                    client=addr.kafka_client,
                )
            )
        )


def replay(
    pipeline: str = typer.Argument(..., help="The deployed pipeline to run the events through."),
    topic: str = typer.Option(..., "--topic", help="The topic to read the range from."),
    from_offset: int | None = typer.Option(
        None, "--from-offset", help="First offset (each partition)."
    ),
    from_time: str | None = typer.Option(
        None, "--from-time", help="First record time: RFC 3339 or epoch ms."
    ),
    to_offset: int | None = typer.Option(
        None, "--to-offset", help="Stop before this offset (default: the end)."
    ),
    to_time: str | None = typer.Option(None, "--to-time", help="Stop before this record time."),
    partition: list[int] | None = typer.Option(
        None, "--partition", help="Only these partitions (repeatable)."
    ),
    dedupe: bool = typer.Option(
        True, "--dedupe/--no-dedupe", help="Skip outputs the sink already received."
    ),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    kafka_config: Path | None = KafkaConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Re-run a range of a topic through a deployed pipeline (e.g. after a fix)."""
    from eventbus.pipelines import PipelineConfig
    from eventbus.serving._replay import ReplayRange, parse_time_arg
    from eventbus.serving._replay import replay as run_replay

    addr = Addresses(ray_address, kafka_bootstrap, redis_url, kafka_config)
    client = controller_client(addr)
    try:
        rng = ReplayRange(
            from_offset=from_offset,
            to_offset=to_offset,
            from_time_ms=parse_time_arg(from_time) if from_time else None,
            to_time_ms=parse_time_arg(to_time) if to_time else None,
            partitions=list(partition) if partition else None,
        )
        rng.check()
        config = PipelineConfig.model_validate(client.get(pipeline)["document"])
        client.wake(pipeline)  # at zero its Serve application is away
    except EventBusError as exc:
        fail(str(exc))
    from eventbus.serving._host import pipeline_handle

    handle = pipeline_handle(pipeline, config.spec.serving.host)

    async def dispatch(events: list[Any]) -> Any:
        return await handle.process.remote(events)

    from rich.progress import Progress, SpinnerColumn, TextColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), console=err, transient=True
    ) as bar:
        task = bar.add_task("replaying...", total=None)

        def show(st: Any) -> None:
            bar.update(
                task,
                description=f"replayed {st.replayed:,} events: {st.outputs:,} outputs, {st.dead_lettered:,} dead letters, {st.duplicates:,} duplicates skipped",
            )

        try:
            stats = asyncio.run(
                run_replay(
                    config,
                    topic,
                    rng,
                    bootstrap=addr.kafka or "",
                    redis_url=addr.redis,
                    dispatch=dispatch,
                    dedupe=dedupe,
                    progress=show,
                    kafka_client=addr.kafka_client,
                )
            )
        except EventBusError as exc:
            fail(str(exc))
    out.print(
        f"replayed {stats.replayed} events of {topic} through {pipeline}: {stats.outputs} outputs, "
        f"{stats.dropped} filtered, {stats.dead_lettered} dead letters, {stats.duplicates} duplicates skipped"
    )


def redrive(
    pipeline: str = typer.Argument(
        ..., help="The deployed pipeline whose dead letters to redrive."
    ),
    since: str | None = typer.Option(
        None, "--since", help="Only dead letters written at or after: RFC 3339 or epoch ms."
    ),
    filter_: str | None = typer.Option(
        None,
        "--filter",
        help="CEL over the dead letter, eb* attributes included (e.g. \"ebstep == 'score'\").",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would be redriven."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    kafka_config: Path | None = KafkaConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Send a pipeline's dead letters back through its steps (eb* attributes removed, outputs
    deduped), and report how many went where."""
    from eventbus.pipelines import PipelineConfig
    from eventbus.serving._redrive import compile_where
    from eventbus.serving._redrive import redrive as run_redrive
    from eventbus.serving._replay import parse_time_arg

    try:  # input mistakes first, before connecting to anything
        since_ms = parse_time_arg(since.strip()) if since is not None else None
        if filter_ is not None:
            compile_where(filter_)
    except EventBusError as exc:
        fail(str(exc).replace("time ", "--since ", 1) if since else str(exc))
    addr = Addresses(ray_address, kafka_bootstrap, redis_url, kafka_config)
    client = controller_client(addr)
    try:
        config = PipelineConfig.model_validate(client.get(pipeline)["document"])
        client.wake(pipeline)  # at zero its Serve application is away
    except EventBusError as exc:
        fail(str(exc))
    from eventbus.serving._host import pipeline_handle

    handle = pipeline_handle(pipeline, config.spec.serving.host)

    async def dispatch(events: list[Any]) -> Any:
        return await handle.process.remote(events)

    from rich.progress import Progress, SpinnerColumn, TextColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), console=err, transient=True
    ) as bar:
        task = bar.add_task("redriving...", total=None)

        def show(r: Any) -> None:
            bar.update(task, description=f"read {r.read:,} dead letters, redriven {r.redriven:,}")

        try:
            report = asyncio.run(
                run_redrive(
                    config,
                    bootstrap=addr.kafka or "",
                    redis_url=addr.redis,
                    dispatch=dispatch,
                    since_ms=since_ms,
                    where=filter_,
                    dry_run=dry_run,
                    progress=show,
                    kafka_client=addr.kafka_client,
                )
            )
        except EventBusError as exc:
            fail(str(exc))
    if as_json:
        plain(out, json.dumps(report.as_dict(), sort_keys=True))
        return
    plain(out, _redrive_summary(pipeline, report))


def _redrive_summary(pipeline: str, r: Any) -> str:
    if r.read == 0:
        return f"nothing to redrive: the dead-letter topic {r.topic} of {pipeline} is empty"
    left = {
        "written before --since": r.before_since,
        "of other pipelines": r.other_pipeline,
        "not matching --filter": r.not_matched,
        "not EventBus dead letters": r.undecodable + r.not_dead_letters,
        "repeats of one dead letter": r.repeats,
    }
    left_text = ", ".join(f"{n} {why}" for why, n in left.items() if n) or "none"
    steps = ", ".join(f"{s}: {n}" for s, n in sorted(r.by_step.items())) or "-"
    if r.dry_run:
        return (
            f"dry run: {r.redriven} of {r.read} dead letters in {r.topic} would be redriven "
            f"through {pipeline} (failed in {steps}); left alone: {left_text}"
        )
    return (
        f"redrove {r.redriven} of {r.read} dead letters in {r.topic} through {pipeline} "
        f"(failed in {steps}): {r.outputs} to the sink, {r.duplicates} already there (dedupe), "
        f"{r.filtered} filtered, "
        + (f"{r.unrouted} matched no route, " if r.unrouted else "")
        + f"{r.dead_lettered} dead-lettered again; left alone: {left_text}"
    )


def _require_topic(addr: Addresses, topic: str) -> None:
    """Exit 1 naming ``topic`` when it is invalid or missing (instead of waiting silently on a
    topic that does not exist, or having a broker create it)."""
    from eventbus.eventing._topics import require_topics

    _run_or_fail(lambda: asyncio.run(require_topics(addr.kafka or "", [topic], addr.kafka_client)))


def _run_or_fail(call: Any) -> None:
    try:
        call()
    except EventBusError as exc:
        fail(str(exc))
