"""Stable ports for the stack ``eventbus up`` starts.

Each part keeps the port it had the last time (``<home>/ports.json``, kept across ``down``),
else its documented default (the gateway: HTTP 8080, gRPC 50051), when that port is free; only
when it is taken does the part move to a free port, and :func:`pick_port` says so, so that
``eventbus up`` can print it. ``eventbus url gateway`` prints the address for scripts.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

__all__ = ["DEFAULT_PORTS", "pick_port", "port_free", "remembered_ports"]

#: The documented default ports (``eventbus up --help``, docs/deployment.md).
DEFAULT_PORTS = {"gateway HTTP": 8080, "gateway gRPC": 50051}


def _file(home: Path) -> Path:
    return home / "ports.json"


def remembered_ports(home: Path) -> dict[str, int]:
    """Part -> the port it had at the last ``up`` (empty when none was recorded)."""
    try:
        data = json.loads(_file(home).read_text())
    except (OSError, ValueError):
        return {}
    return {k: int(v) for k, v in data.items() if isinstance(v, int) and 0 < v < 65536}


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``host:port`` now.

    ``SO_REUSEADDR`` as every server sets it: connections of a stopped server that linger in
    ``TIME_WAIT`` do not make its port look taken (they did, and ``up`` after ``down`` moved
    the gateway off 8080); a socket listening there still does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def pick_port(home: Path, part: str, asked: int | None = None) -> tuple[int, str | None]:
    """The port ``part`` listens on, and a note when it could not have the one it wanted.

    Wanted: ``asked`` (an option given); else the port it had last time, or else its default
    in :data:`DEFAULT_PORTS`, whichever is free first; else any free port. The choice is
    remembered for the next ``up``.

    Returns:
        ``(port, note)``; ``note`` names the part, the port it wanted and why it moved.
    """
    ports = remembered_ports(home)
    candidates = [asked] if asked else [ports.get(part), DEFAULT_PORTS.get(part)]
    wanted = [p for p in dict.fromkeys(candidates) if p]
    free = [p for p in wanted if port_free(p)]
    port = free[0] if free else _free_port()
    note = None
    if wanted and port != wanted[0]:
        why = (
            "given with the option"
            if asked
            else "it had last time"
            if ports.get(part)
            else "its default"
        )
        note = (
            f"{part} port {wanted[0]} ({why}) is taken by another process; using {port} "
            "instead (`eventbus url` prints the addresses)"
        )
    ports[part] = port
    home.mkdir(parents=True, exist_ok=True)
    _file(home).write_text(json.dumps(ports, indent=2, sort_keys=True))
    return port, note
