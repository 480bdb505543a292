"""The deploy's check of ``serving.placement`` against the live Ray nodes.

A pipeline whose replicas no live node can take would deploy and then wait forever with its
replicas pending; it is refused instead, naming the labels, the nodes there are and the fix.
Nodes that join later are not waited for: an autoscaled cluster gives ``replicas.min`` that
fits the nodes it runs now.
"""

from __future__ import annotations

from typing import Any

from eventbus.pipelines._placement_config import label_matches

__all__ = ["live_nodes", "placement_problems"]


def live_nodes() -> list[dict[str, Any]]:
    """``[{"id", "address", "labels"}]`` of the alive nodes of the connected Ray cluster."""
    import ray

    return [
        {
            "id": n["NodeID"],
            "address": n.get("NodeManagerAddress", "?"),
            "labels": {
                k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith("ray.io/")
            },
        }
        for n in ray.nodes()  # type: ignore[no-untyped-call]
        if n.get("Alive")
    ]


def _shown(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(labels.items())) + "}"


def placement_problems(serving: Any, nodes: list[dict[str, Any]]) -> list[str]:
    """What in ``serving.placement`` the live ``nodes`` cannot hold (empty: it fits)."""
    placement = serving.placement
    if placement is None:
        return []
    matching = [n for n in nodes if label_matches(placement.node_labels, n["labels"])]
    seen = "; ".join(f"{n['address']} {_shown(n['labels'])}" for n in nodes) or "none"
    if placement.node_labels and not matching:
        return [
            f"spec.serving.placement.node_labels: no live Ray node has labels "
            f"{_shown(placement.node_labels)} (the nodes: {seen}); start one with them "
            f"(`ray start --address HEAD --labels KEY=VALUE`, or `eventbus up --labels "
            f"KEY=VALUE`), or change node_labels"
        ]
    need = max(1, serving.replica_bounds.min)  # min 0 still starts one
    if placement.spread and need > len(matching):
        which = f" with labels {_shown(placement.node_labels)}" if placement.node_labels else ""
        return [
            f"spec.serving.placement.spread: true puts at most one replica on a node, but "
            f"serving.replicas asks at least {need} and {len(matching)} live Ray node(s){which} "
            f"can take one (the nodes: {seen}); add nodes, lower replicas to {len(matching)}, "
            f"or drop spread"
        ]
    return []
