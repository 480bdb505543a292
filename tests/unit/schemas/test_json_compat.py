"""JSON Schema compatibility, case by case against the rules Confluent documents for JSON
Schema (schema evolution: open, closed content models; required; types; enums; limits), and
the registry storing and serving ``schemaType: JSON`` over its REST API."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from eventbus.schemas import MemorySchemaLog, SchemaRegistry, build_registry_app
from eventbus.schemas._errors import SchemaRegistryError
from eventbus.schemas._json_compat import json_incompatibilities, parse_json_schema


def obj(props: dict[str, Any], closed: bool = False, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, **kw}
    if closed:
        out["additionalProperties"] = False
    return out


INT, STR, NUM = {"type": "integer"}, {"type": "string"}, {"type": "number"}


def backward(old: Any, new: Any) -> list[str]:
    """The new schema reading the old data (Confluent's BACKWARD)."""
    return json_incompatibilities(
        parse_json_schema(json.dumps(new)), parse_json_schema(json.dumps(old))
    )


# (old, new, BACKWARD compatible?, FORWARD compatible?, the rule named when not backward)
CASES = [
    # a property added to an open content model: old data may hold it with another type
    (obj({"a": INT}), obj({"a": INT, "b": STR}), False, True, "open content model"),
    # ... to a closed one: old data never held it
    (obj({"a": INT}, closed=True), obj({"a": INT, "b": STR}, closed=True), True, False, ""),
    # a property removed from an open model is backward compatible; from a closed one it is not
    (obj({"a": INT, "b": STR}), obj({"a": INT}), True, False, ""),
    (obj({"a": INT, "b": STR}, True), obj({"a": INT}, True), False, True, "closed content model"),
    # required added (without a default) breaks; removed is fine; with a default it is fine
    (obj({"a": INT}, True), obj({"a": INT}, True, required=["a"]), False, True, "required"),
    (obj({"a": INT}, True, required=["a"]), obj({"a": INT}, True), True, False, ""),
    (
        obj({"a": INT}, True),
        obj({"a": {"type": "integer", "default": 0}}, True, required=["a"]),
        True,
        True,
        "",
    ),
    # types: widened (integer -> number, a type added) is backward compatible; narrowed is not
    (obj({"a": INT}), obj({"a": NUM}), True, False, ""),
    (obj({"a": NUM}), obj({"a": INT}), False, True, "type narrowed"),
    (obj({"a": STR}), obj({"a": {"type": ["string", "null"]}}), True, False, ""),
    # enums: extended is backward compatible, narrowed is not
    (obj({"c": {"enum": ["a", "b"]}}), obj({"c": {"enum": ["a", "b", "c"]}}), True, False, ""),
    (obj({"c": {"enum": ["a", "b"]}}), obj({"c": {"enum": ["a"]}}), False, True, "enum narrowed"),
    # limits: a maximum added or decreased narrows; a minLength raised narrows
    (obj({"a": INT}), obj({"a": {"type": "integer", "maximum": 10}}), False, True, "maximum"),
    (
        obj({"a": {"type": "string", "minLength": 1}}),
        obj({"a": {"type": "string", "minLength": 3}}),
        False,
        True,
        "minLength",
    ),
    # additionalProperties narrowed from open to closed breaks backward
    (obj({"a": INT}), obj({"a": INT}, closed=True), False, True, "open to closed"),
    # nested objects and arrays are followed
    (
        obj({"o": {"type": "array", "items": obj({"x": NUM})}}),
        obj({"o": {"type": "array", "items": obj({"x": INT})}}),
        False,
        True,
        "#/properties/o/items/properties/x",
    ),
    # a union extended is backward compatible
    (obj({"a": {"oneOf": [INT]}}), obj({"a": {"oneOf": [INT, STR]}}), True, False, ""),
]


@pytest.mark.parametrize(("old", "new", "back", "fwd", "named"), CASES)
def test_confluent_rules(old: Any, new: Any, back: bool, fwd: bool, named: str) -> None:
    problems = backward(old, new)
    assert (not problems) is back, problems
    assert (not backward(new, old)) is fwd
    if not back:
        assert named in "; ".join(problems), problems


def test_local_refs_and_recursive_schemas_are_followed() -> None:
    tree = {
        "$defs": {
            "node": obj({"v": INT, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}})
        },
        "$ref": "#/$defs/node",
    }
    wider = json.loads(json.dumps(tree).replace('"integer"', '"number"'))
    assert backward(tree, wider) == []
    assert backward(wider, tree)  # narrowed, found through the recursion


def test_unjudged_keywords_are_refused_when_they_differ() -> None:
    old = obj({"a": INT})
    new = {**old, "allOf": [{"required": ["a"]}]}
    assert "allOf changed" in "; ".join(backward(old, new))
    assert backward(new, new) == []


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("{", "not JSON"),
        ('{"type": 5}', "not a valid JSON Schema"),
        ("[1]", "an object or a boolean"),
        ('{"items":' * 300 + "{}" + "}" * 300, "nest"),
    ],
)
def test_bad_schemas_are_refused_with_the_reason(text: str, expect: str) -> None:
    with pytest.raises(SchemaRegistryError, match=expect):
        parse_json_schema(text)


def test_registry_stores_serves_and_checks_json_schemas() -> None:
    reg = SchemaRegistry(MemorySchemaLog())
    app = build_registry_app(reg)

    async def go() -> None:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://r"
        ) as c:
            v1 = {"schema": json.dumps(obj({"a": INT})), "schemaType": "JSON"}
            sid = (await c.post("/subjects/s-value/versions", json=v1)).json()["id"]
            got = (await c.get(f"/schemas/ids/{sid}")).json()
            assert got["schemaType"] == "JSON" and json.loads(got["schema"]) == obj({"a": INT})
            latest = (await c.get("/subjects/s-value/versions/latest")).json()
            assert latest["schemaType"] == "JSON"
            bad = {"schema": json.dumps(obj({"a": INT, "b": STR})), "schemaType": "JSON"}
            r = await c.post(
                "/compatibility/subjects/s-value/versions/latest?verbose=true", json=bad
            )
            assert r.json()["is_compatible"] is False
            assert "open content model" in " ".join(r.json()["messages"])
            r = await c.post("/subjects/s-value/versions", json=bad)
            assert r.status_code == 409, r.text
            # an Avro schema under a JSON subject is a changed type, never compared
            avro = {"schema": '"string"'}
            r = await c.post("/subjects/s-value/versions", json=avro)
            assert r.status_code == 409 and "schema type changed" in r.text
            await c.put("/config/s-value", json={"compatibility": "NONE"})
            assert (await c.post("/subjects/s-value/versions", json=bad)).status_code == 200
            # FORWARD_TRANSITIVE: version 1 (a: integer) cannot read a number
            await c.put("/config/s-value", json={"compatibility": "FORWARD_TRANSITIVE"})
            wider = {"schema": json.dumps(obj({"a": NUM, "b": STR})), "schemaType": "JSON"}
            r = await c.post("/subjects/s-value/versions", json=wider)
            assert r.status_code == 409 and "version 1 (old schema reading new data)" in r.text
            refs = {**v1, "references": [{"name": "x", "subject": "s-value", "version": 1}]}
            r = await c.post("/subjects/t-value/versions", json=refs)
            assert r.status_code == 422 and "references of JSON schemas" in r.text

    asyncio.run(go())
