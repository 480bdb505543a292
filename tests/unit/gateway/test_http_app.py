"""The gateway's HTTP face over an in-process backend: modes, sync/async, auth, schema, limits."""

from __future__ import annotations

import re

import httpx
import orjson
import pytest

from eventbus.eventing.sources import sign_request
from eventbus.gateway._http import build_http_app

CE = {
    "ce-specversion": "1.0",
    "ce-id": "e1",
    "ce-source": "/shop",
    "ce-type": "payment.created",
    "content-type": "application/json",
}


@pytest.fixture
def client(ingress_factory):
    ingress, backend = ingress_factory()
    app = build_http_app(ingress)
    c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    c.backend = backend  # type: ignore[attr-defined]
    return c


async def test_async_binary_event_is_published_as_sent(client) -> None:
    r = await client.post("/v1/pipelines/open/events", headers=CE, content=b'{"amount": 500}')
    assert r.status_code == 202, r.text
    assert r.json() == {"accepted": 1, "ids": ["e1"]}
    (e,) = client.backend.published["open"]
    assert (e.id, e.source, e.type, e.data) == ("e1", "/shop", "payment.created", {"amount": 500})


async def test_structured_batch_and_plain_modes(client) -> None:
    one = {"specversion": "1.0", "id": "s1", "source": "/s", "type": "t", "data": {"amount": 1}}
    r = await client.post(
        "/hooks/open",
        content=orjson.dumps(one),
        headers={"content-type": "application/cloudevents+json"},
    )
    assert r.status_code == 202
    batch = [dict(one, id=f"b{i}") for i in range(3)]
    r = await client.post(
        "/hooks/open",
        content=orjson.dumps(batch),
        headers={"content-type": "application/cloudevents-batch+json"},
    )
    assert r.json()["ids"] == ["b0", "b1", "b2"]
    r = await client.post("/hooks/open", json={"amount": 7})
    assert r.status_code == 202
    plain = client.backend.published["open"][-1]
    assert (plain.type, plain.source, plain.data) == (
        "eventbus.http",
        "/eventbus/open",
        {"amount": 7},
    )
    assert [e.id for e in client.backend.published["open"][:4]] == ["s1", "b0", "b1", "b2"]


async def test_sync_returns_binary_for_one_output_and_204_when_filtered(client) -> None:
    r = await client.post(
        "/v1/pipelines/echo/events?wait=true", headers=CE, content=b'{"amount": 500}'
    )
    assert r.status_code == 200, r.text
    assert r.headers["ce-type"] == "payment.large" and r.headers["ce-id"] == "e1"
    assert r.json() == {"amount": 500, "amount_cny": 3500.0, "cents": 50000}
    r = await client.post(
        "/v1/pipelines/echo/events?wait=true", headers=CE, content=b'{"amount": 5}'
    )
    assert r.status_code == 204
    assert "echo" not in client.backend.published  # sync answers, it does not also publish


