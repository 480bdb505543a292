"""The hand-written CloudEvents codecs, checked against the cloudevents 2.x SDK."""

from __future__ import annotations

import base64
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from cloudevents.core.bindings import kafka as sdk_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent as SdkEvent

from eventbus.errors import EventDecodeError
from eventbus.eventing import _event as _event_module
from eventbus.eventing._codecs import (
    RawRecord,
    decode_kafka,
    decode_kafka_fast,
    decode_kafka_records,
    encode_kafka_binary,
    encode_kafka_structured,
    event_from_json,
    event_to_json,
    events_from_json_batch,
)
from eventbus.eventing._event import CloudEvent, format_time, parse_time, time_ms

TIME = "2024-05-01T12:00:00.250000Z"
WHERE: dict[str, Any] = {"topic": "payments", "partition": 2, "offset": 1042}


def decode(
    value: bytes | None, headers: list[tuple[str, bytes]], key: bytes | None = None
) -> CloudEvent:
    return decode_kafka(
        value,
        headers,
        key=key,
        default_type="eventbus.message",
        default_source="kafka://payments",
        **WHERE,
    )


def binary_headers(**attrs: str) -> list[tuple[str, bytes]]:
    base = {"specversion": "1.0", "id": "e1", "source": "/shop", "type": "payment.created"}
    base.update(attrs)
    return [("ce_" + k, v.encode()) for k, v in base.items()]


EVENTS = {
    "json-object": CloudEvent.create(
        type="payment.created", source="/shop", id="1", data={"amount": 5, "tags": ["a"]}, time=TIME
    ),
    "json-list": CloudEvent.create(type="t", source="/s", id="2", data=[1, 2.5, None, "x"]),
    "json-string": CloudEvent.create(
        type="t", source="/s", id="3", data="hello", datacontenttype="application/json"
    ),
    "json-suffix": CloudEvent.create(
        type="t",
        source="/s",
        id="4",
        data={"v": 1},
        datacontenttype="application/vnd.shop+json; charset=utf-8",
    ),
    "no-data": CloudEvent.create(type="t", source="/s", id="5"),
    "bytes": CloudEvent.create(
        type="t",
        source="/s",
        id="6",
        data=b"\x00\xff\x10",
        datacontenttype="application/octet-stream",
    ),
    "text": CloudEvent.create(
        type="t", source="/s", id="7", data="héllo".encode(), datacontenttype="text/plain"
    ),
    "all-attributes": CloudEvent.create(
        type="t",
        source="https://example.com/src",
        id="8",
        data={"k": "v"},
        time="2024-05-01T14:00:00+02:00",
        subject="sub/1",
        dataschema="https://example.com/schema.json",
        partitionkey="cust-9",
        traceparent="00-abc-def-01",
    ),
}


# -- round trips ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(EVENTS))
def test_binary_round_trip(name: str) -> None:
    event = EVENTS[name]
    headers, value = encode_kafka_binary(event)
    key = event.get("partitionkey", "").encode() or None
    assert decode(value, headers, key) == event


@pytest.mark.parametrize("name", list(EVENTS))
def test_structured_round_trip(name: str) -> None:
    event = EVENTS[name]
    headers, value = encode_kafka_structured(event)
    assert headers == [("content-type", b"application/cloudevents+json")]
    assert decode(value, headers) == event


@pytest.mark.parametrize("name", list(EVENTS))
def test_json_format_round_trip(name: str) -> None:
    event = EVENTS[name]
    raw = event_to_json(event)
    assert event_from_json(raw) == event
    assert event_from_json(orjson.loads(raw)) == event
    assert event_from_json(raw.decode()) == event


def test_structured_keeps_extension_types_binary_makes_them_strings() -> None:
    event = CloudEvent.create(type="t", source="/s", id="1", count=3, flag=True)
    assert decode(*reversed(encode_kafka_structured(event)))["count"] == 3  # type: ignore[misc]
    headers, value = encode_kafka_binary(event)
    assert ("ce_count", b"3") in headers and ("ce_flag", b"true") in headers
    decoded = decode(value, headers)
    assert (decoded["count"], decoded["flag"]) == ("3", "true")


