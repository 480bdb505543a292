"""The schedule source: its config, which ticks a pass emits or skips, and tick events."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from eventbus.errors import PipelineConfigError
from eventbus.eventing.sources._schedule import due_ticks, tick_event
from eventbus.eventing.sources._schedule_config import MAX_DATA_BYTES, ScheduleSourceConfig
from eventbus.pipelines import load_pipeline_text

S = 1000  # ms


def _cfg(**kw: object) -> ScheduleSourceConfig:
    return ScheduleSourceConfig.model_validate(kw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "give exactly one of cron (e.g. '*/5 * * * *') or every_s (e.g. 60)"),
        ({"cron": "* * * * *", "every_s": 5}, "give exactly one of cron"),
        ({"every_s": 0.01}, "greater than or equal to 1"),
        ({"cron": "0 0 30 2 *"}, "never fires"),
        (
            {"cron": "* * * * *", "timezone": "Mars/Olympus"},
            "unknown time zone 'Mars/Olympus'; use an IANA name",
        ),
        (
            {"every_s": 5, "timezone": "Europe/Berlin"},
            "timezone 'Europe/Berlin' applies to cron only",
        ),
        ({"every_s": 5, "name": "Bad-Name"}, "String should match pattern"),
        ({"every_s": 5, "catch_up": "some"}, "'latest', 'all' or 'none'"),
        ({"cron": "x" * 300}, "at most 200 characters"),
    ],
)
def test_config_errors(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        _cfg(**raw)


def test_payload_size_is_bounded() -> None:
    with pytest.raises(
        ValidationError, match=f"a schedule's payload may be at most {MAX_DATA_BYTES}"
    ):
        _cfg(every_s=5, data={"blob": "x" * MAX_DATA_BYTES})
    nested: object = "leaf"
    for _ in range(50):
        nested = {"a": nested}
    assert _cfg(every_s=5, data=nested).data == nested


def _doc(sources: str, extra: str = "") -> str:
    return (
        "apiVersion: eventbus/v1\nkind: Pipeline\nmetadata: {name: ticks}\nspec:\n"
        f"  sources: {sources}\n  sink: {{kafka: {{topic: out}}}}\n{extra}"
    )


def test_pipeline_rules() -> None:
    config = load_pipeline_text(_doc("[{schedule: {every_s: 5}}, {http: {}}]"))
    # the ticks and the HTTP events share the ingress topic, consumed once
    assert [s.topic for s in config.consumed_sources] == ["eventbus-ingress-ticks"]
    with pytest.raises(PipelineConfigError, match="two schedule sources are named 'a'"):
        load_pipeline_text(
            _doc("[{schedule: {every_s: 5, name: a}}, {schedule: {cron: '@daily', name: a}}]")
        )
    with pytest.raises(
        PipelineConfigError,
        match=re.escape(
            "a schedule source runs on the pipeline's replicas, but serving.replicas.min is 0"
        ),
    ):
        load_pipeline_text(
            _doc("[{schedule: {every_s: 5}}]", "  serving: {replicas: {min: 0, max: 1}}\n")
        )


def test_on_time_ticks_are_all_emitted() -> None:
    cfg = _cfg(every_s=2)
    due = due_ticks(cfg, through_ms=100 * S, now_ms=107 * S)
    assert (due.emit, due.missed, due.late, due.through) == (
        [102 * S, 104 * S, 106 * S],
        0,
        0,
        106 * S,
    )
    assert due_ticks(cfg, 106 * S, 107 * S).emit == []  # nothing new: through stays
    assert due_ticks(cfg, 106 * S, 107 * S).through == 106 * S


@pytest.mark.parametrize(
    ("catch_up", "emitted", "missed"),
    [
        ("latest", [3590, 3600, 3610, 3620], 3588 - 1),
        ("all", [3592, 3594, 3596, 3598, 3600, 3610, 3620], 3588 - 5),
        ("none", [3600, 3610, 3620], 3588),
    ],
)
def test_missed_ticks_follow_catch_up(catch_up: str, emitted: list[int], missed: int) -> None:
    # every 1 s; down from t=10 s to t=3620 s; grace 30 s: ticks before 3590 s are missed
    cfg = _cfg(every_s=1, misfire_grace_s=30, catch_up=catch_up, max_catch_up=5)
    due = due_ticks(cfg, through_ms=1 * S, now_ms=3620 * S)
    assert due.missed == missed
    on_time = list(range(3590, 3621))
    if catch_up == "latest":
        assert due.emit == [3589 * S] + [t * S for t in on_time]
    elif catch_up == "all":
        assert due.emit == [t * S for t in range(3585, 3590)] + [t * S for t in on_time]
    else:
        assert due.emit == [t * S for t in on_time]
    assert due.late == len(due.emit) - len(on_time) and emitted  # late = caught-up ticks


def test_a_long_outage_is_worked_through_in_bounded_passes() -> None:
    cfg = _cfg(every_s=1, misfire_grace_s=10)
    through, now, passes, missed, emitted = 0, 30 * 86400 * S, 0, 0, []
    while True:
        due = due_ticks(cfg, through, now)
        passes += 1
        missed += due.missed
        emitted += due.emit
        through = due.through
        if not due.more:
            break
    assert through == now and emitted[0] == now - 11 * S  # the newest missed tick, then on time
    assert len(emitted) == 12 and missed == 30 * 86400 - 12
    assert passes == 30 * 86400 // 20_000 + 1


def test_cron_ticks_in_zone() -> None:
    cfg = _cfg(
        cron="0 * * * *", timezone="Asia/Kolkata", misfire_grace_s=86400
    )  # UTC+05:30: on the half hour UTC
    due = due_ticks(cfg, through_ms=0, now_ms=3 * 3600 * S)
    assert due.emit == [1800 * S, 5400 * S, 9000 * S]


def test_tick_event() -> None:
    cfg = _cfg(every_s=1, name="nightly", data={"job": "report"}, type="acme.tick")
    e = tick_event(cfg, "orders", 1_700_000_000_000)
    assert (e.id, e.time, e.type, e.source) == (
        "2023-11-14T22:13:20Z",
        "2023-11-14T22:13:20Z",
        "acme.tick",
        "/eventbus/orders/schedules/nightly",
    )
    assert e.data == {"job": "report"} and e.datacontenttype == "application/json"
    assert tick_event(cfg, "orders", 1_700_000_000_250).id == "2023-11-14T22:13:20.250Z"
    assert tick_event(_cfg(every_s=1, source="/x"), "orders", 0).source == "/x"
