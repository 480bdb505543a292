"""``eventbus join``: this host's Ray worker node in a cluster whose head runs elsewhere.

The operator's command on a second or third machine: ``ray start --address HEAD`` with the
head's token (``$EVENTBUS_HOME/ray_auth_token`` on the head, copied here), this host's address, its
CPUs and labels (``serving.placement.node_labels`` selects nodes by them), and the environment
EventBus gives its own head, except the switch that keeps a local stack on loopback (a joined
node has an address of its own). What was started is recorded in ``$EVENTBUS_HOME/join.json``;
``eventbus down`` stops it (only its processes: the token is copied under this home, so its
processes are told apart from any other node's on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from eventbus._internal.ray_head import RAY_ENV, RAY_HEAD_ENV, stop_ray
from eventbus._internal.stack_secrets import write_private
from eventbus.errors import StackError

__all__ = ["join_ray", "joined", "leave_ray"]

_STATE = "join.json"


def joined(home: Path) -> dict[str, Any] | None:
    """The node ``eventbus join`` started from ``home`` (None: none)."""
    path = home / _STATE
    return json.loads(path.read_text()) if path.exists() else None


def join_ray(
    home: Path,
    head: str,
    token_file: Path,
    node_ip: str | None = None,
    num_cpus: int | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start this host's worker node of the cluster at ``head`` (``host:port``).

    Raises:
        StackError: a node was already joined from ``home``, the token cannot be read, or
            ``ray start`` failed (its message, and the fix).
    """
    if (state := joined(home)) is not None:
        msg = (
            f"this EVENTBUS_HOME ({home}) already joined {state['head']}: `eventbus down` "
            "first, or use another EVENTBUS_HOME"
        )
        raise StackError(msg)
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        msg = (
            f"--token-file {str(token_file)!r} cannot be read ({exc.strerror}): copy the "
            "head's $EVENTBUS_HOME/ray_auth_token here"
        )
        raise StackError(msg) from None
    if not token:
        raise StackError(
            f"--token-file {str(token_file)!r} is empty: copy the head's ray_auth_token"
        )
    home.mkdir(parents=True, exist_ok=True)
    own_token = home / "ray_auth_token"
    write_private(own_token, token)
    # Ray's Unix socket paths must stay under 107 bytes: a short temp dir of its own
    temp_dir = tempfile.mkdtemp(prefix="eventbus-node-", dir=tempfile.gettempdir())
    argv = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        f"--address={head}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    if node_ip is not None:
        argv.append(f"--node-ip-address={node_ip}")
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    if labels:
        argv.append("--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
    env = {
        **RAY_HEAD_ENV,
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))},
        **RAY_ENV,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",  # a node of a cluster over the network
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(own_token),
    }
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        stop_ray(temp_dir, str(own_token))
        shutil.rmtree(temp_dir, ignore_errors=True)
        msg = (
            f"`ray start --address={head}` failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-2000:]}\nfix: check that the head is reachable from this host at "
            f"{head} and that the token is the head's"
        )
        raise StackError(msg)
    state = {
        "head": head,
        "temp_dir": temp_dir,
        "token_path": str(own_token),
        "labels": labels or {},
    }
    (home / _STATE).write_text(json.dumps(state))
    return state


def leave_ray(home: Path) -> bool:
    """Stop the node ``eventbus join`` started from ``home``; False: there was none."""
    state = joined(home)
    if state is None:
        return False
    stop_ray(state["temp_dir"], state["token_path"])
    shutil.rmtree(state["temp_dir"], ignore_errors=True)
    (home / _STATE).unlink(missing_ok=True)
    return True
