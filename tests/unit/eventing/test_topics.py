"""Topic names and ``create:`` in the Kafka source and sink configs (no broker)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from eventbus.eventing._topics import (
    MAX_TOPIC_NAME,
    TopicCreateConfig,
    topic_name_problem,
    topic_suggestion,
)
from eventbus.eventing.sinks import KafkaSinkConfig
from eventbus.eventing.sources import KafkaSourceConfig


@pytest.mark.parametrize("name", ["orders", "a.b_c-D9", "x" * MAX_TOPIC_NAME, "_schemas"])
def test_valid_names(name: str) -> None:
    assert topic_name_problem(name) is None
    KafkaSinkConfig(topic=name)
    KafkaSourceConfig(topic=[name, "other"])


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        ("", "topic is empty"),
        (".", "'.' and '..' are reserved"),
        ("a b", "' ' is not allowed"),
        ("a/b\x00c", "'\\x00', '/' are not allowed"),
        ("x" * (MAX_TOPIC_NAME + 1), "(250 characters) is too long for Kafka"),
        ("ü" * 1_000_000, "(1000000 characters) is too long"),
    ],
)
def test_invalid_names_are_named_with_the_fix(name: str, expect: str) -> None:
    problem = topic_name_problem(name)
    assert problem is not None and expect in problem
    assert len(problem) < 300  # a huge name is cut in the message
    with pytest.raises(ValidationError, match="topic"):
        KafkaSinkConfig(topic=name)
    with pytest.raises(ValidationError, match="topic"):
        KafkaSourceConfig(topic=["fine", name])


def test_suggestion_is_the_closest_user_topic() -> None:
    existing = {"payments", "payments-large", "__consumer_offsets", "orders"}
    assert topic_suggestion("paymnets", existing) == " (did you mean 'payments'?)"
    assert topic_suggestion("__consumer_offset", existing) == ""  # Kafka's own: never
    assert topic_suggestion("zzz", existing) == ""


def test_create_config() -> None:
    assert KafkaSinkConfig(topic="t").create is None
    assert KafkaSinkConfig(topic="t", create={}).create == TopicCreateConfig()
    src = KafkaSourceConfig(topic="t", create={"partitions": 6, "replication_factor": 3})
    assert src.create is not None and (src.create.partitions, src.create.replication_factor) == (
        6,
        3,
    )
    for bad in (
        {"partitions": 0},
        {"partitions": 10_001},
        {"partitons": 3},
        {"replication_factor": 0},
    ):
        with pytest.raises(ValidationError):
            KafkaSinkConfig(topic="t", create=bad)
