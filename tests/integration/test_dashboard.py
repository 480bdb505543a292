"""Observability on the real stack: /metrics, the stats API, traces over OTLP, the dashboard in
headless Chromium.

A gateway process (tracing to an OTLP/HTTP receiver this test runs on loopback) in front of a
pipeline with a Kafka and an HTTP source; its replica publishes figures to Redis and spans to
the same receiver. The browser test keeps a screenshot in ``test-artifacts/dashboard.png``.
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from eventbus import CloudEvent
from eventbus._internal.services import free_port
from tests.integration.kafka_helpers import collect, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


class OtlpReceiver:
    """A real OTLP/HTTP trace receiver on loopback: decodes ExportTraceServiceRequest bodies."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[dict[str, Any]] = []
        lock = self.lock = threading.Lock()
        spans = self.spans

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with lock:
                    for rs in req.resource_spans:
                        service = next(
                            (
                                a.value.string_value
                                for a in rs.resource.attributes
                                if a.key == "service.name"
                            ),
                            "",
                        )
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                spans.append(
                                    {
                                        "service": service,
                                        "name": s.name,
                                        "trace_id": s.trace_id.hex(),
                                        "span_id": s.span_id.hex(),
                                        "parent": s.parent_span_id.hex(),
                                        "attributes": {
                                            a.key: a.value.string_value or a.value.int_value
                                            for a in s.attributes
                                        },
                                    }
                                )
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Gateway:
    def __init__(self, kafka: str, redis: str, otlp: str, log: Path) -> None:
        self.http_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        argv = [
            sys.executable,
            "-m",
            "eventbus.cli",
            "gateway",
            "--host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            "0",
            "--ray-address",
            ray.get_runtime_context().gcs_address,
            "--kafka-bootstrap",
            kafka,
            "--redis-url",
            redis,
            "--otlp-endpoint",
            otlp,
            "--log-format",
            "json",
        ]
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_for(
            lambda: _ok(self.url + "/healthz") or self.proc.poll() is not None,
            60,
            lambda: log.read_text()[-2000:],
        )
        assert self.proc.poll() is None, log.read_text()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(
    cond: Callable[[], Any], timeout_s: float, describe: Callable[[], Any] = lambda: ""
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"condition not met within {timeout_s} s: {describe()}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def gateway(
    ray_cluster: None,
    eventbus_client: Any,
    kafka_bootstrap: str,
    redis_url: str,
    otlp: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    gw = Gateway(
        kafka_bootstrap, redis_url, otlp.url, tmp_path_factory.mktemp("gateway") / "gateway.log"
    )
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def deployed(
    gateway: Gateway,
    eventbus_client: Any,
    kafka_bootstrap: str,
    otlp: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """One pipeline for the module: Kafka + HTTP sources, filter + convert, sink, dead letters;
    60 Kafka events and 20 async HTTP events sent, all delivered; 3 sync calls (one output,
    one filtered, one failed)."""
    import yaml

    from eventbus._internal.services import create_topics
    from tests.fixtures.services import _run_in_thread

    tag = uuid.uuid4().hex[:6]
    name = f"dash-{tag}"
    src, sink, dlq = f"dash-in-{tag}", f"dash-out-{tag}", f"dash-dlq-{tag}"
    _run_in_thread(lambda: create_topics(kafka_bootstrap, [src, sink, dlq], partitions=1))
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [
                {"kafka": {"topic": src}},
                {"http": {"path": f"/dash/{tag}", "type": "payment.created", "mode": "sync"}},
            ],
            "steps": [
                {"id": "large", "filter": "data.amount > 100"},
                {
                    "id": "cny",
                    "convert": {"set": {"data.cny": "data.amount * 7", "type": "'payment.large'"}},
                },
            ],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "serving": {"replicas": 1, "batch": {"max_size": 500, "linger_ms": 2}},
            "observability": {"tracing": {"otlp_endpoint": otlp.url}, "logs": "json"},
        },
    }
    path = tmp_path_factory.mktemp("dash") / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    eventbus_client.deploy(path)
    # Kafka: 55 events of amounts 0..540 (11 of them <= 100: filtered) and 5 whose double
    # amount fails in `cny` (double * int is a CEL error): dead letters.
    events = [
        CloudEvent.create(type="payment.created", source="/it", id=f"k{i}", data={"amount": i * 10})
        for i in range(55)
    ]
    events += [
        CloudEvent.create(type="payment.created", source="/it", id=f"f{i}", data={"amount": 500.5})
        for i in range(5)
    ]
    asyncio.run(produce(kafka_bootstrap, src, events))
    traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    with httpx.Client(base_url=gateway.url, timeout=30) as c:
        for i in range(20):
            headers = {"traceparent": traceparent} if i == 0 else {}
            r = c.post(f"/dash/{tag}?wait=false", json={"amount": 1000 + i}, headers=headers)
            assert r.status_code == 202, r.text
        # sync calls run on the replica, not through the sources: the gateway counts them
        for amount, status in ((200, 200), (50, 204), (300.5, 422)):
            r = c.post(f"/dash/{tag}?wait=true", json={"amount": amount})
            assert r.status_code == status, r.text
    expected_out = 44 + 20  # amounts 110..540 from Kafka, every HTTP one
    outputs = asyncio.run(collect(kafka_bootstrap, sink, expected_out, timeout_s=60))
    yield {
        "name": name,
        "tag": tag,
        "sink": sink,
        "outputs": outputs,
        "traceparent": traceparent,
        "expected_out": expected_out,
    }
    eventbus_client.delete(name)