def test_bytes_data_is_data_base64_in_json() -> None:
    event = EVENTS["bytes"]
    obj = orjson.loads(event_to_json(event))
    assert obj["data_base64"] == base64.b64encode(b"\x00\xff\x10").decode()
    assert "data" not in obj


def test_text_data_given_as_json_string_becomes_bytes() -> None:
    raw = {
        "specversion": "1.0",
        "id": "1",
        "source": "/s",
        "type": "t",
        "datacontenttype": "text/plain",
        "data": "hi",
    }
    assert event_from_json(raw).data == b"hi"


def test_null_attributes_are_absent() -> None:
    raw = {
        "specversion": "1.0",
        "id": "1",
        "source": "/s",
        "type": "t",
        "subject": None,
        "data": None,
    }
    assert event_from_json(raw) == CloudEvent(
        {"specversion": "1.0", "id": "1", "source": "/s", "type": "t"}
    )


def test_batch_format() -> None:
    events = [EVENTS["json-object"], EVENTS["bytes"], EVENTS["no-data"]]
    raw = orjson.dumps([orjson.loads(event_to_json(e)) for e in events])
    assert events_from_json_batch(raw) == events
    assert events_from_json_batch(orjson.loads(raw)) == events
    assert events_from_json_batch(b"[]") == []


def test_datetime_time_attribute_is_written_as_rfc3339() -> None:
    event = CloudEvent(
        {
            "specversion": "1.0",
            "id": "1",
            "source": "/s",
            "type": "t",
            "time": datetime(2024, 5, 1, 12, tzinfo=UTC),
        }
    )
    headers, _ = encode_kafka_binary(event)
    assert ("ce_time", b"2024-05-01T12:00:00Z") in headers
    assert orjson.loads(event_to_json(event))["time"] == "2024-05-01T12:00:00Z"


# -- the Kafka key and plain messages ---------------------------------------------------------
def test_key_becomes_partitionkey_unless_set() -> None:
    assert decode(b"{}", binary_headers(), key=b"k1")["partitionkey"] == "k1"
    assert decode(b"{}", binary_headers(partitionkey="mine"), key=b"k1")["partitionkey"] == "mine"
    structured = encode_kafka_structured(EVENTS["json-object"])
    assert decode(structured[1], structured[0], key=b"k2")["partitionkey"] == "k2"
    assert "partitionkey" not in decode(b"{}", binary_headers()).attributes


def test_plain_json_message_is_wrapped_with_deterministic_id() -> None:
    event = decode(b'{"amount": 5}', [("x-trace", b"abc")], key=b"cust-1")
    assert event.attributes == {
        "specversion": "1.0",
        "id": "payments-2-1042",
        "source": "kafka://payments",
        "type": "eventbus.message",
        "datacontenttype": "application/json",
        "partitionkey": "cust-1",
    }
    assert event.data == {"amount": 5}
    assert decode(b'{"amount": 5}', [], key=b"cust-1") == event  # redelivery: same id


def test_plain_non_json_message_is_bytes() -> None:
    event = decode(b"\x00not json", [])
    assert event.data == b"\x00not json"
    assert event.datacontenttype == "application/octet-stream"
    assert event.id == "payments-2-1042"


def test_plain_message_content_type_header_is_used() -> None:
    assert decode(b"hello", [("content-type", b"text/plain")]).data == b"hello"
    assert decode(b"hello", [("content-type", b"text/plain")]).datacontenttype == "text/plain"
    assert decode(b'{"a":1}', [("Content-Type", b"application/json")]).data == {"a": 1}


def test_plain_tombstone_has_no_data() -> None:
    event = decode(None, [], key=b"k")
    assert event.data is None and "datacontenttype" not in event.attributes


def test_binary_without_content_type_parses_json_else_bytes() -> None:
    assert decode(b'{"a": 1}', binary_headers()).data == {"a": 1}
    event = decode(b"\xffraw", binary_headers())
    assert (event.data, event.datacontenttype) == (b"\xffraw", "application/octet-stream")
    assert decode(None, binary_headers()).data is None


