"""The join step on in-memory state: inner, outer (with the sweeper), latest, late events,
eviction, redelivery re-emits the same event, output mappings, config errors."""

from __future__ import annotations

import re
from typing import Any

import pytest

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner


def runner(join: dict[str, Any], steps_after: list[dict[str, Any]] | None = None) -> PipelineRunner:
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "shop"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [{"id": "pair", "join": join}, *(steps_after or [])],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    return PipelineRunner(PipelineConfig.model_validate(doc))


SIDES = [
    {"name": "orders", "when": "type == 'order.created'", "key": "data.order_id"},
    {"name": "payments", "when": "type == 'payment.created'", "key": "data.order_id"},
]


def order(i: int, **kw: Any) -> CloudEvent:
    return CloudEvent.create(
        type="order.created",
        source="/o",
        id=f"o{i}",
        data={"order_id": f"k{i}", "item": f"i{i}"},
        **kw,
    )


def payment(i: int, **kw: Any) -> CloudEvent:
    return CloudEvent.create(
        type="payment.created",
        source="/p",
        id=f"p{i}",
        data={"order_id": f"k{i}", "amount": i},
        **kw,
    )


def test_inner_join_emits_once_every_side_arrived() -> None:
    r = runner({"sides": SIDES})
    out = r.run([order(1), payment(2), order(3)])
    assert out == [[], [], []]
    out = r.run([payment(1), CloudEvent.create(type="other", source="/x", id="x", data={})])
    [[joined], [passthrough]] = out
    assert joined.type == "pair.joined" and joined.source == "/eventbus/shop/pair"
    assert joined.data == {
        "orders": {"order_id": "k1", "item": "i1"},
        "payments": {"order_id": "k1", "amount": 1},
    }
    assert joined["partitionkey"] == "k1"
    assert passthrough.id == "x"  # matches no side: passes through


def test_redelivered_event_of_a_completed_key_re_emits_the_same_event() -> None:
    r = runner({"sides": SIDES})
    r.run([order(1)])
    [[first]] = r.run([payment(1)])
    [[again]] = r.run([payment(1)])  # the completing event consumed again after a crash
    assert again.id == first.id and again.data == first.data
    assert r.run([order(1)]) == [[]]  # the other side consumed again emits nothing


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move the join's clock forward (windows close on the wall clock)."""
    import eventbus.pipelines.steps._join as join_module

    real = join_module.now_ms
    monkeypatch.setattr(join_module, "now_ms", lambda: real() + int(seconds * 1000))


def test_outer_join_emits_partial_results_when_the_window_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = runner(
        {"mode": "outer", "window_s": 60, "sides": SIDES, "output": {"type": "order.settled"}}
    )
    r.run([order(1), order(2), payment(2)])
    [sweeper] = r.timers()
    assert sweeper.sweep() == ([], [], [])  # the window is still open
    later(monkeypatch, 61)
    outputs, dead, keys = sweeper.sweep()
    assert [e.data for e in outputs] == [
        {"orders": {"order_id": "k1", "item": "i1"}, "_missing": ["payments"]}
    ]
    assert outputs[0].type == "order.settled" and not dead and len(keys) == 2  # k1 and k2 closed
    sweeper.forget(keys)
    assert sweeper.sweep() == ([], [], [])


def test_inner_join_drops_expired_keys_and_counts_them(monkeypatch: pytest.MonkeyPatch) -> None:
    r = runner({"window_s": 60, "sides": SIDES})
    r.run([order(1)])
    later(monkeypatch, 61)
    [sweeper] = r.timers()
    outputs, dead, keys = sweeper.sweep()
    assert outputs == [] and dead == [] and len(keys) == 1
    assert r.stats()["pair"]["absorbed_expired"] == 1


def test_max_pending_evicts_the_oldest_to_the_dead_letter_sink() -> None:
    r = runner({"sides": SIDES, "max_pending": 2})
    r.run([order(1)])
    r.run([order(2)])
    r.run([order(3)])
    [sweeper] = r.timers()
    outputs, dead, keys = sweeper.sweep()
    assert [e.id for e in dead] == ["o1"] and len(keys) == 1 and outputs == []
    assert dead[0]["eberrortype"] == "JoinEvictedError" and "max_pending (2)" in dead[0]["eberror"]