async def test_sync_batch_gives_a_batch(client) -> None:
    batch = [
        {
            "specversion": "1.0",
            "id": f"b{i}",
            "source": "/s",
            "type": "t",
            "data": {"amount": 200 + i},
        }
        for i in range(3)
    ]
    r = await client.post(
        "/v1/pipelines/echo/events?wait=true",
        content=orjson.dumps(batch),
        headers={"content-type": "application/cloudevents-batch+json"},
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/cloudevents-batch+json"
    assert [e["data"]["amount_cny"] for e in r.json()] == [1400.0, 1407.0, 1414.0]


async def test_failing_step_is_422_naming_step_and_event(client) -> None:
    r = await client.post(
        "/v1/pipelines/echo/events?wait=true",
        headers=CE,
        content=b'{"amount": 9223372036854775807}',
    )
    assert r.status_code == 422
    assert "event 'e1' failed in step 'cny'" in r.json()["error"]
    assert "overflow" in r.json()["error"]


async def test_source_mode_sync_is_the_default_there(client) -> None:
    r = await client.post(
        "/v1/pipelines/payments/events",
        headers={**CE, "authorization": "Bearer pay-token"},
        content=b'{"amount": 500}',
    )
    assert r.status_code == 200 and r.json()["amount_cny"] == 3500.0
    r = await client.post(
        "/v1/pipelines/payments/events?wait=false",
        headers={**CE, "authorization": "Bearer pay-token"},
        content=b'{"amount": 500}',
    )
    assert r.status_code == 202


ORDERS = "http://gw/v1/pipelines/orders/events"


def signed(body: bytes, url: str = ORDERS, secret: str = "orders-secret", **headers: str):
    h = {"content-type": "application/json", **headers}
    return {**h, "x-eventbus-signature": sign_request(secret, "POST", url, h, body)}


async def test_hmac_auth_401(client) -> None:
    body = b'{"amount": 5}'
    good = signed(body)
    assert (
        await client.post("/v1/pipelines/orders/events", content=body, headers=good)
    ).status_code == 202
    r = await client.post(
        "/v1/pipelines/orders/events", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 401 and "x-eventbus-signature" in r.json()["error"]
    bad = signed(body, secret="wrong")
    assert (
        await client.post("/v1/pipelines/orders/events", content=body, headers=bad)
    ).status_code == 401
    # a valid token of another pipeline
    r = await client.post(
        "/v1/pipelines/payments/events", content=body, headers={"authorization": "Bearer nope"}
    )
    assert r.status_code == 401
    r = await client.post(
        "/v1/pipelines/payments/events",
        content=body,
        headers={**CE, "authorization": "Bearer pay-token"},
    )
    assert r.status_code == 204  # filtered out (amount 5), synchronously


async def test_bearer_token_of_another_pipeline_is_403(ingress_factory) -> None:
    from tests.unit.gateway.conftest import ENV, pipeline_doc

    docs = [
        pipeline_doc("a", [{"http": {"auth": {"bearer": {"token_env": "PAY_TOKEN"}}}}]),
        pipeline_doc("b", [{"http": {"auth": {"bearer": {"token_env": "ORDERS_SECRET"}}}}]),
    ]
    ingress, _ = ingress_factory(docs)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_http_app(ingress)), base_url="http://gw"
    ) as c:
        r = await c.post(
            "/v1/pipelines/b/events",
            json={},
            headers={"authorization": f"Bearer {ENV['PAY_TOKEN']}"},
        )
    assert r.status_code == 403
    assert ENV["PAY_TOKEN"] not in r.text


async def test_schema_violation_is_422_with_the_json_pointer(client) -> None:
    body = orjson.dumps({"amount": 5, "tags": ["ok", 3]})
    r = await client.post(
        "/v1/pipelines/orders/events",
        content=body,
        headers=signed(body),
    )
    assert r.status_code == 422
    assert "at JSON pointer /tags/1: 3 is not of type 'string'" in r.json()["error"]