def test_binary_header_names_are_case_insensitive() -> None:
    headers = [("CE_SpecVersion", b"1.0"), ("Ce_Id", b"1"), ("ce_source", b"/s"), ("ce_type", b"t")]
    assert decode(None, headers).attributes == {
        "specversion": "1.0",
        "id": "1",
        "source": "/s",
        "type": "t",
    }


# -- interoperability with the cloudevents SDK ------------------------------------------------
def sdk_attributes(event: Any) -> dict[str, Any]:
    attrs = dict(event.get_attributes())
    if isinstance(attrs.get("time"), datetime):
        text = attrs["time"].isoformat()
        attrs["time"] = text[:-6] + "Z" if text.endswith("+00:00") else text
    return attrs


def to_sdk(event: CloudEvent) -> SdkEvent:
    attrs = dict(event.attributes)
    if "time" in attrs:
        attrs["time"] = datetime.fromisoformat(attrs["time"])
    return SdkEvent(attributes=attrs, data=event.data)


SDK_SAFE = ["json-object", "json-suffix", "bytes", "all-attributes"]  # the SDK reads text as str


@pytest.mark.parametrize("name", SDK_SAFE)
def test_sdk_reads_our_binary(name: str) -> None:
    event = EVENTS[name].replace(time=EVENTS[name].time or TIME)  # the SDK adds time when absent
    headers, value = encode_kafka_binary(event)
    message = sdk_kafka.KafkaMessage(
        headers=dict(headers), key=event.get("partitionkey"), value=value or b""
    )
    parsed = sdk_kafka.from_binary_event(message)
    assert sdk_attributes(parsed) == {
        **event.attributes,
        "time": sdk_attributes(to_sdk(event))["time"],
    }
    assert parsed.get_data() == event.data


@pytest.mark.parametrize("name", SDK_SAFE)
def test_sdk_reads_our_structured(name: str) -> None:
    event = EVENTS[name].replace(time=EVENTS[name].time or TIME)
    headers, value = encode_kafka_structured(event)
    parsed = sdk_kafka.from_structured_event(
        sdk_kafka.KafkaMessage(headers=dict(headers), key=None, value=value)
    )
    assert sdk_attributes(parsed) == {
        **event.attributes,
        "time": sdk_attributes(to_sdk(event))["time"],
    }
    assert parsed.get_data() == event.data


def test_sdk_adds_time_when_absent() -> None:
    event = EVENTS["json-object"].replace(time=None)
    headers, value = encode_kafka_binary(event)
    parsed = sdk_kafka.from_binary_event(
        sdk_kafka.KafkaMessage(headers=dict(headers), key=None, value=value or b"")
    )
    attrs = sdk_attributes(parsed)
    assert isinstance(attrs.pop("time"), str)  # the SDK's own addition
    assert attrs == event.attributes


@pytest.mark.parametrize("name", SDK_SAFE)
@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_we_read_the_sdks_messages(name: str, mode: str) -> None:
    sdk_event = to_sdk(EVENTS[name].replace(time=EVENTS[name].time or TIME))
    if mode == "binary":
        message = sdk_kafka.to_binary(sdk_event, JSONFormat())
    else:
        message = sdk_kafka.to_structured(sdk_event, JSONFormat())
    key = message.key.encode() if isinstance(message.key, str) else message.key
    ours = decode(message.value, list(message.headers.items()), key)
    assert ours.attributes == sdk_attributes(sdk_event)
    assert ours.data == sdk_event.get_data()


def test_we_read_sdk_event_with_generated_time_and_id() -> None:
    sdk_event = SdkEvent(attributes={"type": "t", "source": "/s"}, data={"x": 1})
    message = sdk_kafka.to_binary_event(sdk_event)
    ours = decode(message.value, list(message.headers.items()))
    assert ours.attributes == sdk_attributes(sdk_event)
    assert ours.data == {"x": 1}


