"""The ``enrich`` step against a real uvicorn endpoint on loopback and the session's real
Redis: the cache (hits, misses, TTL, LRU bound, single-flight under 50 concurrent misses), the
rate limit, timeouts, outages, 5xx, malformed and huge answers, each failure policy, empty
answers, batch requests, and the config's errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from eventbus import CloudEvent, Failure
from eventbus.pipelines import validate_pipeline_text
from eventbus.pipelines.steps._enrich import EnrichStep
from eventbus.pipelines.steps._enrich_config import EnrichConfig
from tests.fixtures.http_receiver import Received, Receiver, Reply

pytestmark = pytest.mark.timeout(60)


def _customer(req: Received, n: int) -> Reply:
    cid = req.path.rsplit("/", 1)[1]
    return Reply(200, body=json.dumps({"name": f"c{cid}"}).encode())


def _events(keys: list[Any]) -> list[CloudEvent]:
    return [
        CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"cid": k})
        for i, k in enumerate(keys)
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_step() -> Iterator[Callable[..., EnrichStep]]:
    made: list[EnrichStep] = []

    def make(clock: Callable[[], float] = time.monotonic, **config: Any) -> EnrichStep:
        step = EnrichStep("enrich", EnrichConfig(**config), clock=clock)
        made.append(step)
        return step

    yield make
    for step in made:
        step.close()


def _url(r: Receiver) -> str:
    return f"http://127.0.0.1:{r.port}/customers/{{data.cid}}"


def test_cache_hits_and_one_call_per_key_per_ttl(receiver_factory, make_step) -> None:
    r = receiver_factory(_customer)
    clock = Clock()
    step = make_step(
        clock, http={"url": _url(r)}, into="data.customer", cache={"key": "data.cid", "ttl_s": 60}
    )
    events = _events([i % 5 for i in range(50)])
    for _ in range(3):  # within one TTL window: each key fetched once
        out = step.process(events)
        clock.now += 10
    assert len(r.requests) == 5
    assert sorted(q.path for q in r.requests) == [f"/customers/{k}" for k in range(5)]
    assert out[7].data == {"cid": 2, "customer": {"name": "c2"}}  # type: ignore[union-attr]
    stats = step.stats()
    assert stats["cache_misses"] == 5 and stats["calls"] == 5
    assert stats["cache_hits"] + stats["coalesced"] == 150 - 5
    clock.now += 60  # the window is over: one more call per key
    step.process(events)
    assert len(r.requests) == 10
    assert events[0].data == {"cid": 0}  # the input event is not changed


def test_cache_is_bounded_lru(receiver_factory, make_step) -> None:
    r = receiver_factory(_customer)
    step = make_step(http={"url": _url(r)}, cache={"key": "data.cid", "max_entries": 3})
    for k in range(10):  # one at a time: a batch's calls end in any order (the LRU's order)
        step.process(_events([k]))
    assert step.stats()["cache_size"] == 3
    step.process(_events([9, 8, 7]))  # the three most recent: hits
    assert len(r.requests) == 10
    step.process(_events([0]))
    assert len(r.requests) == 11


def test_fifty_concurrent_misses_of_one_key_make_one_call(receiver_factory, make_step) -> None:
    r = receiver_factory(lambda q, n: Reply(200, body=b'{"tier": "gold"}', delay_s=0.3))
    step = make_step(http={"url": _url(r)}, into="data.c", cache={"key": "data.cid"})
    barrier = threading.Barrier(50)
    results: list[Any] = [None] * 50

    def one(k: int) -> None:
        barrier.wait()
        results[k] = step.process(_events([7]))[0]

    threads = [threading.Thread(target=one, args=(k,)) for k in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(r.requests) == 1
    assert all(res.data == {"cid": 7, "c": {"tier": "gold"}} for res in results)
    assert step.stats()["calls"] == 1
    # and in one batch: 50 events of one key, one call
    step2 = make_step(http={"url": _url(r)}, cache={"key": "data.cid"})
    step2.process(_events([8] * 50))
    assert len(r.requests) == 2


def test_rate_limit_spaces_the_calls(receiver_factory, make_step) -> None:
    r = receiver_factory(_customer)
    step = make_step(http={"url": _url(r)}, max_rate=40, burst=1)
    started = time.monotonic()
    out = step.process(_events(list(range(41))))
    elapsed = time.monotonic() - started
    assert all(isinstance(e, CloudEvent) for e in out)
    assert len(r.requests) == 41
    # 41 calls at 40/s with a burst of 1 cannot take less than 1 s (a slow machine: longer)
    assert elapsed >= 1.0
    assert step.stats()["rate_limited_waits"] >= 35


def test_concurrency_limit(receiver_factory, make_step) -> None:
    r = receiver_factory(lambda q, n: Reply(200, body=b"{}", delay_s=0.05))
    step = make_step(http={"url": _url(r)}, max_concurrency=3)
    step.process(_events(list(range(20))))
    assert len(r.requests) == 20 and r.max_in_flight <= 3


@pytest.mark.parametrize("policy", ["fail", "skip", "default"])
def test_timeout_then_the_failure_policy(receiver_factory, make_step, policy) -> None:
    r = receiver_factory(lambda q, n: Reply(hang=True))
    extra = {"default": {"name": "unknown"}} if policy == "default" else {}
    step = make_step(
        http={"url": _url(r)},
        into="data.customer",
        timeout_s=0.2,
        call_retries=1,
        backoff={"initial_ms": 1, "max_ms": 1},
        on_failure=policy,
        **extra,
    )
    [out] = step.process(_events([1]))
    assert len(r.requests) == 2  # one retry
    if policy == "fail":
        assert isinstance(out, Failure) and out.error_type == "EnrichTimeout"
        assert "timeout_s=0.2" in out.message and step.errors == 1
    elif policy == "skip":
        assert out.data == {"cid": 1} and step.stats()["skipped"] == 1  # type: ignore[union-attr]
    else:
        assert out.data == {"cid": 1, "customer": {"name": "unknown"}}  # type: ignore[union-attr]
        assert step.stats()["defaulted"] == 1


@pytest.mark.parametrize("policy", ["fail", "skip", "default"])
def test_outage_server_stopped(receiver_factory, make_step, policy) -> None:
    r = receiver_factory(_customer)
    extra = {"default": {}} if policy == "default" else {}
    step = make_step(
        http={"url": _url(r)},
        into="data.customer",
        cache={"key": "data.cid"},
        call_retries=2,
        backoff={"initial_ms": 1, "max_ms": 2},
        on_failure=policy,
        **extra,
    )
    assert isinstance(step.process(_events([1]))[0], CloudEvent)
    r.stop()
    out = step.process(_events([1, 2, 2]))
    assert isinstance(out[0], CloudEvent)  # cached before the outage
    if policy == "fail":
        assert all(isinstance(o, Failure) and o.error_type == "EnrichConnectError" for o in out[1:])
        assert "enrich endpoint http://127.0.0.1" in out[1].message  # type: ignore[union-attr]
    elif policy == "skip":
        assert [o.data for o in out[1:]] == [{"cid": 2}, {"cid": 2}]  # type: ignore[union-attr]
    else:
        assert [o.data for o in out[1:]] == [{"cid": 2, "customer": {}}] * 2  # type: ignore[union-attr]
    stats = step.stats()
    assert stats["failures"] == 1 and stats["retries"] == 2  # key 2: one call, retried twice


def test_5xx_is_retried_4xx_is_not(receiver_factory, make_step) -> None:
    r = receiver_factory(
        lambda q, n: Reply(503, body=b"down") if "/1" in q.path else Reply(404, body=b"nobody")
    )
    step = make_step(http={"url": _url(r)}, call_retries=2, backoff={"initial_ms": 1, "max_ms": 1})
    out = step.process(_events([1, 2]))
    assert isinstance(out[0], Failure) and isinstance(out[1], Failure)
    assert out[0].error_type == "EnrichHttpError" and "503" in out[0].message
    assert "down" in out[0].message
    assert "404" in out[1].message and "nobody" in out[1].message
    paths = [q.path for q in r.requests]
    assert paths.count("/customers/1") == 3 and paths.count("/customers/2") == 1


def test_malformed_json_answer(receiver_factory, make_step) -> None:
    r = receiver_factory(lambda q, n: Reply(200, body=b"{not json"))
    step = make_step(http={"url": _url(r)})
    [out] = step.process(_events([1]))
    assert isinstance(out, Failure) and out.error_type == "EnrichAnswerError"
    assert "not JSON" in out.message and "{not json" in out.message
    assert len(r.requests) == 1  # not retried


def test_huge_answer_is_cut_with_a_clear_error(receiver_factory, make_step) -> None:
    r = receiver_factory(lambda q, n: Reply(200, body_size=20 * 1024 * 1024))
    step = make_step(http={"url": _url(r)}, max_answer_bytes=64 * 1024)
    [out] = step.process(_events([1]))  # a hang would trip the suite's per-test timeout
    assert isinstance(out, Failure) and out.error_type == "EnrichAnswerTooLarge"
    assert "max_answer_bytes=65536" in out.message and "raise max_answer_bytes" in out.message


def test_empty_answer_drops_when_configured(receiver_factory, make_step) -> None:
    from eventbus.pipelines import PipelineRunner, load_pipeline_text

    r = receiver_factory(
        lambda q, n: Reply(204) if q.path.endswith("/0") else Reply(200, body=b'{"a": 1}')
    )
    text = f"""
