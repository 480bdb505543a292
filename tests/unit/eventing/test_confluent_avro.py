"""The Confluent wire format's header checks, JSON of Avro data, and the source's config."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import ValidationError

from eventbus.errors import EventDecodeError
from eventbus.eventing._confluent_avro import AvroWireDecoder, avro_to_json
from eventbus.eventing.sources import KafkaSourceConfig


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        (None, "has no value"),
        (b"", "0 bytes, shorter than the 5-byte Confluent header"),
        (b"\x00\x00\x00\x01", "4 bytes, shorter"),
        (b"\x07\x00\x00\x00\x01\x02", "magic byte 7 is not the Confluent wire format's 0"),
    ],
)
def test_bad_headers_are_named(value: bytes | None, expect: str) -> None:
    with pytest.raises(EventDecodeError, match=expect):
        AvroWireDecoder.schema_id(value)


def test_schema_id_is_big_endian() -> None:
    assert AvroWireDecoder.schema_id(b"\x00\x01\x00\x00\x00") == 1 << 24


def test_an_unfetched_id_is_a_decode_error_not_a_crash() -> None:
    decoder = AvroWireDecoder("http://127.0.0.1:1/registry")
    with pytest.raises(EventDecodeError, match="schema id 9 is not in the registry"):
        decoder.decode(b"\x00\x00\x00\x00\x09\x02")


def test_avro_data_as_json() -> None:
    assert avro_to_json({"b": b"\xff", "d": Decimal("1.50"), "n": None}) == (
        b'{"b":"/w==","d":"1.50","n":null}'
    )


def test_avro_needs_a_registry_url() -> None:
    with pytest.raises(ValidationError, match="schema_registry_url is not set"):
        KafkaSourceConfig(topic="t", value_format="avro")
    with pytest.raises(ValidationError, match="should match pattern"):
        KafkaSourceConfig(topic="t", value_format="avro", schema_registry_url="ftp://x")
    ok = KafkaSourceConfig(topic="t", value_format="avro", schema_registry_url="http://r:8081")
    assert ok.value_format == "avro"
