"""Pipelines on the stack: ``eventbus validate``, ``deploy``, ``delete``, ``get``, ``versions``,
``promote``, ``canary``, ``rollback``, ``list``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from eventbus.cli._common import (
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
    print_pipelines,
    working,
)
from eventbus.cli._reader import reader
from eventbus.errors import EventBusError, PipelineConfigError

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add this group's commands to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.command()(validate)
    app.command()(deploy)
    app.command()(delete)
    app.command()(get)
    app.command()(versions)
    app.command()(promote)
    app.command("canary")(canary_)
    app.command()(rollback)
    app.command("list")(list_)


def validate(
    files: list[Path] = typer.Argument(..., help="Pipeline YAML files."),
    kafka_config: Path | None = KafkaConfigOpt,
    check_topics: bool = typer.Option(
        False,
        "--check-topics",
        help="Also check that every Kafka topic exists (or says create:) on its cluster: "
        "the stack's (--kafka-bootstrap, $EVENTBUS_KAFKA_BOOTSTRAP, the recorded stack) or "
        "the one a component names. Without it validate never contacts a cluster; deploy "
        "always checks.",
    ),
    kafka_bootstrap: str | None = KafkaOpt,
) -> None:
    """Check pipeline files; print every problem as file:line:col: path: message.

    Also checks that the Kafka connection settings' secret references (the stack's, from
    --kafka-config or $EVENTBUS_KAFKA_CONFIG, and each source's and sink's ``client``) resolve
    here, and names each one that does not (never a secret's value).
    """
    from eventbus.eventing._kafka_client import kafka_client_problems
    from eventbus.pipelines._loader import validate_pipeline_text

    bad = False
    stack_client = Addresses(None, None, None, kafka_config).kafka_client
    for line in kafka_client_problems(stack_client, "kafka config"):
        plain(err, line)
        bad = True
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as exc:
            err.print(f"{f}:1:1: file: cannot read ({exc.strerror})", highlight=False)
            bad = True
            continue
        sys.path.insert(0, str(f.resolve().parent))
        try:
            config, problems = validate_pipeline_text(text, str(f))
        finally:
            sys.path.remove(str(f.resolve().parent))
        for p in problems:
            plain(err, str(p))
        client_problems = _kafka_client_problems(config) if config is not None else []
        for line in client_problems:
            plain(err, f"{f}: {line}")
        if check_topics and config is not None and not client_problems:
            client_problems = _missing_topics(config, kafka_bootstrap, kafka_config)
            for line in client_problems:
                plain(err, f"{f}: {line}")
        if problems or client_problems:
            bad = True
        else:
            out.print(f"{f}: ok", highlight=False)
        if config is not None:
            from eventbus.serving._secret_check import deprecated_spellings

            for notice in deprecated_spellings(config):
                plain(err, f"{f}: warning: {notice}")
    if bad:
        raise typer.Exit(1)


def _kafka_client_problems(config: Any) -> list[str]:
    """Unresolvable secret references and unreadable files of the pipeline's Kafka clients."""
    from eventbus.eventing._kafka_client import kafka_client_problems

    spec = config.spec
    lines: list[str] = []
    for i, src in enumerate(spec.sources):
        if src.kafka is not None:
            lines += kafka_client_problems(src.kafka.client, f"spec.sources[{i}].kafka.client")
    for name, sink in spec.output_paths().items():
        if sink.kafka is not None:
            lines += kafka_client_problems(sink.kafka.client, f"spec.{name}.kafka.client")
    return lines


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
    kafka_config: Path | None = KafkaConfigOpt,
) -> None:
    """Validate and deploy (or redeploy) a pipeline, at once or as a canary."""
    client = controller_client(Addresses(ray_address, kafka_bootstrap, redis_url, kafka_config))
    try:
        if canary is not None:
            weights = sorted({canary, *(w for w in (50, 100) if w > canary)})
            with working(
                f"starting a canary of {file}: validate, push models, start the canary steps on the replicas..."
            ):
                info = client.deploy(file, canary=weights, step_s=step_seconds)
            out.print(
                f"canary of [bold]{info['name']}[/bold] version {info['canary_version']} on {info['weight']}% of the events; "
                f"steps {', '.join(f'{w}%' for w in info['weights'])} every {step_seconds:g} s (`eventbus canary {info['name']}`)"
            )
            return
        with working(
            f"deploying {file}: validate, push models, start the Serve application and sources..."
        ):
            info = client.deploy(file)
    except PipelineConfigError as exc:
        for p in exc.problems:
            plain(err, p)
        raise typer.Exit(1) from None
    except EventBusError as exc:
        fail(str(exc).splitlines()[-1] if str(exc) else type(exc).__name__)
    out.print(
        f"deployed [bold]{info['name']}[/bold] version {info['version']} ({info['sources']} source(s), {info['steps']} step(s))"
    )
    for notice in info.get("notices", []):
        plain(err, f"{file}: warning: {notice}")


