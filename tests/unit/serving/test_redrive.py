"""Redrive's selection of dead letters and its input errors (the real-stack run is in
tests/integration/test_redrive.py)."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import pytest
from typer.testing import CliRunner

from eventbus import CloudEvent
from eventbus.cli import app
from eventbus.errors import ConfigError
from eventbus.eventing._codecs import encode_kafka_binary
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._redrive import RedriveReport, _select, compile_where


class Rec(NamedTuple):
    value: bytes | None
    headers: Any
    key: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: int


def _rec(event: CloudEvent | None, offset: int, timestamp: int = 1000) -> Rec:
    if event is None:  # not a CloudEvent: a raw record with a broken ce_ header
        return Rec(b"{}", [("ce_id", b"x")], None, "dlq", 0, offset, timestamp)
    headers, value = encode_kafka_binary(event)
    return Rec(value, headers, b"k", "dlq", 0, offset, timestamp)


def _dead(i: int, *, pipeline: str = "orders", step: str = "score") -> CloudEvent:
    return CloudEvent.create(
        type="t",
        source="/s",
        id=f"e{i}",
        data={"n": i},
        ebpipeline=pipeline,
        ebstep=step,
        eberror="boom",
        ebtopic="orders-in",
        ebpartition=2,
        eboffset=40 + i,
    )


CONFIG = PipelineConfig.model_validate(
    {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "orders"},
        "spec": {
            "sources": [{"kafka": {"topic": "orders-in"}}],
            "sink": {"kafka": {"topic": "out"}},
            "dead_letter": {"kafka": {"topic": "dlq"}},
        },
    }
)


def test_select_sorts_every_record_into_one_count() -> None:
    records = [
        _rec(_dead(0), 0, timestamp=10),  # before --since
        _rec(_dead(1, pipeline="other"), 1),
        _rec(_dead(2), 2),  # filter false
        _rec(None, 3),
        _rec(CloudEvent.create(type="t", source="/s", id="plain"), 4),  # no eb* attributes
        _rec(_dead(5, step="parse"), 5),
        _rec(_dead(5, step="parse"), 6),  # the same dead letter again
        _rec(_dead(7), 7),
    ]
    report = RedriveReport(topic="dlq")
    seen: set[bytes] = set()
    out = _select(CONFIG, records, 100, compile_where("data.n != 2"), report, seen)
    assert [e.id for e, _, _ in out] == ["e5", "e7"]
    assert (report.before_since, report.other_pipeline, report.not_matched) == (1, 1, 1)
    assert (report.undecodable, report.not_dead_letters, report.repeats) == (1, 1, 1)
    assert report.by_step == {"parse": 1, "score": 1}
    event, key, where = out[1]
    assert not any(k.startswith("eb") for k in event.attributes) and event.data == {"n": 7}
    assert (key, where) == (b"k", ("orders-in", 2, 47))


def test_filter_sees_eb_attributes_and_a_failing_evaluation_is_no_match() -> None:
    where = compile_where("ebstep == 'score' && data.amount > 1")
    assert where(_dead(1).replace(data={"amount": 5}))
    assert not where(_dead(1))  # no data.amount: not matched, no error


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("data.n ==", "--filter 'data.n ==' is not a valid CEL expression"),
        ("dta.n == 1", "did you mean 'data'?"),
        ("x" * 200_000, "is not a valid CEL expression"),
    ],
)
def test_bad_filters(expression: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        compile_where(expression)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "--since 'yesterday' is neither RFC 3339"),
        (["--since", "2024-05-01T12:00:00"], "has no offset; add Z or +08:00"),
        (["--filter", "data.n =="], "is not a valid CEL expression"),
    ],
)
def test_cli_refuses_bad_input_before_connecting(args: list[str], message: str) -> None:
    # no stack and no addresses: the input errors come first, exit 1
    res = CliRunner().invoke(app, ["redrive", "orders", *args])
    assert res.exit_code == 1
    assert message in " ".join(res.output.split())
