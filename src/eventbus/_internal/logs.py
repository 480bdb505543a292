"""Where the stack's logs are: ``eventbus logs gateway|controller|PIPELINE``.

The gateway ``eventbus up`` starts writes ``<home>/logs/gateway.log``. The controller and a
pipeline's replicas are Ray actors: each writes to its worker's files in the Ray session's log
folder (``<temp dir>/session_latest/logs/worker-*.err|.out``), which Ray begins with a line
``:actor_name:<class>`` (``Controller``; ``ServeReplica:eventbus-<pipeline>:<deployment>`` for
a replica); Ray Serve also keeps a log per replica (``serve/replica_eventbus-<pipeline>_*``).
A pipeline that runs as a member of a shared host (``serving.host``) has no replica of its own:
its lines are in the host's replicas' logs (``eventbus-host-<host>``), among its fellow
members', and are picked out by its name (:func:`member_lines`).
No Ray import: the files are read where the stack runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "HOST_APP_PREFIX",
    "actor_logs",
    "host_logs",
    "member_lines",
    "pipeline_logs",
    "session_logs",
    "tail_lines",
]

#: The Serve application name of a shared host is this and the host's name (``serving._host``).
HOST_APP_PREFIX = "eventbus-host-"
#: Most bytes read from the end of a shared host's log to pick a member's lines out of.
MEMBER_SCAN_BYTES = 16 * 1024 * 1024

_MARKER = ":actor_name:"
#: Lines at the top of a worker's file where Ray's markers are (``:job_id:`` comes first).
_HEAD_LINES = 4


def session_logs(temp_dir: str | Path) -> Path:
    """The log folder of the newest Ray session under ``temp_dir``."""
    return Path(temp_dir) / "session_latest" / "logs"


def _markers(path: Path) -> Iterator[str]:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            for _ in range(_HEAD_LINES):
                line = f.readline()
                if not line:
                    return
                if line.startswith(_MARKER):
                    yield line[len(_MARKER) :].strip()
    except OSError:
        return


def actor_logs(logs: Path, actor_class: str, *, prefix: bool = False) -> list[Path]:
    """The worker files of the actors of class ``actor_class`` (``prefix``: whose class starts
    with it), newest first."""
    found = []
    for path in logs.glob("worker-*"):
        if path.suffix not in (".err", ".out"):
            continue
        for cls in _markers(path):
            if cls == actor_class or (prefix and cls.startswith(actor_class)):
                found.append(path)
                break
    return _newest_first(found)


def pipeline_logs(logs: Path, app: str) -> list[Path]:
    """A pipeline's replica logs (Serve application ``app``): its workers' stderr/stdout and
    Serve's per-replica logs, newest first."""
    serve = list((logs / "serve").glob(f"replica_{app}_*.log"))
    return actor_logs(logs, f"ServeReplica:{app}:", prefix=True) + _newest_first(serve)


def _newest_first(paths: Iterator[Path] | list[Path]) -> list[Path]:
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(paths, key=mtime, reverse=True)


def tail_lines(path: Path, n: int) -> list[str]:
    """The last ``n`` lines of a file (Ray's marker lines left out), read from its end."""
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        chunk = min(size, max(4096, n * 400))
        f.seek(size - chunk)
        text = f.read().decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if not line.startswith((":job_id:", _MARKER))]
    if chunk < size and lines:
        lines = lines[1:]  # the first one may be cut
    return lines[-n:]


def host_logs(logs: Path, host: str | None = None) -> dict[str, list[Path]]:
    """The replica logs of the shared hosts (of ``host`` only, when given), per host name,
    newest first."""
    found: dict[str, list[Path]] = {}
    prefix = f"ServeReplica:{HOST_APP_PREFIX}"
    for path in actor_logs(logs, prefix, prefix=True):
        name = next(c for c in _markers(path) if c.startswith(prefix))
        found.setdefault(name[len(prefix) :].split(":", 1)[0], []).append(path)
    for path in _newest_first(list((logs / "serve").glob(f"replica_{HOST_APP_PREFIX}*.log"))):
        # replica_eventbus-host-<host>_<deployment>_<id>.log; host names have no '_'
        name = path.name[len("replica_" + HOST_APP_PREFIX) :].split("_", 1)[0]
        found.setdefault(name, []).append(path)
    if host is not None:
        return {host: found[host]} if host in found else {}
    return found


def _names(pipeline: str) -> re.Pattern[str]:
    # the name as a whole word: 'orders', orders:, "pipeline":"orders", eventbus-orders; not
    # orders-eu (pipeline names are [a-z][a-z0-9-]*)
    return re.compile(rf"(?<![a-z0-9-])(?:eventbus-)?{re.escape(pipeline)}(?![a-z0-9-])")


def member_lines(path: Path, pipeline: str, n: int) -> list[str]:
    """The last ``n`` lines of a shared host's log that name ``pipeline`` (with the traceback
    that follows one), from at most :data:`MEMBER_SCAN_BYTES` at the file's end."""
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        chunk = min(size, MEMBER_SCAN_BYTES)
        f.seek(size - chunk)
        text = f.read().decode("utf-8", errors="replace")
    lines = text.splitlines()
    if chunk < size and lines:
        lines = lines[1:]  # the first one may be cut
    named = _names(pipeline)
    kept: list[str] = []
    keeping = traceback = False
    for line in lines:
        if line.startswith((":job_id:", _MARKER)):
            continue
        if named.search(line):
            kept.append(line)
            keeping, traceback = True, False
        elif keeping and (line[:1] in (" ", "\t") or line.startswith("Traceback (")):
            kept.append(line)  # the traceback of the line kept
            traceback = traceback or line.startswith("Traceback (")
        elif keeping and traceback:
            kept.append(line)  # the exception that ends it
            keeping = traceback = False
        else:
            keeping = traceback = False
    return kept[-n:]