def test_latest_mode_enriches_with_the_latest_table_event() -> None:
    r = runner({"mode": "latest", "table": "payments", "sides": SIDES})
    assert r.run(
        [payment(1), payment(1).replace(id="p1b", data={"order_id": "k1", "amount": 99})]
    ) == [[], []]
    [[a], [b]] = r.run([order(1), order(2)])
    assert a.data == {
        "orders": {"order_id": "k1", "item": "i1"},
        "payments": {"order_id": "k1", "amount": 99},
    }
    assert b.data == {"orders": {"order_id": "k2", "item": "i2"}, "_missing": ["payments"]}


def test_late_events_fail_with_the_reason() -> None:
    r = runner({"time": "event", "window_s": 60, "allowed_lateness_s": 30, "sides": SIDES})
    assert r.run([order(2, time="2024-01-01T00:10:00Z")]) == [[]]  # the watermark: 00:10
    [f, ok] = r.run([order(1, time="2024-01-01T00:08:29Z"), order(3, time="2024-01-01T00:08:31Z")])
    assert isinstance(f, Failure) and f.step == "pair" and f.error_type == "LateEventError"
    assert "is late: 91.0 s behind the watermark 2024-01-01T00:10:00" in f.message
    assert (
        "beyond window_s (60 s) plus allowed_lateness_s (30 s); raise allowed_lateness_s"
        in f.message
    )
    assert ok == []


def test_output_data_mapping_sees_each_side() -> None:
    r = runner(
        {
            "sides": SIDES,
            "output": {
                "data": "{'order': orders.data.item, 'paid': payments.data.amount, 'by': payments.source}"
            },
        }
    )
    r.run([order(7)])
    [[e]] = r.run([payment(7)])
    assert e.data == {"order": "i7", "paid": 7, "by": "/p"}


def test_bad_key_fails_only_that_event() -> None:
    r = runner({"sides": SIDES})
    bad = CloudEvent.create(type="order.created", source="/o", id="bad", data={"order_id": [1]})
    [f, ok] = r.run([bad, order(1)])
    assert (
        isinstance(f, Failure) and "a key must be a string or an integer" in f.message and ok == []
    )


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ({"sides": SIDES[:1]}, "at least 2"),
        (
            {"sides": [SIDES[0], dict(SIDES[1], name="orders")]},
            "join side name 'orders' is used twice",
        ),
        (
            {"mode": "latest", "table": "orders", "emit": "every", "sides": SIDES},
            "'emit: every' is for modes inner and outer",
        ),
        ({"emit": "all", "sides": SIDES}, "'every', 'first' or 'latest'"),
        ({"max_key_bytes": 10, "sides": SIDES}, "greater than or equal to 1024"),
        ({"mode": "latest", "sides": SIDES}, "join mode 'latest' needs 'table:'"),
        (
            {"mode": "latest", "table": "refunds", "sides": SIDES},
            "join table 'refunds' is not a side",
        ),
        ({"table": "orders", "sides": SIDES}, "'table:' is for mode 'latest'"),
    ],
)
def test_config_errors(join: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        runner(join)


def test_output_data_naming_an_unknown_side_is_an_error() -> None:
    from eventbus import cel

    with pytest.raises(cel.CELError, match="'refunds', which is not a side"):
        runner({"sides": SIDES, "output": {"data": "refunds.data"}})


def test_validate_reports_join_expressions_with_positions(tmp_path) -> None:
    from eventbus.errors import PipelineConfigError
    from eventbus.pipelines._loader import load_pipeline

    p = tmp_path / "j.yaml"
    p.write_text(
        "apiVersion: eventbus/v1\nkind: Pipeline\nmetadata: {name: j}\nspec:\n  sources: [{kafka: {topic: a}}]\n"
        '  steps:\n    - id: pair\n      join:\n        sides:\n          - {name: a, when: "type == \'a\'", key: "dta.id"}\n'
        "          - {name: b, when: \"type == 'b'\", key: data.id}\n  sink: {kafka: {topic: out}}\n"
    )
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(p)
    assert re.search(
        r"j\.yaml:10:\d+: spec\.steps\[0\]\.join\.sides\[0\]\.key: step 'pair': unknown variable 'dta' \(did you mean 'data'\?\)",
        str(info.value),
    ), str(info.value)
