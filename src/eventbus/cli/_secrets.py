"""Secrets on the stack: ``eventbus secret set NAME`` (value on stdin or ``--file``),
``eventbus secret list``, ``eventbus secret delete NAME``.

Values are encrypted (Fernet) with the stack's key (``$EVENTBUS_SECRET_KEY``, else
``$EVENTBUS_HOME/secret.key``, created by the first ``set``) and kept in the stack's Redis;
pipelines reference them as ``{secret: NAME}``. Values are never printed or logged.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from eventbus.cli._common import Addresses, RedisOpt, fail, out
from eventbus.errors import EventBusError

__all__ = ["register"]

secret_app = typer.Typer(
    name="secret",
    help="Secrets stored on the stack (encrypted), referenced as {secret: NAME}.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add the ``secret`` group to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.add_typer(secret_app)


def _store(redis_url: str | None, *, key: bool, create: bool = False) -> Any:
    from eventbus._internal.redis_client import connect, explain
    from eventbus._internal.secret_store import SecretStore, load_key

    addresses = Addresses(None, None, redis_url)
    addresses.fill_from_stack(("redis",))
    assert addresses.redis is not None
    try:
        k = load_key(create=create) if key else None
        client = connect(addresses.redis)
        client.ping()
    except EventBusError as e:
        fail(str(e))
    except Exception as e:  # noqa: BLE001 - the connection's error, explained
        fail(explain(addresses.redis, e))
    return SecretStore(client, k)


@secret_app.command("set")
def set_(
    name: str = typer.Argument(..., help="The secret's name (letters, digits, _ . -)."),
    file: Path | None = typer.Option(
        None, "--file", help="Read the value from this file (else from stdin)."
    ),
    redis_url: str | None = RedisOpt,
) -> None:
    """Store or rotate a secret; gateways and replicas pick it up within seconds."""
    from eventbus._internal.secret_store import MAX_VALUE_BYTES, check_name

    try:
        check_name(name)
    except EventBusError as e:
        fail(str(e))
    if file is not None:
        try:
            value = file.read_bytes()
        except OSError as e:
            fail(f"secret {name!r}: cannot read --file {file} ({e.strerror})")
    else:
        if sys.stdin.isatty():
            out.print(f"value of {name} (end with Ctrl-D):", highlight=False)
        value = sys.stdin.buffer.read(MAX_VALUE_BYTES + 2)
    value = value.rstrip(b"\r\n")  # `echo x | eventbus secret set` stores x
    try:
        existed = _store(redis_url, key=True, create=True).set(name, value)
    except EventBusError as e:
        fail(str(e))
    out.print(f"secret {name} {'rotated' if existed else 'set'}", highlight=False)


@secret_app.command("list")
def list_(redis_url: str | None = RedisOpt) -> None:
    """The stack's secrets: names and when each was last set (never a value)."""
    rows = _store(redis_url, key=False).list()
    if not rows:
        out.print("no secrets (`eventbus secret set NAME` stores one)")
        return
    table = Table("name", "updated")
    for r in rows:
        at = r["updated_at"]
        table.add_row(
            r["name"], time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "?"
        )
    out.print(table)


@secret_app.command("delete")
def delete(
    name: str = typer.Argument(..., help="The secret's name."),
    redis_url: str | None = RedisOpt,
) -> None:
    """Forget a secret (pipelines that reference it stop resolving it)."""
    try:
        removed = _store(redis_url, key=False).delete(name)
    except EventBusError as e:
        fail(str(e))
    if not removed:
        fail(f"no secret named {name!r} (`eventbus secret list` shows them)")
    out.print(f"secret {name} deleted", highlight=False)
