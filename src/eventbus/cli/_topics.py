"""Kafka topics of the stack's cluster: ``eventbus topics list``, ``create``, ``delete``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from eventbus.cli._common import Addresses, KafkaConfigOpt, KafkaOpt, fail, out, plain
from eventbus.errors import EventBusError

__all__ = ["register"]

topics_app = typer.Typer(
    name="topics",
    help="Kafka topics of the stack's cluster: list, create, delete. Pipelines refuse missing "
    "topics at deploy unless their YAML says 'create:'.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add the ``topics`` group to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.add_typer(topics_app, name="topics")


def _addr(kafka_bootstrap: str | None, kafka_config: Path | None) -> Addresses:
    addr = Addresses(None, kafka_bootstrap, None, kafka_config)
    addr.fill_from_stack(("kafka",))
    return addr


@topics_app.command("list")
def list_(
    kafka_bootstrap: str | None = KafkaOpt,
    kafka_config: Path | None = KafkaConfigOpt,
    internal: bool = typer.Option(False, "--internal", help="Also Kafka's own (__*) topics."),
) -> None:
    """Print the cluster's topics, one a line."""
    from eventbus.eventing._topics import list_topics

    addr = _addr(kafka_bootstrap, kafka_config)
    try:
        names = asyncio.run(list_topics(addr.kafka or "", addr.kafka_client))
    except EventBusError as exc:
        fail(str(exc))
    for name in sorted(names):
        if internal or not name.startswith("__"):
            plain(out, name)


@topics_app.command()
def create(
    names: list[str] = typer.Argument(..., help="Topic names."),
    partitions: int = typer.Option(1, "--partitions", min=1, max=10_000, help="Partitions."),
    replication_factor: int = typer.Option(
        1, "--replication-factor", min=1, max=32, help="Copies of each partition."
    ),
    kafka_bootstrap: str | None = KafkaOpt,
    kafka_config: Path | None = KafkaConfigOpt,
) -> None:
    """Create topics (existing ones are left as they are)."""
    from eventbus._internal.services import create_topics
    from eventbus.eventing._topics import topic_name_problem

    problems = [p for p in map(topic_name_problem, names) if p]
    if problems:
        fail("; ".join(problems))
    addr = _addr(kafka_bootstrap, kafka_config)
    try:
        asyncio.run(
            create_topics(
                addr.kafka or "",
                names,
                partitions,
                replication_factor=replication_factor,
                client=addr.kafka_client,
            )
        )
    except EventBusError as exc:
        fail(str(exc))
    plain(out, f"created {', '.join(names)} ({partitions} partition(s)) on {addr.kafka}")


@topics_app.command()
def delete(
    names: list[str] = typer.Argument(..., help="Topic names."),
    kafka_bootstrap: str | None = KafkaOpt,
    kafka_config: Path | None = KafkaConfigOpt,
) -> None:
    """Delete topics and their records (pipelines using them turn DEGRADED)."""
    from eventbus.eventing._topics import delete_topics

    addr = _addr(kafka_bootstrap, kafka_config)
    try:
        asyncio.run(delete_topics(addr.kafka or "", names, addr.kafka_client))
    except EventBusError as exc:
        fail(str(exc))
    plain(out, f"deleted {', '.join(names)} on {addr.kafka}")