def test_stats_api_reports_topology_counters_latency_and_lag(
    gateway: Gateway, deployed: dict[str, Any]
) -> None:
    name = deployed["name"]

    def settled() -> dict[str, Any] | None:
        v = httpx.get(f"{gateway.url}/v1/pipelines/{name}/stats", timeout=5).json()
        return (
            v
            if v["totals"]["outputs"] >= deployed["expected_out"] + 1
            and v["totals"]["consumed"] >= 83
            and v["totals"]["committed"] >= 80
            and v["lag_total"] == 0
            and v["lag"]
            and v["steps"]["large"]["in"] >= 83
            else None
        )

    v = wait_for(settled, 30, lambda: httpx.get(f"{gateway.url}/v1/pipelines/{name}/stats").text)
    t = v["totals"]
    # 80 through the sources + 3 sync calls (1 out, 1 filtered, 1 failed: answered 422, not dead-lettered)
    assert (t["consumed"], t["outputs"], t["dropped"], t["failed"], t["dead_lettered"]) == (
        83,
        65,
        12,
        6,
        5,
    )
    assert v["sync"] == {"consumed": 3, "outputs": 1, "dropped": 1, "failed": 1}
    assert v["version"] == 1 and v["replicas"] == 1
    assert [s["kind"] for s in v["topology"]["sources"]] == ["kafka", "http"]
    assert [s["id"] for s in v["topology"]["steps"]] == ["large", "cny"]
    large, cny = v["steps"]["large"], v["steps"]["cny"]
    assert (large["in"], large["out"], large["filtered"]) == (83, 71, 12)
    assert (cny["in"], cny["out"], cny["errors"]) == (71, 65, 6)
    # the figures status and the dashboard show, named as the steps' counters
    assert (t["in"], t["out"], t["filtered"], t["errors"], t["absorbed"], t["late"]) == (
        83,
        65,
        12,
        6,
        0,
        0,
    )
    assert v["last_event_at"] is not None
    assert (
        v["latency"]["histogram"]["count"] == 80
        and 0 < v["latency"]["p50_s"] <= v["latency"]["p99_s"] < 60
    )
    assert v["batch_size"]["histogram"]["sum"] == 83
    assert f"dash-in-{deployed['tag']}[0]" in v["lag"] and v["lag_total"] == 0
    assert (
        v["gateway"]["async"]["requests"] == {"202": 20} and v["gateway"]["async"]["events"] == 20
    )
    assert v["gateway"]["sync"]["requests"] == {"200": 1, "204": 1, "422": 1}
    assert httpx.get(f"{gateway.url}/v1/pipelines/nope-{name}/stats").status_code == 404


