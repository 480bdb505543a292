"""``eventbus keeper``: register clusters, deploy a pipeline to each, set traffic weights.

``import eventbus.cli`` stays free of Ray: :mod:`eventbus.serving` (which imports Ray and Serve,
3 s) is imported when a command runs. The registry's location comes from ``--keeper-redis`` or
the environment variable ``EVENTBUS_KEEPER_REDIS`` (read here, at the CLI edge): a ``redis://``
URL or a file. Exit codes: 0 ok, 1 invalid input or a failed deploy, 2 usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from eventbus.cli._common import EXIT_USAGE, fail, out
from eventbus.errors import EventBusError

if TYPE_CHECKING:
    from eventbus.serving._keeper import Keeper

__all__ = ["register"]

KEEPER_REDIS_ENV = "EVENTBUS_KEEPER_REDIS"

keeper_app = typer.Typer(
    name="keeper",
    help="Several clusters: register them, deploy a pipeline to each, set their traffic weights.",
    no_args_is_help=True,
)

KeeperOpt = typer.Option(
    None,
    "--keeper-redis",
    envvar=KEEPER_REDIS_ENV,
    help="Where the registry lives: redis://host:port/db (key eventbus:keeper:clusters) or a JSON file path.",
)


def register(app: typer.Typer) -> None:
    """Add the ``keeper`` group to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.add_typer(keeper_app, name="keeper")


def _keeper(location: str | None) -> Keeper:
    if not location:
        fail(
            f"no keeper registry: pass --keeper-redis redis://host:port/db (or a file path), or set {KEEPER_REDIS_ENV}",
            EXIT_USAGE,
        )
    from eventbus.serving._keeper import Keeper

    return Keeper(location)


@keeper_app.command("add")
def add(
    name: str = typer.Argument(..., help="The cluster's name (letters, digits, '-', '_')."),
    gateway: str | None = typer.Option(
        None, "--gateway", help="HTTP base URL of its gateway (default: from --home)."
    ),
    grpc: str | None = typer.Option(
        None, "--grpc", help="host:port of its gateway's gRPC service (default: from --home)."
    ),
    home: Path | None = typer.Option(
        None,
        "--home",
        help="An EVENTBUS_HOME whose stack.json describes the cluster (`eventbus up`).",
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="Its Ray address (for deploys)."
    ),
    kafka_bootstrap: str | None = typer.Option(
        None, "--kafka-bootstrap", help="Its Kafka bootstrap servers (for deploys)."
    ),
    redis_url: str | None = typer.Option(None, "--redis-url", help="Its Redis URL (for deploys)."),
    ray_token_file: str | None = typer.Option(
        None, "--ray-token-file", help="Its Ray auth token file (for deploys)."
    ),
    kafka_config: Path | None = typer.Option(
        None,
        "--kafka-config",
        help="Its Kafka connection settings file (TLS, SASL; secrets by reference), for deploys.",
    ),
    weight: int = typer.Option(
        100,
        "--weight",
        min=0,
        help="Relative share of the traffic (0: none while the others answer).",
    ),
    local: bool = typer.Option(
        False, "--local/--no-local", help="Clients prefer this cluster while its weight is above 0."
    ),
    keeper_redis: str | None = KeeperOpt,
) -> None:
    """Register a cluster (or replace the one of the same name)."""
    keeper = _keeper(keeper_redis)
    from eventbus._client._registry import ClusterInfo
    from eventbus.serving._keeper import cluster_from_home

    given: dict[str, Any] = {
        "gateway": gateway,
        "grpc": grpc,
        "ray_address": ray_address,
        "kafka": kafka_bootstrap,
        "redis": redis_url,
        "ray_token_file": ray_token_file,
        "kafka_config": _checked_kafka_config(kafka_config),
        "weight": weight,
        "local": local,
    }
    try:
        if home is not None:
            cluster = cluster_from_home(name, home, **given)
        else:
            cluster = ClusterInfo(name=name, **{k: v for k, v in given.items() if v is not None})
        new = keeper.add(cluster)
    except EventBusError as exc:
        fail(str(exc))
    out.print(
        f"{'added' if new else 'updated'} cluster {name}: gateway {cluster.gateway or '-'}, gRPC {cluster.grpc or '-'}, weight {cluster.weight}",
        highlight=False,
    )


