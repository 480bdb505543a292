"""``delivery: {guarantee: exactly_once}``: which pipelines may ask for it, and the reasons
given for those that may not (a non-Kafka source or sink, another cluster, Redis state,
dedupe), all at once with the alternatives."""

from __future__ import annotations

import pytest

from eventbus.cli._pipelines import delivery_guarantee
from eventbus.pipelines import load_pipeline_text, validate_pipeline_text

HEAD = """apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: eos}
spec:
"""
GOOD = """  sources: [{kafka: {topic: in}}]
  steps:
    - {id: big, filter: "data.n > 1"}
    - {id: tag, convert: {set: {"data.tag": "'x'"}}}
  sink: {kafka: {topic: out}}
  dead_letter: {kafka: {topic: dlq}}
  delivery: {guarantee: exactly_once}
"""


def problems(body: str) -> str:
    config, found = validate_pipeline_text(HEAD + body, "p.yaml")
    assert config is None
    return "\n".join(str(p) for p in found)


def test_a_stateless_kafka_to_kafka_pipeline_runs_exactly_once() -> None:
    config = load_pipeline_text(HEAD + GOOD, "p.yaml")
    assert config.spec.delivery.guarantee == "exactly_once"
    assert delivery_guarantee(HEAD + GOOD) == "exactly_once"


def test_the_default_is_at_least_once() -> None:
    body = GOOD.replace("  delivery: {guarantee: exactly_once}\n", "")
    assert load_pipeline_text(HEAD + body, "p.yaml").spec.delivery.guarantee == "at_least_once"
    assert delivery_guarantee(HEAD + body) == "at_least_once"
    dedupe = body + "  delivery: {dedupe: {window_s: 60}}\n"
    assert delivery_guarantee(HEAD + dedupe) == "at_least_once + dedupe"
    assert delivery_guarantee(": not yaml: [").startswith("unknown")


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        (
            ("sink: {kafka: {topic: out}}", "sink: {http: {url: 'http://127.0.0.1:1/x'}}"),
            "spec.sink is of kind 'http' but delivery.guarantee is 'exactly_once': a http sink "
            "cannot join a Kafka transaction",
        ),
        (
            ("dead_letter: {kafka: {topic: dlq}}", "dead_letter: {http: {url: 'http://h/x'}}"),
            "spec.dead_letter is of kind 'http'",
        ),
        (
            ("{topic: out}", "{topic: out, bootstrap_servers: 'other:9092'}"),
            "name several Kafka clusters (other:9092, the stack's broker)",
        ),
        (
            ("sources: [{kafka: {topic: in}}]", "sources: [{http: {path: /in}}]"),
            "sources[0] is of kind 'http' but delivery.guarantee is 'exactly_once'",
        ),
        (
            ("{guarantee: exactly_once}", "{guarantee: exactly_once, dedupe: {window_s: 60}}"),
            "delivery.dedupe is set but delivery.guarantee is 'exactly_once'",
        ),
        (
            ("{guarantee: exactly_once}", "{guarantee: exactly-once}"),
            "'at_least_once' or 'exactly_once'",
        ),
    ],
)
def test_refusals_name_the_reason_and_the_alternative(change: tuple[str, str], expect: str) -> None:
    body = GOOD.replace(*change)
    assert body != GOOD
    found = problems(body)
    assert expect in found, found
    if "guarantee: exactly-once" not in body and "dedupe" not in expect:
        assert "at_least_once" in found  # the alternative is named


def with_aggregate(options: str) -> str:
    """GOOD with an aggregate step ``total`` of ``options`` (YAML flow mapping entries) in
    place of the convert."""
    body = GOOD.replace(
        '    - {id: tag, convert: {set: {"data.tag": "\'x\'"}}}\n',
        "    - id: total\n"
        "      aggregate: {key: data.k, window: {tumbling: {size_s: 60}}, aggregations: "
        f"{{n: count}}{', ' if options else ''}{options}}}\n",
    )
    assert body != GOOD
    return body


@pytest.mark.parametrize(
    "options",
    [
        "",
        "allowed_lateness_s: 5, emit: close",
        "window: {hopping: {size_s: 60, advance_s: 20}}",
        "window: {session: {gap_s: 30}}",
    ],
)
def test_an_event_time_aggregate_emitting_on_close_runs_exactly_once(options: str) -> None:
    body = with_aggregate(options)
    if "window:" in options:  # the second window replaces the first
        body = body.replace("window: {tumbling: {size_s: 60}}, ", "")
    config = load_pipeline_text(HEAD + body, "p.yaml")
    assert config.spec.delivery.guarantee == "exactly_once"