def test_history_api_adds_up_to_the_totals(gateway: Gateway, deployed: dict[str, Any]) -> None:
    """The 15-minute history in Redis (10 s buckets, written with the figures) holds every
    event the totals count, once: its rates times the bucket length sum to the totals."""
    name = deployed["name"]
    url = f"{gateway.url}/v1/pipelines/{name}/history"

    def summed() -> tuple[int, int, int]:
        h = httpx.get(url, timeout=5).json()
        return tuple(  # type: ignore[return-value]
            round(sum(h[k]) * h["bucket_s"]) for k in ("in_per_s", "out_per_s", "failed_per_s")
        )

    # 83 in (80 Kafka + 3 sync), 65 out, 6 failed; buckets settle 10-12 s after their start
    wait_for(lambda: summed() == (83, 65, 6), 40, summed)
    # the lag the replica published last: 0 once its last commit is in (it publishes every
    # second while figures move, so the newest bucket may still hold the lag before it)
    wait_for(
        lambda: httpx.get(url, timeout=5).json()["lag"][-1] == 0,
        30,
        lambda: httpx.get(url, timeout=5).json()["lag"][-5:],
    )
    h = httpx.get(url, timeout=5).json()
    assert h["lag"][-1] == 0
    assert h["window_s"] == 900 and len(h["t"]) == 90 and h["bucket_s"] == 10
    assert h["replicas"][-1] == 1 and 0 in h["replicas"]  # none before the deploy
    delivered = [p for p in h["p99_s"] if p is not None]
    assert delivered and all(0 < p < 60 for p in delivered)
    short = httpx.get(url + "?window_s=60", timeout=5).json()
    assert short["t"] == h["t"][-6:] and short["in_per_s"] == h["in_per_s"][-6:]
    r = httpx.get(url + "?window_s=5", timeout=5)
    assert r.status_code == 400 and "window_s 5 is out of range" in r.json()["error"]
    assert httpx.get(f"{gateway.url}/v1/pipelines/nope-{name}/history").status_code == 404


def test_metrics_endpoint_exposes_the_same_figures(
    gateway: Gateway, deployed: dict[str, Any]
) -> None:
    name = deployed["name"]
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("pipeline") == name:
                values[(s.name, frozenset(s.labels.items()))] = s.value

    def total(metric: str) -> float:
        return sum(v for (n, _), v in values.items() if n == metric)

    assert total("eventbus_events_in_total") == 83  # source "sync": the gateways' sync calls
    assert (
        values[
            ("eventbus_events_in_total", frozenset({"pipeline": name, "source": "sync"}.items()))
        ]
        == 3
    )
    assert total("eventbus_events_out_total") == 65
    assert total("eventbus_events_dropped_total") == 12
    assert total("eventbus_dead_letters_total") == 5
    assert total("eventbus_step_events_errors_total") == 6
    assert total("eventbus_pipeline_events_in_total") == 83
    assert total("eventbus_pipeline_events_out_total") == 65
    assert total("eventbus_pipeline_events_filtered_total") == 12
    assert total("eventbus_pipeline_events_errors_total") == 6
    assert total("eventbus_pipeline_last_event_timestamp_seconds") > 0
    assert total("eventbus_end_to_end_latency_seconds_count") == 80
    assert total("eventbus_pipeline_version") == 1
    assert total("eventbus_gateway_requests_total") >= 20
    assert any(n == "eventbus_consumer_lag" for n, _ in values)


