"""The gateway on the real stack: HTTP and gRPC in, the pipeline's sink out.

A gateway process (``python -m eventbus.cli gateway``) runs against the session's broker,
Redis and Ray; pipelines with ``http``/``grpc`` sources are deployed through the controller.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest
import ray

from eventbus import CloudEvent
from eventbus._internal.services import free_port
from eventbus.eventing._proto import eventbus_pb2_grpc
from eventbus.eventing._protobuf import event_from_proto, event_to_proto, events_to_proto_batch
from eventbus.eventing.sources import sign_request
from tests.integration.kafka_helpers import collect

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

SECRET = "it-hmac-" + uuid.uuid4().hex
TOKEN = "it-token-" + uuid.uuid4().hex


class GatewayProcess:
    def __init__(self, kafka: str, redis: str, log: Path) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
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
            str(self.grpc_port),
            "--ray-address",
            ray.get_runtime_context().gcs_address,
            "--kafka-bootstrap",
            kafka,
            "--redis-url",
            redis,
        ]
        env = {**os.environ, "IT_SECRET": SECRET, "IT_TOKEN": TOKEN}
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, f"gateway exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"gateway did not start: {log.read_text()[-2000:]}"
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def gateway(
    ray_cluster: None,
    eventbus_client: Any,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(
        kafka_bootstrap, redis_url, tmp_path_factory.mktemp("gateway") / "gateway.log"
    )
    yield gw
    gw.stop()


def doc(name: str, sink: str, sources: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": sources,
            "steps": [
                {"id": "large", "filter": "data.amount > 100"},
                {
                    "id": "cny",
                    "convert": {
                        "set": {
                            "data.amount_cny": "double(data.amount) * 7.0",
                            "type": "'payment.large'",
                        }
                    },
                },
            ],
            "sink": {"kafka": {"topic": sink}},
            "serving": {"replicas": 1, "batch": {"max_size": 1000, "linger_ms": 2}},
            **spec,
        },
    }


def binary(i: int, amount: int) -> tuple[dict[str, str], bytes]:
    return {
        "ce-specversion": "1.0",
        "ce-id": f"h{i}",
        "ce-source": "/it",
        "ce-type": "payment.created",
        "content-type": "application/json",
    }, orjson.dumps({"amount": amount, "i": i})


async def test_async_http_events_reach_the_sink_in_every_mode(
    gateway: GatewayProcess, deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    sink = topic_factory("gw-sink")
    name = f"gw-async-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(doc(name, sink, [{"http": {"path": f"/hooks/{name}"}}]))
    n = 3000
    sem = asyncio.Semaphore(32)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as c:

        async def send(i: int) -> int:
            async with sem:
                amount = 50 if i % 4 == 0 else 200 + i
                if i % 3 == 0:
                    h, body = binary(i, amount)
                    r = await c.post(f"/v1/pipelines/{name}/events", headers=h, content=body)
                elif i % 3 == 1:
                    ev = {
                        "specversion": "1.0",
                        "id": f"h{i}",
                        "source": "/it",
                        "type": "payment.created",
                        "data": {"amount": amount, "i": i},
                    }
                    r = await c.post(
                        f"/hooks/{name}",
                        content=orjson.dumps(ev),
                        headers={"content-type": "application/cloudevents+json"},
                    )
                else:
                    ev = {
                        "specversion": "1.0",
                        "id": f"h{i}",
                        "source": "/it",
                        "type": "payment.created",
                        "data": {"amount": amount, "i": i},
                    }
                    r = await c.post(
                        f"/hooks/{name}",
                        content=orjson.dumps([ev]),
                        headers={"content-type": "application/cloudevents-batch+json"},
                    )
                return r.status_code

        codes = await asyncio.gather(*(send(i) for i in range(n)))
    assert set(codes) == {202}
    expected = {f"h{i}": 200 + i for i in range(n) if i % 4 != 0}
    out = await collect(kafka_bootstrap, sink, len(expected))
    got = {e.id: e for e in out}
    assert set(got) == set(expected)
    for eid, amount in expected.items():
        e = got[eid]
        assert (e.type, e.source, e.data["amount"], e.data["amount_cny"]) == (
            "payment.large",
            "/it",
            amount,
            amount * 7.0,
        )


async def test_sync_invoke_over_http_and_grpc(
    gateway: GatewayProcess, deploy_pipeline: Any, topic_factory: Any
) -> None:
    sink = topic_factory("gw-sync")
    name = f"gw-sync-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        doc(
            name,
            sink,
            [
                {"http": {"mode": "sync", "auth": {"bearer": {"token_env": "IT_TOKEN"}}}},
                {"grpc": {"mode": "sync", "auth": {"bearer": {"token_env": "IT_TOKEN"}}}},
            ],
        )
    )
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as c:
        h, body = binary(1, 300)
        r = await c.post(
            f"/v1/pipelines/{name}/events?wait=true", headers={**h, **auth}, content=body
        )
        assert r.status_code == 200, r.text
        assert r.headers["ce-type"] == "payment.large" and r.json()["amount_cny"] == 2100.0
        h, body = binary(2, 5)
        r = await c.post(
            f"/v1/pipelines/{name}/events?wait=true", headers={**h, **auth}, content=body
        )
        assert r.status_code == 204
        # concurrent sync calls are batched and each gets its own answer
        rs = await asyncio.gather(
            *(
                c.post(
                    f"/v1/pipelines/{name}/events?wait=true",
                    headers={**binary(i, 1000 + i)[0], **auth},
                    content=binary(i, 1000 + i)[1],
                )
                for i in range(200)
            )
        )
        assert [r.json()["amount"] for r in rs] == [1000 + i for i in range(200)]
        assert [r.headers["ce-id"] for r in rs] == [f"h{i}" for i in range(200)]
        r = await c.post(f"/v1/pipelines/{name}/events", headers=h, content=body)
        assert r.status_code == 401
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
        stub = eventbus_pb2_grpc.EventBusStub(channel)
        md = [("x-eventbus-pipeline", name), ("authorization", f"Bearer {TOKEN}")]
        event = CloudEvent.create(
            type="payment.created", source="/grpc", id="g1", data={"amount": 150}
        )
        out = await stub.Invoke(event_to_proto(event), metadata=md, timeout=30)
        (e,) = [event_from_proto(m) for m in out.events]
        assert (e.id, e.type, e.data["amount_cny"]) == ("g1", "payment.large", 1050.0)
        reply = await stub.Publish(
            events_to_proto_batch([event.replace(id=f"gp{i}") for i in range(10)]),
            metadata=md,
            timeout=30,
        )
        assert reply.accepted == 10
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Invoke(
                event_to_proto(event), metadata=[("x-eventbus-pipeline", name)], timeout=30
            )
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_curl_and_errors_on_the_live_gateway(
    gateway: GatewayProcess, deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    sink = topic_factory("gw-curl")
    name = f"gw-curl-{uuid.uuid4().hex[:6]}"
    schema = {
        "type": "object",
        "required": ["amount"],
        "properties": {"amount": {"type": "integer"}},
    }
    deploy_pipeline(
        doc(
            name,
            sink,
            [
                {
                    "http": {
                        "auth": {"hmac_sha256": {"secret_env": "IT_SECRET"}},
                        "data_schema": schema,
                        "max_body_bytes": 4096,
                    }
                }
            ],
        )
    )
    body = b'{"amount": 777}'
    url = f"{gateway.url}/v1/pipelines/{name}/events"

    def curl(*args: str) -> tuple[int, str]:
        proc = subprocess.run(
            ["curl", "-s", "-o", "/dev/stderr", "-w", "%{http_code}", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return int(proc.stdout), proc.stderr

    ce = {
        "content-type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": "curl-1",
        "ce-source": "/curl",
        "ce-type": "payment.created",
    }
    signed = [
        "-X",
        "POST",
        url,
        "-H",
        f"x-eventbus-signature: {sign_request(SECRET, 'POST', url, ce, body)}",
        *(x for k, v in ce.items() for x in ("-H", f"{k}: {v}")),
        "--data-binary",
        body.decode(),
    ]
    code, _ = curl(*signed)
    assert code == 202
    code, text = curl(*signed)  # the same signed request again: the replay cache (Redis)
    assert code == 401 and "was replayed" in text
    # an async source is write-only: no answers
    code, text = curl(
        "-X", "POST", url + "?wait=true", "-H", "content-type: application/json", "-d", "{}"
    )
    assert code == 401  # credentials first
    wait_url = url + "?wait=true"
    code, text = curl(
        "-X",
        "POST",
        wait_url,
        "-H",
        "content-type: application/json",
        "-H",
        f"x-eventbus-signature: {sign_request(SECRET, 'POST', wait_url, {'content-type': 'application/json'}, body)}",
        "--data-binary",
        body.decode(),
    )
    assert code == 403 and "mode: async" in text
    code, text = curl(
        "-X", "POST", url, "-H", "content-type: application/json", "--data-binary", body.decode()
    )
    assert code == 401 and "x-eventbus-signature" in text
    bad = b'{"amount": "x"}'
    code, text = curl(
        "-X",
        "POST",
        url,
        "-H",
        "content-type: application/json",
        "-H",
        f"x-eventbus-signature: {sign_request(SECRET, 'POST', url, {'content-type': 'application/json'}, bad)}",
        "--data-binary",
        bad.decode(),
    )
    assert code == 422 and "/amount" in text
    big = orjson.dumps({"amount": 1, "pad": "x" * 5000})
    code, _ = curl(
        "-X", "POST", url, "-H", "content-type: application/json", "--data-binary", big.decode()
    )
    assert code == 413
    code, text = curl(
        "-X", "POST", f"{gateway.url}/v1/pipelines/no-such-{name}/events", "--data-binary", "{}"
    )
    assert code == 404 and "no-such" in text
    (e,) = await collect(kafka_bootstrap, sink, 1)
    assert (e.id, e.source, e.data) == ("curl-1", "/curl", {"amount": 777, "amount_cny": 5439.0})


async def test_gateway_killed_mid_burst_loses_no_accepted_event(
    ray_cluster: None,
    eventbus_client: Any,
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    sink = topic_factory("gw-kill")
    name = f"gw-kill-{uuid.uuid4().hex[:6]}"
    d = doc(name, sink, [{"http": {}}])
    d["spec"]["steps"] = []
    deploy_pipeline(d)
    gw = GatewayProcess(kafka_bootstrap, redis_url, tmp_path / "gateway.log")
    accepted: list[str] = []
    sent = 0
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:

            async def client(k: int) -> None:
                nonlocal sent
                i = 0
                while True:
                    eid = f"k{k}-{i}"
                    i += 1
                    body = orjson.dumps(
                        [
                            {
                                "specversion": "1.0",
                                "id": f"{eid}-{j}",
                                "source": "/kill",
                                "type": "t",
                                "data": {"j": j},
                            }
                            for j in range(5)
                        ]
                    )
                    sent += 5
                    try:
                        r = await c.post(
                            f"/v1/pipelines/{name}/events",
                            content=body,
                            headers={"content-type": "application/cloudevents-batch+json"},
                        )
                    except httpx.HTTPError:
                        return  # the gateway is gone
                    if r.status_code != 202:
                        return
                    accepted.extend(r.json()["ids"])

            tasks = [asyncio.create_task(client(k)) for k in range(32)]
            while len(accepted) < 20_000:
                await asyncio.sleep(0.01)
            gw.kill()
            await asyncio.gather(*tasks)
    finally:
        gw.kill()
    assert len(accepted) >= 20_000
    out = await collect(kafka_bootstrap, sink, len(accepted), timeout_s=120)
    counts = Counter(e.id for e in out)
    missing = set(accepted) - set(counts)
    assert not missing, f"{len(missing)} accepted events lost, e.g. {sorted(missing)[:5]}"
    assert all(counts[i] == 1 for i in accepted), "an accepted event arrived twice"


async def test_a_pipeline_at_zero_takes_async_and_sync_calls_through_the_gateway(
    gateway: GatewayProcess, deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str
) -> None:
    """Async events wait in the ingress topic and wake the pipeline; a sync call wakes it and
    is answered within its deadline (503 with Retry-After only when the cold start takes longer
    than the deadline: tests/unit/serving/test_scale_to_zero.py)."""
    from tests.integration.test_autoscaling import replica_count
    from tests.integration.test_autoscaling import wait_for as wait_for_async

    sink = topic_factory("gw-zero")
    name = f"gw-zero-{uuid.uuid4().hex[:6]}"
    deadline_ms = 20_000
    deploy_pipeline(
        doc(
            name,
            sink,
            [{"http": {"mode": "sync", "timeout_ms": deadline_ms}}],
            serving={"replicas": {"min": 0, "max": 1, "idle_s": 2, "poll_s": 0.25}},
        )
    )
    await wait_for_async(lambda: replica_count(name) == 0, 30, "the scale to zero")
    n = 100
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as c:
        codes = await asyncio.gather(
            *(
                c.post(
                    f"/v1/pipelines/{name}/events?wait=false",
                    headers=binary(i, 200 + i)[0],
                    content=binary(i, 200 + i)[1],
                )
                for i in range(n)
            )
        )
        assert {r.status_code for r in codes} == {202}
        out = await collect(kafka_bootstrap, sink, n, timeout_s=40)
        assert sorted(e.id for e in out) == sorted(f"h{i}" for i in range(n))
        await wait_for_async(lambda: replica_count(name) == 0, 30, "the second scale to zero")
        # a sync call at zero wakes the pipeline and is answered within its deadline
        h, body = binary(n, 300)
        t0 = time.monotonic()
        r = await c.post(f"/v1/pipelines/{name}/events?wait=true", headers=h, content=body)
        took_s = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert r.json()["amount_cny"] == 2100.0
        assert took_s < deadline_ms / 1000, f"answered after {took_s:.1f} s"
        print(f"a sync call at zero: answered after {took_s:.2f} s (deadline {deadline_ms} ms)")


async def test_grpc_invoke_at_zero_waits_for_the_cold_start_or_says_when_to_retry(
    gateway: GatewayProcess, deploy_pipeline: Any, topic_factory: Any
) -> None:
    """A gRPC ``Invoke`` of a pipeline scaled to zero wakes it: with a deadline too short for
    the cold start it gets UNAVAILABLE before its deadline, with ``retry-after`` and
    ``grpc-retry-pushback-ms``; a call with a deadline long enough waits for the cold start
    and is answered (the unit tests time both against a simulated start). The dashboard's
    history (``/v1/pipelines/{name}/history``) shows the scale to zero and the cold start."""
    from tests.integration.test_autoscaling import replica_count
    from tests.integration.test_autoscaling import wait_for as wait_for_async

    sink = topic_factory("gw-zero-grpc")
    name = f"gw-zgrpc-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        doc(
            name,
            sink,
            [{"grpc": {"mode": "sync", "timeout_ms": 30_000}}],
            serving={"replicas": {"min": 0, "max": 1, "idle_s": 2, "poll_s": 0.25}},
        )
    )
    md = [("x-eventbus-pipeline", name)]
    event = CloudEvent.create(type="payment.created", source="/grpc", id="z1", data={"amount": 150})

    async def at_zero() -> None:
        await wait_for_async(lambda: replica_count(name) == 0, 30, "the scale to zero")
        # the gateway reads the state from Redis every 0.5 s
        await wait_for_async(
            lambda: name in scaled_to_zero(gateway), 10, "the gateway to see the pipeline at zero"
        )

    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
        stub = eventbus_pb2_grpc.EventBusStub(channel)
        t0 = time.monotonic()
        await at_zero()
        zero_s = time.monotonic() - t0
        # the dashboard's history shows the scale to zero: a settled 10 s bucket without a
        # replica after buckets with one
        await wait_for_async(
            lambda: _went_to_zero(history(gateway, name)["replicas"]),
            40,  # the next whole bucket (<= 10 s away) settled: <= 22 s on an idle machine
            "the history to show the scale to zero",
        )
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Invoke(event_to_proto(event), metadata=md, timeout=1.0)
        refused_s = time.monotonic() - started
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
        assert "scaled to zero" in (info.value.details() or "")
        trailing = dict(info.value.trailing_metadata() or ())
        assert int(trailing["retry-after"]) >= 1
        assert int(trailing["grpc-retry-pushback-ms"]) >= 1000
        assert refused_s < 1.0  # before the caller's own deadline
        # The refused call woke the pipeline; a call with a deadline long enough waits out
        # the cold start and is answered.
        out = await stub.Invoke(event_to_proto(event.replace(id="z2")), metadata=md, timeout=30)
        cold_s = time.monotonic() - started
        (e,) = [event_from_proto(m) for m in out.events]
        assert (e.id, e.data["amount_cny"]) == ("z2", 1050.0)

    # ... and the cold start: after the bucket(s) at zero, one with a replica that ran events
    def woke() -> bool:
        h = history(gateway, name)
        zero = _went_to_zero(h["replicas"])
        return zero is not None and any(
            r >= 1 and n > 0 for r, n in zip(h["replicas"][zero:], h["in_per_s"][zero:])
        )

    await wait_for_async(woke, 40, "the history to show the cold start")
    print(
        f"gRPC Invoke at zero (after {zero_s:.1f} s to zero): a 1 s deadline refused after "
        f"{refused_s:.2f} s; the next call answered {cold_s:.2f} s after the first"
    )


def history(gateway: GatewayProcess, name: str) -> dict[str, Any]:
    r = httpx.get(f"{gateway.url}/v1/pipelines/{name}/history?window_s=300", timeout=5)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _went_to_zero(replicas: list[int]) -> int | None:
    """The index of the first bucket without a replica after one with a replica, if any."""
    up = next((i for i, n in enumerate(replicas) if n >= 1), None)
    if up is None:
        return None
    return next((i for i in range(up + 1, len(replicas)) if replicas[i] == 0), None)


def scaled_to_zero(gateway: GatewayProcess) -> set[str]:
    """The pipelines the gateway's stats show at zero."""
    views = httpx.get(f"{gateway.url}/v1/stats", timeout=5).json()
    return {v["name"] for v in views if v.get("state") == "SCALED_TO_ZERO"}


def test_the_gateway_serves_the_schema_registry(gateway: GatewayProcess) -> None:
    """``/registry`` is a Confluent-compatible registry (eventbus.schemas), its topic read from
    the first request on; the gateway's own routes are untouched."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    with SchemaRegistryClient({"url": gateway.url + "/registry"}) as client:
        subject = f"gw-{uuid.uuid4().hex[:6]}-value"
        schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
        schema_id = client.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
        assert json.loads(client.get_schema(schema_id).schema_str) == schema
        assert subject in client.get_subjects()
    assert httpx.get(gateway.url + "/registry", timeout=10).json() == {}
    bad = httpx.post(
        gateway.url + f"/registry/subjects/{subject}/versions", content=b"{", timeout=10
    )
    assert (bad.status_code, bad.json()["error_code"]) == (400, 400)
    assert httpx.get(gateway.url + "/registryx", timeout=10).status_code in (404, 405)  # not ours
    assert httpx.get(gateway.url + "/healthz", timeout=10).status_code == 200
