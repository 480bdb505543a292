"""Whether the broker lets this client's principal do what a source or sink needs, asked at start.

A producer without WRITE on its topic starts fine and fails only at its first send, long
after ``eventbus deploy`` said yes (and a consumer without READ fails in the background).
So a source or sink on a secured connection asks once, at start, what its principal may do
to its topics (KIP-430: a Metadata request with ``include_topic_authorized_operations``,
answered for the caller's own principal, no admin rights needed) and fails the deploy with
the principal, the operation, the topic and the ``kafka-acls`` command that grants it.

aiokafka (0.14) speaks Metadata up to v5 and v8 adds the authorized operations: the v8
request and response below are built on aiokafka's protocol classes (``aiokafka.protocol``,
public modules meant for new requests: see ``aiokafka.protocol.api.Request``). Their encoding
is pinned by ``tests/unit/eventing/test_kafka_acl.py``, which breaks if an upgrade changes
them; a broker that does not answer v8 (or answers without the field) is not checked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

from eventbus.errors import StackError
from eventbus.eventing._kafka_client import KafkaClientConfig, kafka_client_kwargs

__all__ = ["OPERATIONS", "check_topic_access", "principal_of"]

log = logging.getLogger(__name__)

#: Kafka's ACL operation codes (``org.apache.kafka.common.acl.AclOperation``); an authorized
#: operations bitfield sets bit ``1 << code`` for each one allowed.
OPERATIONS = {"READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7, "DESCRIBE": 8}
_NOT_PROVIDED = -(2**31)  # Int32 MIN: the broker did not compute the field
_TOPIC_AUTHORIZATION_FAILED = 29
_OK = 0


class MetadataResponseV8(Response):  # type: ignore[misc]  # aiokafka is untyped here
    """Metadata v8 answer: v7's (partition leader epochs) plus authorized operations."""

    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            Array(
                ("node_id", Int32),
                ("host", String("utf-8")),
                ("port", Int32),
                ("rack", String("utf-8")),
            ),
        ),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            Array(
                ("error_code", Int16),
                ("topic", String("utf-8")),
                ("is_internal", Boolean),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition", Int32),
                        ("leader", Int32),
                        ("leader_epoch", Int32),
                        ("replicas", Array(Int32)),
                        ("isr", Array(Int32)),
                        ("offline_replicas", Array(Int32)),
                    ),
                ),
                ("topic_authorized_operations", Int32),
            ),
        ),
        ("cluster_authorized_operations", Int32),
    )


class MetadataRequestV8(RequestStruct):  # type: ignore[misc]
    """Metadata v8: the named topics, never created by asking, with their operations."""

    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = MetadataResponseV8
    SCHEMA = Schema(
        ("topics", Array(String("utf-8"))),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class TopicOperationsRequest(Request[MetadataRequestV8]):  # type: ignore[misc]
    """What the caller's principal may do to ``topics`` (Metadata v8, KIP-430)."""

    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self.topics = topics

    def build(self, request_struct_class: type[MetadataRequestV8]) -> MetadataRequestV8:
        return request_struct_class(self.topics, False, False, True)


def principal_of(config: KafkaClientConfig | None) -> str:
    """The principal the broker sees for ``config``, as ``kafka-acls`` names it."""
    sasl = config.sasl if config is not None else None
    if sasl is not None and sasl.username is not None:
        return f"User:{sasl.username}"
    if sasl is not None:
        return f"the principal of the token from {sasl.token_provider}"
    if config is not None and config.cert_file is not None:
        return f"the principal of client certificate {config.cert_file}"
    return "User:ANONYMOUS"


def denied(topics: Mapping[str, str], answer: Any) -> list[tuple[str, str, bool]]:
    """``(topic, operation, sees_topic)`` for each wanted operation the answer denies.

    ``sees_topic`` is False when the broker denies even DESCRIBE (the topic is invisible to
    the principal). Topics missing, or answered without the field, are not judged.
    """
    out = []
    for error_code, name, _internal, _parts, ops in answer.topics:
        wanted = topics.get(name)
        if wanted is None:
            continue
        if error_code == _TOPIC_AUTHORIZATION_FAILED:
            out.append((name, wanted, False))
        elif (
            error_code == _OK
            and ops not in (_NOT_PROVIDED, 0)
            and not ops & (1 << OPERATIONS[wanted])
        ):
            out.append((name, wanted, True))
    return out


async def check_topic_access(
    what: str, servers: str, config: KafkaClientConfig | None, topics: Mapping[str, str]
) -> None:
    """Fail if the broker denies ``config``'s principal an operation on a topic.

    Asked only on secured connections (TLS or SASL: where principals and ACLs mean
    something); a plaintext client is left to the broker, as before. Never per event.

    Args:
        what: the client's owner (``kafka sink for topic 'out'``).
        servers: the bootstrap servers.
        config: the connection settings the source or sink uses.
        topics: topic -> the operation it needs (``READ``, ``WRITE``).

    Raises:
        StackError: naming the principal, the operation, the topic and the grant command.
    """
    if config is None or config.security_protocol == "PLAINTEXT" or not topics:
        return
    from aiokafka import AIOKafkaClient
    from aiokafka.errors import KafkaError

    client = AIOKafkaClient(bootstrap_servers=servers, **kafka_client_kwargs(config))
    try:
        try:
            await client.bootstrap()
        except (KafkaError, OSError) as e:  # the client's own start names why (login, TLS)
            log.debug("%s: cannot connect to ask for its ACLs (%s)", what, e)
            return
        try:
            answer = await client.send(client.get_random_node(), TopicOperationsRequest([*topics]))
        except (KafkaError, NotImplementedError, OSError) as e:  # no v8 (Tansu), a timeout
            log.warning("%s: the broker did not say what it authorizes (%s); not checked", what, e)
            return
    finally:
        await client.close()
    problems = denied(topics, answer)
    if not problems:
        return
    principal = principal_of(config)
    named = principal if principal.startswith("User:") else "PRINCIPAL"
    lines = []
    for topic, op, sees in problems:
        hidden = "" if sees else f" (it may not even DESCRIBE {topic!r})"
        lines.append(
            f"principal {principal} is not authorized to {op} topic {topic!r}{hidden}; grant it "
            f"with: kafka-acls.sh --bootstrap-server {servers} --command-config admin.properties "
            f"--add --allow-principal {named} --operation {op} --topic {topic}"
        )
    msg = f"{what} on the Kafka cluster at {servers}: " + " and ".join(lines)
    raise StackError(msg)
