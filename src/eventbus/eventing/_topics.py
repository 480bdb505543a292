"""Kafka topics as configuration: valid names, ``create:`` in the YAML, and existence checks.

A pipeline's Kafka topics must exist before it is deployed, or be created by EventBus because
its YAML asks for it (``create: {partitions: N}`` on the source or sink): a misspelled topic is
refused at deploy instead of being created empty by a broker's ``auto.create.topics.enable``.
``eventbus publish`` and ``tail`` refuse a missing topic the same way. Topics EventBus owns
(the gateway's ingress topics) are created by EventBus as before.
"""

from __future__ import annotations

import asyncio
import difflib
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from eventbus.errors import ConfigError
from eventbus.eventing._kafka_client import (
    KafkaClientConfig,
    kafka_client_kwargs,
    kafka_connect_error,
)

__all__ = [
    "MAX_TOPIC_NAME",
    "TopicCreateConfig",
    "delete_topics",
    "list_topics",
    "missing_topic_message",
    "require_topics",
    "topic_name_problem",
    "topic_suggestion",
]

#: Kafka's limit on a topic name's length (``Topic.MAX_NAME_LENGTH``).
MAX_TOPIC_NAME = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


class TopicCreateConfig(BaseModel):
    """``create:`` on a Kafka source or sink: EventBus creates the topic at deploy when missing.

    Example:
        >>> TopicCreateConfig(partitions=3).partitions
        3
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    partitions: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Partitions of the topic; None: one per replica the pipeline may have "
        "(serving.replicas.max), at least 2. An existing topic is left as it is.",
    )
    replication_factor: int = Field(
        default=1,
        ge=1,
        le=32,
        description="Copies of each partition (at most the number of brokers).",
    )


def _shown(name: str) -> str:
    """A topic name for a message: whole when short, else its start and its length."""
    return repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name)} characters)"


def topic_name_problem(name: str) -> str | None:
    """What makes ``name`` an invalid Kafka topic name (Kafka's own rules), or None.

    Example:
        >>> topic_name_problem("orders")
        >>> topic_name_problem("my orders")
        "topic 'my orders' is not a valid Kafka topic name: ' ' is not allowed; use only ASCII letters, digits, '.', '_' and '-'"
    """
    if not name:
        return "topic is empty; name a topic"
    if len(name) > MAX_TOPIC_NAME:
        return f"topic {_shown(name)} is too long for Kafka: at most {MAX_TOPIC_NAME} characters"
    if name in (".", ".."):
        return f"topic {name!r} is not a valid Kafka topic name; '.' and '..' are reserved"
    if not _LEGAL.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL.fullmatch(c)})
        return (
            f"topic {_shown(name)} is not a valid Kafka topic name: "
            f"{', '.join(repr(c) for c in bad[:5])} {'is' if len(bad) == 1 else 'are'} not "
            "allowed; use only ASCII letters, digits, '.', '_' and '-'"
        )
    return None


def topic_suggestion(name: str, existing: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest existing topic, or ``""``.

    Kafka's own topics (``__consumer_offsets``...) are never suggested.
    """
    candidates = [t for t in existing if not t.startswith("__")]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def missing_topic_message(name: str, bootstrap: str, existing: Iterable[str]) -> str:
    """``topic 'x' does not exist on HOST:PORT (did you mean 'y'?)``: the start of every
    missing-topic message; callers add the fix that fits them."""
    return f"topic {_shown(name)} does not exist on {bootstrap}{topic_suggestion(name, existing)}"


async def _admin(
    bootstrap: str, client: KafkaClientConfig | None, what: str, timeout_s: float
) -> Any:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=int(timeout_s * 1000),
        **kafka_client_kwargs(client),
    )
    try:
        await admin.start()
    except (KafkaError, KeyError) as e:  # KeyError: aiokafka's SCRAM client, login refused
        await admin.close()
        raise await kafka_connect_error(what, bootstrap, client, e) from e
    return admin


async def list_topics(
    bootstrap: str, client: KafkaClientConfig | None = None, *, timeout_s: float = 10.0
) -> set[str]:
    """The names of every topic of a cluster (a metadata request that creates nothing).

    Raises:
        StackError: the cluster cannot be reached or refused the login, naming why.
        ConfigError: a secret reference of ``client`` cannot be resolved.
    """
    admin = await _admin(bootstrap, client, "listing topics", timeout_s)
    try:
        return set(await asyncio.wait_for(admin.list_topics(), timeout_s))
    finally:
        await admin.close()


async def require_topics(
    bootstrap: str, names: Iterable[str], client: KafkaClientConfig | None = None
) -> None:
    """Refuse topics that are invalid or do not exist (``eventbus publish`` and ``tail``).

    Raises:
        ConfigError: naming each invalid or missing topic, the closest existing one and the
            fix.
        StackError: the cluster cannot be reached.
    """
    wanted = list(names)
    problems = [p for p in map(topic_name_problem, wanted) if p]
    if problems:
        raise ConfigError("; ".join(problems))
    existing = await list_topics(bootstrap, client)
    missing = [n for n in wanted if n not in existing]
    if missing:
        msg = "; ".join(missing_topic_message(n, bootstrap, existing) for n in missing) + (
            "; create it first (`eventbus topics create NAME --partitions N`), or deploy a "
            "pipeline whose sink has 'create: {partitions: N}'; `eventbus topics list` shows "
            "the topics"
        )
        raise ConfigError(msg)


async def delete_topics(
    bootstrap: str, names: Iterable[str], client: KafkaClientConfig | None = None
) -> None:
    """Delete topics (``eventbus topics delete``); a missing one is refused first, by name.

    Raises:
        ConfigError: a topic is invalid or does not exist.
        StackError: the cluster cannot be reached or refused, naming the error code.
    """
    from eventbus.errors import StackError

    wanted = list(names)
    await require_topics(bootstrap, wanted, client)
    admin = await _admin(bootstrap, client, "deleting topics", 30.0)
    try:
        response = await admin.delete_topics(wanted)
    finally:
        await admin.close()
    failed = [(t, code) for t, code, *_ in response.topic_error_codes if code]
    if failed:
        msg = "; ".join(
            f"broker {bootstrap} refused to delete topic {t!r}: error code {c}" for t, c in failed
        )
        raise StackError(msg)
