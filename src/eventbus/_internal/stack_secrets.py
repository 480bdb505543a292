"""The secret files of ``eventbus up`` (the gateway's admin token, the Redis password, the
Ray head's token), written readable by us only and never briefly readable by others."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["make_admin_token", "make_ray_token", "redis_password", "write_private"]


def write_private(path: Path, text: str, *, replace: bool = True) -> bool:
    """Write ``text`` to ``path`` readable by us only, atomically: a temporary file created
    with mode 0600 (never briefly readable by others, whatever the umask), then renamed.

    Args:
        path: the file.
        text: its content.
        replace: replace an existing file; False keeps it (and returns False).

    Returns:
        Whether the file was written.
    """
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)  # fails if it exists: two `up` at once keep one token
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def make_admin_token(home: Path) -> str:
    """The gateway's admin API token (kept across restarts), readable by us only."""
    import secrets

    path = home / "admin_token"
    write_private(path, secrets.token_hex(32), replace=False)
    return str(path)


def redis_password(home: Path) -> str:
    """The password of the Redis ``up`` starts (kept across restarts), readable by us only."""
    import secrets

    path = home / "redis_password"
    write_private(path, secrets.token_hex(32), replace=False)
    return path.read_text(encoding="utf-8").strip()


def make_ray_token(home: Path) -> str:
    """A fresh token for the local Ray head: Ray's token authentication, readable by us only."""
    import secrets

    path = home / "ray_auth_token"
    write_private(path, secrets.token_hex(32))
    return str(path)
