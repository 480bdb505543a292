"""A pipeline's Kafka topics, checked at deploy and watched while it runs.

At deploy (:func:`check_topics`) every Kafka topic a pipeline reads or writes must exist on its
cluster, or carry ``create:`` in the YAML, in which case it is created now; a missing topic is
refused with its YAML path, the closest existing topic and the fix. Nothing relies on a
broker's ``auto.create.topics.enable``.

While pipelines run, :class:`TopicWatch` (a thread of the controller) lists each cluster's
topics every few seconds and records the pipelines whose topics are gone in
:data:`keys.DEGRADED`, which ``eventbus status``, ``list`` and the dashboard show as DEGRADED
with the reason, until the topic is back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from eventbus._internal import keys
from eventbus.errors import DeployError
from eventbus.eventing._kafka_client import KafkaClientConfig
from eventbus.eventing._topics import (
    TopicCreateConfig,
    list_topics,
    missing_topic_message,
)
from eventbus.pipelines._config import PipelineConfig

__all__ = ["TopicWatch", "check_topics", "kafka_topics", "topic_problems"]

log = logging.getLogger("eventbus.serving.topics")

#: How often the watch lists the clusters' topics.
WATCH_EVERY_S = 3.0
#: How long a deploy waits for a topic it does not see yet: a broker answers metadata from a
#: cache that learns of a topic created a moment ago (KRaft) shortly after the create returned.
SETTLE_S = 5.0


@dataclass
class _Cluster:
    client: KafkaClientConfig | None
    #: (YAML path of the component, topic, its ``create:`` or None)
    topics: list[tuple[str, str, TopicCreateConfig | None]] = field(default_factory=list)


def kafka_topics(
    config: PipelineConfig, bootstrap: str, client: KafkaClientConfig | None
) -> dict[str, _Cluster]:
    """The Kafka topics of a pipeline's sources, sinks and dead-letter sink, per cluster
    (``bootstrap`` and ``client``: the stack's, for components that name none)."""
    clusters: dict[str, _Cluster] = {}

    def add(path: str, options: Any) -> None:
        at = options.bootstrap_servers or bootstrap
        cluster = clusters.setdefault(at, _Cluster(options.client or client))
        names = options.topics if hasattr(options, "topics") else [options.topic]
        cluster.topics.extend((path, t, options.create) for t in names)

    for i, src in enumerate(config.spec.sources):
        if src.kafka is not None:
            add(f"spec.sources[{i}].kafka", src.kafka)
    for path, sink in config.spec.output_paths().items():
        if sink.kafka is not None:
            add(f"spec.{path}.kafka", sink.kafka)
    return clusters


_Missing = tuple[str, _Cluster, str, TopicCreateConfig]


def topic_problems(
    config: PipelineConfig, bootstrap: str, client: KafkaClientConfig | None
) -> tuple[list[str], list[_Missing]]:
    """The missing topics of a pipeline: one problem line per topic without ``create:``
    (its YAML path, the closest existing topic, the fix), and those with ``create:``
    (``(cluster, its settings, topic, create)``). Creates nothing (``eventbus validate
    --check-topics``).

    Raises:
        StackError: a cluster cannot be reached, naming why.
    """
    problems: list[str] = []
    to_create: list[_Missing] = []
    for at, cluster in kafka_topics(config, bootstrap, client).items():
        existing = _settled_topics(at, cluster.client, {t for _, t, _ in cluster.topics})
        for path, topic, create in cluster.topics:
            if topic in existing:
                continue
            if create is not None:
                to_create.append((at, cluster, topic, create))
                continue
            hidden = (
                " (or its principal may not DESCRIBE it: Kafka hides such topics)"
                if cluster.client is not None and cluster.client.sasl is not None
                else ""
            )
            problems.append(
                f"{path}.topic: {missing_topic_message(topic, at, existing)}{hidden}; create it "
                f"(`eventbus topics create {topic} --partitions N`), or add "
                f"'create: {{partitions: N}}' to {path} to let EventBus create it"
            )
    return problems, to_create


def check_topics(
    config: PipelineConfig, bootstrap: str, client: KafkaClientConfig | None
) -> list[str]:
    """Create the missing topics that carry ``create:``; refuse the other missing ones.

    Returns:
        The topics created.

    Raises:
        DeployError: naming every missing topic (its YAML path, the closest existing topic,
            the fix); nothing was created. Or a cluster cannot be reached.
    """
    from eventbus._internal.services import create_topics
    from eventbus.errors import EventBusError

    try:
        problems, to_create = topic_problems(config, bootstrap, client)
    except EventBusError as exc:
        msg = f"pipeline {config.name!r} could not be deployed: {exc}"
        raise DeployError(msg) from None
    if problems:
        msg = f"pipeline {config.name!r} could not be deployed:\n" + "\n".join(problems)
        raise DeployError(msg)
    default_partitions = max(2, config.spec.serving.replica_bounds.max)
    created = []
    for at, cluster, topic, create in to_create:
        try:
            asyncio.run(
                create_topics(
                    at,
                    [topic],
                    create.partitions or default_partitions,
                    replication_factor=create.replication_factor,
                    client=cluster.client,
                )
            )
        except EventBusError as exc:
            msg = f"pipeline {config.name!r} could not be deployed: {exc}"
            raise DeployError(msg) from None
        created.append(topic)
    return created


def _settled_topics(bootstrap: str, client: KafkaClientConfig | None, wanted: set[str]) -> set[str]:
    """The cluster's topics; while some of ``wanted`` are missing, asked again for up to
    :data:`SETTLE_S` (a topic created just before the deploy may not be listed yet)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        existing = asyncio.run(list_topics(bootstrap, client))
        if wanted <= existing or time.monotonic() >= deadline:
            return existing
        time.sleep(0.25)


def missing_reason(
    config: PipelineConfig,
    bootstrap: str,
    client: KafkaClientConfig | None,
    listed: dict[str, set[str] | None],
) -> str | None:
    """Why a running pipeline is degraded (its missing topics), or None. ``listed``: cluster
    -> its topics (None: could not be listed), filled as clusters are listed."""
    missing = []
    for at, cluster in kafka_topics(config, bootstrap, client).items():
        if at not in listed:
            try:
                listed[at] = asyncio.run(list_topics(at, cluster.client, timeout_s=5.0))
            except Exception as exc:  # noqa: BLE001 - an unreachable cluster is not a deletion
                log.info("topic watch: cannot list the topics of %s: %s", at, exc)
                listed[at] = None
        existing = listed[at]
        if existing is None:
            continue
        missing += [
            f"{path}.topic {topic!r} no longer exists on {at}"
            for path, topic, _ in cluster.topics
            if topic not in existing
        ]
    if not missing:
        return None
    return (
        "; ".join(missing)
        + "; create it again (`eventbus topics create NAME --partitions N`) or redeploy with "
        "'create:'; `eventbus logs controller` shows the controller's log"
    )


class TopicWatch:
    """Marks the pipelines whose topics are gone DEGRADED (and clears the mark when they are
    back), every :data:`WATCH_EVERY_S` seconds, on a daemon thread of the controller."""

    def __init__(
        self, redis: Any, bootstrap: str, client: KafkaClientConfig | None, every_s: float = 0
    ) -> None:
        self._redis = redis
        self._bootstrap = bootstrap
        self._client = client
        self._every_s = every_s or WATCH_EVERY_S
        self._stop = threading.Event()
        self._last_error = ""
        #: pipeline -> the reason seen at the last look, not yet marked: a topic is marked
        #: missing at the second look in a row that misses it (a topic created a moment ago
        #: may not be listed yet)
        self._suspect: dict[str, str] = {}

    def start(self) -> None:
        """Run the watch on a daemon thread."""
        threading.Thread(target=self._run, name="eventbus-topic-watch", daemon=True).start()

    def stop(self) -> None:
        """End the watch after its current look."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self.look()
                self._last_error = ""
            except Exception as exc:  # noqa: BLE001 - e.g. Redis away: said once, tried again
                if str(exc) != self._last_error:
                    log.warning("topic watch: a look failed (%s)", exc)
                self._last_error = str(exc)

    def look(self) -> None:
        """One look at every deployed pipeline's topics."""
        listed: dict[str, set[str] | None] = {}
        marks = self._redis.hgetall(keys.DEGRADED)
        for name, raw in self._redis.hgetall(keys.PIPELINES).items():
            config = PipelineConfig.model_validate(json.loads(raw)["document"])
            reason = missing_reason(config, self._bootstrap, self._client, listed)
            if reason is not None and name not in marks and self._suspect.get(name) != reason:
                self._suspect[name] = reason
                continue
            self._suspect.pop(name, None)
            if reason is None:
                if name in marks:
                    self._redis.hdel(keys.DEGRADED, name)
                    log.info("pipeline %r: its topics exist again", name)
                continue
            old = json.loads(marks[name]) if name in marks else None
            if old is None or old.get("reason") != reason:
                since = old["since"] if old else time.time()
                self._redis.hset(
                    keys.DEGRADED, name, json.dumps({"reason": reason, "since": since})
                )
                log.warning("pipeline %r is degraded: %s", name, reason)
        for name in set(marks) - set(self._redis.hkeys(keys.PIPELINES)):
            self._redis.hdel(keys.DEGRADED, name)