def test_sdk_json_format_and_ours_agree() -> None:
    event = EVENTS["all-attributes"]
    ours = orjson.loads(event_to_json(event))
    theirs = orjson.loads(JSONFormat().write(to_sdk(event)))
    theirs["time"] = event.time  # the SDK rewrites the offset form; same instant
    assert ours == theirs
    assert (
        event_from_json(
            JSONFormat().write(
                to_sdk(EVENTS["bytes"]).__class__(
                    attributes={
                        **EVENTS["bytes"].attributes,
                        "time": datetime(2024, 5, 1, tzinfo=UTC),
                    },
                    data=b"\x00\xff\x10",
                )
            )
        ).data
        == b"\x00\xff\x10"
    )


# -- every error message ----------------------------------------------------------------------
P = "payments[2]@1042: "
STRUCTURED = [("content-type", b"application/cloudevents+json")]


def structured(**obj: Any) -> bytes:
    base: dict[str, Any] = {"specversion": "1.0", "id": "e1", "source": "/shop", "type": "t"}
    base.update(obj)
    return orjson.dumps({k: v for k, v in base.items() if v is not ...})


DECODE_ERRORS = [
    (
        b"{}",
        binary_headers(specversion="0.3"),
        "header ce_specversion is '0.3'; EventBus speaks CloudEvents 1.0 (ce_specversion: 1.0)",
    ),
    (
        b"{}",
        [("ce_type", b"t"), ("ce_id", b"1")],
        (
            "headers ce_id, ce_type look like a binary-mode CloudEvent but header ce_specversion is "
            "missing; add header ce_specversion: 1.0 (or drop the ce_ headers to send a plain message)"
        ),
    ),
    (
        b"{}",
        [h for h in binary_headers() if h[0] != "ce_source"],
        "header ce_source is missing; every CloudEvent needs source (add header ce_source)",
    ),
    (b"{}", binary_headers(id=""), "header ce_id is ''; id must be a non-empty string"),
    (
        b"{}",
        binary_headers(time="yesterday"),
        (
            "header ce_time is 'yesterday'; time must be RFC 3339 with an offset, like "
            "'2024-05-01T12:00:00Z'"
        ),
    ),
    (
        b"{}",
        binary_headers(time="2024-05-01T12:00:00"),
        (
            "header ce_time is '2024-05-01T12:00:00'; time must be RFC 3339 with an offset, like "
            "'2024-05-01T12:00:00Z'"
        ),
    ),
    (
        b"{}",
        [*binary_headers(), ("ce_Bad_Name", b"x")],
        (
            "header ce_bad_name names attribute 'bad_name'; CloudEvents attribute names must match "
            "[a-z0-9]{1,20} (lowercase letters and digits, at most 20); rename it"
        ),
    ),
    (
        b"{}",
        [*binary_headers(), ("ce_" + "a" * 21, b"x")],
        (
            f"header ce_{'a' * 21} names attribute '{'a' * 21}'; CloudEvents attribute names must "
            "match [a-z0-9]{1,20} (lowercase letters and digits, at most 20); rename it"
        ),
    ),
    (
        b"{}",
        [*binary_headers(), ("ce_datacontenttype", b"application/json")],
        (
            "header ce_datacontenttype is set; in the Kafka binding datacontenttype travels in the "
            "content-type header; rename the header to content-type"
        ),
    ),
    (
        b"{}",
        [*binary_headers()[:-1], ("ce_type", b"\xff\xfe")],
        "header ce_type is not UTF-8 (b'\\xff\\xfe'); CloudEvents header values are UTF-8 text",
    ),
    (
        b"{oops",
        [*binary_headers(), ("content-type", b"application/json")],
        (
            "value is not valid JSON (<orjson's message>; starts "
            "b'{oops') but the content type is 'application/json'; send JSON, or set the content "
            "type to the payload's media type"
        ),
    ),
    (
        b"{oops",
        [("content-type", b"application/json")],
        (
            "value is not valid JSON (<orjson's message>; starts "
            "b'{oops') but the content type is 'application/json'; send JSON, or set the content "
            "type to the payload's media type"
        ),
    ),
    (
        b"[1]",
        [("content-type", b"application/cloudevents-batch+json")],
        (
            "header content-type is 'application/cloudevents-batch+json'; the Kafka binding carries "
            "one event per record, so send each event as its own record "
            "(application/cloudevents+json)"
        ),
    ),
    (
        b"<e/>",
        [("content-type", b"application/cloudevents+xml")],
        (
            "header content-type is 'application/cloudevents+xml'; EventBus reads the JSON event "
            "format only (content-type: application/cloudevents+json)"
        ),
    ),
    (
        None,
        STRUCTURED,
        (
            "header content-type is application/cloudevents+json but the value is empty; send the "
            "event as a JSON object in the value"
        ),
    ),
    (
        b"{not json",
        STRUCTURED,
        (
            "value is not valid JSON (<orjson's message>; starts "
            "b'{not json') but header content-type is application/cloudevents+json; send the event "
            "as a JSON object, or use binary mode"
        ),
    ),
    (
        b"[1, 2]",
        STRUCTURED,
        (
            "the event is a JSON list, not an object; structured mode carries one event as a JSON "
            "object with specversion, id, source and type"
        ),
    ),
    (
        structured(specversion="0.3"),
        STRUCTURED,
        (
            "attribute 'specversion' is '0.3'; EventBus speaks CloudEvents 1.0 "
            '("specversion": "1.0")'
        ),
    ),
    (
        structured(specversion=...),
        STRUCTURED,
        'attribute \'specversion\' is missing; add "specversion": "1.0"',
    ),
    (
        structured(type=...),
        STRUCTURED,
        "attribute 'type' is missing; every CloudEvent needs type (add \"type\" to the JSON object)",
    ),
    (structured(id=42), STRUCTURED, "attribute 'id' is 42 (int); id must be a string (quote it)"),
    (
        structured(subject=["a"]),
        STRUCTURED,
        "attribute 'subject' is ['a'] (list); subject must be a string (quote it)",
    ),
    (
        structured(time=1714564800),
        STRUCTURED,
        (
            "attribute 'time' is 1714564800 (int); time must be an RFC 3339 string like "
            "'2024-05-01T12:00:00Z'"
        ),
    ),
    (
        structured(amount=1.5),
        STRUCTURED,
        (
            "attribute 'amount' is 1.5 (float); extension attribute values must be strings, integers "
            "or booleans; encode it as a string"
        ),
    ),
    (
        structured(Amount="1"),
        STRUCTURED,
        (
            "attribute 'Amount' names attribute 'Amount'; CloudEvents attribute names must match "
            "[a-z0-9]{1,20} (lowercase letters and digits, at most 20); rename it"
        ),
    ),
    (
        structured(data=1, data_base64="AA=="),
        STRUCTURED,
        'the event has both "data" and "data_base64"; send only one',
    ),
    (
        structured(data_base64="not base64!"),
        STRUCTURED,
        (
            "\"data_base64\" is not valid base64 (starts 'not base64!'); encode the bytes with "
            'standard base64 (RFC 4648), or send JSON data in "data"'
        ),
    ),
    (structured(data_base64=5), STRUCTURED, '"data_base64" is 5 (int); it must be a base64 string'),
]


