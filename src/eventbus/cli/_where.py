"""Where the stack is: ``eventbus url gateway|dashboard|...`` and ``eventbus logs WHAT``."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from eventbus.cli._common import EXIT_USAGE, err, fail, home, out, plain

if TYPE_CHECKING:
    from eventbus._internal.stack import Stack

__all__ = ["register"]

#: ``eventbus url`` targets: what each prints.
URL_TARGETS = {
    "gateway": "the gateway's HTTP base URL",
    "dashboard": "the dashboard page",
    "metrics": "the Prometheus metrics endpoint",
    "grpc": "the gateway's gRPC address (host:port)",
    "registry": "the schema registry (Confluent-compatible) the gateway serves",
    "kafka": "the Kafka bootstrap servers",
    "ray": "the Ray cluster's address",
}

_PIPELINE_NAME = re.compile(r"[a-z][a-z0-9-]{0,47}")
_URL_HELP = "One of: " + ", ".join(f"{k} ({v})" for k, v in URL_TARGETS.items())


def register(app: typer.Typer) -> None:
    """Add ``url`` and ``logs`` to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.command()(url)
    app.command()(logs)


def _stack() -> Stack:
    from eventbus._internal.stack import load_stack

    stack = load_stack(home())
    if stack is None:
        fail(f"no stack is recorded in {home()}; start one with `eventbus up`")
    return stack


