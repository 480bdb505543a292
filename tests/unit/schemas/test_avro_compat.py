"""Avro compatibility, case by case: Avro's schema-resolution rules and the decisions
Confluent's documentation gives per level ("Schema Evolution and Compatibility": BACKWARD
allows deleting fields and adding optional ones; FORWARD adding fields and deleting optional
ones; FULL adding and deleting optional ones; the _TRANSITIVE forms check every earlier
version, the others the latest only; NONE anything)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from eventbus.schemas import MemorySchemaLog, SchemaRegistry, avro_incompatibilities, parse_avro


def record(*fields: dict[str, Any], name: str = "R", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def f(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def reads(reader: Any, writer: Any) -> bool:
    """Can ``reader`` read what ``writer`` wrote?"""
    problems = avro_incompatibilities(
        parse_avro(json.dumps(reader)), parse_avro(json.dumps(writer))
    )
    return not problems


def verdict(level: str, new: Any, *history: Any) -> bool:
    """Would ``new`` be registered after ``history`` (oldest first) at ``level``?"""
    reg = SchemaRegistry(MemorySchemaLog())

    async def run() -> bool:
        await reg.set_level(None, {"compatibility": "NONE"})
        for old in history:
            await reg.register("s", {"schema": json.dumps(old)})
        await reg.set_level("s", {"compatibility": level})
        return not reg.check("s", {"schema": json.dumps(new)}, None)

    return asyncio.run(run())


# --- Avro's resolution rules (reader, writer) ---


@pytest.mark.parametrize(
    ("writer", "reader", "ok"),
    [
        ("int", "long", True),
        ("int", "float", True),
        ("int", "double", True),
        ("long", "float", True),
        ("long", "double", True),
        ("float", "double", True),
        ("long", "int", False),
        ("double", "float", False),
        ("float", "long", False),
        ("string", "bytes", True),
        ("bytes", "string", True),
        ("string", "int", False),
        ("boolean", "int", False),
        ("null", "null", True),
    ],
)
def test_primitive_promotions(writer: str, reader: str, ok: bool) -> None:
    assert reads(reader, writer) is ok


def test_field_added_with_default_is_read_from_old_data() -> None:
    old = record(f("a", "int"))
    assert reads(record(f("a", "int"), f("b", "string", default="x")), old)
    assert not reads(record(f("a", "int"), f("b", "string")), old)


def test_field_removed_is_skipped_by_the_reader() -> None:
    assert reads(record(f("a", "int")), record(f("a", "int"), f("b", "string")))


def test_enum_symbols() -> None:
    abc = {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}
    ab = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
    assert reads(abc, ab)
    problems = avro_incompatibilities(parse_avro(json.dumps(ab)), parse_avro(json.dumps(abc)))
    assert problems == ["/: reader enum lacks writer symbols ['C'] and has no default"]
    assert reads({**ab, "default": "A"}, abc)  # Avro 1.9: unknown symbols read as the default


def test_unions() -> None:
    assert reads(["null", "string"], "string")  # a reader union with the writer's type
    assert not reads("string", ["null", "string"])  # the writer's null cannot be read
    assert reads(["null", "string", "int"], ["null", "string"])
    assert not reads(["null", "string"], ["null", "string", "int"])
    assert reads(["null", "long"], ["null", "int"])  # promotion inside a union
    assert reads("long", ["int", "long"])


def test_nested_records_report_the_path() -> None:
    inner_old = record(f("x", "int"), name="Inner")
    inner_new = record(f("x", "int"), f("y", "int"), name="Inner")
    problems = avro_incompatibilities(
        parse_avro(json.dumps(record(f("in", inner_new)))),
        parse_avro(json.dumps(record(f("in", inner_old)))),
    )
    assert problems == [
        "/fields/in/fields/y: reader field 'y' is missing from the writer and has no default"
    ]


def test_names_and_aliases() -> None:
    old = record(f("a", "int"), name="Old", namespace="shop")
    assert not reads(record(f("a", "int"), name="New", namespace="shop"), old)
    assert reads(record(f("a", "int"), name="New", namespace="shop", aliases=["shop.Old"]), old)
    assert reads(record(f("a", "int"), name="Old", namespace="other"), old)  # unqualified
    renamed = record(f("b", "int", aliases=["a"]), name="Old", namespace="shop")
    assert reads(renamed, old)  # a field renamed, its old name an alias
    assert not reads(record(f("b", "int"), name="Old", namespace="shop"), old)


def test_fixed_arrays_maps() -> None:
    fixed4 = {"type": "fixed", "name": "F", "size": 4}
    assert reads(fixed4, fixed4)
    assert not reads({**fixed4, "size": 8}, fixed4)
    assert reads({"type": "array", "items": "long"}, {"type": "array", "items": "int"})
    assert not reads({"type": "array", "items": "int"}, {"type": "array", "items": "long"})
    assert reads({"type": "map", "values": "double"}, {"type": "map", "values": "float"})
    assert not reads({"type": "map", "values": "int"}, {"type": "array", "items": "int"})


def test_a_recursive_record_terminates() -> None:
    node = record(f("v", "int"), f("next", ["null", "Node"]), name="Node")
    node2 = record(
        f("v", "long"), f("next", ["null", "Node"]), f("tag", "string", default=""), name="Node"
    )
    assert reads(node2, node)
    assert not reads(node, node2)  # long cannot be read as int, also deep in the list


# --- the levels, as Confluent's documentation decides them ---

A = record(f("a", "int"))
A_B_OPTIONAL = record(f("a", "int"), f("b", "string", default=""))
A_B_REQUIRED = record(f("a", "int"), f("b", "string"))


@pytest.mark.parametrize(
    ("change", "new", "old", "backward", "forward", "full"),
    [
        ("add optional field", A_B_OPTIONAL, A, True, True, True),
        ("add required field", A_B_REQUIRED, A, False, True, False),
        ("delete optional field", A, A_B_OPTIONAL, True, True, True),
        ("delete required field", A, A_B_REQUIRED, True, False, False),
        ("widen int to long", record(f("a", "long")), A, True, False, False),
        ("string to bytes", record(f("a", "bytes")), record(f("a", "string")), True, True, True),
        ("change type", record(f("a", "string")), A, False, False, False),
    ],
)
def test_levels(change: str, new: Any, old: Any, backward: bool, forward: bool, full: bool) -> None:
    assert verdict("BACKWARD", new, old) is backward, change
    assert verdict("FORWARD", new, old) is forward, change
    assert verdict("FULL", new, old) is full, change
    assert verdict("NONE", new, old) is True, change


def test_transitive_levels_check_every_earlier_version() -> None:
    # BACKWARD: v3 reads v2's data (b is there) but not v1's (b has no default there)
    assert verdict("BACKWARD", A_B_REQUIRED, A, A_B_OPTIONAL)
    assert not verdict("BACKWARD_TRANSITIVE", A_B_REQUIRED, A, A_B_OPTIONAL)
    # FORWARD: v2's reader has a default for b, v1's has none
    assert verdict("FORWARD", A, A_B_REQUIRED, A_B_OPTIONAL)
    assert not verdict("FORWARD_TRANSITIVE", A, A_B_REQUIRED, A_B_OPTIONAL)
    # FULL: v3 is fully compatible with v2 but v1 cannot read it
    assert verdict("FULL", A, A_B_REQUIRED, A_B_OPTIONAL)
    assert not verdict("FULL_TRANSITIVE", A, A_B_REQUIRED, A_B_OPTIONAL)
    assert verdict("FULL_TRANSITIVE", A_B_OPTIONAL, A, A_B_OPTIONAL)


def test_invalid_schemas_are_refused_with_42201() -> None:
    from eventbus.schemas import SchemaRegistryError

    for bad in (
        '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "Nope"}]}',
        '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", "default": "x"}]}',
        "{not json",
        '"nope"',
    ):
        with pytest.raises(SchemaRegistryError) as info:
            parse_avro(bad)
        assert info.value.code == 42201, bad
