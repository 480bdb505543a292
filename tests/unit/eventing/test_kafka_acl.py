"""The Metadata v8 request and answer of the start-time ACL check (``eventing._kafka_acl``).

Built on aiokafka's protocol classes: these tests pin their encoding to the Kafka protocol
(``MetadataRequest``/``MetadataResponse`` v8, KIP-430), so an aiokafka upgrade that changes
them fails here rather than silently skipping the check.
"""

from __future__ import annotations

import struct

import pytest

from eventbus.eventing import KafkaClientConfig
from eventbus.eventing._kafka_acl import (
    OPERATIONS,
    MetadataRequestV8,
    MetadataResponseV8,
    TopicOperationsRequest,
    check_topic_access,
    denied,
    principal_of,
)


def _str(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def test_request_encodes_as_metadata_v8() -> None:
    req = TopicOperationsRequest(["out"]).prepare({3: (4, 13)})
    assert isinstance(req, MetadataRequestV8)
    assert (req.API_KEY, req.API_VERSION) == (3, 8)
    # topics [out], allow_auto_topic_creation false, cluster ops false, topic ops true
    assert req.encode() == struct.pack(">i", 1) + _str("out") + b"\x00\x00\x01"


def test_request_refuses_a_broker_without_v8() -> None:
    with pytest.raises(NotImplementedError):
        TopicOperationsRequest(["out"]).prepare({3: (0, 5)})


def _answer(*topics: tuple[int, str, int]) -> MetadataResponseV8:
    body = struct.pack(">i", 0)  # throttle
    body += (
        struct.pack(">i", 1) + struct.pack(">i", 1) + _str("127.0.0.1") + struct.pack(">i", 9092)
    )
    body += struct.pack(">h", -1)  # rack: null
    body += _str("cluster") + struct.pack(">i", 1)
    body += struct.pack(">i", len(topics))
    for error, name, ops in topics:
        body += struct.pack(">h", error) + _str(name) + b"\x00"
        body += struct.pack(">i", 1)  # one partition
        body += struct.pack(">hiii", 0, 0, 1, 0)  # error, index, leader, leader epoch
        body += struct.pack(">ii", 1, 1) + struct.pack(">ii", 1, 1) + struct.pack(">i", 0)
        body += struct.pack(">i", ops)
    body += struct.pack(">i", -(2**31))
    return MetadataResponseV8.decode(body)


def _bits(*ops: str) -> int:
    return sum(1 << OPERATIONS[o] for o in ops)


def test_answer_decodes_and_judges_each_wanted_operation() -> None:
    answer = _answer(
        (0, "in", _bits("READ", "DESCRIBE")),
        (0, "out", _bits("DESCRIBE")),
        (29, "hidden", -(2**31)),  # TOPIC_AUTHORIZATION_FAILED: not even DESCRIBE
        (3, "missing", -(2**31)),  # UNKNOWN_TOPIC_OR_PARTITION: not judged
        (0, "unreported", -(2**31)),  # the broker did not compute it: not judged
    )
    wants = {"in": "READ", "out": "WRITE", "hidden": "WRITE", "missing": "WRITE"}
    assert denied(wants | {"unreported": "WRITE"}, answer) == [
        ("out", "WRITE", True),
        ("hidden", "WRITE", False),
    ]


def test_principal_as_kafka_acls_names_it() -> None:
    scram = KafkaClientConfig.model_validate(
        {
            "security_protocol": "SASL_SSL",
            "sasl": {"mechanism": "SCRAM-SHA-512", "username": "alice", "password": {"env": "P"}},
        }
    )
    assert principal_of(scram) == "User:alice"
    assert principal_of(KafkaClientConfig(security_protocol="SSL")) == "User:ANONYMOUS"


async def test_plaintext_clients_are_not_asked() -> None:
    # no connection is made (nothing listens on port 1): plaintext is left to the broker
    await check_topic_access("sink", "127.0.0.1:1", None, {"out": "WRITE"})
    await check_topic_access("sink", "127.0.0.1:1", KafkaClientConfig(), {"out": "WRITE"})
