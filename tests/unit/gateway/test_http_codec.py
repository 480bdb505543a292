"""The HTTP binding codec, checked against the cloudevents 2.x SDK's own HTTP messages."""

from __future__ import annotations

import re

import orjson
import pytest
from cloudevents.core.bindings import http as sdk_http
from cloudevents.core.formats.json import JSONFormat

from eventbus.errors import EventDecodeError
from eventbus.eventing._http_codec import (
    decode_http,
    encode_http_batch,
    encode_http_binary,
    encode_http_structured,
)
from tests.unit.eventing.test_codecs import EVENTS, SDK_SAFE, TIME, sdk_attributes, to_sdk


def decode(headers: dict[str, str], body: bytes) -> tuple[list, str]:
    return decode_http(
        {k.lower(): v for k, v in headers.items()},
        body,
        default_type="eventbus.http",
        default_source="/gw",
    )


@pytest.mark.parametrize("name", SDK_SAFE)
@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_we_read_the_sdks_http_messages(name: str, mode: str) -> None:
    sdk_event = to_sdk(EVENTS[name].replace(time=EVENTS[name].time or TIME))
    message = (
        sdk_http.to_binary(sdk_event, JSONFormat())
        if mode == "binary"
        else sdk_http.to_structured(sdk_event, JSONFormat())
    )
    events, got_mode = decode(dict(message.headers), message.body)
    assert got_mode == mode
    assert events[0].attributes == sdk_attributes(sdk_event)
    assert events[0].data == sdk_event.get_data()


@pytest.mark.parametrize("name", SDK_SAFE)
def test_sdk_reads_our_binary_and_structured(name: str) -> None:
    event = EVENTS[name].replace(time=EVENTS[name].time or TIME)
    for encode in (encode_http_binary, encode_http_structured):
        headers, body = encode(event)
        parsed = sdk_http.from_http(
            sdk_http.HTTPMessage(headers=dict(headers), body=body), JSONFormat()
        )
        assert sdk_attributes(parsed) == {
            **event.attributes,
            "time": sdk_attributes(to_sdk(event))["time"],
        }
        assert parsed.get_data() == event.data


def test_binary_header_values_are_percent_encoded_both_ways() -> None:
    event = EVENTS["json-object"].replace(subject='naïve "quoted" 100%')
    headers, body = encode_http_binary(event)
    value = dict(headers)["ce-subject"]
    assert value.isascii() and '"' not in value
    events, _ = decode(dict(headers), body)
    assert events[0].attributes["subject"] == 'naïve "quoted" 100%'


def test_batch_mode_round_trip() -> None:
    events = [EVENTS["json-object"], EVENTS["bytes"]]
    headers, body = encode_http_batch(events)
    got, mode = decode(dict(headers), body)
    assert mode == "batch"
    assert [e.attributes for e in got] == [e.attributes for e in events]
    assert [e.data for e in got] == [e.data for e in events]


def test_plain_json_is_wrapped_with_configured_type_and_source() -> None:
    (e1,), mode = decode({"content-type": "application/json"}, b'{"amount": 5}')
    (e2,), _ = decode({}, b'{"amount": 5}')
    assert mode == "plain"
    assert (e1.type, e1.source, e1.data) == ("eventbus.http", "/gw", {"amount": 5})
    assert e1.id != e2.id  # generated, unique


def test_plain_non_json_body_keeps_its_bytes_and_type() -> None:
    (e,), _ = decode({"content-type": "text/csv"}, b"a,b\n1,2")
    assert e.data == b"a,b\n1,2" and e.attributes["datacontenttype"] == "text/csv"


@pytest.mark.parametrize(
    ("headers", "body", "expect"),
    [
        (
            {"ce-id": "1", "ce-source": "/s", "ce-type": "t"},
            b"{}",
            "header ce-specversion is missing; add header ce-specversion: 1.0",
        ),
        (
            {"ce-specversion": "1.0", "ce-source": "/s", "ce-type": "t"},
            b"{}",
            "header ce-id is missing",
        ),
        (
            {"ce-specversion": "0.3", "ce-id": "1", "ce-source": "/s", "ce-type": "t"},
            b"{}",
            "header ce-specversion is '0.3'",
        ),
        (
            {
                "ce-specversion": "1.0",
                "ce-id": "1",
                "ce-source": "/s",
                "ce-type": "t",
                "ce-time": "yesterday",
            },
            b"",
            "header ce-time is 'yesterday'",
        ),
        (
            {
                "ce-specversion": "1.0",
                "ce-id": "1",
                "ce-source": "/s",
                "ce-type": "t",
                "content-type": "application/json",
            },
            b"{nope",
            "body is not valid JSON",
        ),
        (
            {"content-type": "application/cloudevents+json"},
            b'{"specversion": "1.0", "id": "1", "source": "/s"}',
            "attribute 'type' is missing",
        ),
        (
            {"content-type": "application/cloudevents-batch+json"},
            b'{"a": 1}',
            "the batch format is a JSON array of events",
        ),
        (
            {"content-type": "application/cloudevents-batch+json"},
            b'[{"specversion": "1.0", "id": "1", "source": "/s", "type": "t"}, {"id": 2}]',
            "batch[1]: ",
        ),
        ({"content-type": "application/json"}, b"not json", "body is not valid JSON"),
        ({"content-type": "application/cloudevents+xml"}, b"<e/>", "reads the JSON formats only"),
    ],
)
def test_malformed_requests_name_the_attribute(
    headers: dict[str, str], body: bytes, expect: str
) -> None:
    with pytest.raises(EventDecodeError, match=re.escape(expect)):
        decode(headers, body)


