"""Honest step counters, one vocabulary: every step reports ``in``, ``out`` and why an input
gave no output (``filtered``, ``absorbed``, ``errors``, ``late``) and, for timers, ``emitted``;
the pipeline's totals (``pipeline_view``) add them up and count closed windows in ``out``.

In process, on the runner the replicas wrap; the real stack's test is
``tests/integration/test_counters.py``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.observability import pipeline_view
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner

T0 = 1_700_000_040_000  # a minute boundary (ms)


def doc(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "counted"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": steps,
            "sink": {"kafka": {"topic": "out"}},
        },
    }


def runner(steps: list[dict[str, Any]]) -> PipelineRunner:
    return PipelineRunner(PipelineConfig.model_validate(doc(steps)))


def iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def ev(i: int, t_ms: int, **data: Any) -> CloudEvent:
    return CloudEvent.create(type="t", source="/s", id=f"e{i}", time=iso(t_ms), data=data)


def view(r: PipelineRunner, consumed: int, outputs: int) -> dict[str, Any]:
    """The pipeline's view as status shows it, from one replica's entry of this runner."""
    entry = {
        "at": time.time(),
        "final": False,
        "sources": [{"consumed": consumed, "outputs": outputs, "dropped": consumed - outputs}],
        "metrics": {**r.metrics(), "sources": []},
    }
    record = {"name": "counted", "version": 1, "document": doc([])}
    record["document"]["spec"]["steps"] = [
        {"id": s.id, s.template: {}} for s in r.steps
    ]  # the topology's ids
    return pipeline_view(record, [json.dumps(entry)], [["in"]])


AGGREGATE = {
    "id": "per_minute",
    "aggregate": {
        "key": "data.user",
        "window": {"tumbling": {"size_s": 60}},
        "aggregations": {"n": "count"},
    },
}


def test_aggregate_of_10_events_into_4_windows_absorbs_10_and_emits_4() -> None:
    r = runner([AGGREGATE])
    # 10 events in 4 minutes (3, 3, 2, 2), then one of the fifth minute whose time closes them
    times = [0, 1, 2, 60, 61, 62, 120, 121, 180, 181]
    outcomes = r.run([ev(i, T0 + 1000 * s, user="u") for i, s in enumerate(times)])
    assert outcomes == [[]] * 10
    (timer,) = r.timers()
    assert r.run([ev(10, T0 + 245_000, user="u")]) == [[]]
    fired = timer.fire()
    assert fired is not None and len(fired.outputs) == 4
    outcomes = r.run_after(timer.step_index, fired.outputs)  # the last step: delivered as is
    assert [len(o) for o in outcomes if isinstance(o, list)] == [1, 1, 1, 1]
    st = r.metrics()["steps"]["per_minute"]
    assert (st["in"], st["out"], st["absorbed"], st["emitted"]) == (11, 0, 11, 4)
    assert st["filtered"] == st["errors"] == st["late"] == 0
    t = view(r, consumed=11, outputs=0)["totals"]
    # the pipeline's out counts the closed windows delivered
    assert (t["in"], t["out"], t["absorbed"], t["emitted"], t["filtered"]) == (11, 4, 11, 4, 0)


def test_aggregate_late_event_counts_as_late_not_errors() -> None:
    step = dict(AGGREGATE)
    step["aggregate"] = {**AGGREGATE["aggregate"], "allowed_lateness_s": 5}  # type: ignore[dict-item]
    r = runner([step])
    r.run([ev(0, T0 + 1000, user="a"), ev(1, T0 + 66_000, user="a")])
    out = r.run([ev(2, T0 + 2000, user="a")])
    assert isinstance(out[0], Failure) and out[0].error_type == "AggregateLateEventError"
    st = r.metrics()["steps"]["per_minute"]
    assert (st["in"], st["absorbed"], st["late"], st["errors"]) == (3, 2, 1, 0)


SIDES = [
    {"name": "orders", "when": "type == 'order.created'", "key": "data.order_id"},
    {"name": "payments", "when": "type == 'payment.created'", "key": "data.order_id"},
]


def side(kind: str, i: int) -> CloudEvent:
    return CloudEvent.create(
        type=f"{kind}.created", source="/x", id=f"{kind}{i}", data={"order_id": i}
    )


def test_join_event_waiting_for_its_partner_is_absorbed() -> None:
    r = runner([{"id": "pair", "join": {"sides": SIDES}}])
    assert r.run([side("order", 1), side("order", 2)]) == [[], []]
    [[joined]] = r.run([side("payment", 1)])
    st = r.metrics()["steps"]["pair"]
    assert (st["in"], st["out"], st["absorbed"], st["filtered"]) == (3, 1, 2, 0)
    t = view(r, consumed=3, outputs=1)["totals"]
    assert (t["in"], t["out"], t["absorbed"], t["filtered"]) == (3, 1, 2, 0)


def test_filter_error_on_a_missing_field_counts_as_errors_not_filtered() -> None:
    r = runner([{"id": "big", "filter": "data.amount > 100"}])
    out = r.run(
        [
            CloudEvent.create(type="t", source="/s", id="a", data={"amount": 500}),
            CloudEvent.create(type="t", source="/s", id="b", data={"amount": 5}),
            CloudEvent.create(type="t", source="/s", id="c", data={"other": 1}),  # no amount
        ]
    )
    assert [len(o) for o in out if isinstance(o, list)] == [1, 0, 0]
    st = r.metrics()["steps"]["big"]
    assert (st["in"], st["out"], st["filtered"], st["errors"]) == (3, 1, 1, 1)
    v = view(r, consumed=3, outputs=1)
    assert (v["totals"]["filtered"], v["totals"]["errors"]) == (1, 1)
    assert v["last_event_at"] is not None and v["last_event_at"] <= time.time()


def test_flush_counts_what_a_step_emits_at_the_end_of_the_input() -> None:
    r = runner([AGGREGATE, {"id": "many", "filter": "data.n > 1"}])
    r.run([ev(0, T0, user="a"), ev(1, T0 + 1, user="a"), ev(2, T0 + 2, user="b")])
    out = r.flush()
    assert [e.data["key"] for e in out] == ["a"]
    agg, many = r.metrics()["steps"]["per_minute"], r.metrics()["steps"]["many"]
    assert (agg["absorbed"], agg["emitted"]) == (3, 2)
    assert (many["in"], many["out"], many["filtered"]) == (2, 1, 1)


def test_history_counts_closed_windows_as_out_like_the_totals() -> None:
    from eventbus.observability._history import _figures

    body = {
        "sources": [{"consumed": 10, "outputs": 0, "failed": 0}],
        "metrics": {"timer_outputs": 4, "sources": []},
    }
    counters, _, _ = _figures(body)
    assert counters == [10, 4, 0]
