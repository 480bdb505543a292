"""The ``eventbus`` command line: a thin shell over the public API.

Exit codes: 0 ok, 1 invalid input or a failed test/operation, 2 usage. Environment variables
are read here only: ``EVENTBUS_HOME`` (state, default ``~/.eventbus``), ``RAY_ADDRESS``,
``EVENTBUS_KAFKA_BOOTSTRAP``, ``EVENTBUS_REDIS_URL``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from eventbus.errors import EventBusError

app = typer.Typer(
    name="eventbus",
    help="EventBus: event-driven serverless pipelines on Ray Serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``eventbus`` script."""
    app()


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print("[red]error:[/red] ", end="")
    _plain(err, message)
    raise typer.Exit(code)


def _plain(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _working(description: str) -> Any:
    """A spinner with the elapsed time on stderr (transient) for one long blocking call
    (deploys, rollbacks: the controller does the phases in one Ray call)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    progress.add_task(description, total=None)
    return progress


def _home() -> Path:
    return Path(os.environ.get("EVENTBUS_HOME") or Path.home() / ".eventbus")


class _Addresses:
    def __init__(self, ray: str | None, kafka: str | None, redis: str | None) -> None:
        self.ray = ray or os.environ.get("RAY_ADDRESS") or None
        self.kafka = kafka or os.environ.get("EVENTBUS_KAFKA_BOOTSTRAP") or None
        self.redis = redis or os.environ.get("EVENTBUS_REDIS_URL") or None
        self.ray_env: dict[str, str] = {}

    def fill_from_stack(self, need: tuple[str, ...]) -> None:
        from eventbus._internal.stack import load_stack

        stack = load_stack(_home())
        if stack is not None:
            if self.ray is None or self.ray == stack.ray_address:
                self.ray_env = stack.ray_env()
            self.ray = self.ray or stack.ray_address
            self.kafka = self.kafka or stack.kafka_bootstrap
            self.redis = self.redis or stack.redis_url
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            _fail(
                f"no {', '.join(missing)} address: no stack is recorded in {_home()}; start one with "
                "`eventbus up`, or pass --ray-address/--kafka-bootstrap/--redis-url "
                "(or set RAY_ADDRESS, EVENTBUS_KAFKA_BOOTSTRAP, EVENTBUS_REDIS_URL)"
            )


RayOpt = typer.Option(None, "--ray-address", help="Ray cluster address (host:port).")
KafkaOpt = typer.Option(None, "--kafka-bootstrap", help="Kafka bootstrap servers.")
RedisOpt = typer.Option(None, "--redis-url", help="Redis URL (redis://host:port/db).")


def _client(addr: _Addresses) -> Any:
    addr.fill_from_stack(("ray", "kafka", "redis"))
    os.environ.update(addr.ray_env)  # before Ray is imported: it reads its auth settings then
    from eventbus.serving._client import EventBusClient

    try:
        return EventBusClient(addr.ray, addr.kafka or "", addr.redis or "", ray_env=addr.ray_env)
    except ConnectionError as exc:
        _fail(
            f"cannot reach the Ray cluster at {addr.ray}: {exc}; is the stack up (`eventbus status`)?"
        )


# -- stack ------------------------------------------------------------------------------------


@app.command()
def up(
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
    num_cpus: int | None = typer.Option(None, help="CPUs of the local Ray head (default: all)."),
    gateway: bool = typer.Option(
        True, "--gateway/--no-gateway", help="Start the HTTP/gRPC gateway."
    ),
    http_port: int = typer.Option(8080, help="The gateway's HTTP port (a free one if taken)."),
    grpc_port: int = typer.Option(50051, help="The gateway's gRPC port (a free one if taken)."),
) -> None:
    """Start the local stack (Ray, Kafka-protocol broker, Redis, gateway), or adopt given addresses."""
    from eventbus._internal.stack import stack_status, stack_up

    addr = _Addresses(ray_address, kafka_bootstrap, redis_url)
    with out.status("starting the EventBus stack..."):
        try:
            stack_up(
                _home(),
                ray_address=addr.ray,
                kafka_bootstrap=addr.kafka,
                redis_url=addr.redis,
                num_cpus=num_cpus,
                gateway=gateway,
                http_port=http_port,
                grpc_port=grpc_port,
            )
        except EventBusError as exc:
            _fail(str(exc))
    _print_stack(stack_status(_home()))
    _restore_pipelines(_Addresses(ray_address, kafka_bootstrap, redis_url))


def _restore_pipelines(addr: _Addresses) -> None:
    """After a full restart: the pipelines Redis still holds are deployed again (the
    controller restores them when it starts), before `up` returns."""
    import redis

    addr.fill_from_stack(("ray", "kafka", "redis"))
    try:
        stored = redis.Redis.from_url(addr.redis or "").hlen("eventbus:pipelines")
    except redis.RedisError as exc:
        _fail(f"cannot read the pipelines in Redis at {addr.redis}: {exc}")
    if not stored:
        return
    with out.status(f"restoring {stored} pipeline(s) from Redis..."):
        rows = _client(addr).list()
    running = [r["name"] for r in rows if r["status"] == "RUNNING"]
    out.print(f"restored {len(running)} of {len(rows)} pipeline(s): {', '.join(running) or '-'}")


@app.command()
def gateway(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0 in a container)."),
    http_port: int = typer.Option(8080, help="HTTP port."),
    grpc_port: int = typer.Option(50051, help="gRPC port (0: none)."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
    otlp_endpoint: str | None = typer.Option(
        None,
        help="Export traces over OTLP/HTTP to this URL (default: $OTEL_EXPORTER_OTLP_ENDPOINT; none: tracing off).",
    ),
    trace_sample_ratio: float = typer.Option(
        1.0, min=0.0, max=1.0, help="Share of requests traced when tracing is on."
    ),
    log_format: str = typer.Option("text", help="text, or json (one JSON object per line)."),
    admin_token_file: Path | None = typer.Option(
        None,
        help="Turn the admin API (/v1/admin) on with the bearer token in this file (or set $EVENTBUS_ADMIN_TOKEN).",
    ),
) -> None:
    """Run the HTTP/gRPC gateway in the foreground (one per node; `eventbus up` starts one).

    It also serves /metrics (Prometheus), /dashboard and /v1/pipelines/NAME/stats.
    """
    if log_format not in ("text", "json"):
        _fail(f"--log-format is {log_format!r}; use text or json", 2)
    otlp_endpoint = otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None
    addr = _Addresses(ray_address, kafka_bootstrap, redis_url)
    addr.fill_from_stack(("kafka", "redis"))
    os.environ.update(addr.ray_env)
    if admin_token_file is not None:
        os.environ["EVENTBUS_ADMIN_TOKEN_FILE"] = str(admin_token_file)
    # Serve's router on the gateway's own loop, not a second thread's: a sync call is a few
    # hops shorter. Read when Ray Serve is first imported (by the import below).
    os.environ.setdefault("RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP", "0")
    from eventbus.serving._gateway import run_gateway

    def ready(gw: Any) -> None:
        grpc = f", gRPC on {gw.host}:{gw.grpc_port}" if gw.grpc_port else ""
        _plain(err, f"gateway: HTTP on http://{gw.host}:{gw.http_port}{grpc}")

    try:
        run_gateway(
            addr.kafka or "",
            addr.redis or "",
            ray_address=addr.ray,
            host=host,
            http_port=http_port,
            grpc_port=grpc_port or None,
            on_ready=ready,
            otlp_endpoint=otlp_endpoint,
            trace_sample_ratio=trace_sample_ratio,
            log_format=log_format,
        )
    except (EventBusError, OSError) as exc:
        _fail(f"the gateway stopped: {exc}")


@app.command()
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
    redis_url: str | None = RedisOpt,
) -> None:
    """Re-run a range of a topic through a deployed pipeline (e.g. after a fix)."""
    from eventbus.pipelines._config import PipelineConfig
    from eventbus.serving._replay import ReplayRange, parse_time_arg
    from eventbus.serving._replay import replay as run_replay

    addr = _Addresses(ray_address, kafka_bootstrap, redis_url)
    client = _client(addr)
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
    except EventBusError as exc:
        _fail(str(exc))
    from ray import serve

    from eventbus.serving._deployment import app_name

    handle = serve.get_app_handle(app_name(pipeline))

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
                )
            )
        except EventBusError as exc:
            _fail(str(exc))
    out.print(
        f"replayed {stats.replayed} events of {topic} through {pipeline}: {stats.outputs} outputs, "
        f"{stats.dropped} filtered, {stats.dead_lettered} dead letters, {stats.duplicates} duplicates skipped"
    )


@app.command()
def down() -> None:
    """Stop what `eventbus up` started (nothing that it adopted)."""
    from eventbus._internal.stack import stack_down

    stopped = stack_down(_home())
    out.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing to stop")


@app.command()
def status(
    name: str | None = typer.Argument(None, help="A pipeline to show in detail."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print the stack's parts (or the pipeline's figures) as JSON (for scripts).",
    ),
) -> None:
    """Show the stack, the deployed pipelines, or one pipeline's live counters."""
    from eventbus._internal.stack import stack_status

    st = stack_status(_home())
    if as_json and name is None:
        print(json.dumps(st))
        raise typer.Exit(0 if st["healthy"] else 1)
    if name is None:
        _print_stack(st)
        if not st["healthy"] and not (ray_address or os.environ.get("RAY_ADDRESS")):
            raise typer.Exit(1)
        _print_pipelines(_client(_Addresses(ray_address, kafka_bootstrap, redis_url)).list())
        return
    try:
        info = _client(_Addresses(ray_address, kafka_bootstrap, redis_url)).status(name)
    except EventBusError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(info))
        return
    if info.get("figures") is not None:
        from eventbus.observability._terminal import print_figures

        print_figures(out, info["figures"])
        return
    out.print(f"[bold]{info['name']}[/bold] version {info['version']}")
    for i, s in enumerate(info["sources"]):
        out.print(f"  source {i}: " + ", ".join(f"{k}={v}" for k, v in s.items()))


