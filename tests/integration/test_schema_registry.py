"""EventBus's schema registry against confluent-kafka's own client and Avro serdes, its state
in a compacted topic of the session's broker: register, look up, configure, refuse an
incompatible change (409), survive a restart, and agree across two servers of one topic."""

from __future__ import annotations

import concurrent.futures
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from eventbus.schemas import kafka_registry_app
from tests.integration.registry_helpers import Served

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.tansu]


USER = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]}
USER_AGE = {
    "type": "record",
    "name": "User",
    "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int", "default": 0}],
}
USER_REQUIRED_CITY = {
    "type": "record",
    "name": "User",
    "fields": [{"name": "name", "type": "string"}, {"name": "city", "type": "string"}],
}


@pytest.fixture
def registry_factory(kafka_bootstrap: str) -> Iterator[Callable[[str], Served]]:
    started: list[Served] = []

    def make(topic: str) -> Served:
        served = Served(kafka_registry_app(kafka_bootstrap, topic=topic))
        started.append(served)
        return served

    yield make
    for s in started:
        if s.thread.is_alive():
            s.stop()


@pytest.fixture
def sr_client() -> Iterator[Callable[[str], SchemaRegistryClient]]:
    """confluent-kafka's client for a registry URL, closed after the test."""
    made: list[SchemaRegistryClient] = []

    def make(url: str) -> SchemaRegistryClient:
        made.append(SchemaRegistryClient({"url": url}))
        return made[-1]

    yield make
    for client in made:
        client.close()


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = condition()
            if value:
                return value
        except SchemaRegistryError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_confluent_client_serdes_and_restart(
    registry_factory: Callable[[str], Served], sr_client: Callable[[str], SchemaRegistryClient]
) -> None:
    topic = f"_schemas-{uuid.uuid4().hex[:8]}"
    first = registry_factory(topic)
    client = sr_client(first.url)
    subject = "users-value"

    user_id = client.register_schema(subject, Schema(json.dumps(USER), "AVRO"))
    assert json.loads(client.get_schema(user_id).schema_str) == USER
    assert client.get_subjects() == [subject]
    assert client.get_versions(subject) == [1]
    assert client.set_compatibility(subject, "FULL") == {"compatibility": "FULL"}
    assert client.get_compatibility(subject) == "FULL"
    candidate = Schema(json.dumps(USER_AGE), "AVRO")
    assert client.test_compatibility(subject, candidate) is True
    assert (
        client.test_compatibility(subject, Schema(json.dumps(USER_REQUIRED_CITY), "AVRO")) is False
    )
    age_id = client.register_schema(subject, candidate)
    assert age_id != user_id
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(USER_REQUIRED_CITY), "AVRO"))
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    with pytest.raises(SchemaRegistryError) as unknown:
        client.get_version(subject, 9)
    assert unknown.value.error_code == 40402

    # the Confluent wire format, written and read by confluent-kafka's Avro serdes
    ctx = SerializationContext("users", MessageField.VALUE)
    serializer = AvroSerializer(
        client,
        json.dumps(USER_AGE),
        conf={"auto.register.schemas": False, "use.latest.version": True},
    )
    wire = serializer({"name": "ada", "age": 36}, ctx)
    assert wire[0] == 0 and int.from_bytes(wire[1:5], "big") == age_id
    assert AvroDeserializer(client)(wire, ctx) == {"name": "ada", "age": 36}

    # a restart re-reads the topic: nothing is lost
    first.stop()
    second = registry_factory(topic)
    again = sr_client(second.url)
    assert again.get_versions(subject) == [1, 2]
    assert json.loads(again.get_schema(age_id).schema_str) == USER_AGE
    assert again.get_compatibility(subject) == "FULL"
    assert again.register_schema(subject, Schema(json.dumps(USER), "AVRO")) == user_id
    assert again.get_latest_version(subject).version == 2
    assert AvroDeserializer(again)(wire, ctx) == {"name": "ada", "age": 36}


def test_two_servers_of_one_topic_agree(
    registry_factory: Callable[[str], Served], sr_client: Callable[[str], SchemaRegistryClient]
) -> None:
    topic = f"_schemas-{uuid.uuid4().hex[:8]}"
    a, b = registry_factory(topic), registry_factory(topic)
    clients = [sr_client(s.url) for s in (a, b)]

    def register(i: int) -> tuple[str, int]:
        # both servers: one schema everyone registers, and one per call, at once
        client = clients[i % 2]
        shared = client.register_schema("shared", Schema(json.dumps(USER), "AVRO"))
        enum = {"type": "enum", "name": f"E{i}", "symbols": ["A"]}
        own = client.register_schema(f"own-{i}", Schema(json.dumps(enum), "AVRO"))
        return f"own-{i}", own + 1000 * shared

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(register, range(8)))
    shared_ids = {v // 1000 for _, v in results}
    own_ids = [v % 1000 for _, v in results]
    assert len(shared_ids) == 1, f"one schema got several ids: {shared_ids}"
    assert len(set(own_ids)) == 8 and shared_ids.isdisjoint(own_ids), own_ids
    for c in clients:
        wait_for(lambda c=c: len(c.get_subjects()) == 9, "both servers list the 9 subjects")
        assert c.get_versions("shared") == [1]
    # an id registered through one server is served by the other at once (it reads the
    # topic's end on a miss): a consumer may see a producer's record before the replay
    late = {"type": "fixed", "name": "F", "size": 16}
    late_id = clients[0].register_schema("late", Schema(json.dumps(late), "AVRO"))
    assert json.loads(sr_client(b.url).get_schema(late_id).schema_str) == late
    for subject, value in results:
        for s in (a, b):
            c = sr_client(s.url)
            assert c.get_latest_version(subject).schema_id == value % 1000


def test_the_registry_cli(tmp_path: Any) -> None:
    """``eventbus registry register|list|get|check`` against a served registry."""
    from typer.testing import CliRunner

    from eventbus.cli import app
    from eventbus.schemas import MemorySchemaLog, SchemaRegistry, build_registry_app

    served = Served(build_registry_app(SchemaRegistry(MemorySchemaLog())), lifespan="off")
    try:
        runner = CliRunner()
        user, city = tmp_path / "user.avsc", tmp_path / "city.avsc"
        user.write_text(json.dumps(USER))
        city.write_text(json.dumps(USER_REQUIRED_CITY))
        url = ["--url", served.url]

        def run(*argv: str) -> Any:
            return runner.invoke(app, ["registry", *argv, *url])

        assert run("register", "a/b-value", str(user)).output.strip() == "1"
        assert run("list").output.split() == ["a/b-value"]
        assert run("list", "a/b-value").output.split() == ["1"]
        assert json.loads(run("get", "a/b-value").output)["schema"] == json.dumps(USER)
        assert run("check", "a/b-value", str(user)).output.strip() == "compatible"
        refused = run("check", "a/b-value", str(city))
        assert refused.exit_code == 1
        assert "reader field 'city' is missing from the writer" in refused.output
        again = run("register", "a/b-value", str(city))
        assert again.exit_code == 1 and "(error_code 409;" in again.output
        missing = run("get", "nope")
        assert (
            missing.exit_code == 1
            and "Subject 'nope' not found. (error_code 40401" in missing.output
        )
        unreadable = run("register", "x", str(tmp_path / "none.avsc"))
        assert unreadable.exit_code == 1 and "cannot read the schema file" in unreadable.output
    finally:
        served.stop()