@pytest.mark.parametrize(
    ("options", "expect"),
    [
        (
            "time: processing",
            "step 'total' is of kind 'aggregate' with time 'processing' but delivery.guarantee "
            "is 'exactly_once': processing-time windows close by the wall clock, from a timer "
            "outside any consumed batch, so no Kafka transaction covers their outputs; use "
            "time: event (windows then close when a consumed event moves the watermark past "
            "them, inside its batch's transaction); or keep guarantee: at_least_once",
        ),
        (
            "idle_timeout_s: 30",
            "step 'total' is of kind 'aggregate' with idle_timeout_s 30 but delivery.guarantee "
            "is 'exactly_once': the wall clock closes the windows of an idle input from a timer "
            "outside any consumed batch, so no Kafka transaction covers their outputs; drop "
            "idle_timeout_s (under exactly_once a window closes when a consumed event moves the "
            "watermark past it: an input that stops leaves its last windows open until the next "
            "event); or keep guarantee: at_least_once",
        ),
        (
            "emit: update",
            "step 'total' is of kind 'aggregate' with emit 'update' but delivery.guarantee is "
            "'exactly_once': an intermediate result is emitted by the event that changed the "
            "window, and an event consumed again after an aborted transaction is not merged "
            "again, so its update would not be emitted again; use emit: close; or keep "
            "guarantee: at_least_once",
        ),
    ],
)
def test_an_aggregate_closing_by_the_clock_or_emitting_updates_is_refused(
    options: str, expect: str
) -> None:
    found = problems(with_aggregate(options))
    assert found.count("\n") == 0, found  # the one problem
    assert expect in found, found


def with_join(options: str) -> str:
    """GOOD with a join step of ``options`` (YAML flow mapping entries) before the convert."""
    sides = (
        "sides: [{name: order, when: \"type == 'order'\", key: data.id}, "
        "{name: pay, when: \"type == 'pay'\", key: data.id}]"
    )
    step = f"    - id: pair\n      join: {{{sides}{', ' if options else ''}{options}}}\n"
    body = GOOD.replace("    - {id: tag,", step + "    - {id: tag,")
    assert body != GOOD
    return body


@pytest.mark.parametrize(
    "options",
    [
        "time: event",
        "mode: inner, emit: every, time: event",
        "mode: inner, emit: latest, time: event",
        "time: event, allowed_lateness_s: 5, window_s: 30",
        "mode: outer, time: event",
        "mode: outer, emit: latest, time: event, allowed_lateness_s: 5",
        "mode: outer, emit: first, time: event",
        "mode: inner, emit: first, time: event",
    ],
)
def test_a_join_whose_outputs_come_from_consumed_events_runs_exactly_once(options: str) -> None:
    config = load_pipeline_text(HEAD + with_join(options), "p.yaml")
    assert config.spec.delivery.guarantee == "exactly_once"
    assert delivery_guarantee(HEAD + with_join(options)) == "exactly_once"


@pytest.mark.parametrize("emit", ["every", "first", "latest"])
def test_a_processing_time_outer_join_is_refused_naming_the_setting_and_the_fix(
    emit: str,
) -> None:
    found = problems(with_join(f"mode: outer, emit: {emit}"))
    assert found.count("\n") == 0, found  # the one problem
    expect = (
        "step 'pair' is of kind 'join' with mode 'outer' and time 'processing' but "
        "delivery.guarantee is 'exactly_once': processing-time windows close by the wall "
        "clock, from a timer outside any consumed batch, so no Kafka transaction covers the "
        "outputs of the keys left incomplete; use time: event (windows then close when a "
        "consumed event moves the watermark past them, inside its batch's transaction); or "
        "keep guarantee: at_least_once (the default) with delivery.dedupe for "
        "effectively-once delivery"
    )
    assert expect in found, found


@pytest.mark.parametrize(
    "options", ["", "mode: inner, emit: every", "emit: first, window_s: 30", "emit: latest"]
)
def test_a_processing_time_inner_join_is_refused_naming_the_setting_and_the_fix(
    options: str,
) -> None:
    found = problems(with_join(options))
    assert found.count("\n") == 0, found  # the one problem
    expect = (
        "step 'pair' is of kind 'join' with time 'processing' but delivery.guarantee is "
        "'exactly_once': processing-time windows are forgotten by the wall clock, from a timer "
        "outside any consumed batch: an event consumed again after an aborted transaction, "
        "once its window was forgotten, opens a new window, and the pairs its aborted attempt "
        "emitted are never emitted again (counted absorbed_expired); use time: event (the "
        "consumed events close the windows inside their batches' transactions and keep a "
        "closed window's events 10 minutes, so an event consumed again pairs as the first "
        "time); or keep guarantee: at_least_once (the default) with delivery.dedupe for "
        "effectively-once delivery"
    )
    assert expect in found, found


