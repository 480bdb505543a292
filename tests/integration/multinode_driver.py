"""The driver side of ``test_multinode.py``, run as its own process against a 2-node cluster.

The pytest process may already hold a Ray session (the ``ray_cluster`` fixture), and a process
connects to one Ray cluster at most, so every step that talks to the 2-node cluster runs here:

    python tests/integration/multinode_driver.py deploy ADDRESS KAFKA REDIS PIPELINE.yaml [N]
    python tests/integration/multinode_driver.py placement ADDRESS NAME
    python tests/integration/multinode_driver.py status ADDRESS NAME

Each prints one JSON object as its last line. The Ray token comes from the environment
(``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN_PATH``), as for any EventBus client.

``stamp_node`` is the pipeline's function step: it records which node ran each event.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import eventbus
from eventbus import CloudEvent


@eventbus.function(batch=True)
def stamp_node(events: list[CloudEvent]) -> list[CloudEvent]:
    """Add the id of the Ray node that ran the event to its data (``data.node``)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return [e.replace(data={**e.data, "node": node}) for e in events]


def _connect(address: str) -> Any:
    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(address=address, namespace="eventbus", logging_level="WARNING", log_to_driver=False)
    return ray


def _nodes(ray: Any) -> list[dict[str, Any]]:
    return [
        {
            "node_id": n["NodeID"],
            "alive": n["Alive"],
            "head": "node:__internal_head__" in n["Resources"]
            or "node:__internal_head__" in n.get("Labels", {}),
        }
        for n in ray.nodes()
    ]


def _replicas(app: str) -> list[dict[str, Any]]:
    """The pipeline's Serve replica actors, from the GCS actor table (no dashboard needed)."""
    from ray._private import state

    out = []
    for info in state.actors().values():
        if (
            info["ActorClassName"].startswith("ServeReplica:")
            and f":{app}:" in info["ActorClassName"] + ":"
        ):
            out.append(
                {"state": info["State"], "node_id": info["Address"]["NodeID"], "pid": info["Pid"]}
            )
    return out


def placement(ray: Any, name: str, want: int, timeout_s: float) -> dict[str, Any]:
    """Wait until ``want`` replicas of pipeline ``name`` are alive; return them and the nodes."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [r for r in _replicas(f"eventbus-{name}") if r["state"] == "ALIVE"]
        if len(alive) >= want or time.monotonic() > deadline:
            return {"replicas": alive, "nodes": _nodes(ray)}
        time.sleep(0.25)


def main(argv: list[str]) -> int:
    verb, address = argv[0], argv[1]
    if verb == "deploy":
        kafka, redis_url, path = argv[2], argv[3], Path(argv[4])
        ray = _connect(address)
        from eventbus.errors import DeployError
        from eventbus.serving import EventBusClient

        client = EventBusClient(address, kafka, redis_url)
        try:
            info = client.deploy(path)
        except DeployError as exc:  # the test asserts on the refusal
            print(json.dumps({"refused": str(exc)}))
            return 0
        want = int(argv[5]) if len(argv) > 5 else 2
        result = {"deployed": info, **placement(ray, info["name"], want=want, timeout_s=60)}
    elif verb == "placement":
        ray = _connect(address)
        result = placement(ray, argv[2], want=int(argv[3]) if len(argv) > 3 else 1, timeout_s=30)
    elif verb == "status":
        _connect(address)
        from ray import serve

        from eventbus.serving import EventBusClient

        client = EventBusClient(address, "", "")
        app = serve.status().applications.get(f"eventbus-{argv[2]}")
        result = {
            "pipelines": client.list(),
            "app_status": str(app.status) if app else None,
            "deployments": {
                k: {
                    "status": str(d.status),
                    "replicas": {str(s): n for s, n in d.replica_states.items()},
                }
                for k, d in (app.deployments.items() if app else [])
            },
        }
    else:
        print(f"unknown verb {verb!r}", file=sys.stderr)
        return 2
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
