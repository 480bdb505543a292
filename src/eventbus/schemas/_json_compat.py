"""JSON Schema compatibility: does every document the writer schema accepts pass the reader?

The rules follow Confluent's JSON Schema compatibility (its documentation's "JSON Schema"
section of schema evolution, and the differences its checker names), for the common cases:

- content models: a property added to an *open* writer (``additionalProperties`` not false)
  breaks a reader, since old data may hold that name with any value, unless the new property
  accepts anything; added to a *closed* writer it is fine. A property removed from a *closed*
  reader breaks it; removed from an open reader it is fine (read through its
  ``additionalProperties`` schema when it has one). ``additionalProperties`` narrowed (true to
  false, or to a schema) breaks a reader;
- ``required``: a property the reader requires and the writer does not is a break, unless the
  reader gives it a ``default``; a requirement removed is fine;
- types: the reader's types must cover the writer's (``integer`` is within ``number``): a
  type narrowed breaks, widened is fine; ``enum``/``const``: the writer's values must be the
  reader's (an enum extended is fine, narrowed or added breaks);
- limits: ``maximum``/``maxLength``/``maxItems``/``maxProperties`` (and ``exclusiveMaximum``)
  added or decreased, their ``min`` forms added or increased, ``pattern`` or ``format``
  added or changed, ``uniqueItems`` added: breaks;
- ``items``, ``properties``, ``additionalProperties`` and ``$ref`` (local ``#/...`` pointers)
  are followed; ``oneOf``/``anyOf``: each writer branch must be read by some reader branch.

Not judged (reported as a break when they differ, so NONE or a rewrite gets past them):
``allOf``, ``not``, ``if``/``then``/``else``, ``patternProperties``, ``dependencies``,
``dependentRequired``/``dependentSchemas``, tuple ``items``/``prefixItems``, remote ``$ref``.
"""

from __future__ import annotations

import json
from typing import Any

from eventbus.schemas._avro_compat import MAX_NESTING, _depth
from eventbus.schemas._errors import invalid_schema

__all__ = ["JsonSchema", "json_incompatibilities", "parse_json_schema"]

_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")
_UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_EXACT = ("pattern", "format", "multipleOf")
_UNJUDGED = (
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "patternProperties",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "prefixItems",
)


class JsonSchema:
    """A parsed, checked JSON Schema document (``doc``: the root, for ``$ref``)."""

    __slots__ = ("doc",)

    def __init__(self, doc: Any) -> None:
        self.doc = doc


def parse_json_schema(text: str) -> JsonSchema:
    """Parse ``text`` and check it against its draft's metaschema (jsonschema).

    Raises:
        SchemaRegistryError: 42201 naming the problem.
    """
    import jsonschema
    from jsonschema.validators import validator_for

    try:
        doc = json.loads(text)
    except RecursionError as e:
        raise invalid_schema(f"nested too deeply to parse; a schema may nest {MAX_NESTING}") from e
    except ValueError as e:
        raise invalid_schema(f"not JSON: {e}") from e
    depth = _depth(doc)
    if depth > MAX_NESTING:
        raise invalid_schema(f"nested {depth} levels deep; a schema may nest {MAX_NESTING}")
    if not isinstance(doc, (dict, bool)):
        raise invalid_schema(f"a JSON Schema is an object or a boolean; got {type(doc).__name__}")
    try:
        validator_for(doc).check_schema(doc)  # type: ignore[arg-type]
    except jsonschema.SchemaError as e:
        where = "/".join(map(str, e.absolute_path)) or "(root)"
        raise invalid_schema(f"not a valid JSON Schema at {where}: {e.message[:300]}") from e
    except RecursionError as e:
        raise invalid_schema("nested too deeply") from e
    return JsonSchema(doc)


def json_incompatibilities(reader: JsonSchema, writer: JsonSchema) -> list[str]:
    """Why documents valid under ``writer`` may fail ``reader`` (empty: they all pass).

    Example:
        >>> old = parse_json_schema('{"type": "object", "properties": {"a": {"type": "integer"}}}')
        >>> new = parse_json_schema('{"type": "object", "properties": {"a": {"type": "number"}}}')
        >>> json_incompatibilities(new, old)
        []
        >>> json_incompatibilities(old, new)
        ["#/properties/a: type narrowed from ['number'] to ['integer']"]
    """
    return _Check(reader.doc, writer.doc).run(reader.doc, writer.doc, "#")