def test_structured_body_with_json_data_stays_json() -> None:
    body = orjson.dumps(
        {"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "data": {"x": [1, 2]}}
    )
    (e,), mode = decode({"content-type": "application/cloudevents+json; charset=utf-8"}, body)
    assert mode == "structured" and e.data == {"x": [1, 2]}


# -- percent-encoding of header values (CloudEvents HTTP binding, section 3.1.3.2) ----------
AWKWARD = ['{"othervalue": 5}', "a b", 'say "hi"', "100%", "naïve ✓ 😀", "tab\there", "%41"]


@pytest.mark.parametrize("value", AWKWARD)
def test_header_values_are_encoded_as_the_sdk_encodes_them(value: str) -> None:
    event = EVENTS["json-object"].replace(time=TIME, subject=value, ext=value)
    headers = dict(encode_http_binary(event)[0])
    sdk = sdk_http.to_binary(to_sdk(event), JSONFormat()).headers
    assert headers["ce-subject"] == sdk["ce-subject"] and headers["ce-ext"] == sdk["ce-ext"]
    assert all(c.isascii() and c.isprintable() and c not in ' "' for c in headers["ce-ext"])


def test_the_issues_extension_goes_out_with_its_space_encoded() -> None:
    event = EVENTS["json-object"].replace(othervalue='{"othervalue": 5}')
    assert dict(encode_http_binary(event)[0])["ce-othervalue"] == "{%22othervalue%22:%205}"


@pytest.mark.parametrize("value", AWKWARD)
def test_header_values_are_decoded_as_the_sdk_decodes_them(value: str) -> None:
    event = EVENTS["json-object"].replace(time=TIME, subject=value, ext=value)
    message = sdk_http.to_binary(to_sdk(event), JSONFormat())
    # the server hands header bytes over as latin-1 text
    (got,), _ = decode(
        {k: v.encode().decode("latin-1") for k, v in message.headers.items()}, message.body
    )
    assert got.attributes["subject"] == value and got.attributes["ext"] == value
    assert sdk_attributes(sdk_http.from_binary(message, JSONFormat()))["ext"] == value


def test_raw_utf8_header_bytes_are_read_as_utf8() -> None:
    raw = "naïve ✓".encode().decode("latin-1")  # what the server hands over
    headers = {
        "ce-specversion": "1.0",
        "ce-id": "1",
        "ce-source": "/s",
        "ce-type": "t",
        "ce-subject": raw,
    }
    (got,), _ = decode(headers, b"{}")
    assert got.attributes["subject"] == "naïve ✓"


@pytest.mark.parametrize("value", ["%FF%FE", "\xff\xfe", "%C3"])
def test_header_values_that_are_not_utf8_are_refused_naming_the_header(value: str) -> None:
    headers = {
        "ce-specversion": "1.0",
        "ce-id": "1",
        "ce-source": "/s",
        "ce-type": "t",
        "ce-subject": value,
    }
    expect = "header ce-subject is not UTF-8 text once percent-decoded"
    with pytest.raises(EventDecodeError, match=re.escape(expect)):
        decode(headers, b"{}")


def test_a_content_type_a_step_made_unprintable_is_encoded_not_sent_raw() -> None:
    event = EVENTS["json-object"].replace(datacontenttype="application/json; x=\u2713\r\nx-a: b")
    value = dict(encode_http_binary(event)[0])["content-type"]
    assert value.isascii() and value.isprintable() and "\r" not in value


# -- limits: JSON depth, batch size ----------------------------------------------------------
def test_json_depth_limit_in_each_mode() -> None:
    from eventbus.eventing._codecs import MAX_JSON_DEPTH

    ok, deep = MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1

    def nest(d: int) -> bytes:
        return b"[" * d + b"]" * d

    ce = {"ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s", "ce-type": "t"}
    for headers in (ce, {**ce, "content-type": "application/json"}, {}):
        assert decode(headers, nest(ok))[0][0].data is not None
        with pytest.raises(EventDecodeError, match=f"more than {MAX_JSON_DEPTH} levels deep"):
            decode(headers, nest(deep))
    envelope = b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data":%s}'
    structured = {"content-type": "application/cloudevents+json"}
    decode(structured, envelope % nest(ok - 1))
    with pytest.raises(EventDecodeError, match="the body nests JSON arrays and objects more than"):
        decode(structured, envelope % nest(ok))
    batch = {"content-type": "application/cloudevents-batch+json"}
    decode(batch, b"[" + envelope % nest(ok - 2) + b"]")
    with pytest.raises(EventDecodeError, match="the batch nests JSON arrays and objects more than"):
        decode(batch, b"[" + envelope % nest(ok - 1) + b"]")
    # many brackets side by side are not depth
    (e,), _ = decode({}, orjson.dumps([[i] for i in range(5000)]))
    assert len(e.data) == 5000


def test_batch_event_cap() -> None:
    body = orjson.dumps(
        [{"specversion": "1.0", "id": str(i), "source": "/s", "type": "t"} for i in range(11)]
    )
    headers = {"content-type": "application/cloudevents-batch+json"}
    with pytest.raises(
        EventDecodeError, match="the batch has 11 events; at most 10 are taken per request"
    ):
        decode_http(headers, body, default_type="t", default_source="/s", max_events=10)
    assert (
        len(decode_http(headers, body, default_type="t", default_source="/s", max_events=11)[0])
        == 11
    )
