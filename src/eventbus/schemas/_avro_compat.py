"""Avro schema resolution: can a reader schema read what a writer schema wrote?

The rules are the Avro specification's "Schema Resolution" (as Avro Java's
``SchemaCompatibility``, which Confluent's registry applies):

- the same primitive type; the promotions int -> long, float, double; long -> float, double;
  float -> double; string <-> bytes;
- records: the reader's name is the writer's (unqualified) or one of the reader's aliases is
  the writer's full name; each reader field is read from the writer field of its name (or one
  of its aliases), and a reader field the writer lacks needs a default; writer fields the
  reader lacks are skipped;
- enums: every writer symbol is a reader symbol, unless the reader has a ``default``;
- fixed: same name and size; arrays and maps: their items and values resolve;
- a writer union: every branch must be readable; a reader union: some branch reads the writer.

Schemas are parsed by fastavro first (:func:`parse_avro`), which validates them and qualifies
every name; a named type used before (a recursive record) is a name string, resolved here
through the named types fastavro collected. Recursion ends on a pair already being checked.
"""

from __future__ import annotations

from typing import Any

from eventbus.schemas._errors import invalid_schema

__all__ = ["MAX_NESTING", "AvroSchema", "avro_incompatibilities", "parse_avro"]

#: The deepest JSON nesting a schema may have (a record inside a record is four levels: the
#: fields list, a field, its type): checks recurse once per level.
MAX_NESTING = 200

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}


class AvroSchema:
    """A parsed Avro schema and the named types it defines (full name -> definition).

    Example:
        >>> s = parse_avro('{"type": "record", "name": "R", "fields": []}')
        >>> sorted(s.named)
        ['R']
    """

    __slots__ = ("named", "parsed")

    def __init__(self, parsed: Any, named: dict[str, Any]) -> None:
        self.parsed = parsed
        self.named = named


def parse_avro(text: str, references: dict[str, Any] | None = None) -> AvroSchema:
    """Parse and validate an Avro schema (JSON text) with fastavro.

    Args:
        text: the schema as registered.
        references: named types defined by referenced schemas (full name -> definition).

    Raises:
        SchemaRegistryError: 42201, naming what fastavro refused.
    """
    import json

    import fastavro

    try:
        doc = json.loads(text)
    except RecursionError as e:
        raise invalid_schema(f"nested too deeply to parse; a schema may nest {MAX_NESTING}") from e
    except ValueError as e:
        raise invalid_schema(f"not JSON: {e}") from e
    depth = _depth(doc)
    if depth > MAX_NESTING:
        raise invalid_schema(f"nested {depth} levels deep; a schema may nest {MAX_NESTING}")
    named: dict[str, Any] = dict(references or {})
    try:
        parsed = fastavro.parse_schema(doc, named_schemas=named)
    except RecursionError as e:
        raise invalid_schema("nested too deeply") from e
    except Exception as e:  # fastavro raises several unrelated types
        raise invalid_schema(f"{type(e).__name__}: {e}") from e
    return AvroSchema(parsed, named)


def avro_incompatibilities(reader: AvroSchema, writer: AvroSchema) -> list[str]:
    """Why ``reader`` cannot read data written with ``writer`` (empty: it can).

    Example:
        >>> old = parse_avro('{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}')
        >>> new = parse_avro('{"type":"record","name":"R","fields":[{"name":"a","type":"long"}]}')
        >>> avro_incompatibilities(new, old)
        []
        >>> avro_incompatibilities(old, new)
        ["/fields/a: reader type 'int' cannot read writer type 'long'"]
    """
    return _Resolver(reader.named, writer.named).check(reader.parsed, writer.parsed, "")