apiVersion: eventbus/v1
kind: Pipeline
metadata: {{name: enriched}}
spec:
  sources: [{{kafka: {{topic: in}}}}]
  steps:
    - id: look
      enrich: {{http: {{url: "{_url(r)}"}}, into: data.x, drop_on_empty: true}}
  sink: {{kafka: {{topic: out}}}}
"""
    runner = PipelineRunner(load_pipeline_text(text, "p.yaml"))
    try:
        outcomes = runner.run(_events([0, 1]))
        assert outcomes[0] == [] and outcomes[1][0].data == {"cid": 1, "x": {"a": 1}}  # type: ignore[index,union-attr]
        step = runner.metrics()["steps"]["look"]
        assert step["filtered"] == 1 and step["stats"]["dropped_empty"] == 1
    finally:
        runner.steps[0].close()  # type: ignore[attr-defined]


def test_post_body_auth_and_replacing_data(receiver_factory, make_step, monkeypatch) -> None:
    monkeypatch.setenv("CRM_TOKEN", "t0k")
    r = receiver_factory(lambda q, n: Reply(200, body=q.body))  # echoes the body
    step = make_step(
        http={
            "url": f"http://127.0.0.1:{r.port}/score",
            "method": "POST",
            "body": "{'id': data.cid, 'kind': type}",
            "auth": {"bearer": {"token": {"env": "CRM_TOKEN"}}},
        }
    )
    [out] = step.process(_events([5]))
    assert out.data == {"id": 5, "kind": "t"}  # type: ignore[union-attr]
    assert r.requests[0].headers["authorization"] == "Bearer t0k"
    assert r.requests[0].headers["content-type"] == "application/json"


def test_batch_endpoint_one_post_per_chunk(receiver_factory, make_step) -> None:
    def answer(q: Received, n: int) -> Reply:
        return Reply(200, body=json.dumps([{"got": b["cid"]} for b in json.loads(q.body)]).encode())

    r = receiver_factory(answer)
    step = make_step(
        http={
            "url": f"http://127.0.0.1:{r.port}/many",
            "method": "POST",
            "batch": True,
            "max_batch": 8,
        },
        into="data.r",
        cache={"key": "data.cid"},
    )
    out = step.process(_events([i % 20 for i in range(40)]))
    assert len(r.requests) == 3  # 20 distinct keys in chunks of 8
    assert [o.data["r"] for o in out[:3]] == [{"got": 0}, {"got": 1}, {"got": 2}]  # type: ignore[union-attr]
    wrong = receiver_factory(lambda q, n: Reply(200, body=b"[1]"))
    step2 = make_step(
        http={"url": f"http://127.0.0.1:{wrong.port}/m", "method": "POST", "batch": True}
    )
    out2 = step2.process(_events([1, 2]))
    assert all(isinstance(o, Failure) and "a list of 1 for 2 requests" in o.message for o in out2)


def test_redis_hash_per_event_and_pipelined(redis_url, make_step) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.hset("enrich-test:customer:1", mapping={"name": "Ann", "tier": "gold"})
    client.hset("enrich-test:customer:2", mapping={"name": "Bob", "limits": '{"max": 5}'})
    client.set("enrich-test:customer:3", "not a hash")
    step = make_step(
        redis={"key": "'enrich-test:customer:' + string(data.cid)", "url": redis_url},
        into="data.customer",
        drop_on_empty=True,
    )
    out = step.process(_events([1, 2, 9, 3]))
    assert out[0].data["customer"] == {"name": "Ann", "tier": "gold"}  # type: ignore[union-attr]
    assert out[1].data["customer"]["name"] == "Bob"  # type: ignore[union-attr]
    assert out[2] is None and step.stats()["dropped_empty"] == 1  # no such hash
    assert isinstance(out[3], Failure) and "WRONGTYPE" in out[3].message
    assert step.stats()["calls"] == 1  # one pipelined round trip
    field = make_step(
        redis={
            "key": "'enrich-test:customer:' + string(data.cid)",
            "field": "limits",
            "url": redis_url,
        },
        into="data.limits",
    )
    assert field.process(_events([2]))[0].data["limits"] == {"max": 5}  # type: ignore[union-attr]


def test_redis_outage_fails_with_the_reason(make_step) -> None:
    step = make_step(
        redis={"key": "string(data.cid)", "url": "redis://127.0.0.1:9/0"},
        call_retries=1,
        backoff={"initial_ms": 1, "max_ms": 1},
    )
    [out] = step.process(_events([1]))
    assert isinstance(out, Failure) and out.error_type == "EnrichRedisError"
    assert "127.0.0.1:9" in out.message


def test_bad_events_fail_alone(receiver_factory, make_step) -> None:
    r = receiver_factory(_customer)
    step = make_step(http={"url": _url(r)}, cache={"key": "data.cid"})
    events = [*_events([1]), CloudEvent.create(type="t", source="/s", id="x", data={"other": 1})]
    out = step.process(events)
    assert isinstance(out[0], CloudEvent)
    assert isinstance(out[1], Failure) and out[1].error_type == "EnrichInputError"
    assert "'x'" in out[1].message


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"into": "data"}, "exactly one target"),
        ({"http": {"url": "ftp://x/y"}}, "must start with http://"),
        ({"http": {"url": "http://{data.host}/y"}}, "placeholders only after"),
        ({"http": {"url": "http://h/y"}, "on_failure": "default"}, "needs a 'default'"),
        ({"http": {"url": "http://h/y"}, "default": {}}, "only with on_failure: default"),
        ({"http": {"url": "http://h/y", "batch": True}}, "set method: POST"),
        ({"http": {"url": "http://h/y"}, "into": "attrs.x"}, "pattern"),
    ],
)
def test_config_errors_name_the_fix(config: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        EnrichConfig(**config)


def test_validate_reports_bad_expressions_by_position() -> None:
    text = """\
apiVersion: eventbus/v1
kind: Pipeline
metadata: {name: enriched}
spec:
  sources: [{kafka: {topic: in}}]
  steps:
    - id: look
      enrich:
        http: {url: "http://crm/c/{data.cid +}"}
        cache: {key: "dta.cid"}
        on_failure: default
  sink: {kafka: {topic: out}}
"""
    config, found = validate_pipeline_text(text, "p.yaml")
    lines = [str(p) for p in found]
    assert config is None
    assert any(line.startswith("p.yaml:9:") and "http.url" in line for line in lines), lines
    assert any(line.startswith("p.yaml:10:") and "did you mean 'data'" in line for line in lines), (
        lines
    )
    assert any("needs a 'default'" in line for line in lines), lines