def _print_stack(st: dict[str, Any]) -> None:
    table = Table(title="EventBus stack")
    for col in ("part", "address", "state", "started by eventbus"):
        table.add_column(col)
    for part, info in st["parts"].items():
        table.add_row(
            part,
            info["address"],
            "[green]up[/green]" if info["up"] else "[red]down[/red]",
            "yes" if info["owned"] else "no",
        )
    if not st["parts"]:
        out.print("no stack recorded; start one with `eventbus up`")
    else:
        out.print(table)


def _print_pipelines(rows: list[dict[str, Any]]) -> None:
    table = Table(title="Pipelines")
    for col in ("name", "version", "status", "sources", "steps"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], str(r["version"]), r["status"], str(r["sources"]), str(r["steps"]))
    out.print(table if rows else "no pipelines deployed")


# -- pipelines --------------------------------------------------------------------------------


@app.command()
def validate(files: list[Path] = typer.Argument(..., help="Pipeline YAML files.")) -> None:
    """Check pipeline files; print every problem as file:line:col: path: message."""
    from eventbus.pipelines._loader import validate_pipeline_text

    bad = False
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as exc:
            err.print(f"{f}:1:1: file: cannot read ({exc.strerror})", highlight=False)
            bad = True
            continue
        sys.path.insert(0, str(f.resolve().parent))
        try:
            _, problems = validate_pipeline_text(text, str(f))
        finally:
            sys.path.remove(str(f.resolve().parent))
        for p in problems:
            _plain(err, str(p))
        if problems:
            bad = True
        else:
            out.print(f"{f}: ok", highlight=False)
    if bad:
        raise typer.Exit(1)


