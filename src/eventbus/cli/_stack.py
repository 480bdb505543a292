"""The stack: ``eventbus up``, ``gateway``, ``down``, ``status``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from eventbus._internal import keys
from eventbus.cli._common import (
    EXIT_USAGE,
    RAY_ADDRESS_ENV,
    Addresses,
    KafkaConfigOpt,
    KafkaOpt,
    RayOpt,
    RedisOpt,
    controller_client,
    err,
    fail,
    home,
    out,
    plain,
    print_pipelines,
)
from eventbus.cli._reader import reader
from eventbus.errors import EventBusError

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add this group's commands to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.command()(up)
    app.command()(join)
    app.command()(gateway)
    app.command()(down)
    app.command()(status)


def up(
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
    kafka_config: Path | None = KafkaConfigOpt,
    redis_ca: Path | None = typer.Option(
        None,
        "--redis-ca",
        help="CA bundle (PEM) that signed the TLS certificate of --redis-url "
        "(rediss://); the same as ?ssl_ca_certs=FILE in the URL.",
    ),
    num_cpus: int | None = typer.Option(None, help="CPUs of the local Ray head (default: all)."),
    labels: list[str] = typer.Option(
        [],
        "--labels",
        help="A Ray node label of the local head, KEY=VALUE (repeat, or comma-separated): "
        "pipelines pick nodes by them (serving.placement.node_labels).",
    ),
    gateway: bool = typer.Option(
        True, "--gateway/--no-gateway", help="Start the HTTP/gRPC gateway."
    ),
    http_port: int | None = typer.Option(
        None,
        help="The gateway's HTTP port. Default: the one it had at the last `up`, else 8080; "
        "a free one if taken (said so). `eventbus url gateway` prints it.",
    ),
    grpc_port: int | None = typer.Option(
        None, help="The gateway's gRPC port. Default: the last one, else 50051 (as --http-port)."
    ),
    redis_maxmemory: str = typer.Option(
        "1gb",
        help="Memory limit of the Redis started here (noeviction: at the limit writes fail loudly, nothing is evicted).",
    ),
    broker: str = typer.Option(
        "tansu",
        "--broker",
        help="The broker started here when no --kafka-bootstrap is given: tansu (embedded, "
        "memory only, no dependencies) or kafka (Apache Kafka in KRaft mode, records on disk "
        "under $EVENTBUS_HOME/kafka, kept across down/up; needs Java 17+, its jars are "
        "resolved from Maven Central once).",
    ),
) -> None:
    """Start the local stack (Ray, Kafka-protocol broker, Redis, gateway), or adopt given addresses."""
    from eventbus._internal.stack import stack_status, stack_up

    if broker not in ("tansu", "kafka"):
        fail(f"--broker {broker!r}: use tansu (embedded) or kafka (Apache Kafka)", EXIT_USAGE)
    if kafka_bootstrap is not None and broker == "kafka":
        fail("--broker kafka starts a broker: leave out --kafka-bootstrap", EXIT_USAGE)
    node_labels = _labels(labels)
    if node_labels and ray_address is not None:
        fail("--labels label the Ray head `up` starts: leave out --ray-address", EXIT_USAGE)
    addr = Addresses(ray_address, kafka_bootstrap, redis_url, kafka_config)
    if redis_ca is not None:
        from eventbus._internal.redis_client import with_ca

        if addr.redis is None:
            fail("--redis-ca needs --redis-url (a rediss:// URL of an existing Redis)", EXIT_USAGE)
        try:
            addr.redis = with_ca(addr.redis, redis_ca)
        except EventBusError as exc:
            fail(str(exc), EXIT_USAGE)
    with out.status("starting the EventBus stack..."):
        try:
            stack = stack_up(
                home(),
                ray_address=addr.ray,
                kafka_bootstrap=addr.kafka,
                redis_url=addr.redis,
                num_cpus=num_cpus,
                gateway=gateway,
                http_port=http_port,
                grpc_port=grpc_port,
                redis_maxmemory=redis_maxmemory,
                broker=broker,
                labels=node_labels,
                kafka_client=addr.kafka_client.model_dump(mode="json", exclude_defaults=True)
                if addr.kafka_client is not None
                else None,
            )
        except EventBusError as exc:
            fail(str(exc))
    _print_stack(stack_status(home()))
    for line in stack.moved:
        err.print("[yellow]note:[/yellow] ", end="")
        plain(err, line)
    _restore_pipelines(Addresses(ray_address, kafka_bootstrap, redis_url, kafka_config))


def _labels(given: list[str]) -> dict[str, str]:
    """``--labels`` as a dict; a malformed one fails with the usage exit code."""
    import re

    from eventbus.pipelines._placement_config import LABEL_KEY

    labels: dict[str, str] = {}
    for item in (part.strip() for arg in given for part in arg.split(",")):
        key, eq, value = item.partition("=")
        if (
            not eq
            or not re.match(LABEL_KEY, key)
            or not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,62}", value)
        ):
            fail(
                f"--labels {item!r}: give KEY=VALUE (letters, digits, '-', '_', '.'), e.g. "
                "--labels zone=eu-1",
                EXIT_USAGE,
            )
        labels[key] = value
    return labels


def _restore_pipelines(addr: Addresses) -> None:
    """After a full restart: the pipelines Redis still holds are deployed again (the
    controller restores them when it starts), before `up` returns."""
    import redis

    from eventbus._internal.redis_client import connect, explain

    addr.fill_from_stack(("ray", "kafka", "redis"))
    try:
        stored = connect(addr.redis or "").hlen(keys.PIPELINES)
    except redis.RedisError as exc:
        fail(f"cannot read the pipelines: {explain(addr.redis or '', exc)}")
    if not stored:
        return
    with out.status(f"restoring {stored} pipeline(s) from Redis..."):
        rows = controller_client(addr).list()
    running = [r["name"] for r in rows if r["status"] == "RUNNING"]
    out.print(f"restored {len(running)} of {len(rows)} pipeline(s): {', '.join(running) or '-'}")


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
    read_token_file: Path | None = typer.Option(
        None,
        help="Require the bearer token in this file (or $EVENTBUS_READ_TOKEN; the admin token works too) for /metrics, /v1/stats, /v1/pipelines and /dashboard (a browser opens /dashboard?token=TOKEN once).",
    ),
    allowed_origin: list[str] | None = typer.Option(
        None,
        "--allowed-origin",
        help="A web origin (https://shop.example) whose pages may POST to the gateway; repeat for several. Browser requests from other origins get 403.",
    ),
) -> None:
    """Run the HTTP/gRPC gateway in the foreground (one per node; `eventbus up` starts one).

    It also serves /metrics (Prometheus), /dashboard, /v1/pipelines/NAME/stats and the
    Confluent-compatible schema registry at /registry.
    """
    if log_format not in ("text", "json"):
        fail(f"--log-format is {log_format!r}; use text or json", EXIT_USAGE)
    otlp_endpoint = otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None
    addr = Addresses(ray_address, kafka_bootstrap, redis_url)
    addr.fill_from_stack(("kafka", "redis"))
    os.environ.update(addr.ray_env)
    if admin_token_file is not None:
        os.environ["EVENTBUS_ADMIN_TOKEN_FILE"] = str(admin_token_file)
    if read_token_file is not None:
        os.environ["EVENTBUS_READ_TOKEN_FILE"] = str(read_token_file)
    # Serve's router on the gateway's own loop, not a second thread's: a sync call is a few
    # hops shorter. Read when Ray Serve is first imported (by the import below).
    os.environ.setdefault("RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP", "0")
    from eventbus.gateway._server import run_gateway

    def ready(gw: Any) -> None:
        grpc = f", gRPC on {gw.host}:{gw.grpc_port}" if gw.grpc_port else ""
        plain(err, f"gateway: HTTP on http://{gw.host}:{gw.http_port}{grpc}")

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
            allowed_origins=allowed_origin or (),
            kafka_client=addr.kafka_client,
        )
    except (EventBusError, OSError) as exc:
        fail(f"the gateway stopped: {exc}")


def join(
    head: str = typer.Argument(..., help="The Ray head's address, HOST:PORT (its `ray_address`)."),
    token_file: Path = typer.Option(
        ...,
        "--token-file",
        help="The head's Ray token: its $EVENTBUS_HOME/ray_auth_token, copied to this host.",
    ),
    node_ip: str | None = typer.Option(
        None, "--node-ip-address", help="This host's address the others reach it at."
    ),
    num_cpus: int | None = typer.Option(None, help="CPUs this node offers (default: all)."),
    labels: list[str] = typer.Option(
        [],
        "--labels",
        help="A Ray node label, KEY=VALUE (repeat, or comma-separated): pipelines pick "
        "nodes by them (serving.placement.node_labels).",
    ),
) -> None:
    """Join this host to a cluster whose head runs elsewhere, as a Ray worker node (`eventbus down` stops it)."""
    from eventbus._internal.ray_join import join_ray

    if ":" not in head or not head.rsplit(":", 1)[1].isdigit():
        fail(f"HEAD {head!r}: give the head's HOST:PORT (`eventbus url ray` there)", EXIT_USAGE)
    node_labels = _labels(labels)
    with out.status(f"joining {head}..."):
        try:
            join_ray(home(), head, token_file, node_ip, num_cpus, node_labels)
        except EventBusError as exc:
            fail(str(exc))
    shown = ", ".join(f"{k}={v}" for k, v in node_labels.items())
    out.print(f"joined {head} as a worker node" + (f" (labels {shown})" if shown else ""))


def down() -> None:
    """Stop what `eventbus up` (or `eventbus join`) started here (nothing that it adopted)."""
    from eventbus._internal.ray_join import leave_ray
    from eventbus._internal.stack import stack_down

    stopped = stack_down(home())
    if leave_ray(home()):
        stopped.append("ray node")
    out.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing to stop")


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

    st = stack_status(home())
    if as_json and name is None:
        print(json.dumps(st))
        raise typer.Exit(0 if st["healthy"] else 1)
    if name is None:
        _print_stack(st)
        if not st["healthy"] and not (ray_address or os.environ.get(RAY_ADDRESS_ENV)):
            raise typer.Exit(1)
        rows = reader(Addresses(ray_address, kafka_bootstrap, redis_url)).list()
        print_pipelines(rows)
        return
    try:
        info = reader(Addresses(ray_address, kafka_bootstrap, redis_url)).status(name)
    except EventBusError as exc:
        fail(str(exc))
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