@pytest.mark.parametrize(("value", "headers", "message"), DECODE_ERRORS)
def test_decode_errors_name_place_value_and_fix(
    value: bytes | None, headers: list[tuple[str, bytes]], message: str
) -> None:
    # orjson's own wording differs between versions; pin everything around it.
    pattern = ".+?".join(re.escape(part) for part in (P + message).split("<orjson's message>"))
    with pytest.raises(EventDecodeError, match=pattern + "$"):
        decode(value, headers)


def test_event_decode_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="ce_specversion"):
        decode(b"{}", binary_headers(specversion="0.3"))


def test_json_format_errors() -> None:
    with pytest.raises(EventDecodeError, match=re.escape("CloudEvent JSON: not valid JSON (")):
        event_from_json(b"{nope")
    with pytest.raises(
        EventDecodeError, match=re.escape("CloudEvent JSON: attribute 'source' is missing")
    ):
        event_from_json({"specversion": "1.0", "id": "1", "type": "t"})


def test_batch_errors_name_the_index() -> None:
    good = orjson.loads(event_to_json(EVENTS["json-object"]))
    with pytest.raises(
        EventDecodeError,
        match=re.escape(
            "batch[1]: attribute 'specversion' is '0.3'; EventBus speaks CloudEvents 1.0"
        ),
    ):
        events_from_json_batch(orjson.dumps([good, {**good, "specversion": "0.3"}]))
    with pytest.raises(
        EventDecodeError,
        match=re.escape(
            "CloudEvent batch: got a JSON dict; the batch format is a JSON array of events "
            "(send a single event as structured mode instead)"
        ),
    ):
        events_from_json_batch(orjson.dumps(good))
    with pytest.raises(EventDecodeError, match=re.escape("CloudEvent batch: not valid JSON (")):
        events_from_json_batch(b"[")