class _Resolver:
    def __init__(self, r_named: dict[str, Any], w_named: dict[str, Any]) -> None:
        self.r_named = r_named
        self.w_named = w_named
        self.checking: set[tuple[int, int]] = set()

    @staticmethod
    def _resolve(schema: Any, named: dict[str, Any]) -> Any:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            return named.get(schema, schema)
        return schema

    @staticmethod
    def _kind(schema: Any) -> str:
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, dict):
            kind = schema.get("type")
            return kind if isinstance(kind, str) else "union"
        return str(schema)

    def check(self, reader: Any, writer: Any, path: str) -> list[str]:
        reader = self._resolve(reader, self.r_named)
        writer = self._resolve(writer, self.w_named)
        pair = (id(reader), id(writer))
        if pair in self.checking:
            return []  # a recursive type: assumed compatible while it is being checked
        self.checking.add(pair)
        try:
            return self._check(reader, writer, path)
        finally:
            self.checking.discard(pair)

    def _check(self, reader: Any, writer: Any, path: str) -> list[str]:
        r_kind, w_kind = self._kind(reader), self._kind(writer)
        if w_kind == "union":
            branches = writer if isinstance(writer, list) else writer["type"]
            problems: list[str] = []
            for i, branch in enumerate(branches):
                problems += self.check(reader, branch, f"{path}/{i}")
            return problems
        if r_kind == "union":
            branches = reader if isinstance(reader, list) else reader["type"]
            for branch in branches:
                if not self.check(branch, writer, path):
                    return []
            return [f"{path or '/'}: reader union lacks writer type {_shown(writer, w_kind)!r}"]
        if r_kind == w_kind:
            return self._same_kind(r_kind, reader, writer, path)
        if w_kind in _PROMOTIONS and r_kind in _PROMOTIONS[w_kind]:
            return []
        return [f"{path or '/'}: reader type {r_kind!r} cannot read writer type {w_kind!r}"]

    def _same_kind(self, kind: str, reader: Any, writer: Any, path: str) -> list[str]:
        if kind in _PRIMITIVES:
            return []
        if kind in ("record", "error", "enum", "fixed") and not _names_match(reader, writer):
            return [
                f"{path or '/'}: reader {kind} name {reader.get('name')!r} does not match writer "
                f"name {writer.get('name')!r} (or add it to the reader's aliases)"
            ]
        if kind == "array":
            return self.check(reader["items"], writer["items"], f"{path}/items")
        if kind == "map":
            return self.check(reader["values"], writer["values"], f"{path}/values")
        if kind == "fixed":
            if reader.get("size") != writer.get("size"):
                return [
                    f"{path or '/'}: reader fixed size {reader.get('size')} differs from writer "
                    f"size {writer.get('size')}"
                ]
            return []
        if kind == "enum":
            missing = [s for s in writer.get("symbols", ()) if s not in reader.get("symbols", ())]
            if missing and "default" not in reader:
                return [
                    f"{path or '/'}: reader enum lacks writer symbols {missing} and has no default"
                ]
            return []
        if kind in ("record", "error"):
            return self._record(reader, writer, path)
        return [f"{path or '/'}: unknown Avro type {kind!r}"]

    def _record(self, reader: Any, writer: Any, path: str) -> list[str]:
        by_name = {f["name"]: f for f in writer.get("fields", ())}
        problems: list[str] = []
        for field in reader.get("fields", ()):
            name = field["name"]
            source = by_name.get(name)
            if source is None:
                source = next((by_name[a] for a in field.get("aliases", ()) if a in by_name), None)
            if source is None:
                if "default" not in field:
                    problems.append(
                        f"{path}/fields/{name}: reader field {name!r} is missing from the writer "
                        "and has no default"
                    )
                continue
            problems += self.check(field["type"], source["type"], f"{path}/fields/{name}")
        return problems


def _depth(doc: Any) -> int:
    """The JSON nesting of ``doc``, found without recursion."""
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
        if depth > MAX_NESTING:
            break
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def _unqualified(name: str) -> str:
    return name.rpartition(".")[2]


def _names_match(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    r_name, w_name = str(reader.get("name", "")), str(writer.get("name", ""))
    if _unqualified(r_name) == _unqualified(w_name):
        return True
    aliases = reader.get("aliases", ())
    return w_name in aliases or _unqualified(w_name) in aliases


def _shown(schema: Any, kind: str) -> str:
    if isinstance(schema, dict) and "name" in schema:
        return f"{kind} {schema['name']}"
    return kind