@app.command()
def deploy(
    file: Path = typer.Argument(..., help="Pipeline YAML file."),
    canary: int | None = typer.Option(
        None,
        "--canary",
        min=1,
        max=100,
        help="Start the new steps on this percent of the events, then 50 and 100 percent if they do no worse; "
        "rolled back at once on a regression, promoted after the last step.",
    ),
    step_seconds: float = typer.Option(
        30.0, "--step-seconds", min=1.0, help="Seconds per canary step."
    ),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Validate and deploy (or redeploy) a pipeline, at once or as a canary."""
    from eventbus.errors import PipelineConfigError

    client = _client(_Addresses(ray_address, kafka_bootstrap, redis_url))
    try:
        if canary is not None:
            weights = sorted({canary, *(w for w in (50, 100) if w > canary)})
            with _working(
                f"starting a canary of {file}: validate, push models, start the canary steps on the replicas..."
            ):
                info = client.deploy(file, canary=weights, step_s=step_seconds)
            out.print(
                f"canary of [bold]{info['name']}[/bold] version {info['canary_version']} on {info['weight']}% of the events; "
                f"steps {', '.join(f'{w}%' for w in info['weights'])} every {step_seconds:g} s (`eventbus canary {info['name']}`)"
            )
            return
        with _working(
            f"deploying {file}: validate, push models, start the Serve application and sources..."
        ):
            info = client.deploy(file)
    except PipelineConfigError as exc:
        for p in exc.problems:
            _plain(err, p)
        raise typer.Exit(1) from None
    except EventBusError as exc:
        _fail(str(exc).splitlines()[-1] if str(exc) else type(exc).__name__)
    out.print(
        f"deployed [bold]{info['name']}[/bold] version {info['version']} ({info['sources']} source(s), {info['steps']} step(s))"
    )


@app.command()
def delete(
    name: str = typer.Argument(..., help="Pipeline name."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Drain and delete a deployed pipeline."""
    try:
        with _working(f"deleting {name}: drain the sources, stop the Serve application..."):
            _client(_Addresses(ray_address, kafka_bootstrap, redis_url)).delete(name)
    except EventBusError as exc:
        _fail(str(exc))
    out.print(f"deleted {name}")


@app.command()
def get(
    name: str = typer.Argument(..., help="Pipeline name."),
    as_json: bool = typer.Option(
        False, "--json", help="The stored record as JSON instead of the YAML."
    ),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Print a deployed pipeline's YAML (as deployed), or its stored record."""
    try:
        record = _client(_Addresses(ray_address, kafka_bootstrap, redis_url)).get(name)
    except EventBusError as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps({k: v for k, v in record.items() if k != "python_path"}) + "\n")
        return
    sys.stdout.write(record["yaml"] if record["yaml"].endswith("\n") else record["yaml"] + "\n")


@app.command()
def versions(
    name: str = typer.Argument(..., help="Pipeline name."),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of a table."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """List a pipeline's kept versions (the serving one marked)."""
    try:
        rows = _client(_Addresses(ray_address, kafka_bootstrap, redis_url)).versions(name)
    except EventBusError as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    import time

    table = Table("version", "deployed", "file", "serving", "note")
    for r in rows:
        note = f"rollback to {r['rollback_of']}" if r.get("rollback_of") else ""
        deployed = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["deployed_at"]))
        table.add_row(str(r["version"]), deployed, r["filename"], "*" if r["serving"] else "", note)
    out.print(table)