# The decoder has a fast path for the usual binary-mode record (spec headers only, JSON
# content): an extra extension header sends the same record down the general path, so the
# two can be compared on every shape the fast path may take or must refuse.
FAST_PATH_CASES: dict[str, tuple[bytes | None, list[tuple[str, bytes]], bytes | None]] = {
    "json": (b'{"a": 1}', [*binary_headers(), ("content-type", b"application/json")], b"k1"),
    "json-no-key": (b'{"a": 1}', [*binary_headers(), ("content-type", b"application/json")], None),
    "no-content-type-json": (b"[1, 2]", binary_headers(), None),
    "no-content-type-not-json": (b"\x00\x01", binary_headers(), None),
    "text-json": (b'"s"', [*binary_headers(), ("content-type", b"text/json")], None),
    "not-json-content": (b"abc", [*binary_headers(), ("content-type", b"text/plain")], None),
    "partitionkey-header-wins": (b"{}", binary_headers(partitionkey="pk"), b"k2"),
    "subject-and-dataschema": (b"{}", binary_headers(subject="s", dataschema="https://x/y"), None),
    "with-time": (b"{}", binary_headers(time=TIME), None),
    "with-whole-second-time": (b"{}", binary_headers(time="2024-05-01T12:00:00Z"), None),
    "with-offset-time": (b"{}", binary_headers(time="2024-05-01T14:00:00+02:00"), None),
    "duplicate-id-header": (b"{}", [*binary_headers(), ("ce_id", b"e2")], None),
    "empty-value": (b"", [*binary_headers(), ("content-type", b"application/json")], None),
    "tombstone": (None, binary_headers(), None),
}


@pytest.mark.parametrize("name", sorted(FAST_PATH_CASES))
def test_fast_path_decodes_like_the_general_path(name: str) -> None:
    value, headers, key = FAST_PATH_CASES[name]
    fast = decode(value, headers, key)
    general = decode(value, [*headers, ("ce_probe", b"1")], key)
    general.attributes.pop("probe")
    assert fast.attributes == general.attributes
    assert list(fast.attributes) == list(general.attributes)  # header order kept
    assert fast.data == general.data


@pytest.mark.parametrize(
    ("value", "headers", "key", "message"),
    [
        (
            b"{nope",
            [*binary_headers(), ("content-type", b"application/json")],
            None,
            "value is not valid JSON",
        ),
        (b"{}", binary_headers(id=""), None, "ce_id is ''"),
        (b"{}", binary_headers(time="2024-13-01T00:00:00Z"), None, "ce_time is '2024-13-01"),
        (b"{}", binary_headers(time="2024-05-01T12:00:00"), None, "ce_time is"),
        (b"{}", binary_headers(specversion="0.3"), None, "ce_specversion is '0.3'"),
        (b"{}", binary_headers(), b"\xff\xfe", "header key is not UTF-8"),
        (b"{}", [*binary_headers(), ("ce_type", b"\xff")], None, "not UTF-8"),
    ],
)
def test_fast_path_leaves_errors_to_the_general_path(
    value: bytes, headers: list[tuple[str, bytes]], key: bytes | None, message: str
) -> None:
    with pytest.raises(EventDecodeError, match=re.escape(message)):
        decode(value, headers, key)