class _Check:
    def __init__(self, reader_root: Any, writer_root: Any) -> None:
        self.roots = (reader_root, writer_root)
        self.seen: set[tuple[int, int]] = set()  # pairs being checked (not done)

    def _deref(self, schema: Any, side: int) -> Any:
        hops = 0
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and hops < 50:
            ref = schema["$ref"]
            if not ref.startswith("#"):
                return {"$remote": ref}
            node: Any = self.roots[side]
            for part in ref[1:].split("/")[1:] if ref != "#" else []:
                part = part.replace("~1", "/").replace("~0", "~")
                node = node.get(part) if isinstance(node, dict) else None
            schema, hops = node, hops + 1
        return schema

    def run(self, reader: Any, writer: Any, at: str) -> list[str]:
        reader, writer = self._deref(reader, 0), self._deref(writer, 1)
        if reader is True or reader == {} or writer is False:
            return []
        if reader is False or reader is None:
            return [f"{at}: the reader accepts nothing"]
        if writer is True or writer == {}:
            return [f"{at}: the writer accepts anything; the reader is narrower"]
        if writer is None or "$remote" in writer or "$remote" in reader:
            return [f"{at}: a remote or broken $ref cannot be judged"]
        pair = (id(reader), id(writer))
        if pair in self.seen:  # a recursive $ref already being checked
            return []
        self.seen.add(pair)
        try:
            return self._judge(reader, writer, at)
        finally:
            self.seen.discard(pair)

    def _judge(self, reader: dict[str, Any], writer: dict[str, Any], at: str) -> list[str]:
        for key in ("oneOf", "anyOf"):
            if key in writer:
                return [p for b in writer[key] for p in self.run(reader, b, f"{at}/{key}")]
        for key in ("oneOf", "anyOf"):
            if key in reader:
                rest = {k: v for k, v in reader.items() if k != key}
                if any(not self.run(b, writer, at) for b in reader[key]) and not (
                    rest and self.run(rest, writer, at)
                ):
                    return []
                return [f"{at}: no branch of the reader's {key} reads the writer's schema"]
        problems: list[str] = []
        for key in _UNJUDGED:
            if reader.get(key) != writer.get(key):
                problems.append(f"{at}: {key} changed; this registry does not judge {key}")
        problems += _types(reader, writer, at)
        problems += _values(reader, writer, at)
        problems += _limits(reader, writer, at)
        problems += self._object(reader, writer, at)
        if "items" in reader and not isinstance(reader["items"], list):
            items = writer.get("items", True)
            if isinstance(items, list):
                problems.append(f"{at}/items: tuple items are not judged")
            else:
                problems += self.run(reader["items"], items, f"{at}/items")
        return problems

    def _object(self, reader: dict[str, Any], writer: dict[str, Any], at: str) -> list[str]:
        r_props, w_props = reader.get("properties", {}), writer.get("properties", {})
        r_extra, w_extra = (
            reader.get("additionalProperties", True),
            writer.get("additionalProperties", True),
        )
        problems: list[str] = []
        for name, schema in r_props.items():
            where = f"{at}/properties/{name}"
            if name in w_props:
                problems += self.run(schema, w_props[name], where)
            elif w_extra is not False and self.run(schema, w_extra, where):
                # old data may hold `name` as anything the writer's open model let through
                problems.append(f"{where}: property added to an open content model")
        for name, schema in w_props.items():
            if name in r_props:
                continue
            where = f"{at}/properties/{name}"
            if r_extra is False:
                problems.append(f"{where}: property removed from a closed content model")
            elif r_extra is not True and self.run(r_extra, schema, where):
                problems.append(f"{where}: property removed, not read by additionalProperties")
        if r_extra is not True and w_extra is not False:
            if r_extra is False:
                problems.append(f"{at}: additionalProperties narrowed from open to closed")
            elif self.run(r_extra, w_extra, f"{at}/additionalProperties"):
                problems.append(f"{at}: additionalProperties narrowed")
        w_required = set(writer.get("required", []))
        for name in reader.get("required", []):
            has_default = isinstance(r_props.get(name), dict) and "default" in r_props[name]
            if name not in w_required and not has_default:
                problems.append(f"{at}: required property {name!r} added")
        return problems


def _type_set(schema: dict[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    kinds = {kind} if isinstance(kind, str) else set(kind)
    return kinds


def _types(reader: dict[str, Any], writer: dict[str, Any], at: str) -> list[str]:
    r, w = _type_set(reader), _type_set(writer)
    if r is None:
        return []
    w_all = set(_TYPES) if w is None else w
    missing = {t for t in w_all if t not in r and not (t == "integer" and "number" in r)}
    if missing:
        return [f"{at}: type narrowed from {sorted(w_all)} to {sorted(r)}"]
    return []


def _values(reader: dict[str, Any], writer: dict[str, Any], at: str) -> list[str]:
    problems: list[str] = []
    if "enum" in reader:
        w_values = writer.get("enum", [writer["const"]] if "const" in writer else None)
        if w_values is None:
            problems.append(f"{at}: enum added")
        else:
            gone = [v for v in w_values if v not in reader["enum"]]
            if gone:
                problems.append(f"{at}: enum narrowed (drops {json.dumps(gone)[:200]})")
    if (
        "const" in reader
        and writer.get("const", object()) != reader["const"]
        and writer.get("enum") != [reader["const"]]
    ):
        problems.append(f"{at}: const added or changed")
    return problems


def _limits(reader: dict[str, Any], writer: dict[str, Any], at: str) -> list[str]:
    problems: list[str] = []
    for key in _UPPER:
        if isinstance(reader.get(key), (int, float)) and not isinstance(reader[key], bool):
            old = writer.get(key)
            if old is None or old > reader[key]:
                problems.append(f"{at}: {key} added or decreased to {reader[key]}")
    for key in _LOWER:
        if isinstance(reader.get(key), (int, float)) and not isinstance(reader[key], bool):
            old = writer.get(key)
            if old is None or old < reader[key]:
                problems.append(f"{at}: {key} added or increased to {reader[key]}")
    for key in _EXACT:
        if key in reader and reader[key] != writer.get(key):
            problems.append(f"{at}: {key} added or changed")
    if reader.get("uniqueItems") and not writer.get("uniqueItems"):
        problems.append(f"{at}: uniqueItems added")
    return problems