def _checked_kafka_config(path: Path | None) -> str | None:
    """The absolute path of a valid Kafka config file (checked now, not at the first deploy)."""
    if path is None:
        return None
    from eventbus.eventing._kafka_client import load_kafka_client_config

    try:
        load_kafka_client_config(path)
    except EventBusError as exc:
        fail(str(exc))
    return str(path.resolve())


@keeper_app.command("list")
def list_(
    keeper_redis: str | None = KeeperOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the registry as JSON."),
) -> None:
    """Show the registered clusters and their weights."""
    keeper = _keeper(keeper_redis)
    try:
        clusters = keeper.clusters()
    except EventBusError as exc:
        fail(str(exc))
    if as_json:
        from eventbus._client._registry import dump_registry

        print(dump_registry(clusters))
        return
    if not clusters:
        out.print("no clusters registered; add one with `eventbus keeper add NAME --home DIR`")
        return
    total = sum(c.weight for c in clusters) or 1
    table = Table(title=f"Clusters ({keeper.location})")
    for col in ("name", "gateway", "gRPC", "weight", "share", "local", "Ray"):
        table.add_column(col)
    for c in clusters:
        table.add_row(
            c.name,
            c.gateway or "-",
            c.grpc or "-",
            str(c.weight),
            f"{100 * c.weight / total:.0f}%",
            "yes" if c.local else "",
            c.ray_address or "-",
        )
    out.print(table)


@keeper_app.command("weight")
def weight(
    name: str = typer.Argument(..., help="The cluster."),
    value: int = typer.Argument(
        ..., min=0, help="Its new weight (blue-green: 100 and 0; canary: e.g. 90 and 10)."
    ),
    keeper_redis: str | None = KeeperOpt,
) -> None:
    """Set a cluster's traffic weight (clients pick it up within their refresh period)."""
    keeper = _keeper(keeper_redis)
    try:
        clusters = keeper.set_weights({name: value})
    except EventBusError as exc:
        fail(str(exc))
    total = sum(c.weight for c in clusters) or 1
    out.print(
        "weights: "
        + ", ".join(f"{c.name} {c.weight} ({100 * c.weight / total:.0f}%)" for c in clusters),
        highlight=False,
    )


@keeper_app.command("deploy")
def deploy(
    file: Path = typer.Argument(..., help="Pipeline YAML file."),
    cluster: list[str] | None = typer.Option(
        None, "--cluster", help="Only this cluster (repeatable; default: all)."
    ),
    keeper_redis: str | None = KeeperOpt,
) -> None:
    """Deploy (or redeploy) a pipeline to every registered cluster, one after the other."""
    keeper = _keeper(keeper_redis)
    from eventbus.serving._keeper import deploy_failed

    try:
        with out.status(f"deploying {file}..."):
            results = keeper.deploy(file, cluster or None)
    except EventBusError as exc:
        fail(str(exc))
    for r in results:
        mark = "[green]ok[/green]" if r.ok else "[red]failed[/red]"
        out.print(f"{r.cluster}: {mark}", end=" ")
        out.print(r.output.splitlines()[-1] if r.output else "", markup=False, highlight=False)
    failed = deploy_failed(results)
    if failed is not None:
        fail(f"the deploy failed on: {failed}")


@keeper_app.command("remove")
def remove(
    name: str = typer.Argument(..., help="The cluster."),
    keeper_redis: str | None = KeeperOpt,
) -> None:
    """Unregister a cluster (its pipelines keep running; clients stop sending to it)."""
    keeper = _keeper(keeper_redis)
    try:
        keeper.remove(name)
    except EventBusError as exc:
        fail(str(exc))
    out.print(f"removed cluster {name}")
