"""The registry's REST API over the in-memory log: Confluent's answers and error codes, and
hostile input (malformed JSON, a 10 MB schema, self references, unknown names, a race)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from eventbus.schemas import (
    MAX_SCHEMA_BYTES,
    MemorySchemaLog,
    SchemaRegistry,
    build_registry_app,
)

USER = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]}
USER_AGE = {
    "type": "record",
    "name": "User",
    "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int", "default": 0}],
}
USER_REQUIRED_AGE = {
    "type": "record",
    "name": "User",
    "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}],
}


def body(schema: Any, **extra: Any) -> dict[str, Any]:
    return {"schema": json.dumps(schema), **extra}


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = build_registry_app(SchemaRegistry(MemorySchemaLog()))
    with TestClient(app) as c:
        yield c


def error(response: Any) -> tuple[int, int]:
    return response.status_code, response.json()["error_code"]


def test_register_is_idempotent_and_ids_are_global(client: TestClient) -> None:
    r = client.post("/subjects/users-value/versions", json=body(USER))
    assert r.status_code == 200 and r.json() == {"id": 1}
    assert r.headers["content-type"] == "application/vnd.schemaregistry.v1+json"
    # the same schema, formatted otherwise: the same id and no new version
    spaced = {"schema": json.dumps(USER, indent=4)}
    assert client.post("/subjects/users-value/versions", json=spaced).json() == {"id": 1}
    assert client.get("/subjects/users-value/versions").json() == [1]
    # the same schema under another subject: the same id
    assert client.post("/subjects/other/versions", json=body(USER)).json() == {"id": 1}
    assert client.post("/subjects/users-value/versions", json=body(USER_AGE)).json() == {"id": 2}
    assert client.get("/subjects").json() == ["other", "users-value"]
    assert client.get("/subjects/users-value/versions").json() == [1, 2]
    latest = client.get("/subjects/users-value/versions/latest").json()
    assert latest == {
        "subject": "users-value",
        "version": 2,
        "id": 2,
        "schema": json.dumps(USER_AGE),
    }
    assert client.get("/subjects/users-value/versions/1").json()["id"] == 1
    assert json.loads(client.get("/subjects/users-value/versions/1/schema").text) == USER
    assert client.get("/schemas/ids/2").json() == {"schema": json.dumps(USER_AGE)}
    assert client.get("/schemas/ids/1/versions").json() == [
        {"subject": "other", "version": 1},
        {"subject": "users-value", "version": 1},
    ]
    assert client.get("/schemas/ids/1/subjects").json() == ["other", "users-value"]
    found = client.post("/subjects/users-value", json=body(USER_AGE)).json()
    assert (found["version"], found["id"]) == (2, 2)


def test_unknown_names_get_confluents_codes(client: TestClient) -> None:
    client.post("/subjects/s/versions", json=body(USER))
    assert error(client.get("/subjects/nope/versions")) == (404, 40401)
    assert error(client.get("/subjects/nope/versions/1")) == (404, 40401)
    assert error(client.get("/subjects/s/versions/7")) == (404, 40402)
    assert error(client.get("/subjects/s/versions/zero")) == (422, 42202)
    assert error(client.get("/subjects/s/versions/0")) == (422, 42202)
    assert error(client.get("/schemas/ids/99")) == (404, 40403)
    assert error(client.get("/schemas/ids/abc")) == (404, 40403)
    assert error(client.post("/subjects/s", json=body(USER_AGE))) == (404, 40403)
    assert error(client.post("/subjects/nope", json=body(USER))) == (404, 40401)
    assert error(client.get("/no/such/route")) == (404, 404)


def test_incompatible_change_is_409_and_check_says_why(client: TestClient) -> None:
    client.post("/subjects/s/versions", json=body(USER))
    r = client.post("/subjects/s/versions", json=body(USER_REQUIRED_AGE))
    assert error(r) == (409, 409)
    assert "reader field 'age' is missing from the writer and has no default" in r.json()["message"]
    check = client.post(
        "/compatibility/subjects/s/versions/latest?verbose=true", json=body(USER_REQUIRED_AGE)
    )
    assert check.json()["is_compatible"] is False and check.json()["messages"]
    ok = client.post("/compatibility/subjects/s/versions/1", json=body(USER_AGE))
    assert ok.json() == {"is_compatible": True}
    assert client.post("/compatibility/subjects/s/versions", json=body(USER_AGE)).json() == {
        "is_compatible": True
    }
    assert error(client.post("/compatibility/subjects/s/versions/9", json=body(USER))) == (
        404,
        40402,
    )
    assert error(client.post("/compatibility/subjects/x/versions/1", json=body(USER))) == (
        404,
        40401,
    )


def test_config(client: TestClient) -> None:
    assert client.get("/config").json() == {"compatibilityLevel": "BACKWARD"}
    assert client.put("/config", json={"compatibility": "full"}).json() == {"compatibility": "FULL"}
    assert client.get("/config").json() == {"compatibilityLevel": "FULL"}
    assert error(client.get("/config/s")) == (404, 40408)
    assert client.get("/config/s?defaultToGlobal=true").json() == {"compatibilityLevel": "FULL"}
    assert client.put("/config/s", json={"compatibility": "NONE"}).json() == {
        "compatibility": "NONE"
    }
    assert client.get("/config/s").json() == {"compatibilityLevel": "NONE"}
    client.post("/subjects/s/versions", json=body(USER))
    assert client.post("/subjects/s/versions", json=body({"type": "string"})).json() == {"id": 2}
    assert client.delete("/config/s").json() == {"compatibilityLevel": "NONE"}
    assert error(client.get("/config/s")) == (404, 40408)
    for bad in ({"compatibility": "SIDEWAYS"}, {"compatibility": 3}, {}, []):
        assert error(client.put("/config", json=bad)) == (422, 42203)


def test_delete_soft_then_permanent(client: TestClient) -> None:
    client.post("/subjects/s/versions", json=body(USER))
    client.post("/subjects/s/versions", json=body(USER_AGE))
    assert error(client.delete("/subjects/s/versions/1?permanent=true")) == (404, 40407)
    assert client.delete("/subjects/s/versions/1").json() == 1
    assert client.get("/subjects/s/versions").json() == [2]
    assert client.get("/subjects/s/versions?deleted=true").json() == [1, 2]
    assert error(client.delete("/subjects/s?permanent=true")) == (404, 40405)
    assert client.delete("/subjects/s").json() == [1, 2]
    assert client.get("/subjects").json() == []
    assert client.get("/subjects?deleted=true").json() == ["s"]
    assert client.delete("/subjects/s?permanent=true").json() == [1, 2]
    assert client.get("/subjects?deleted=true").json() == []
    assert error(client.get("/schemas/ids/1")) == (404, 40403)


@pytest.mark.parametrize(
    ("payload", "expect"),
    [
        (b"{not json", (400, 400)),
        (b"", (422, 42201)),
        (b"[1, 2]", (422, 42201)),
        (b'{"schema": 42}', (422, 42201)),
        (b'{"schema": "{\\"type\\": \\"record\\"}"}', (422, 42201)),
        (b'{"schema": "\\"string\\"", "schemaType": "PROTOBUF"}', (422, 42201)),
        (b'{"schema": "\\"string\\"", "references": [{"name": 1}]}', (422, 42201)),
        (b"[" * 100_000, (400, 400)),
    ],
)
def test_malformed_bodies(client: TestClient, payload: bytes, expect: tuple[int, int]) -> None:
    r = client.post("/subjects/s/versions", content=payload)
    assert error(r) == expect
    assert client.get("/subjects").json() == []


def test_a_10_mb_schema_is_refused_with_413(client: TestClient) -> None:
    fields = [{"name": f"f{i}", "type": "string"} for i in range(200_000)]
    big = json.dumps({"schema": json.dumps({"type": "record", "name": "Big", "fields": fields})})
    assert len(big) > 10 * MAX_SCHEMA_BYTES
    started = time.perf_counter()
    r = client.post("/subjects/s/versions", content=big.encode())
    assert error(r) == (413, 413)
    assert f"at most {MAX_SCHEMA_BYTES} bytes" in r.json()["message"]
    # no Content-Length: refused while streaming, at the limit
    chunks = (big[i : i + 65536].encode() for i in range(0, len(big), 65536))
    assert error(client.post("/subjects/s/versions", content=chunks)) == (413, 413)
    assert time.perf_counter() - started < 60  # not parsed: a generous bound for a loaded box


def test_self_references(client: TestClient) -> None:
    node = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}],
    }
    assert client.post("/subjects/list/versions", json=body(node)).json() == {"id": 1}
    # a reference to the version being registered (it does not exist yet)
    me = body(USER, references=[{"name": "User", "subject": "me", "version": 1}])
    r = client.post("/subjects/me/versions", json=me)
    assert error(r) == (422, 42201)
    assert "reference 'User' to subject 'me' version 1" in r.json()["message"]
    # a reference to an existing subject's named type works
    client.post("/subjects/user/versions", json=body(USER))
    holder = {"type": "record", "name": "Holder", "fields": [{"name": "u", "type": "User"}]}
    ref = body(holder, references=[{"name": "User", "subject": "user", "version": 1}])
    assert client.post("/subjects/holder/versions", json=ref).json() == {"id": 3}
    got = client.get("/subjects/holder/versions/1").json()
    assert got["references"] == [{"name": "User", "subject": "user", "version": 1}]


def test_write_token() -> None:
    app = build_registry_app(SchemaRegistry(MemorySchemaLog()), write_token="s3cret")
    with TestClient(app) as c:
        assert error(c.post("/subjects/s/versions", json=body(USER))) == (401, 40101)
        assert error(
            c.put("/config", json={"compatibility": "NONE"}, headers={"Authorization": "Bearer no"})
        ) == (401, 40101)
        ok = c.post(
            "/subjects/s/versions", json=body(USER), headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.json() == {"id": 1}
        basic = c.post("/subjects/t/versions", json=body(USER), auth=("anyone", "s3cret"))
        assert basic.json() == {"id": 1}
        assert c.get("/subjects").json() == ["s", "t"]  # reads stay open


def test_concurrent_registrations_of_one_schema_get_one_id() -> None:
    reg = SchemaRegistry(MemorySchemaLog())

    async def run() -> list[dict[str, Any]]:
        same = [reg.register("s", body(USER)) for _ in range(20)]
        others = [
            reg.register(f"t{i}", body({"type": "enum", "name": "E", "symbols": [f"S{i}"]}))
            for i in range(5)
        ]
        return await asyncio.gather(*same, *others)

    results = asyncio.run(run())
    assert {r["id"] for r in results[:20]} == {1}
    assert sorted(r["id"] for r in results[20:]) == [2, 3, 4, 5, 6]
    assert reg.state.live("s")[-1].version == 1 and len(reg.state.live("s")) == 1


def test_deep_schemas_are_checked_or_refused_by_name(client: TestClient) -> None:
    def nested(levels: int, leaf: str) -> str:
        return '{"type": "array", "items": ' * levels + f'"{leaf}"' + "}" * levels

    assert client.post("/subjects/d/versions", json={"schema": nested(99, "int")}).json() == {
        "id": 1
    }
    # the whole depth is compared: int widens to long at the bottom
    assert client.post("/subjects/d/versions", json={"schema": nested(99, "long")}).json() == {
        "id": 2
    }
    refused = client.post("/subjects/d/versions", json={"schema": nested(5000, "long")})
    assert error(refused) == (422, 42201)
    assert "a schema may nest 200" in refused.json()["message"]
