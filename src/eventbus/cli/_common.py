"""What the command groups share: the stack's addresses, consoles and rendering, exit codes.

Environment variables are read here, at the CLI edge, and nowhere in the library:
``EVENTBUS_HOME`` (state, default ``~/.eventbus``), ``RAY_ADDRESS``,
``EVENTBUS_KAFKA_BOOTSTRAP``, ``EVENTBUS_REDIS_URL``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # importing eventbus.serving imports Ray: only when a command runs
    from rich.progress import Progress

    from eventbus.eventing._kafka_client import KafkaClientConfig
    from eventbus.serving import EventBusClient

__all__ = [
    "EXIT_FAILED",
    "EXIT_USAGE",
    "HOME_ENV",
    "KAFKA_BOOTSTRAP_ENV",
    "RAY_ADDRESS_ENV",
    "REDIS_URL_ENV",
    "Addresses",
    "KafkaOpt",
    "RayOpt",
    "RedisOpt",
    "controller_client",
    "err",
    "fail",
    "home",
    "out",
    "plain",
    "print_pipelines",
    "working",
]

EXIT_FAILED = 1
"""Invalid input, a failed test or a failed operation."""
EXIT_USAGE = 2
"""A usage error (click exits 2 on its own for unknown verbs and missing arguments)."""

HOME_ENV = "EVENTBUS_HOME"
RAY_ADDRESS_ENV = "RAY_ADDRESS"
KAFKA_BOOTSTRAP_ENV = "EVENTBUS_KAFKA_BOOTSTRAP"
REDIS_URL_ENV = "EVENTBUS_REDIS_URL"
KAFKA_CONFIG_ENV = "EVENTBUS_KAFKA_CONFIG"

out = Console()
err = Console(stderr=True)

RayOpt: Any = typer.Option(None, "--ray-address", help="Ray cluster address (host:port).")
KafkaOpt: Any = typer.Option(None, "--kafka-bootstrap", help="Kafka bootstrap servers.")
RedisOpt: Any = typer.Option(
    None,
    "--redis-url",
    help="Redis URL: redis://[USER:PASSWORD@]HOST:PORT/DB, rediss://... (TLS; "
    "?ssl_ca_certs=CA.pem), redis+cluster://HOST:PORT (Redis Cluster).",
)
KafkaConfigOpt: Any = typer.Option(
    None,
    "--kafka-config",
    help="YAML/JSON file of Kafka connection settings (security_protocol, TLS files, SASL; "
    "secrets by reference). Default: $EVENTBUS_KAFKA_CONFIG, else the recorded stack's.",
)


def plain(console: Console, text: str) -> None:
    """Print ``text`` as is: no markup, no highlighting, no wrapping.

    Args:
        console: ``out`` or ``err``.
        text: The text; may contain brackets (YAML paths, JSON) that rich must not parse.
    """
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``.

    Args:
        message: What went wrong and how to fix it.
        code: ``EXIT_FAILED`` (1) or ``EXIT_USAGE`` (2).

    Raises:
        typer.Exit: Always.
    """
    err.print("[red]error:[/red] ", end="")
    plain(err, message)
    raise typer.Exit(code)


def working(description: str) -> Progress:
    """A transient spinner with the elapsed time on stderr, for one long blocking call.

    Deploys and rollbacks are one Ray call in which the controller does every phase, so
    there is no finer progress to show.

    Args:
        description: What is being done.

    Returns:
        A ``Progress`` to use as a context manager around the call.
    """
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