@app.command()
def promote(
    name: str = typer.Argument(..., help="Pipeline name."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Make a pipeline's running canary its serving version now."""
    try:
        info = _client(_Addresses(ray_address, kafka_bootstrap, redis_url)).promote(name)
    except EventBusError as exc:
        _fail(str(exc))
    out.print(f"promoted {name}: version {info['version']} serves")


@app.command("canary")
def canary_(
    name: str = typer.Argument(..., help="Pipeline name."),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of text."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Show a pipeline's canary: its share, steps and verdicts, or how the last one ended."""
    try:
        state = _client(_Addresses(ray_address, kafka_bootstrap, redis_url)).canary(name)
    except EventBusError as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps(state) + "\n")
        return
    if state is None:
        out.print(f"{name} has no canary; start one with `eventbus deploy FILE --canary 10`")
        return
    out.print(
        f"canary of {name} version {state['version']}: {state['status']} ({state.get('reason') or 'at ' + str(state['weight']) + '%'})"
    )
    for h in state["history"]:
        c = h["figures"]["canary"]
        out.print(
            f"  {h['weight']}%: {h['verdict']} ({h['reason']}); canary {int(c['events'])} events, {int(c['failed'])} failed"
        )


@app.command()
def rollback(
    name: str = typer.Argument(..., help="Pipeline name."),
    to: int | None = typer.Option(
        None, "--to", help="The version to restore (default: the one before the serving one)."
    ),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """End a running canary, or deploy an earlier version of a pipeline again (as a new version)."""
    try:
        with _working(
            f"rolling back {name}: end the canary, or deploy the earlier version again..."
        ):
            info = _client(_Addresses(ray_address, kafka_bootstrap, redis_url)).rollback(name, to)
    except EventBusError as exc:
        _fail(str(exc))
    if "canary_rolled_back" in info:
        out.print(
            f"rolled back the canary of {name} (version {info['canary_rolled_back']}); version {info['version']} serves"
        )
        return
    out.print(
        f"rolled back {name}: version {info['version']} serves the YAML of version {info['rollback_of']}"
    )


@app.command("list")
def list_(
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """List the deployed pipelines."""
    _print_pipelines(_client(_Addresses(ray_address, kafka_bootstrap, redis_url)).list())


@app.command()
def schema(
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to this file."),
) -> None:
    """Print the JSON Schema of pipeline YAML."""
    from eventbus.pipelines._schema import pipeline_schema_json

    text = pipeline_schema_json()
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")


@app.command("test")
def test_(
    paths: list[str] = typer.Argument(
        ..., help="Pipeline files, *_test.yaml files or directories."
    ),
) -> None:
    """Run pipeline unit tests in process (no stack needed)."""
    from eventbus.errors import ConfigError, PipelineConfigError
    from eventbus.pipelines._testing import find_test_files, run_test_file

    try:
        files = find_test_files(paths)
    except ConfigError as exc:
        _fail(str(exc))
    if not files:
        _fail(f"no *_test.yaml files under {', '.join(paths)}")
    passed = failed = 0
    for f in files:
        try:
            results = run_test_file(f)
        except PipelineConfigError as exc:
            for p in exc.problems:
                _plain(err, p)
            failed += 1
            continue
        except ConfigError as exc:
            _plain(err, str(exc))
            failed += 1
            continue
        for r in results:
            if r.passed:
                passed += 1
                out.print(f"[green]PASS[/green] {r.file}: {r.name}", highlight=False)
            else:
                failed += 1
                out.print(f"[red]FAIL[/red] {r.file}: {r.name}", highlight=False)
                for d in r.diffs:
                    out.print(d, highlight=False, markup=False)
    out.print(f"{passed} passed, {failed} failed")
    if failed:
        raise typer.Exit(1)


# -- events -----------------------------------------------------------------------------------


@app.command()
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
) -> None:
    """Publish CloudEvents to a topic over the Kafka protocol binding."""
    from eventbus.eventing._publish import build_events, publish_events

    if mode not in ("binary", "structured"):
        _fail(f"--mode must be binary or structured; got {mode!r}", 2)
    addr = _Addresses(None, kafka_bootstrap, None)
    addr.fill_from_stack(("kafka",))
    try:
        events = build_events(type_=type_, source=source, data=data, file=file, count=count)
    except EventBusError as exc:
        _fail(str(exc))
    n = asyncio.run(publish_events(addr.kafka or "", topic, events, mode=mode, key=key))
    out.print(f"published {n} event(s) to {topic}")


@app.command()
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
) -> None:
    """Print CloudEvents as they arrive on a topic."""
    from eventbus.eventing._publish import tail_events

    addr = _Addresses(None, kafka_bootstrap, None)
    addr.fill_from_stack(("kafka",))

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
                _plain(out, "  " + ", ".join(f"{k}={v}" for k, v in extra.items()))
            if "data" in obj:
                out.print_json(data=obj["data"])

    try:
        asyncio.run(
            tail_events(
                addr.kafka or "",
                topic,
                show,
                from_beginning=from_beginning,
                max_events=max_events,
                idle_timeout_s=timeout_s,
            )
        )
    except KeyboardInterrupt:
        pass


_SHOWN = {"specversion", "id", "source", "type", "data", "data_base64", "datacontenttype"}

# -- solver -----------------------------------------------------------------------------------

from eventbus.solver._cli import solve_command  # noqa: E402  (imports torch only when it runs)

app.command("solve")(solve_command)

from eventbus._keeper_cli import keeper_app  # noqa: E402  (several clusters; no Ray at import)

app.add_typer(keeper_app, name="keeper")

from eventbus.models._cli import model_app  # noqa: E402  (Ray and torch only when a command runs)

app.add_typer(model_app, name="model")

if __name__ == "__main__":  # pragma: no cover
    main()
