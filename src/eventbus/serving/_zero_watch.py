"""What the scale-to-zero watcher (``_scale_to_zero``) knows of each ``replicas.min: 0``
pipeline, and its decisions from an observation (no Kafka, no Redis, no threads), so each
rule is tested alone."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.pipelines._config import PipelineConfig

__all__ = [
    "REREAD_S",
    "SCALED_TO_ZERO",
    "SETTLE_S",
    "Watched",
    "committed_marks",
    "decide",
    "left_to_the_ringer",
    "watched_of",
]

#: The status of a pipeline whose replicas were scaled to zero.
SCALED_TO_ZERO = "SCALED_TO_ZERO"
#: After a pipeline went to zero, its replicas' drain may still commit for this long.
SETTLE_S = 5.0
#: A pipeline at zero has its committed offsets read again this often (someone else may
#: commit for its group: an operator's reset with another tool; ``eventbus replay`` wakes
#: the pipeline first). Each read is two requests per group and a ``ListOffsets`` through
#: aiokafka: every 60 s, fifty pipelines at zero kept the watcher reading almost every second.
REREAD_S = 300.0


@dataclass
class Watched:
    """What the watcher knows of one ``min: 0`` pipeline."""

    name: str
    #: cluster (bootstrap servers) -> consumer group -> topics
    groups: dict[str, dict[str, list[str]]]
    clients: dict[str, KafkaClientConfig | None]
    idle_s: float
    poll_s: float
    last_activity: float = field(default_factory=time.monotonic)
    last_event_at: float = field(default_factory=time.time)
    committed: dict[str, int] = field(default_factory=dict)
    wake_at: float = 0.0
    next_at: float = 0.0
    busy: bool = False  # a scale action is running
    committed_read_at: float = 0.0  # epoch s of the last OffsetFetch
    fetched: dict[str, int] = field(default_factory=dict)  # what it answered
    zero_since: float | None = None  # epoch s it went to zero (as of the last check)
    nudged: bool = False  # the ringer saw records wait: checked now, not at next_at
    #: (committed_read_at it was made of, (topic, partition) -> committed offset)
    marks: tuple[float, dict[tuple[str, int], int]] = (0.0, {})
    #: when the ringer last compared these marks with the partitions' ends (monotonic), and
    #: how often it does: while that is at least every ``poll_s``, the watcher's own read of
    #: a pipeline at zero is left to it (see :meth:`ScaleToZero.looked`)
    looked_at: float = float("-inf")
    looked_every_s: float = float("inf")


def decide(
    w: Watched,
    *,
    now: float,
    lag: int,
    committed: dict[str, int],
    wake_at: float,
    at_zero_since: float | None,
    replica_lag: int = 0,
) -> str | None:
    """Update ``w`` with one observation; ``"down"``, ``"up"`` or None (nothing to do).

    Args:
        now: monotonic time.
        lag: records past the committed offsets, summed over partitions (end - committed).
        committed: the committed offsets (``topic[partition]`` -> offset).
        wake_at: the latest sync call a gateway recorded (epoch s).
        at_zero_since: when the pipeline went to zero (epoch s); None: it runs.
        replica_lag: the lag the replicas last published (their fetches' view).
    """
    moved = bool(w.committed) and committed != w.committed
    called = wake_at > w.wake_at
    w.committed, w.wake_at = committed, max(w.wake_at, wake_at)
    if moved or called or lag > 0 or replica_lag > 0:
        w.last_activity = now
        if moved or called:
            w.last_event_at = time.time()
    if at_zero_since is not None:
        return "up" if lag > 0 or wake_at > at_zero_since else None
    if now - w.last_activity >= w.idle_s:
        return "down"
    return None


def watched_of(
    config: PipelineConfig, bootstrap: str, client: KafkaClientConfig | None
) -> Watched | None:
    """The watch of a pipeline, or None when it may not scale to zero."""
    bounds = config.spec.serving.replica_bounds
    if not bounds.scale_to_zero:
        return None
    groups: dict[str, dict[str, list[str]]] = {}
    clients: dict[str, KafkaClientConfig | None] = {}
    for src in config.consumed_sources:
        cluster = src.bootstrap_servers or bootstrap
        clients.setdefault(cluster, src.client or client)
        group = src.group or f"eventbus-{config.name}"
        groups.setdefault(cluster, {}).setdefault(group, []).extend(src.topics)
    return Watched(config.name, groups, clients, bounds.idle_s, bounds.poll_s)


def committed_marks(
    fetched: dict[str, int], groups: dict[str, list[str]]
) -> dict[tuple[str, int], int]:
    """(topic, partition) -> committed offset of ``fetched`` (``group/topic[p]`` -> offset)
    for ``groups``; a partition of two groups: the lower offset."""
    marks: dict[tuple[str, int], int] = {}
    for name, offset in fetched.items():
        group, _, tp = name.rpartition("/")
        topic, _, part = tp.rpartition("[")
        if group not in groups:
            continue
        key = (topic, int(part.rstrip("]")))
        marks[key] = min(offset, marks.get(key, offset))
    return marks


def left_to_the_ringer(w: Watched, now: float, wake_at: float) -> bool:
    """Whether the ringer's looks cover ``w`` this round: it is at zero, no sync call came
    since, its committed offsets are younger than :data:`REREAD_S`, and the ringer compared
    them with the ends within the last ``poll_s`` (plus one of its rounds, its own pace) and
    looks at least every ``poll_s``. Otherwise the watcher reads it itself."""
    if w.zero_since is None or w.nudged or wake_at > w.zero_since:
        return False
    if time.time() - w.committed_read_at >= REREAD_S or w.looked_every_s > w.poll_s:
        return False
    return now - w.looked_at < w.poll_s + w.looked_every_s