def delete(
    name: str = typer.Argument(..., help="Pipeline name."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Drain and delete a deployed pipeline."""
    try:
        with working(f"deleting {name}: drain the sources, stop the Serve application..."):
            controller_client(Addresses(ray_address, kafka_bootstrap, redis_url)).delete(name)
    except EventBusError as exc:
        fail(str(exc))
    out.print(f"deleted {name}")


def get(
    name: str = typer.Argument(..., help="Pipeline name."),
    as_json: bool = typer.Option(
        False, "--json", help="The stored record as JSON instead of the YAML."
    ),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Print a deployed pipeline's YAML (as deployed), or its stored record; the delivery
    guarantee it runs goes to stderr as a YAML comment (``guarantee`` in the JSON), so the YAML
    on stdout stays the deployable file."""
    try:
        record = reader(Addresses(ray_address, kafka_bootstrap, redis_url)).get(name)
    except EventBusError as exc:
        fail(str(exc))
    guarantee = delivery_guarantee(record["yaml"])
    if as_json:
        shown = {k: v for k, v in record.items() if k != "python_path"}
        sys.stdout.write(json.dumps({**shown, "guarantee": guarantee}) + "\n")
        return
    sys.stdout.write(record["yaml"] if record["yaml"].endswith("\n") else record["yaml"] + "\n")
    sys.stderr.write(f"# delivery guarantee: {guarantee}\n")


def delivery_guarantee(text: str) -> str:
    """The delivery guarantee a pipeline document asks for, in words: ``at_least_once``,
    ``at_least_once + dedupe`` (effectively once at the sink) or ``exactly_once``."""
    import yaml

    try:
        doc = yaml.safe_load(text)
        delivery = (doc.get("spec") or {}).get("delivery") or {}
    except (yaml.YAMLError, AttributeError):
        return "unknown (the stored YAML does not parse)"
    guarantee = str(delivery.get("guarantee", "at_least_once"))
    if guarantee == "at_least_once" and delivery.get("dedupe") is not None:
        return "at_least_once + dedupe"
    return guarantee


def versions(
    name: str = typer.Argument(..., help="Pipeline name."),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of a table."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """List a pipeline's kept versions (the serving one marked)."""
    addr = Addresses(ray_address, kafka_bootstrap, redis_url)
    try:
        rows = reader(addr).versions(name)
    except EventBusError as exc:
        fail(str(exc))
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


def promote(
    name: str = typer.Argument(..., help="Pipeline name."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Make a pipeline's running canary its serving version now."""
    try:
        info = controller_client(Addresses(ray_address, kafka_bootstrap, redis_url)).promote(name)
    except EventBusError as exc:
        fail(str(exc))
    out.print(f"promoted {name}: version {info['version']} serves")


def canary_(
    name: str = typer.Argument(..., help="Pipeline name."),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of text."),
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Show a pipeline's canary: its share, steps and verdicts, or how the last one ended."""
    try:
        state = controller_client(Addresses(ray_address, kafka_bootstrap, redis_url)).canary(name)
    except EventBusError as exc:
        fail(str(exc))
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
    addr = Addresses(ray_address, kafka_bootstrap, redis_url)
    try:
        with working(
            f"rolling back {name}: end the canary, or deploy the earlier version again..."
        ):
            info = controller_client(addr).rollback(name, to)
    except EventBusError as exc:
        fail(str(exc))
    if "canary_rolled_back" in info:
        out.print(
            f"rolled back the canary of {name} (version {info['canary_rolled_back']}); version {info['version']} serves"
        )
        return
    out.print(
        f"rolled back {name}: version {info['version']} serves the YAML of version {info['rollback_of']}"
    )


def list_(
    ray_address: str | None = RayOpt,
    kafka_bootstrap: str | None = KafkaOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """List the deployed pipelines."""
    print_pipelines(reader(Addresses(ray_address, kafka_bootstrap, redis_url)).list())


def _missing_topics(
    config: Any, kafka_bootstrap: str | None, kafka_config: Path | None
) -> list[str]:
    """``validate --check-topics``: the pipeline's missing topics (nothing is created)."""
    from eventbus.serving._topic_checks import topic_problems

    addr = Addresses(None, kafka_bootstrap, None, kafka_config)
    addr.fill_from_stack(("kafka",))
    try:
        problems, _ = topic_problems(config, addr.kafka or "", addr.kafka_client)
    except EventBusError as exc:
        return [str(exc)]
    return problems
