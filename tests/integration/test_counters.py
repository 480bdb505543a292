"""Honest counters on the real stack: a join and an aggregate pipeline report, per step and in
their totals, ``in``/``out`` and why the rest gave no output (``absorbed``, not ``filtered``),
the closed windows as ``emitted`` and in the pipeline's ``out``, and when the last event came
in; ``eventbus status`` (text and ``--json``), ``/metrics`` and the dashboard (headless
Chromium) show the same numbers under the same names.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from eventbus import CloudEvent
from tests.integration.kafka_helpers import collect, produce
from tests.integration.test_dashboard import Gateway, OtlpReceiver, browser, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

__all__ = ["browser"]  # the dashboard test's headless Chromium fixture, used here too

NAMES = ("in", "out", "filtered", "absorbed", "errors", "late", "emitted")


@pytest.fixture(scope="module")
def counters_gateway(
    ray_cluster: None,
    eventbus_client: Any,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    otlp = OtlpReceiver()
    gw = Gateway(
        kafka_bootstrap, redis_url, otlp.url, tmp_path_factory.mktemp("gw") / "gateway.log"
    )
    yield gw
    gw.stop()
    otlp.close()


def _deploy(client: Any, tmp: Path, name: str, doc: dict[str, Any]) -> None:
    import yaml

    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    client.deploy(path)


@pytest.fixture(scope="module")
def stateful(
    counters_gateway: Gateway,
    eventbus_client: Any,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, str]]:
    """A join (3 orders, 1 payment: 1 joined, 3 absorbed) and an aggregate (10 events in 4
    one-minute windows of 2024: three closed by event time, the last by the idle watermark,
    4 emitted) pipeline."""
    from eventbus._internal.services import create_topics
    from tests.fixtures.services import _run_in_thread

    tag = uuid.uuid4().hex[:6]
    tmp = tmp_path_factory.mktemp("counters")
    names = {"join": f"cjoin-{tag}", "aggregate": f"cagg-{tag}"}
    topics = {k: (f"{v}-in", f"{v}-out") for k, v in names.items()}
    _run_in_thread(
        lambda: create_topics(kafka_bootstrap, [t for p in topics.values() for t in p], 1)
    )
    sides = [
        {"name": "orders", "when": "type == 'order.created'", "key": "data.order_id"},
        {"name": "payments", "when": "type == 'payment.created'", "key": "data.order_id"},
    ]
    steps = {
        "join": [{"id": "pair", "join": {"sides": sides, "window_s": 600}}],
        "aggregate": [
            {
                "id": "per_minute",
                "aggregate": {
                    "key": "data.user",
                    "window": {"tumbling": {"size_s": 60}},
                    "aggregations": {"n": "count"},
                    "idle_timeout_s": 1,
                },
            }
        ],
    }
    for kind, name in names.items():
        src, sink = topics[kind]
        _deploy(
            eventbus_client,
            tmp,
            name,
            {
                "apiVersion": "eventbus/v1",
                "kind": "Pipeline",
                "metadata": {"name": name},
                "spec": {
                    "sources": [{"kafka": {"topic": src}}],
                    "steps": steps[kind],
                    "sink": {"kafka": {"topic": sink}},
                    "serving": {"replicas": 1},
                },
            },
        )
    orders = [
        CloudEvent.create(type="order.created", source="/o", id=f"o{i}", data={"order_id": i})
        for i in range(3)
    ]
    pay = CloudEvent.create(type="payment.created", source="/p", id="p0", data={"order_id": 0})
    asyncio.run(produce(kafka_bootstrap, topics["join"][0], [*orders, pay]))
    # 3, 3, 2, 2 per minute; the last two at the end of their minute: the idle clock moves the
    # watermark on from the latest event time, so it closes [180, 240) a second after 239, not
    # a minute after 181
    seconds = [0, 1, 2, 60, 61, 62, 120, 121, 238, 239]
    events = [
        CloudEvent.create(
            type="t",
            source="/a",
            id=f"a{i}",
            time=f"2024-01-01T00:{s // 60:02d}:{s % 60:02d}Z",
            data={"user": "u"},
        )
        for i, s in enumerate(seconds)
    ]
    asyncio.run(produce(kafka_bootstrap, topics["aggregate"][0], events))
    assert len(asyncio.run(collect(kafka_bootstrap, topics["join"][1], 1, timeout_s=60))) == 1
    windows = asyncio.run(collect(kafka_bootstrap, topics["aggregate"][1], 4, timeout_s=60))
    assert sorted(w.data["n"] for w in windows) == [2, 2, 3, 3]
    yield names
    for name in names.values():
        eventbus_client.delete(name)


@pytest.fixture(scope="module")
def webhook(
    counters_gateway: Gateway,
    eventbus_client: Any,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """A webhook → filter → function → Kafka pipeline that took one event (async) and
    delivered it: 1 in / 1 out in every step box."""
    from eventbus._internal.services import create_topics
    from tests.fixtures.services import _run_in_thread

    tag = uuid.uuid4().hex[:6]
    name, sink = f"chook-{tag}", f"chook-{tag}-out"
    _run_in_thread(lambda: create_topics(kafka_bootstrap, [sink], 1))
    _deploy(
        eventbus_client,
        tmp_path_factory.mktemp("hook"),
        name,
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"http": {"path": f"/hook/{tag}", "type": "n.created"}}],
                "steps": [
                    {"id": "big", "filter": "data.n > 1"},
                    {"id": "score", "function": "tests.integration.funcs:score"},
                ],
                "sink": {"kafka": {"topic": sink}},
                "serving": {"replicas": 1},
            },
        },
    )
    with httpx.Client(base_url=counters_gateway.url, timeout=30) as c:
        wait_for(lambda: c.post(f"/hook/{tag}", json={"n": 5}).status_code == 202, 60)
    assert len(asyncio.run(collect(kafka_bootstrap, sink, 1, timeout_s=60))) == 1
    yield name
    eventbus_client.delete(name)


WANT = {
    "join": ({"in": 4, "out": 1, "absorbed": 3}, ("pair", {"in": 4, "out": 1, "absorbed": 3})),
    "aggregate": (
        {"in": 10, "out": 4, "absorbed": 10, "emitted": 4},
        ("per_minute", {"in": 10, "out": 0, "absorbed": 10, "emitted": 4}),
    ),
}


def _expected(want: dict[str, int]) -> dict[str, int]:
    return {k: want.get(k, 0) for k in NAMES}


def _stats(gw: Gateway, name: str) -> dict[str, Any]:
    return httpx.get(f"{gw.url}/v1/pipelines/{name}/stats", timeout=5).json()  # type: ignore[no-any-return]


def _settled(gw: Gateway, name: str, kind: str) -> dict[str, Any]:
    totals, (step, figures) = WANT[kind]

    def done() -> dict[str, Any] | None:
        v = _stats(gw, name)
        st = v["steps"].get(step, {})
        ok = {k: v["totals"][k] for k in NAMES} == _expected(totals) and {
            k: st.get(k) for k in NAMES
        } == _expected(figures)
        return v if ok else None

    return wait_for(done, 60, lambda: _stats(gw, name))  # type: ignore[no-any-return]


def _status(name: str, kafka: str, redis: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "eventbus.cli", "status", name, *extra]
    argv += ["--ray-address", ray.get_runtime_context().gcs_address]
    argv += ["--kafka-bootstrap", kafka, "--redis-url", redis]
    env = {**os.environ, "COLUMNS": "220"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("kind", ["join", "aggregate"])
def test_stateful_steps_count_absorbed_and_emitted_not_filtered(
    counters_gateway: Gateway,
    stateful: dict[str, str],
    kind: str,
    kafka_bootstrap: str,
    redis_url: str,
) -> None:
    name = stateful[kind]
    v = _settled(counters_gateway, name, kind)
    assert v["totals"]["filtered"] == 0 and v["last_event_at"] is not None
    # eventbus status: the text and --json agree, under the same names
    info = orjson.loads(_status(name, kafka_bootstrap, redis_url, "--json").stdout)
    t = info["figures"]["totals"]
    assert {k: t[k] for k in NAMES} == _expected(WANT[kind][0])
    text = _status(name, kafka_bootstrap, redis_url).stdout
    cells = [
        ln.replace("│", " ").replace("┃", " ").split()
        for ln in text.splitlines()
        if "│" in ln or "┃" in ln
    ]
    header = next(i for i, c in enumerate(cells) if c[:3] == ["in", "out", "filtered"])
    assert cells[header][:7] == list(NAMES), text
    assert cells[header + 1][:7] == [str(t[k]) for k in NAMES], text
    step, figures = WANT[kind][1]
    row = next(c for c in cells if c and c[0] == step)
    assert row[2:9] == [str(_expected(figures)[k]) for k in NAMES], text
    timing = next(i for i, c in enumerate(cells) if c[:2] == ["p50", "p99"])
    assert cells[timing][-2:] == ["last", "event"] and cells[timing + 1][-1] != "–", text
    # /metrics: the same numbers, the same names
    prom: dict[str, float] = {}
    for fam in text_string_to_metric_families(
        httpx.get(f"{counters_gateway.url}/metrics", timeout=5).text
    ):
        for s in fam.samples:
            if s.labels.get("pipeline") == name:
                prom[s.name] = prom.get(s.name, 0) + s.value
    for k in NAMES:
        assert prom[f"eventbus_pipeline_events_{k}_total"] == t[k], k
        assert prom[f"eventbus_step_events_{k}_total"] == _expected(figures)[k], k


def test_dashboard_tiles_and_step_boxes_agree_with_status_json(
    counters_gateway: Gateway,
    stateful: dict[str, str],
    browser: Any,
    kafka_bootstrap: str,
    redis_url: str,
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    for kind, name in stateful.items():
        _settled(counters_gateway, name, kind)
    browser.get(f"{counters_gateway.url}/dashboard")
    wait = WebDriverWait(browser, 30, poll_frequency=0.2)
    read = """
        const card = document.querySelector(`section.pipeline[data-name="${arguments[0]}"]`);
        if (!card) return null;
        const figures = {};
        for (const f of card.querySelectorAll("[data-figure]")) figures[f.dataset.figure] = f.querySelector("b").textContent;
        const rows = {};
        for (const r of card.querySelectorAll("tr[data-step]")) rows[r.dataset.step] = [...r.cells].map(c => c.textContent);
        const boxes = {};
        for (const b of card.querySelectorAll("[data-step-box]")) boxes[b.dataset.stepBox] = b.querySelector("small").textContent;
        return {figures, rows, boxes};
    """
    for kind, name in stateful.items():
        info = orjson.loads(_status(name, kafka_bootstrap, redis_url, "--json").stdout)
        t = info["figures"]["totals"]
        step, _ = WANT[kind][1]
        st = info["figures"]["steps"][step]
        card = wait.until(
            lambda d, n=name, t=t: (
                c
                if (c := d.execute_script(read, n)) and c["figures"]["in"] == str(t["in"])
                else None
            )
        )
        assert {k: card["figures"][k] for k in NAMES} == {k: str(t[k]) for k in NAMES}, card
        assert card["figures"]["last_event"] != "–", card
        assert card["rows"][step][2:9] == [str(st[k]) for k in NAMES], card
        # the step's box: in / out and the reasons that are not zero
        box = card["boxes"][step]
        assert box.startswith(f"{st['in']} in / {st['out']} out"), box
        assert f"{st['absorbed']} absorbed" in box and "filtered" not in box, box
        if kind == "aggregate":
            assert f"{st['emitted']} emitted" in box, box


def test_dashboard_step_boxes_of_a_webhook_pipeline_show_its_one_event(
    counters_gateway: Gateway, webhook: str, browser: Any
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    wait_for(
        lambda: _stats(counters_gateway, webhook)["steps"].get("score", {}).get("out") == 1,
        60,
        lambda: _stats(counters_gateway, webhook),
    )
    v = _stats(counters_gateway, webhook)
    assert {k: v["totals"][k] for k in ("in", "out")} == {"in": 1, "out": 1}
    browser.get(f"{counters_gateway.url}/dashboard")
    read = """
        const card = document.querySelector(`section.pipeline[data-name="${arguments[0]}"]`);
        if (!card) return null;
        const boxes = {};
        for (const b of card.querySelectorAll("[data-step-box]")) boxes[b.dataset.stepBox] = b.querySelector("small").textContent;
        const last = card.querySelector('[data-figure="last_event"] b').textContent;
        return {boxes, last, out: card.querySelector('[data-figure="out"] b').textContent};
    """
    card = WebDriverWait(browser, 30, poll_frequency=0.2).until(
        lambda d: c if (c := d.execute_script(read, webhook)) and c["out"] == "1" else None
    )
    assert card["boxes"] == {"big": "1 in / 1 out", "score": "1 in / 1 out"}, card
    assert card["last"] != "–", card