@pytest.mark.parametrize("time", ["processing", "event"])
def test_a_latest_mode_join_is_refused_naming_the_setting_and_the_fix(time: str) -> None:
    found = problems(with_join(f"mode: latest, table: order, time: {time}"))
    assert found.count("\n") == 0, found  # the one problem, whatever the time
    expect = (
        "step 'pair' is of kind 'join' with mode 'latest' but delivery.guarantee is "
        "'exactly_once': an event is enriched with the table's entry present when it is "
        "consumed, and the join's state in Redis is not rolled back with an aborted "
        "transaction: an event consumed again can find the entry replaced by a later table "
        "event of its aborted attempt, or expired (it lives window_s by the wall clock), and "
        "be joined otherwise than in any run without the abort; use mode: inner with time: "
        "event (emit: latest pairs each event with the latest event of every other side in "
        "its window; the consumed events close the windows); or keep guarantee: "
        "at_least_once (the default) with delivery.dedupe for effectively-once delivery"
    )
    assert expect in found, found


def test_every_refused_join_is_named_at_once() -> None:
    sides = (
        "sides: [{name: order, when: \"type == 'order'\", key: data.id}, "
        "{name: pay, when: \"type == 'pay'\", key: data.id}]"
    )
    body = with_join("emit: first").replace(
        '    - {id: tag, convert: {set: {"data.tag": "\'x\'"}}}\n',
        f"    - id: enrich\n      join: {{{sides}, mode: latest, table: order, time: event}}\n"
        f"    - id: fine\n      join: {{{sides}, time: event}}\n",
    )
    found = problems(body)
    assert found.count("\n") == 1, found  # two problems, one a line
    assert "step 'pair' is of kind 'join' with time 'processing'" in found
    assert "step 'enrich' is of kind 'join' with mode 'latest'" in found
    assert "'fine'" not in found


@pytest.mark.parametrize("options", ["", "mode: latest, table: order"])
def test_a_processing_time_or_latest_join_runs_at_least_once(options: str) -> None:
    body = with_join(options).replace("  delivery: {guarantee: exactly_once}\n", "")
    assert load_pipeline_text(HEAD + body, "p.yaml").spec.delivery.guarantee == "at_least_once"


def test_an_outer_join_runs_at_least_once() -> None:
    body = with_join("mode: outer").replace("  delivery: {guarantee: exactly_once}\n", "")
    assert load_pipeline_text(HEAD + body, "p.yaml").spec.delivery.guarantee == "at_least_once"


def test_an_outer_join_and_an_aggregate_are_refused_at_once() -> None:
    body = with_join("mode: outer").replace(
        '    - {id: tag, convert: {set: {"data.tag": "\'x\'"}}}\n',
        "    - id: total\n"
        "      aggregate: {key: data.k, window: {tumbling: {size_s: 60}}, aggregations: {n: count}, time: processing}\n",
    )
    found = problems(body)
    assert "step 'pair' is of kind 'join' with mode 'outer'" in found
    assert "step 'total' is of kind 'aggregate' with time 'processing'" in found


def test_every_reason_at_once() -> None:
    body = (
        GOOD.replace("sink: {kafka: {topic: out}}", "sink: {http: {url: 'http://h/x'}}")
        .replace("dead_letter: {kafka: {topic: dlq}}", "dead_letter: {http: {url: 'http://h/y'}}")
        .replace("{guarantee: exactly_once}", "{guarantee: exactly_once, dedupe: {}}")
    )
    found = problems(body)
    assert "spec.sink" in found and "spec.dead_letter" in found and "delivery.dedupe" in found


def test_the_commit_interval_defaults_to_100_ms_and_reaches_the_sources() -> None:
    from eventbus.serving._outputs import delivery_policy

    config = load_pipeline_text(HEAD + GOOD, "p.yaml")
    assert config.spec.delivery.commit_interval() == 100
    assert delivery_policy(config, None).commit_interval_s == pytest.approx(0.1)
    body = GOOD.replace("exactly_once}", "exactly_once, commit_interval_ms: 0}")
    config = load_pipeline_text(HEAD + body, "p.yaml")
    assert delivery_policy(config, None).commit_interval_s == 0  # a transaction per batch


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("-1", "delivery.commit_interval_ms is -1: it must be a whole number of milliseconds"),
        ("10001", "delivery.commit_interval_ms is 10001"),
        ("99999999999999999999", "from 0 (a transaction per batch) to 10000"),
        ("1.5", "delivery.commit_interval_ms is 1.5"),
        ("'fast'", "delivery.commit_interval_ms is 'fast'"),
        ("true", "delivery.commit_interval_ms is True"),
        ("[100]", "delivery.commit_interval_ms is [100]"),
    ],
)
def test_a_bad_commit_interval_is_refused_naming_the_range(value: str, expect: str) -> None:
    body = GOOD.replace("exactly_once}", f"exactly_once, commit_interval_ms: {value}}}")
    assert expect in problems(body)


def test_a_commit_interval_without_transactions_is_refused() -> None:
    body = GOOD.replace("{guarantee: exactly_once}", "{commit_interval_ms: 50}")
    found = problems(body)
    assert "delivery.commit_interval_ms is 50 but delivery.guarantee is 'at_least_once'" in found
    assert "set guarantee: exactly_once, or drop commit_interval_ms" in found