def home() -> Path:
    """The folder of the CLI's state (the recorded stack): ``$EVENTBUS_HOME`` or ``~/.eventbus``."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".eventbus")


class Addresses:
    """The stack's addresses: from the options, else the environment, else the recorded stack.

    Args:
        ray: ``--ray-address`` (else ``$RAY_ADDRESS``).
        kafka: ``--kafka-bootstrap`` (else ``$EVENTBUS_KAFKA_BOOTSTRAP``).
        redis: ``--redis-url`` (else ``$EVENTBUS_REDIS_URL``).
        kafka_config: ``--kafka-config`` (else ``$EVENTBUS_KAFKA_CONFIG``): the Kafka
            connection settings; else the recorded stack's; else plaintext.

    Raises:
        typer.Exit: (1) the Kafka config file is unreadable or invalid.
    """

    def __init__(
        self,
        ray: str | None,
        kafka: str | None,
        redis: str | None,
        kafka_config: Path | None = None,
    ) -> None:
        from eventbus.errors import EventBusError
        from eventbus.eventing._kafka_client import load_kafka_client_config

        self.ray = ray or os.environ.get(RAY_ADDRESS_ENV) or None
        self.kafka = kafka or os.environ.get(KAFKA_BOOTSTRAP_ENV) or None
        self.redis = redis or os.environ.get(REDIS_URL_ENV) or None
        self.ray_env: dict[str, str] = {}
        config_path = kafka_config or os.environ.get(KAFKA_CONFIG_ENV) or None
        self.kafka_client: KafkaClientConfig | None = None
        if config_path:
            try:
                self.kafka_client = load_kafka_client_config(config_path)
            except EventBusError as exc:
                fail(str(exc))

    def fill_from_stack(self, need: tuple[str, ...]) -> None:
        """Fill the addresses not given from the stack recorded by ``eventbus up``.

        Args:
            need: The addresses the command needs, of ``"ray"``, ``"kafka"``, ``"redis"``.

        Raises:
            typer.Exit: (1) when one of ``need`` is still unknown.
        """
        from eventbus._internal.stack import load_stack

        stack = load_stack(home())
        if stack is not None:
            if self.ray is None or self.ray == stack.ray_address:
                self.ray_env = stack.ray_env()
            self.ray = self.ray or stack.ray_address
            self.kafka = self.kafka or stack.kafka_bootstrap
            self.redis = self.redis or stack.redis_url
            if self.kafka_client is None and stack.kafka_client:
                from eventbus.eventing._kafka_client import KafkaClientConfig

                self.kafka_client = KafkaClientConfig.model_validate(stack.kafka_client)
        if self.redis is not None:  # {secret: NAME} in the Kafka settings (tail, publish)
            from eventbus._internal.secret_store import configure

            configure(self.redis)
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            fail(
                f"no {', '.join(missing)} address: no stack is recorded in {home()}; start one with "
                "`eventbus up`, or pass --ray-address/--kafka-bootstrap/--redis-url "
                f"(or set {RAY_ADDRESS_ENV}, {KAFKA_BOOTSTRAP_ENV}, {REDIS_URL_ENV})"
            )


def controller_client(addr: Addresses) -> EventBusClient:
    """Connect to the stack's controller (the driver-side client; imports Ray).

    Args:
        addr: The addresses; the missing ones are filled from the recorded stack.

    Returns:
        The connected client.

    Raises:
        typer.Exit: (1) when an address is unknown or Ray cannot be reached.
    """
    addr.fill_from_stack(("ray", "kafka", "redis"))
    os.environ.update(addr.ray_env)  # before Ray is imported: it reads its auth settings then
    from eventbus.serving import EventBusClient

    try:
        return EventBusClient(
            addr.ray,
            addr.kafka or "",
            addr.redis or "",
            ray_env=addr.ray_env,
            kafka_client=addr.kafka_client,
        )
    except ConnectionError as exc:
        fail(
            f"cannot reach the Ray cluster at {addr.ray}: {exc}; is the stack up (`eventbus status`)?"
        )


def print_pipelines(rows: list[dict[str, Any]]) -> None:
    """Print the deployed pipelines as a table (``eventbus list``, ``eventbus status``).

    Args:
        rows: The controller's list: name, version, status, sources, steps.
    """
    table = Table(title="Pipelines")
    for col in ("name", "version", "status", "sources", "steps"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], str(r["version"]), r["status"], str(r["sources"]), str(r["steps"]))
    out.print(table if rows else "no pipelines deployed")