async def test_body_over_the_limit_is_413(client) -> None:
    body = orjson.dumps({"amount": 1, "pad": "x" * 3000})
    r = await client.post(
        "/v1/pipelines/orders/events", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    assert "takes at most 2048" in r.json()["error"]

    async def chunks():
        for _ in range(4):
            yield b"x" * 1000

    r = await client.post(
        "/v1/pipelines/orders/events",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413


async def test_malformed_cloudevent_is_400_naming_the_attribute(client) -> None:
    r = await client.post(
        "/v1/pipelines/open/events",
        headers={k: v for k, v in CE.items() if k != "ce-source"},
        content=b"{}",
    )
    assert r.status_code == 400
    assert "header ce-source is missing" in r.json()["error"]


async def test_unknown_pipeline_path_or_transport_is_404(client) -> None:
    r = await client.post("/v1/pipelines/nope/events", json={})
    assert r.status_code == 404 and re.search(
        r"no pipeline named 'nope' accepts http events \(those that do: .*open", r.json()["error"]
    )
    r = await client.post("/v1/pipelines/kafka-only/events", json={})
    assert r.status_code == 404 and "has no http source" in r.json()["error"]
    r = await client.post("/hooks/nothing", json={})
    assert r.status_code == 404 and "/hooks/open" in r.json()["error"]


async def test_unloadable_secret_is_503_without_naming_the_variable(client, caplog) -> None:
    r = await client.post("/v1/pipelines/broken/events", json={})
    assert r.status_code == 503
    assert r.json()["error"] == (
        "pipeline 'broken' is not accepting http events: its auth secret is not configured on "
        "the gateway (the gateway's log says what is missing: `eventbus logs gateway`)"
    )
    assert "UNSET_TOKEN" not in r.text


def test_unloadable_secret_is_logged_with_its_variable(caplog) -> None:
    from eventbus.gateway._routes import RouteTable
    from tests.unit.gateway.conftest import default_docs

    with caplog.at_level("ERROR", logger="eventbus.gateway"):
        RouteTable.from_documents(default_docs(), {})
    assert "UNSET_TOKEN is not set" in caplog.text


async def test_a_signed_request_is_accepted_once(client) -> None:
    body = b'{"amount": 5}'
    h = signed(body)
    r = await client.post("/v1/pipelines/orders/events", content=body, headers=h)
    assert r.status_code == 202
    r = await client.post("/v1/pipelines/orders/events", content=body, headers=h)
    assert r.status_code == 401 and "was replayed" in r.json()["error"]
    assert len(client.backend.published["orders"]) == 1


async def test_a_signed_request_replayed_with_another_type_or_wait_is_401(client) -> None:
    body = b'{"amount": 5}'
    ce = {"ce-specversion": "1.0", "ce-id": "x1", "ce-source": "/s", "ce-type": "payment.created"}
    h = signed(body, **ce)
    r = await client.post(
        "/v1/pipelines/orders/events", content=body, headers={**h, "ce-type": "refund"}
    )
    assert r.status_code == 401 and "does not match the request" in r.json()["error"]
    r = await client.post("/v1/pipelines/orders/events?wait=true", content=body, headers=h)
    assert r.status_code == 401 and "does not match the request" in r.json()["error"]
    assert "orders" not in client.backend.published


@pytest.mark.parametrize("t", ["\u00b2", "9" * 5000])
async def test_odd_signature_timestamps_are_401_not_500(client, t) -> None:
    value = f"t={t},v2=00".encode()  # as bytes on the wire (latin-1 for the gateway)
    h = {"content-type": "application/json", "x-eventbus-signature": value}
    r = await client.post("/v1/pipelines/orders/events", content=b"{}", headers=h)
    assert r.status_code == 401 and "ASCII digits" in r.json()["error"]


async def test_a_failing_replay_cache_is_503_and_nothing_accepted(ingress_factory) -> None:
    ingress, backend = ingress_factory()

    class Down:
        async def claim(self, replay):
            raise ConnectionError("redis down")

    ingress.replay = Down()
    body = b'{"amount": 5}'
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_http_app(ingress)), base_url="http://gw"
    ) as c:
        r = await c.post("/v1/pipelines/orders/events", content=body, headers=signed(body))
    assert r.status_code == 503 and "replays" in r.json()["error"]
    assert "orders" not in backend.published


async def test_wait_true_on_an_async_source_is_403_naming_the_fix(client) -> None:
    for url in ("/v1/pipelines/open/events?wait=true", "/hooks/open?wait=1"):
        r = await client.post(url, headers=CE, content=b'{"amount": 500}')
        assert r.status_code == 403, url
        assert r.json()["error"] == (
            "pipeline 'open' answers no ?wait=true: its http source is mode: async "
            "(write-only); send without ?wait=true, or set mode: sync on the source and redeploy"
        )
    assert "open" not in client.backend.published


