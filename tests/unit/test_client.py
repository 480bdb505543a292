"""eventbus.Client: weights, local preference, failover, backoff, failover timing, registry.

No network: a fake transport plays the clusters; the HTTP contract is checked against the
real gateway app (in-process backend) over httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

import eventbus
from eventbus import CloudEvent
from eventbus._client import (
    Accepted,
    ClusterInfo,
    Unavailable,
    dump_registry,
    parse_registry,
    read_registry,
)
from eventbus._client._grpc import _grpc_error
from eventbus._client._http import AsyncHttpTransport, _answer
from eventbus.errors import ConfigError, IngressError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeClusters:
    """A transport whose clusters answer per ``state[name]``: "ok", "down", "slow" (down after
    ``slow_s`` of fake time), or an HTTP status; records the ids each cluster accepted."""

    def __init__(self, clock: Clock, slow_s: float = 2.0) -> None:
        self.clock = clock
        self.slow_s = slow_s
        self.state: dict[str, Any] = {}
        self.calls: list[str] = []
        self.accepted: dict[str, list[str]] = {}

    def _go(self, cluster: ClusterInfo, pipeline: str) -> None:
        self.calls.append(cluster.name)
        st = self.state.get(cluster.name, "ok")
        if st == "down":
            raise Unavailable("ConnectError: connection refused")
        if st == "flaky":  # fails once
            self.state[cluster.name] = "ok"
            raise Unavailable("gRPC UNAVAILABLE: Stream removed")
        if st == "slow":
            self.clock.now += self.slow_s
            raise Unavailable("ReadTimeout: timed out")
        if isinstance(st, int):
            _answer(cluster, pipeline, st, {}, b'{"error": "bad thing", "status": %d}' % st)

    def publish(self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]) -> list[str]:
        self._go(cluster, pipeline)
        self.clock.now += 0.01
        ids = [e.id for e in events]
        self.accepted.setdefault(cluster.name, []).extend(ids)
        return ids

    def invoke(self, cluster: ClusterInfo, pipeline: str, event: CloudEvent) -> list[CloudEvent]:
        self._go(cluster, pipeline)
        return [event.replace(type="out." + cluster.name)]

    def close(self) -> None:
        pass


class AsyncFakeClusters(FakeClusters):
    async def publish(
        self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]
    ) -> list[str]:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().publish(cluster, pipeline, events)

    async def invoke(
        self, cluster: ClusterInfo, pipeline: str, event: CloudEvent
    ) -> list[CloudEvent]:  # type: ignore[override]
        return super().invoke(cluster, pipeline, event)

    async def close(self) -> None:  # type: ignore[override]
        pass


def clusters(**weights: int) -> list[ClusterInfo]:
    return [ClusterInfo(name=n, gateway=f"http://{n}:8080", weight=w) for n, w in weights.items()]


@pytest.fixture
def make_client():
    def make(cl: list[ClusterInfo], **kw: Any) -> tuple[eventbus.Client, FakeClusters, Clock]:
        clock = Clock()
        fake = FakeClusters(clock)
        kw.setdefault("seed", 7)
        kw.setdefault("retry_delay_s", 0.0)
        return eventbus.Client(gateways=cl, transport=fake, clock=clock, **kw), fake, clock

    return make


def ev(i: int) -> CloudEvent:
    return CloudEvent.create(type="t", source="/s", id=f"e{i}", data={"i": i})


# -- weights and local preference -------------------------------------------------------------


def test_traffic_is_spread_by_weight_and_reproducible_with_a_seed(make_client) -> None:
    client, fake, _ = make_client(clusters(a=90, b=10))
    for i in range(4000):
        assert isinstance(client.publish("p", ev(i)), Accepted)
    share = Counter(fake.calls)
    assert 0.87 < share["a"] / 4000 < 0.93, share
    again, fake2, _ = make_client(clusters(a=90, b=10))
    for i in range(4000):
        again.publish("p", ev(i))
    assert fake2.calls == fake.calls
    st = client.stats()
    assert (
        st.clusters["a"].events_accepted + st.clusters["b"].events_accepted == 4000
        and st.failovers == 0
    )


def test_blue_green_weights_send_everything_to_one_cluster(make_client) -> None:
    client, fake, _ = make_client(clusters(blue=100, green=0))
    for i in range(200):
        assert client.publish("p", ev(i)).cluster == "blue"
    assert set(fake.calls) == {"blue"}


def test_the_local_cluster_is_preferred_while_its_weight_is_above_zero(make_client) -> None:
    cl = [
        ClusterInfo(name="near", gateway="http://n:1", weight=10, local=True),
        ClusterInfo(name="far", gateway="http://f:1", weight=90),
    ]
    client, fake, _ = make_client(cl)
    assert {client.publish("p", ev(i)).cluster for i in range(100)} == {"near"}
    # Weight 0 takes the local cluster out: the rest by weight.
    cl0 = [
        ClusterInfo(name="near", gateway="http://n:1", weight=0, local=True),
        ClusterInfo(name="far", gateway="http://f:1", weight=90),
    ]
    client, fake, _ = make_client(cl0)
    assert {client.publish("p", ev(i)).cluster for i in range(50)} == {"far"}
    # prefer_local=False spreads by weight even with a local cluster.
    client, fake, _ = make_client(cl, prefer_local=False)
    assert Counter(client.publish("p", ev(i)).cluster for i in range(1000))["far"] > 800
    # local_cluster= names this client's own cluster, whatever the registry's flag says.
    client, fake, _ = make_client(cl, local_cluster="far")
    assert {client.publish("p", ev(i)).cluster for i in range(50)} == {"far"}


# -- failover and backoff ---------------------------------------------------------------------


def test_failover_keeps_the_ids_and_marks_the_cluster_down_for_the_backoff(make_client) -> None:
    client, fake, clock = make_client(
        clusters(a=100), local_cluster="a", backoff_s=1.0, max_backoff_s=4.0
    )
    client._router.update(
        [*clusters(a=100), ClusterInfo(name="b", gateway="http://b:1", weight=100)]
    )
    fake.state["a"] = "down"
    got = client.publish("p", [ev(1), ev(2)])
    assert got == ["e1", "e2"] and got.cluster == "b"
    assert fake.calls == ["a", "b"] and fake.accepted == {"b": ["e1", "e2"]}
    # While a is down it is not even tried.
    fake.calls.clear()
    for i in range(10):
        client.publish("p", ev(i))
    assert set(fake.calls) == {"b"}
    # After the backoff a is tried again; still down: the backoff doubles (1 -> 2 -> 4, capped),
    # each period 50-100 % of that (jitter: clients do not come back to it in lockstep).
    clock.now += 1.01
    fake.calls.clear()
    client.publish("p", ev(20))
    assert fake.calls == ["a", "b"]
    st = client.stats().clusters["a"]
    assert 1.0 <= st.down_until - (clock.now - 0.01) <= 2.0
    clock.now += 2.01
    client.publish("p", ev(21))
    clock.now += 4.01
    client.publish("p", ev(22))
    clock.now += 4.01
    client.publish("p", ev(23))
    assert 2.0 <= client.stats().clusters["a"].down_until - (clock.now - 0.01) <= 4.0
    # Back up: the next try succeeds and a takes its traffic again.
    fake.state["a"] = "ok"
    clock.now += 4.01
    assert client.publish("p", ev(30)).cluster == "a"
    assert client.stats().clusters["a"].down_until == 0.0


def test_failover_time_runs_from_the_first_failed_request_to_the_first_success_elsewhere(
    make_client,
) -> None:
    client, fake, clock = make_client(clusters(a=100, b=100), local_cluster="a")
    fake.slow_s = 2.5
    fake.state["a"] = "slow"  # times out after 2.5 s
    assert client.publish("p", ev(1)).cluster == "b"
    st = client.stats()
    assert (
        st.failovers == 1
        and st.failover_s == [pytest.approx(2.51)]
        and st.last_failover_s == pytest.approx(2.51)
    )
    assert st.clusters["a"].failures == 1 and st.clusters["b"].events_accepted == 1


def test_requests_in_flight_when_a_cluster_went_down_do_not_stretch_its_backoff(
    make_client,
) -> None:
    client, fake, clock = make_client(clusters(a=100, b=100), backoff_s=1.0)
    router = client._router
    a = router.clusters[0]
    started = clock()
    clock.now += 0.1
    router.failed(a, started, Unavailable("reset"))
    down_until = router.stats.clusters["a"].down_until
    assert 0.5 <= down_until - clock.now <= 1.0  # 50-100 % of backoff_s
    for _ in range(19):  # nineteen more concurrent requests to a, all started before it failed
        router.failed(a, started, Unavailable("reset"))
    assert router.stats.clusters["a"].down_until == down_until
    # ... and one of them succeeding late does not bring it back either.
    router.succeeded(a, started, 1)
    assert router.stats.clusters["a"].down_until == down_until


def test_only_a_request_sent_after_the_failure_completes_the_failover(make_client) -> None:
    client, _, clock = make_client(clusters(a=100, b=100))
    router = client._router
    a, b = router.clusters
    early = clock()
    clock.now += 0.5
    router.failed(a, early, Unavailable("reset"))
    router.succeeded(b, early, 1)  # in flight to b since before a failed: not a failover
    assert router.snapshot().failovers == 0
    clock.now += 0.02
    router.succeeded(b, clock.now - 0.01, 1)
    st = router.snapshot()
    assert st.failovers == 1 and st.failover_s == [pytest.approx(0.52)]


def test_a_4xx_is_the_callers_problem_and_is_not_retried_elsewhere(make_client) -> None:
    client, fake, _ = make_client(clusters(a=100, b=100), local_cluster="a")
    fake.state["a"] = 422
    expect = "pipeline 'orders' on cluster 'a': 422: bad thing"
    with pytest.raises(IngressError, match=re.escape(expect)) as info:
        client.publish("orders", ev(1))
    assert info.value.status == 422 and fake.calls == ["a"] and fake.accepted == {}
    assert client.stats().clusters["a"].down_until == 0.0


def test_a_404_tries_the_other_clusters_first(make_client) -> None:
    client, fake, _ = make_client(clusters(a=100, b=100), local_cluster="a")
    fake.state["a"] = 404
    assert client.publish("p", ev(1)).cluster == "b"
    assert client.stats().clusters["a"].down_until == 0.0 and client.stats().failovers == 0
    fake.state["b"] = 404
    with pytest.raises(
        IngressError,
        match=r"pipeline 'p': not found on any cluster \(a: HTTP 404: bad thing; b: HTTP 404: bad thing\)",
    ) as info:
        client.publish("p", ev(2))
    assert info.value.status == 404


def test_when_every_cluster_is_down_the_error_names_each_and_nothing_counts_as_accepted(
    make_client,
) -> None:
    client, fake, clock = make_client(clusters(a=50, b=50))
    fake.state.update(a="down", b=503)
    with pytest.raises(
        IngressError,
        match=r"pipeline 'p': no cluster took the request \(.*a: ConnectError.*b: HTTP 503: bad thing",
    ) as info:
        client.publish("p", ev(1))
    assert info.value.status == 503 and fake.accepted == {}
    assert sorted(fake.calls) == ["a", "a", "b", "b"]  # one extra round (retries=1)
    # Both marked down: they are still tried (soonest back first) rather than failing at once.
    fake.state["b"] = "ok"
    assert client.publish("p", ev(1)).cluster == "b"


def test_a_last_round_retries_every_cluster_when_all_failed(make_client) -> None:
    client, fake, _ = make_client(clusters(a=100, b=100), local_cluster="a")
    fake.state.update(a="flaky", b="down")
    assert client.publish("p", ev(1)).cluster == "a"
    assert fake.calls == ["a", "b", "a"]
    assert client.stats().failovers == 0  # a came back itself
    fake.calls.clear()
    fake.state.update(a=404, b=404)
    with pytest.raises(IngressError, match="not found on any cluster"):
        client.publish("p", ev(2))
    assert sorted(fake.calls) == ["a", "b"]  # a 404 everywhere is not retried
    client.retries = 0
    fake.calls.clear()
    fake.state.update(a="down", b="down")
    with pytest.raises(IngressError, match="no cluster took the request"):
        client.publish("p", ev(3))
    assert sorted(fake.calls) == ["a", "b"]


def test_a_zero_weight_cluster_takes_traffic_only_when_every_weighted_one_is_down(
    make_client,
) -> None:
    client, fake, _ = make_client(clusters(blue=100, green=0))
    fake.state["blue"] = "down"
    assert client.publish("p", ev(1)).cluster == "green"
    assert client.publish("p", ev(2)).cluster == "green"


def test_invoke_returns_the_outputs_and_fails_over(make_client) -> None:
    client, fake, _ = make_client(clusters(a=100, b=100), local_cluster="a")
    fake.state["a"] = "down"
    [out] = client.invoke("p", {"amount": 5}, type="payment.created", source="/shop")
    assert out.type == "out.b" and out.data == {"amount": 5} and out.source == "/shop"
    with pytest.raises(ConfigError, match="invoke takes one event"):
        client.invoke("p", [ev(1), ev(2)])


def test_events_and_data(make_client) -> None:
    client, fake, _ = make_client(clusters(a=1))
    ids = client.publish("p", {"x": 1}, type="t.x", source="/x")
    assert len(ids) == 1 and len(ids[0]) >= 16
    assert client.publish("p", [ev(1), ev(2)]) == ["e1", "e2"]
    with pytest.raises(ConfigError, match="non-empty list of CloudEvents"):
        client.publish("p", [])


def test_no_clusters_and_bad_arguments() -> None:
    client = eventbus.Client(gateways=[], transport=FakeClusters(Clock()))
    with pytest.raises(
        IngressError, match="no clusters are registered; add one with `eventbus keeper add`"
    ):
        client.publish("p", ev(1))
    with pytest.raises(ConfigError, match="give exactly one of keeper_redis="):
        eventbus.Client()
    with pytest.raises(ConfigError, match="transport must be 'http' or 'grpc'; got 'udp'"):
        eventbus.Client(gateways=["http://a:1"], transport="udp")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="weight must be an integer >= 0; got -1"):
        ClusterInfo(name="a", weight=-1)
    with pytest.raises(ConfigError, match="cluster name 'a b' must be letters"):
        ClusterInfo(name="a b")


# -- discovery --------------------------------------------------------------------------------


def test_registry_round_trip_and_refresh(tmp_path: Path) -> None:
    path = tmp_path / "clusters.json"
    path.write_text(dump_registry(clusters(a=100, b=0)))
    assert parse_registry(path.read_bytes()) == clusters(a=100, b=0)
    assert read_registry(keeper_file=tmp_path / "none.json") == []
    with pytest.raises(ConfigError, match="the keeper registry is not a valid document"):
        parse_registry(b"{}")
    clock = Clock()
    fake = FakeClusters(clock)
    client = eventbus.Client(keeper_file=path, transport=fake, clock=clock, refresh_s=5.0, seed=1)
    assert {client.publish("p", ev(i)).cluster for i in range(20)} == {"a"}
    path.write_text(dump_registry(clusters(a=0, b=100)))  # the blue-green switch
    clock.now = 1004.9  # read at 1000.0, the first request
    assert client.publish("p", ev(0)).cluster == "a"
    clock.now = 1005.0
    assert {client.publish("p", ev(i)).cluster for i in range(20)} == {"b"}
    # An unreadable registry keeps the last one.
    path.write_text("not json")
    clock.now += 10
    assert client.publish("p", ev(0)).cluster == "b"
    # ... but with none read yet the client cannot start.
    bad = eventbus.Client(keeper_file=path, transport=fake, clock=clock)
    with pytest.raises(IngressError, match="cannot read the keeper registry at"):
        bad.publish("p", ev(0))


def test_keeper_file_registry(tmp_path: Path) -> None:
    from eventbus.serving._keeper import Keeper

    keeper = Keeper(str(tmp_path / "k.json"))
    assert keeper.add(ClusterInfo(name="blue", gateway="http://b:1")) is True
    assert keeper.add(ClusterInfo(name="green", gateway="http://g:1", weight=0)) is True
    assert keeper.add(ClusterInfo(name="green", gateway="http://g:2", weight=0)) is False
    keeper.set_weights({"blue": 0, "green": 100})
    assert [(c.name, c.gateway, c.weight) for c in keeper.clusters()] == [
        ("blue", "http://b:1", 0),
        ("green", "http://g:2", 100),
    ]
    with pytest.raises(
        ConfigError,
        match=re.escape("no cluster named 'red' is registered (registered: blue, green)"),
    ):
        keeper.set_weights({"red": 1})
    with pytest.raises(ConfigError, match="needs a gateway"):
        keeper.add(ClusterInfo(name="red"))
    keeper.remove("blue")
    assert [c.name for c in keeper.clusters()] == ["green"]
    [result] = keeper.deploy(tmp_path / "p.yaml")
    assert not result.ok and "has no ray_address and no --home" in result.output


# -- the async client -------------------------------------------------------------------------


async def test_async_client_fails_over_under_concurrency() -> None:
    clock = Clock()
    fake = AsyncFakeClusters(clock)
    client = eventbus.AsyncClient(
        gateways=clusters(a=50, b=50), transport=fake, clock=clock, seed=3
    )
    accepted: dict[str, str] = {}

    async def send(i: int) -> None:
        if i == 100:
            fake.state["b"] = "down"
        got = await client.publish("p", ev(i))
        accepted.update(dict.fromkeys(got, got.cluster))

    await asyncio.gather(*(send(i) for i in range(300)))
    assert len(accepted) == 300
    for name, ids in fake.accepted.items():
        assert all(accepted[x] == name for x in ids)
    st = client.stats()
    assert st.failovers == 1 and st.clusters["b"].failures >= 1
    [out] = await client.invoke("p", ev(1))
    assert out.type == "out.a"
    await client.close()


# -- the HTTP and gRPC contract ---------------------------------------------------------------


def _gateway_app(fail: Exception | None = None) -> Any:
    from eventbus.gateway._http import build_http_app
    from eventbus.gateway._ingress import Ingress
    from eventbus.gateway._routes import RouteTable
    from eventbus.pipelines._config import PipelineConfig
    from eventbus.pipelines._runner import PipelineRunner

    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "orders"},
        "spec": {
            "sources": [
                {
                    "http": {
                        "mode": "sync",  # Client.invoke asks for answers; publish for 202s
                        "data_schema": {"type": "object", "required": ["amount"]},
                    }
                }
            ],
            "steps": [{"id": "big", "filter": "data.amount > 100"}],
            "sink": {"kafka": {"topic": "out"}},
        },
    }

    class Backend:
        published: list[CloudEvent] = []
        runner = PipelineRunner(PipelineConfig.model_validate(doc))

        async def publish(self, pipeline: str, events: list[CloudEvent]) -> None:
            if fail is not None:
                raise fail
            self.published.extend(events)

        async def invoke(self, pipeline: str, events: list[CloudEvent]) -> Any:
            return self.runner.run(events)

    backend = Backend()
    return build_http_app(Ingress(backend, RouteTable.from_documents([doc], {}))), backend  # type: ignore[arg-type]


async def test_http_transport_against_the_gateway_app() -> None:
    down_app, _ = _gateway_app(IngressError(503, "the broker is unavailable"))
    up_app, backend = _gateway_app()
    transport = AsyncHttpTransport(5.0)
    apps = {"down": down_app, "up": up_app}

    async def route(request: httpx.Request) -> httpx.Response:
        inner = httpx.ASGITransport(app=apps[request.url.host])
        return await inner.handle_async_request(request)

    await transport._http.aclose()
    transport._http = httpx.AsyncClient(transport=httpx.MockTransport(route))
    cl = [
        ClusterInfo(name="down", gateway="http://down", local=True),
        ClusterInfo(name="up", gateway="http://up"),
    ]
    client = eventbus.AsyncClient(gateways=cl, transport=transport)
    got = await client.publish(
        "orders",
        [
            CloudEvent.create(type="t", source="/s", id=f"o{i}", data={"amount": 200 + i})
            for i in range(3)
        ],
    )
    assert got == ["o0", "o1", "o2"] and got.cluster == "up"
    assert [e.id for e in backend.published] == ["o0", "o1", "o2"] and backend.published[
        1
    ].data == {"amount": 201}
    [out] = await client.invoke(
        "orders", CloudEvent.create(type="t", source="/s", id="i1", data={"amount": 500})
    )
    assert (out.id, out.data) == ("i1", {"amount": 500})
    assert await client.invoke("orders", {"amount": 5}) == []
    with pytest.raises(
        IngressError, match=r"pipeline 'orders' on cluster 'up': 422: .*amount"
    ) as info:
        await client.publish("orders", {"no_amount": 1})
    assert info.value.status == 422
    with pytest.raises(IngressError, match="not found on any cluster"):
        await client.publish("nope", {"amount": 1})
    await client.close()


def test_grpc_codes_map_to_failover_or_the_callers_error() -> None:
    import grpc

    class Err:
        def __init__(self, code: grpc.StatusCode) -> None:
            self._code = code

        def code(self) -> grpc.StatusCode:
            return self._code

        def details(self) -> str:
            return "details"

    c = ClusterInfo(name="a", grpc="a:1")
    assert isinstance(_grpc_error(c, "p", Err(grpc.StatusCode.UNAVAILABLE)), Unavailable)
    assert isinstance(_grpc_error(c, "p", Err(grpc.StatusCode.DEADLINE_EXCEEDED)), Unavailable)
    nf = _grpc_error(c, "p", Err(grpc.StatusCode.NOT_FOUND))
    assert isinstance(nf, Unavailable) and not nf.mark_down
    bad = _grpc_error(c, "p", Err(grpc.StatusCode.INVALID_ARGUMENT))
    assert (
        isinstance(bad, IngressError)
        and bad.status == 400
        and str(bad) == "pipeline 'p' on cluster 'a': 400: INVALID_ARGUMENT: details"
    )


def test_import_eventbus_client_imports_neither_ray_nor_grpc() -> None:
    import subprocess
    import sys

    code = "import sys, eventbus; eventbus.Client(gateways=['http://a:1']); print('ray' in sys.modules, 'grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_keeper_cli_on_a_file_registry(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from eventbus.cli import app

    runner = CliRunner()
    env = {"EVENTBUS_KEEPER_REDIS": str(tmp_path / "k.json"), "COLUMNS": "200"}
    home = tmp_path / "home"
    home.mkdir()
    (home / "stack.json").write_text(
        json.dumps(
            {
                "ray_address": "127.0.0.1:1",
                "kafka_bootstrap": "127.0.0.1:2",
                "redis_url": "redis://127.0.0.1:3/0",
                "gateway_http": "http://127.0.0.1:4",
                "gateway_grpc": "127.0.0.1:5",
                "ray_auth_token_path": "/tok",
            }
        )
    )
    res = runner.invoke(app, ["keeper", "add", "blue", "--home", str(home), "--local"], env=env)
    assert (
        res.exit_code == 0
        and "added cluster blue: gateway http://127.0.0.1:4, gRPC 127.0.0.1:5, weight 100"
        in res.output
    ), res.output
    res = runner.invoke(
        app,
        [
            "keeper",
            "add",
            "green",
            "--gateway",
            "http://g:8080",
            "--grpc",
            "g:50051",
            "--weight",
            "0",
        ],
        env=env,
    )
    assert res.exit_code == 0, res.output
    assert (
        runner.invoke(app, ["keeper", "weight", "green", "10"], env=env).output.strip()
        == "weights: blue 100 (91%), green 10 (9%)"
    )
    reg = json.loads(runner.invoke(app, ["keeper", "list", "--json"], env=env).output)
    blue = reg["clusters"][0]
    assert (blue["ray_address"], blue["kafka"], blue["ray_token_file"], blue["local"]) == (
        "127.0.0.1:1",
        "127.0.0.1:2",
        "/tok",
        True,
    )
    assert "green" in runner.invoke(app, ["keeper", "list"], env=env).output
    bad = runner.invoke(app, ["keeper", "weight", "red", "1"], env=env)
    assert (
        bad.exit_code == 1
        and "no cluster named 'red' is registered (registered: blue, green)" in bad.output
    )
    assert runner.invoke(app, ["keeper", "weight", "blue", "-1"], env=env).exit_code == 2
    assert runner.invoke(app, ["keeper", "remove", "blue"], env=env).exit_code == 0
    assert [
        c["name"]
        for c in json.loads(runner.invoke(app, ["keeper", "list", "--json"], env=env).output)[
            "clusters"
        ]
    ] == ["green"]
    res = runner.invoke(app, ["keeper", "list"], env={"EVENTBUS_KEEPER_REDIS": ""})
    assert res.exit_code == 2 and "no keeper registry" in res.output


def test_keeper_passes_each_clusters_kafka_config_to_its_deploy(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from eventbus.cli import app

    runner = CliRunner()
    env = {"EVENTBUS_KEEPER_REDIS": str(tmp_path / "k.json"), "COLUMNS": "200"}
    config = tmp_path / "kafka.yaml"
    config.write_text("security_protocol: SSL\nca_file: /etc/ssl/certs/ca-certificates.crt\n")
    addresses = ["--ray-address", "127.0.0.1:1", "--kafka-bootstrap", "127.0.0.1:2"]
    addresses += ["--redis-url", "redis://127.0.0.1:3/0", "--gateway", "http://127.0.0.1:4"]
    res = runner.invoke(
        app, ["keeper", "add", "tls", *addresses, "--kafka-config", str(config)], env=env
    )
    assert res.exit_code == 0, res.output
    [cluster] = json.loads(runner.invoke(app, ["keeper", "list", "--json"], env=env).output)[
        "clusters"
    ]
    assert cluster["kafka_config"] == str(config.resolve())

    # an invalid file is refused when the cluster is added, naming the field
    bad = tmp_path / "bad.yaml"
    bad.write_text("security_protocol: TLS\n")
    res = runner.invoke(
        app, ["keeper", "add", "bad", *addresses, "--kafka-config", str(bad)], env=env
    )
    assert res.exit_code == 1 and "security_protocol" in res.output, res.output

    # the deploy subprocess reads the cluster's own file: broken since, it names it
    from eventbus.serving._keeper import Keeper

    config.write_text("security_protocol: [")
    [result] = Keeper(str(tmp_path / "k.json")).deploy(tmp_path / "p.yaml", timeout_s=60)
    assert not result.ok and f"kafka config {config.resolve()}: cannot read it" in result.output, (
        result.output
    )
