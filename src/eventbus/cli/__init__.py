"""The ``eventbus`` command line: a thin shell over the public API.

One module per command group; each has a ``register(app)`` that adds its commands, and
``_GROUPS`` below is the one place the groups are listed (a new group is a module and a line).
What the groups share (the stack's addresses, consoles, rendering, exit codes) is in
:mod:`eventbus.cli._common`.

Exit codes: 0 ok, 1 invalid input or a failed test/operation, 2 usage. Environment variables
are read here only: ``EVENTBUS_HOME`` (state, default ``~/.eventbus``), ``RAY_ADDRESS``,
``EVENTBUS_KAFKA_BOOTSTRAP``, ``EVENTBUS_REDIS_URL``, ``EVENTBUS_KEEPER_REDIS``.
Importing this package imports neither Ray nor torch; a command imports what it needs when it runs.
"""

from __future__ import annotations

import typer

from eventbus.cli import (
    _authoring,
    _events,
    _keeper,
    _models,
    _pipelines,
    _plugins,
    _registry,
    _secrets,
    _solve,
    _stack,
    _topics,
    _where,
)

__all__ = ["app", "main"]

app = typer.Typer(
    name="eventbus",
    help="EventBus: event-driven serverless pipelines on Ray Serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# the order of the commands in `eventbus --help`
_GROUPS = (
    _stack,
    _where,
    _pipelines,
    _secrets,
    _authoring,
    _plugins,
    _events,
    _topics,
    _registry,
    _solve,
    _keeper,
    _models,
)
for _group in _GROUPS:
    _group.register(app)


def main() -> None:
    """Run the ``eventbus`` command (the entry point of the ``eventbus`` script).

    Example:
        >>> from eventbus.cli import main
        >>> main()  # doctest: +SKIP
    """
    app()