@pytest.mark.parametrize(
    ("time", "fast"),
    [
        ("2024-05-01T12:00:00.250000Z", True),
        ("2024-05-01T12:00:00Z", True),
        ("2024-05-01T12:00:00.123456789Z", True),
        ("2024-05-01T14:00:00+02:00", False),  # an offset: the general path
        ("2024-05-01t12:00:00z", False),
        ("2024-05-01T12:00:00.1234567890Z", False),
        ("1969-12-31T23:59:59.5Z", False),
        ("2024-13-01T00:00:00Z", False),  # not a time: the general path names it
    ],
)
def test_fast_path_takes_the_usual_utc_time_only(time: str, fast: bool) -> None:
    got = decode_kafka_fast(b"{}", binary_headers(time=time), None)
    assert (got is not None) == fast
    if got is not None:
        general = decode(b"{}", [*binary_headers(time=time), ("ce_probe", b"1")])
        general.attributes.pop("probe")
        assert got.attributes == general.attributes


# decode_kafka_records is the path every Kafka consumer of events takes (the source, the
# replica decoding for a source actor, replay): record by record it must equal decode_kafka,
# whichever path (fast or general) a record takes, and report an undecodable one by position.
def raw(value: bytes | None, headers: list[tuple[str, bytes]], key: bytes | None) -> RawRecord:
    return RawRecord(value, headers, key, WHERE["topic"], WHERE["partition"], WHERE["offset"])


@pytest.mark.parametrize("name", sorted(FAST_PATH_CASES))
@pytest.mark.parametrize("general", [False, True], ids=["as-is", "general-path"])
def test_records_path_decodes_like_decode_kafka(name: str, general: bool) -> None:
    value, headers, key = FAST_PATH_CASES[name]
    if general:
        headers = [*headers, ("ce_probe", b"1")]
    expected = decode(value, headers, key)
    events, errors = decode_kafka_records(
        [raw(value, headers, key)], default_type="eventbus.message", default_source=None
    )
    assert errors == []
    [got] = events
    assert got.attributes == expected.attributes
    assert list(got.attributes) == list(expected.attributes)
    assert got.data == expected.data
    if general:
        assert decode_kafka_fast(value, headers, key) is None  # it did take the general path


def test_records_path_keeps_order_and_reports_errors_by_position() -> None:
    good = (b'{"a": 1}', [*binary_headers(), ("content-type", b"application/json")], b"k")
    bad_json = (b"{nope", [*binary_headers(), ("content-type", b"application/json")], None)
    bad_version = (b"{}", binary_headers(specversion="0.3"), None)
    plain = (b'{"p": 1}', [], None)
    records = [raw(*good), raw(*bad_json), raw(*plain), raw(*bad_version), raw(*good)]
    events, errors = decode_kafka_records(
        records, default_type="eventbus.message", default_source="kafka://payments"
    )
    assert [e.data for e in events] == [{"a": 1}, {"p": 1}, {"a": 1}]
    assert [i for i, _ in errors] == [1, 3]
    for (_, error), (value, headers, key) in zip(errors, [bad_json, bad_version]):
        assert isinstance(error, EventDecodeError)
        with pytest.raises(EventDecodeError) as expected:
            decode(value, headers, key)
        assert str(error) == str(expected.value)
        assert str(error).startswith("payments[2]@1042")


def test_records_path_default_source_is_the_topic() -> None:
    for default_source in (None, ""):
        events, _ = decode_kafka_records(
            [raw(b"1", [], None)], default_type="my.type", default_source=default_source
        )
        assert (events[0].source, events[0].type) == ("kafka://payments", "my.type")
    events, _ = decode_kafka_records(
        [raw(b"1", [], None)], default_type="my.type", default_source="/mine"
    )
    assert events[0].source == "/mine"


def test_records_path_takes_consumer_records() -> None:
    from aiokafka.structs import ConsumerRecord

    value, headers, key = FAST_PATH_CASES["json"]
    record = ConsumerRecord("payments", 2, 1042, 0, 0, key, value, None, 0, 0, tuple(headers))
    events, errors = decode_kafka_records(
        [record], default_type="eventbus.message", default_source=None
    )
    assert errors == []
    assert events[0].attributes == decode(value, headers, key).attributes