async def test_broker_failure_is_503_and_nothing_claimed_accepted(client) -> None:
    client.backend.fail_publish = ConnectionError("broker down")
    r = await client.post("/v1/pipelines/open/events", json={"amount": 1})
    assert r.status_code == 503 and "nothing was accepted, retry" in r.json()["error"]


async def test_openapi_and_health(client) -> None:
    spec = (await client.get("/openapi.json")).json()
    post = spec["paths"]["/v1/pipelines/{name}/events"]["post"]
    assert set(post["requestBody"]["content"]) == {
        "application/json",
        "application/cloudevents+json",
        "application/cloudevents-batch+json",
    }
    assert {"202", "400", "401", "403", "404", "413", "422"} <= set(post["responses"])
    health = (await client.get("/healthz")).json()
    assert health["status"] == "ok" and "orders" in health["pipelines"]


async def test_event_routes_answer_in_front_of_the_app_like_the_app(client) -> None:
    # The event routes are answered straight from the ASGI scope; the answers must be the
    # ones the FastAPI routes give: status, headers, the wait parameter, source paths.
    r = await client.post("/v1/pipelines/open/events?wait=maybe", headers=CE, content=b"{}")
    assert r.status_code == 400 and "query parameter wait is 'maybe'" in r.json()["error"]
    r = await client.post(
        "/v1/pipelines/echo/events?x=1&wait=1", headers=CE, content=b'{"amount": 500}'
    )
    assert (
        r.status_code == 200
        and r.headers["ce-id"] == "e1"
        and r.headers["content-length"] == str(len(r.content))
    )
    r = await client.post("/hooks/open/", headers=CE, content=b'{"amount": 500}')
    assert r.status_code == 202 and r.headers["content-type"] == "application/json"
    r = await client.post(
        "/v1/pipelines/echo/events?wait=true",
        headers={**CE, "ce-id": "small"},
        content=b'{"amount": 5}',
    )
    assert r.status_code == 204 and r.content == b"" and "content-length" not in r.headers
    r = await client.post("/v1/pipelines/nope/events", headers=CE, content=b"{}")
    assert r.status_code == 404 and "no pipeline named 'nope'" in r.json()["error"]
    r = await client.post(
        "/v1/pipelines/a/b/events", headers=CE, content=b"{}"
    )  # not a pipeline name: the app's catch-all
    assert (
        r.status_code == 404
        and "no pipeline serves path '/v1/pipelines/a/b/events'" in r.json()["error"]
    )
    r = await client.get("/v1/pipelines/open/events")
    assert r.status_code == 405


async def test_admin_posts_reach_the_admin_api_ahead_of_the_event_catch_all(
    ingress_factory,
) -> None:
    """The gateway's app ends in a POST catch-all for source paths; the admin API's POST routes
    (deploy, rollback, canary, promote) must still be matched first (FastAPI 0.165 includes a
    router as one entry without a path)."""
    from eventbus.gateway._admin import add_admin_routes

    calls: list[str] = []

    class Controller:
        def __getattr__(self, method: str):
            class Remote:
                async def remote(self, *args, **kwargs):
                    calls.append(method)
                    return {"method": method}

            return Remote()

    app = build_http_app(ingress_factory()[0])
    add_admin_routes(app, "tok", controller=Controller)
    auth = {"Authorization": "Bearer tok"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        r = await c.post("/v1/admin/pipelines", content=b"kind: Pipeline", headers=auth)
        assert r.status_code == 201 and r.json() == {"method": "deploy"}, r.text
        r = await c.post("/v1/admin/pipelines/p/promote", headers=auth)
        assert r.status_code == 200 and r.json() == {"method": "promote"}, r.text
        r = await c.post("/v1/admin/pipelines", content=b"kind: Pipeline")
        assert r.status_code == 401, "the catch-all must not answer for the admin API"
        r = await c.post("/not-a-source", content=b"{}")
        assert r.status_code == 404 and "no pipeline serves path" in r.json()["error"]
    assert calls == ["deploy", "promote"]