def test_trace_goes_from_gateway_through_replica_to_sink(
    deployed: dict[str, Any], otlp: OtlpReceiver
) -> None:
    trace_id = deployed["traceparent"].split("-")[1]
    names = lambda: {s["name"] for s in otlp.of_trace(trace_id)}  # noqa: E731
    want = {
        f"eventbus.gateway {deployed['name']}",
        f"eventbus.process {deployed['name']}",
        f"eventbus.sink dash-out-{deployed['tag']}",
    }
    wait_for(lambda: want <= names(), 20, names)
    spans = {s["name"]: s for s in otlp.of_trace(trace_id)}
    gw = spans[f"eventbus.gateway {deployed['name']}"]
    proc = spans[f"eventbus.process {deployed['name']}"]
    send = spans[f"eventbus.sink dash-out-{deployed['tag']}"]
    assert gw["parent"] == deployed["traceparent"].split("-")[2]
    assert proc["parent"] == gw["span_id"] and send["parent"] == proc["span_id"]
    assert gw["service"] == "eventbus-gateway" and proc["service"] == f"eventbus-{deployed['name']}"
    # the output on the sink topic carries the sink span's context
    (out,) = [
        e
        for e in deployed["outputs"]
        if e.attributes.get("traceparent", "").split("-")[1:2] == [trace_id]
    ]
    assert out.attributes["traceparent"].split("-")[2] == send["span_id"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    assert chromium and driver_path, (
        "the browser test needs Debian's chromium and chromium-driver (make system-deps)"
    )
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1200",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    yield driver
    driver.quit()


def test_dashboard_shows_the_pipeline_and_sends_a_test_event(
    gateway: Gateway, deployed: dict[str, Any], browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    name = deployed["name"]
    browser.get(f"{gateway.url}/dashboard")
    wait = WebDriverWait(browser, 20, poll_frequency=0.2)
    card_css = f'section.pipeline[data-name="{name}"]'

    # The page re-renders every second: read a card in one script call (no stale elements).
    read_card = """
        const card = document.querySelector(arguments[0]);
        if (!card) return null;
        const figures = {};
        for (const f of card.querySelectorAll("[data-figure]")) figures[f.dataset.figure] = f.querySelector("b").textContent;
        const rows = {};
        for (const r of card.querySelectorAll("tr[data-step]")) rows[r.dataset.step] = [...r.cells].map(c => c.textContent);
        return {figures, rows, topology: card.querySelector(".topology").innerText};
    """

    def card() -> dict[str, Any] | None:
        return browser.execute_script(read_card, card_css)  # type: ignore[no-any-return]

    def figure(key: str) -> str:
        c = card()
        return c["figures"][key] if c else ""

    wait.until(lambda d: figure("in") == "83")
    c = card()
    assert c is not None
    f = c["figures"]
    assert (
        f["out"],
        f["dead_letters"],
        f["errors"],
        f["filtered"],
        f["version"],
        f["replicas"],
        f["lag"],
    ) == ("65", "5", "6", "12", "1", "1", "0")
    assert f["p50"].endswith("ms") and f["p99"].endswith("ms")
    for part in (
        "kafka",
        "http",
        "large (filter)",
        "cny (convert)",
        f"dash-out-{deployed['tag']}",
        f"dash-dlq-{deployed['tag']}",
    ):
        assert part in c["topology"]
    assert c["rows"]["large"][:7] == ["large", "filter", "83", "71", "12", "0", "0"]
    assert f["last_event"] != "–"

    # The charts of the last 15 minutes: inline SVG drawn from /v1/history, with data.
    read_charts = """
        const card = document.querySelector(arguments[0]);
        if (!card) return null;
        const out = {};
        for (const chart of card.querySelectorAll("svg[data-chart]")) {
            const box = chart.getBoundingClientRect();
            const base = chart.querySelector("line.axis").y1.baseVal.value;
            const series = {};
            for (const g of chart.querySelectorAll("g[data-series]")) {
                const ys = [];
                for (const line of g.querySelectorAll("polyline"))
                    for (let i = 0; i < line.points.numberOfItems; i++) ys.push(line.points.getItem(i).y);
                for (const dot of g.querySelectorAll("circle")) ys.push(dot.cy.baseVal.value);
                series[g.dataset.series] = {
                    points: ys.length,
                    above: ys.filter(y => y < base - 0.5).length,
                    levels: [...new Set(ys.map(y => Math.round(y)))].length,
                };
            }
            out[chart.dataset.chart] = {width: box.width, height: box.height, series};
        }
        return out;
    """

    def charts() -> dict[str, Any] | None:
        got = browser.execute_script(read_charts, card_css)
        return (
            got
            if got and got.get("rate", {}).get("series", {}).get("in", {}).get("above")
            else None
        )

    drawn = wait.until(lambda d: charts())
    assert set(drawn) == {"rate", "latency", "lag", "replicas"}
    for chart_id, chart in drawn.items():
        assert chart["width"] > 200 and chart["height"] > 50, (chart_id, chart)
    rate, latency = drawn["rate"]["series"], drawn["latency"]["series"]
    assert rate["in"]["above"] >= 1 and rate["out"]["above"] >= 1 and rate["failed"]["above"] >= 1
    assert rate["in"]["points"] >= 90  # one per bucket of the 15 minutes
    assert latency["p50"]["above"] >= 1 and latency["p99"]["above"] >= 1
    assert drawn["lag"]["series"]["lag"]["points"] >= 1
    # the deploy is a step from zero replicas (before it) to one
    assert drawn["replicas"]["series"]["replicas"]["levels"] == 2

    Select(browser.find_element(By.ID, "test-pipeline")).select_by_value(name)
    body = browser.find_element(By.ID, "test-body")
    body.clear()
    body.send_keys('{"amount": 321}')
    browser.find_element(By.ID, "test-send").click()
    wait.until(lambda d: d.find_element(By.ID, "test-status").text.startswith("200"))
    result = browser.find_element(By.ID, "test-result").text
    out = (
        orjson.loads(result[result.index("\n{") + 1 :]) if "\n{" in result else orjson.loads(result)
    )
    assert out == {"amount": 321, "cny": 2247}
    assert '"type": "payment.large"' in result
    # a filtered test event
    body.clear()
    body.send_keys('{"amount": 1}')
    browser.find_element(By.ID, "test-send").click()
    wait.until(lambda d: d.find_element(By.ID, "test-status").text.startswith("204"))
    # the sync requests show up in the gateway's figures and in the totals
    wait.until(lambda d: "/" in figure("sync_latency"))
    wait.until(lambda d: (figure("in"), figure("out"), figure("filtered")) == ("85", "66", "13"))
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000


def test_eventbus_status_shows_the_same_figures(
    deployed: dict[str, Any], kafka_bootstrap: str, redis_url: str
) -> None:
    argv = [
        sys.executable,
        "-m",
        "eventbus.cli",
        "status",
        deployed["name"],
        "--ray-address",
        ray.get_runtime_context().gcs_address,
        "--kafka-bootstrap",
        kafka_bootstrap,
        "--redis-url",
        redis_url,
    ]
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(
        f"dash-in-{deployed['tag']}" in ln and "large (filter) → cny (convert)" in ln
        for ln in lines
    ), r.stdout
    cells = [
        ln.replace("│", " ").replace("┃", " ").split()
        for ln in lines
        if ln.strip()[:1] in ("│", "┃")
    ]
    header = next(i for i, c in enumerate(cells) if c[:3] == ["in", "out", "filtered"])
    figures = cells[header + 1]
    row = (
        next(ln for ln in lines if "large" in ln and "filter" in ln and "│" in ln)
        .replace("│", " ")
        .split()
    )
    r = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=90, env=env)
    assert r.returncode == 0, r.stderr
    info = orjson.loads(r.stdout)
    t = info["figures"]["totals"]
    # 83 in, or 85 with the dashboard test's two sync events when it ran first
    assert (t["consumed"], t["outputs"], t["dropped"], t["failed"], t["dead_lettered"]) in (
        (83, 65, 12, 6, 5),
        (85, 66, 13, 6, 5),
    )
    # the text shows the --json figures under the same names
    names = ("in", "out", "filtered", "absorbed", "errors", "late", "emitted", "dead_lettered")
    assert cells[header][:7] == list(names[:7]), r.stdout
    assert figures[:8] == [str(t[k]) for k in names], r.stdout
    assert info["figures"]["steps"]["cny"]["errors"] == 6
    large = info["figures"]["steps"]["large"]
    assert large["in"] == t["in"] and row[:9] == [
        "large",
        "filter",
        *(str(large[k]) for k in names[:7]),
    ], r.stdout


def test_actor_placement_publishes_the_same_figures(
    gateway: Gateway, eventbus_client: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """source_placement: actor: the source actors publish their counters, latency and lag,
    the replicas (which run the steps for them) the steps' figures, the gateway its sync calls."""
    import yaml

    from eventbus._internal.services import create_topics
    from tests.fixtures.services import _run_in_thread

    tag = uuid.uuid4().hex[:6]
    name = f"dact-{tag}"
    src, sink, dlq = f"dact-in-{tag}", f"dact-out-{tag}", f"dact-dlq-{tag}"
    _run_in_thread(lambda: create_topics(kafka_bootstrap, [src, sink, dlq], partitions=1))
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [
                {"kafka": {"topic": src}},
                {"http": {"path": f"/dact/{tag}", "type": "t", "mode": "sync"}},
            ],
            "steps": [
                {"id": "large", "filter": "data.amount > 100"},
                {"id": "cny", "convert": {"set": {"data.cny": "data.amount * 7"}}},
            ],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "serving": {
                "replicas": 1,
                "source_placement": "actor",
                "batch": {"max_size": 500, "linger_ms": 2},
            },
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    eventbus_client.deploy(path)
    try:
        # Kafka: amounts 0..290 (11 <= 100: filtered, 19 out) and 2 that fail in `cny`.
        events = [
            CloudEvent.create(type="t", source="/it", id=f"k{i}", data={"amount": i * 10})
            for i in range(30)
        ]
        events += [
            CloudEvent.create(type="t", source="/it", id=f"f{i}", data={"amount": 500.5})
            for i in range(2)
        ]
        asyncio.run(produce(kafka_bootstrap, src, events))
        with httpx.Client(base_url=gateway.url, timeout=30) as c:
            wait_for(
                lambda: c.post(f"/dact/{tag}?wait=false", json={"amount": 1000}).status_code == 202,
                30,
            )  # the route is read from Redis
            for i in range(4):
                assert (
                    c.post(f"/dact/{tag}?wait=false", json={"amount": 1001 + i}).status_code == 202
                )
            assert c.post(f"/dact/{tag}?wait=true", json={"amount": 200}).status_code == 200
            assert c.post(f"/dact/{tag}?wait=true", json={"amount": 50}).status_code == 204
        asyncio.run(collect(kafka_bootstrap, sink, 19 + 5, timeout_s=60))
        want = {"consumed": 39, "outputs": 25, "dropped": 12, "failed": 2, "dead_lettered": 2}

        def settled() -> dict[str, Any] | None:
            v = httpx.get(f"{gateway.url}/v1/pipelines/{name}/stats", timeout=5).json()
            t = v["totals"]
            done = (
                {k: t[k] for k in want} == want
                and t["committed"] == 37
                and v["lag"]
                and v["lag_total"] == 0
            )
            # the steps' counters are published apart from the sources' (each once a second)
            return (
                v
                if done and v["steps"]["cny"]["in"] == 27 and v["steps"]["large"]["in"] == 39
                else None
            )

        v = wait_for(
            settled, 30, lambda: httpx.get(f"{gateway.url}/v1/pipelines/{name}/stats").text
        )
        assert v["replicas"] == 1  # the source actors publish too, but are not replicas
        assert v["sync"] == {"consumed": 2, "outputs": 1, "dropped": 1, "failed": 0}
        assert [s["counters"]["consumed"] for s in v["sources"]] == [32, 5]
        large, cny = v["steps"]["large"], v["steps"]["cny"]
        assert (large["in"], large["out"], large["filtered"]) == (39, 27, 12)
        assert (cny["in"], cny["out"], cny["errors"]) == (27, 25, 2)
        assert (
            v["latency"]["histogram"]["count"] == 37
            and 0 < v["latency"]["p50_s"] <= v["latency"]["p99_s"] < 60
        )
        assert f"{src}[0]" in v["lag"]
        status = eventbus_client.status(name)
        assert {k: status["figures"]["totals"][k] for k in want} == want
    finally:
        eventbus_client.delete(name)