def test_binary_headers_of_new_names_and_non_string_values_take_the_general_path() -> None:
    # The per-event fast path covers string attributes of known header names; anything else
    # (a name first seen, None, bytes, a datetime) is encoded by the general loop.
    name = "fresh" + uuid.uuid4().hex[:8]  # a name no earlier encode saw
    event = CloudEvent(
        {
            "specversion": "1.0",
            "id": "1",
            "source": "/s",
            "type": "t",
            name: "v",
            "skipped": None,
            "blob": b"ab",
            "when": datetime(2024, 5, 1, 12, tzinfo=UTC),
        },
        [1, 2],
    )
    headers, value = encode_kafka_binary(event)
    assert headers == [
        ("ce_specversion", b"1.0"),
        ("ce_id", b"1"),
        ("ce_source", b"/s"),
        ("ce_type", b"t"),
        (f"ce_{name}", b"v"),
        ("ce_blob", b"YWI="),
        ("ce_when", b"2024-05-01T12:00:00Z"),
    ]
    assert value == b"[1,2]"
    again, _ = encode_kafka_binary(CloudEvent({"id": "2", name: "w"}, {"a": 1}))
    assert again == [("ce_id", b"2"), (f"ce_{name}", b"w")]  # the name is known now


@pytest.mark.parametrize(
    "text",
    [
        "2024-05-01T12:00:00Z",
        "2024-05-01T12:00:00.250Z",
        "2024-05-01T12:00:00.999999Z",
        "2024-05-01T12:00:00.0009Z",
        "2024-05-01T14:00:00.5+02:00",
        "2024-05-01T12:00:00.25z",
        "1969-12-31T23:59:59.5Z",
        "2000-02-29T00:00:00.001Z",
    ],
)
def test_time_ms_equals_parse_time(text: str) -> None:
    # the fast path (usual UTC text, a cache of parsed seconds) gives what parsing does
    expected = int(parse_time(text).timestamp() * 1000)
    assert time_ms(text) == expected
    assert time_ms(text) == expected  # again, from the cache


def test_time_ms_cache_stays_bounded_and_keeps_giving_right_answers() -> None:
    base = parse_time("2024-05-01T00:00:00Z")
    for s in range(0, 3 * 4096, 7):
        text = format_time(base + timedelta(seconds=s, milliseconds=s % 1000))
        assert time_ms(text) == int((base + timedelta(seconds=s)).timestamp()) * 1000 + s % 1000
    assert len(_event_module._HEADS) <= _event_module._HEADS_MAX


def test_whole_time_texts_cache_stays_bounded_and_keeps_giving_right_answers() -> None:
    # utc_ms keeps the texts it parsed (decode checks an event's time, a step windows it):
    # more distinct texts than it keeps, each asked twice, all right; other texts not kept
    base = parse_time("2024-05-01T00:00:00Z")
    n = 2 * _event_module._TIMES_MAX + 100
    for i in range(n):
        text = format_time(base + timedelta(milliseconds=37 * i))
        expected = int(base.timestamp()) * 1000 + 37 * i
        assert time_ms(text) == expected
        assert time_ms(text) == expected  # again, from the cache
        assert len(_event_module._TIMES) <= _event_module._TIMES_MAX
    assert time_ms("2024-05-01T14:00:00.5+02:00") == int(base.timestamp()) * 1000 + 43_200_500
    assert "2024-05-01T14:00:00.5+02:00" not in _event_module._TIMES
    with pytest.raises(ValueError, match="2024-13-01T00:00:00Z"):
        time_ms("2024-13-01T00:00:00Z")
    assert "2024-13-01T00:00:00Z" not in _event_module._TIMES


@pytest.mark.parametrize(
    "text", ["2024-02-30T00:00:00Z", "2024-05-01T25:00:00Z", "2024-05-01T12:00:00", "nope", ""]
)
def test_time_ms_names_a_bad_time(text: str) -> None:
    with pytest.raises(ValueError, match=f"time {re.escape(repr(text))} (is not|has no UTC)"):
        time_ms(text)