def url(
    what: str = typer.Argument("gateway", help=_URL_HELP),
) -> None:
    """Print an address of the running stack, for scripts: curl "$(eventbus url gateway)/..."."""
    if what not in URL_TARGETS:
        import difflib

        close = difflib.get_close_matches(what, list(URL_TARGETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        fail(f"unknown address {what!r}{hint}; use one of: {', '.join(URL_TARGETS)}", EXIT_USAGE)
    stack = _stack()
    if what in ("gateway", "dashboard", "metrics", "grpc", "registry") and not stack.gateway_http:
        fail(
            f"the stack recorded in {home()} runs no gateway (it was started with --no-gateway); "
            "start one with `eventbus gateway`, or `eventbus down` and `eventbus up`"
        )
    value = {
        "gateway": stack.gateway_http,
        "dashboard": f"{stack.gateway_http}/dashboard",
        "metrics": f"{stack.gateway_http}/metrics",
        "registry": f"{stack.gateway_http}/registry",
        "grpc": stack.gateway_grpc,
        "kafka": stack.kafka_bootstrap,
        "ray": stack.ray_address,
    }[what]
    plain(out, str(value))


def logs(
    what: str = typer.Argument(..., help="gateway, controller, or a pipeline's name."),
    lines: int = typer.Option(50, "--lines", "-n", min=1, max=100_000, help="Lines per file."),
    files: bool = typer.Option(False, "--files", help="Only print the log files' paths."),
    ray_logs: Path | None = typer.Option(
        None,
        "--ray-logs",
        help="The Ray session's log folder (default: the one of the Ray head `eventbus up` "
        "started, else the local default session's).",
    ),
) -> None:
    """Show the last lines of the gateway's, the controller's or a pipeline's replicas' logs."""
    from eventbus._internal.logs import actor_logs, pipeline_logs, session_logs, tail_lines
    from eventbus._internal.stack import load_stack

    if what not in ("gateway", "controller") and not _PIPELINE_NAME.fullmatch(what):
        shown = what if len(what) <= 60 else what[:60] + "..."
        fail(
            f"{shown!r} is neither gateway, controller nor a pipeline name (pipeline names "
            "match ^[a-z][a-z0-9-]{0,47}$; `eventbus list` shows them)",
            EXIT_USAGE,
        )
    stack = load_stack(home())
    if what == "gateway":
        gw = stack.owned.get("gateway") if stack is not None else None
        if gw is None:
            fail(
                f"no gateway started by `eventbus up` is recorded in {home()}; a gateway started "
                "with `eventbus gateway` logs to its own terminal (or where its output goes)"
            )
        paths = [Path(gw["log"])]
    else:
        if ray_logs is None:
            ray_part = stack.owned.get("ray") if stack is not None else None
            temp = ray_part["temp_dir"] if ray_part else str(Path(tempfile.gettempdir()) / "ray")
            ray_logs = session_logs(temp)
        if not ray_logs.is_dir():
            fail(
                f"no Ray session logs at {ray_logs}: the Ray cluster was not started here; read "
                "them on its head node (`ray logs`), or pass --ray-logs DIR"
            )
        if what == "controller":
            paths = actor_logs(ray_logs, "Controller")[:1]
        else:
            paths = pipeline_logs(ray_logs, f"eventbus-{what}")[:4]
            if not paths and _shared_host(stack, ray_logs, what, lines, files):
                return
        if not paths:
            who = "the controller" if what == "controller" else f"pipeline {what!r}"
            hint = "" if what == "controller" else " (is it deployed? `eventbus list`)"
            fail(f"no log of {who} under {ray_logs}{hint}")
    for path in paths:
        if files:
            plain(out, str(path))
            continue
        if len(paths) > 1:
            plain(out, f"==> {path} <==")
        try:
            for line in tail_lines(path, lines):
                plain(out, line)
        except OSError as exc:
            fail(f"cannot read {path}: {exc}")


def _host_of(stack: Stack | None, pipeline: str) -> str | None:
    """The shared host ``pipeline`` is a member of, from the stack's records (None: not one,
    or the stack's Redis cannot be asked)."""
    if stack is None:
        return None
    import json

    from redis.exceptions import RedisError

    from eventbus._internal import keys
    from eventbus._internal.redis_client import connect
    from eventbus.errors import ConfigError

    try:
        redis = connect(stack.redis_url, decode_responses=True, socket_timeout=3)
        records = redis.hgetall(keys.HOSTS)
    except (RedisError, OSError, ConfigError):  # a stack that is down: read by the name
        return None
    for host, raw in sorted(records.items()):
        try:
            if pipeline in (json.loads(raw).get("members") or {}):
                return str(host)
        except (ValueError, AttributeError):
            continue
    return None


def _shared_host(
    stack: Stack | None, ray_logs: Path, pipeline: str, lines: int, files: bool
) -> bool:
    """Show ``pipeline``'s lines from the log of the shared host it runs in; False when it
    runs in none (that the stack records, or whose log names it)."""
    from eventbus._internal.logs import host_logs, member_lines

    host = _host_of(stack, pipeline)
    found = host_logs(ray_logs, host)
    shown: dict[str, list[tuple[Path, list[str]]]] = {}
    for name, paths in sorted(found.items()):
        for path in paths[:4]:
            try:
                picked = member_lines(path, pipeline, lines)
            except OSError as exc:
                fail(f"cannot read {path}: {exc}")
            if picked or host is not None:
                shown.setdefault(name, []).append((path, picked))
    if not shown:
        if host is not None:
            fail(
                f"pipeline {pipeline!r} runs in shared host {host!r}, whose replicas have no "
                f"log under {ray_logs} yet (is the host starting? `eventbus status {pipeline}`)"
            )
        return False
    for name, logs in shown.items():
        err.print(
            f"pipeline {pipeline!r} runs in shared host {name!r}: its lines are in the host's "
            "replica logs, shared with the host's other members"
            + ("" if files else f"; showing the lines that name {pipeline!r}"),
            markup=False,
            highlight=False,
        )
        for path, picked in logs:
            if files:
                plain(out, str(path))
                continue
            plain(out, f"==> {path} (shared host {name!r}, lines naming {pipeline!r}) <==")
            if not picked:
                plain(out, f"(no line names {pipeline!r} yet; the whole file is the host's log)")
            for line in picked:
                plain(out, line)
    return True
