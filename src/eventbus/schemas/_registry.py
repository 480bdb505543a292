"""The registry's operations over its state and its log (Confluent's REST semantics).

Reads answer from the state this server has replayed. Writes are serialized per server by a
lock and across servers by the log: a write appends its record, waits until this server has
replayed up to it, and finds out whether it won (see ``_state``); a loser decides again on
the state it now holds (the same schema registered elsewhere meanwhile: that id; else the
next one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Protocol

from eventbus.schemas._avro_compat import AvroSchema, avro_incompatibilities, parse_avro
from eventbus.schemas._errors import (
    SchemaRegistryError,
    invalid_schema,
    schema_not_found,
    subject_not_found,
    version_not_found,
)
from eventbus.schemas._json_compat import (
    JsonSchema,
    json_incompatibilities,
    parse_json_schema,
)
from eventbus.schemas._state import (
    LEVELS,
    Entry,
    RegistryState,
    canonical,
    config_key,
    schema_key,
)

__all__ = ["SchemaLog", "SchemaRegistry"]

_RACES = 20  # attempts of one write that lost to other servers before it gives up


class SchemaLog(Protocol):
    """Where the records go: ``append`` returns once ``state`` has applied the record."""

    state: RegistryState

    async def append(self, key: bytes, value: bytes | None) -> None: ...

    async def catch_up(self) -> None: ...


class SchemaRegistry:
    """Register, look up, check and configure schemas (the REST API's operations).

    Example:
        >>> import asyncio
        >>> from eventbus.schemas import MemorySchemaLog
        >>> reg = SchemaRegistry(MemorySchemaLog())
        >>> asyncio.run(reg.register("s", {"schema": '"string"'}))["id"]
        1
    """

    def __init__(self, log: SchemaLog) -> None:
        self.log = log
        self._lock = asyncio.Lock()

    @property
    def state(self) -> RegistryState:
        return self.log.state

    # reads

    def entry(self, subject: str, version: str | int, deleted: bool = False) -> Entry:
        vs = self.state.versions.get(subject)
        if not vs or not (deleted or any(not e.deleted for e in vs.values())):
            raise subject_not_found(subject)
        if version in ("latest", -1, "-1"):
            live = self.state.live(subject) if not deleted else [vs[v] for v in sorted(vs)]
            if not live:
                raise version_not_found(subject, version)
            return live[-1]
        number = _version_number(version)
        entry = vs.get(number)
        if entry is None or (entry.deleted and not deleted):
            raise version_not_found(subject, version)
        return entry

    def by_id(self, schema_id: int) -> Entry:
        entry = self.state.by_id.get(schema_id)
        if entry is None:
            raise schema_not_found(f"{schema_id}")
        return entry

    def versions_of_id(self, schema_id: int) -> list[dict[str, Any]]:
        self.by_id(schema_id)
        return [
            {"subject": e.subject, "version": e.version}
            for s in sorted(self.state.versions)
            for e in self.state.live(s)
            if e.id == schema_id
        ]

    def lookup(self, subject: str, body: Any, deleted: bool = False) -> Entry:
        schema_type, text, refs = _schema_of(body)
        canon = canonical(schema_type, text, refs)
        vs = self.state.versions.get(subject)
        if not vs:
            raise subject_not_found(subject)
        for v in sorted(vs):
            if vs[v].canon == canon and (deleted or not vs[v].deleted):
                return vs[v]
        raise schema_not_found(f"for subject '{subject}'")

    # compatibility

    def parse(
        self, schema_type: str, text: str, refs: tuple[tuple[str, str, int], ...]
    ) -> AvroSchema | JsonSchema:
        if schema_type == "JSON":
            if refs:
                msg = (
                    "references of JSON schemas are not supported by this registry yet; "
                    "inline the referenced definitions under $defs"
                )
                raise invalid_schema(msg)
            return parse_json_schema(text)
        if schema_type != "AVRO":
            msg = (
                f"schemaType {schema_type!r} is not supported by this registry yet; "
                "register AVRO or JSON schemas (PROTOBUF follows)"
            )
            raise invalid_schema(msg)
        named: dict[str, Any] = {}
        for name, subject, version in refs:
            try:
                ref = self.entry(subject, version)
            except SchemaRegistryError as e:
                msg = f"reference {name!r} to subject {subject!r} version {version}: {e}"
                raise invalid_schema(msg) from e
            parsed = self.parse(ref.schema_type, ref.schema, ref.references)
            if not isinstance(parsed, AvroSchema):
                msg = f"reference {name!r}: an AVRO schema may only reference AVRO schemas"
                raise invalid_schema(msg)
            named.update(parsed.named)
        return parse_avro(text, named)

    def incompatibilities(
        self,
        level: str,
        new: AvroSchema | JsonSchema,
        existing: list[Entry],
        every: bool = False,
    ) -> list[str]:
        """Why ``new`` breaks ``level`` against ``existing`` (oldest first); ``every``: check
        each of them whatever the level (a check against one chosen version)."""
        if level == "NONE" or not existing:
            return []
        against = existing if every or level.endswith("_TRANSITIVE") else existing[-1:]
        base = level.removesuffix("_TRANSITIVE")
        problems: list[str] = []
        for entry in reversed(against):
            old = self.parse(entry.schema_type, entry.schema, entry.references)
            where = f"version {entry.version}"
            if type(old) is not type(new):
                problems.append(f"{where}: the schema type changed ({entry.schema_type})")
                continue
            if base in ("BACKWARD", "FULL"):
                problems += [
                    f"{where} (new schema reading old data): {p}" for p in _reads(new, old)
                ]
            if base in ("FORWARD", "FULL"):
                problems += [
                    f"{where} (old schema reading new data): {p}" for p in _reads(old, new)
                ]
        return problems

    def check(self, subject: str, body: Any, version: str | None) -> list[str]:
        """``POST /compatibility/subjects/{s}/versions[/{v}]``: the problems (none: ok)."""
        schema_type, text, refs = _schema_of(body)
        new = self.parse(schema_type, text, refs)
        level = self.state.level(subject)
        if version is None:
            return self.incompatibilities(level, new, self.state.live(subject))
        return self.incompatibilities(level, new, [self.entry(subject, version)], every=True)

    # writes

    async def register(self, subject: str, body: Any) -> dict[str, Any]:
        """``POST /subjects/{s}/versions``: the id (the same schema again: its id)."""
        schema_type, text, refs = _schema_of(body)
        canon = canonical(schema_type, text, refs)
        async with self._lock:
            await self.log.catch_up()
            new = self.parse(schema_type, text, refs)
            for _ in range(_RACES):
                state = self.state
                live = state.live(subject)
                same = next((e for e in live if e.canon == canon), None)
                if same is not None:
                    return {"id": same.id}
                problems = self.incompatibilities(state.level(subject), new, live)
                if problems:
                    msg = (
                        f"Schema being registered is incompatible with an earlier schema for "
                        f"subject '{subject}' ({state.level(subject)}): " + "; ".join(problems)
                    )
                    raise SchemaRegistryError(409, 409, msg)
                schema_id = state.id_of.get(canon, state.max_id + 1)
                version = state.next_version(subject)
                entry = Entry(subject, version, schema_id, text, schema_type, refs)
                await self._tidy()
                await self.log.append(schema_key(entry), json.dumps(entry.to_value()).encode())
                won = self.state.versions.get(subject, {}).get(version)
                if won is not None and won.id == schema_id:
                    return {"id": schema_id}
            raise SchemaRegistryError(
                500, 50001, f"registering under '{subject}' kept losing races"
            )

    async def _tidy(self) -> None:
        """Tombstone rejected records (compaction then drops them)."""
        while self.state.rejected:
            await self.log.append(self.state.rejected.pop(), None)

    async def set_level(self, subject: str | None, body: Any) -> str:
        level = body.get("compatibility") if isinstance(body, dict) else None
        if not isinstance(level, str) or level.upper() not in LEVELS:
            msg = f"Invalid compatibility level {level!r}; valid levels are {', '.join(LEVELS)}."
            raise SchemaRegistryError(422, 42203, msg)
        async with self._lock:
            await self.log.append(
                config_key(subject), json.dumps({"compatibilityLevel": level.upper()}).encode()
            )
        return level.upper()

    async def clear_level(self, subject: str) -> str:
        async with self._lock:
            await self.log.catch_up()
            before = self.subject_level(subject)
            await self.log.append(config_key(subject), None)
        return before

    def subject_level(self, subject: str) -> str:
        level = self.state.levels.get(subject)
        if level is None:
            msg = f"Subject '{subject}' does not have subject-level compatibility configured"
            raise SchemaRegistryError(404, 40408, msg)
        return level

    async def delete_version(self, subject: str, version: str, permanent: bool) -> int:
        async with self._lock:
            await self.log.catch_up()
            entry = self.entry(subject, version, deleted=permanent)
            if permanent and not entry.deleted:
                msg = (
                    f"Subject '{subject}' Version {entry.version} was not deleted first before "
                    "being permanently deleted"
                )
                raise SchemaRegistryError(404, 40407, msg)
            await self._delete(entry, permanent)
            return entry.version

    async def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        async with self._lock:
            await self.log.catch_up()
            vs = self.state.versions.get(subject)
            if not vs or not (permanent or any(not e.deleted for e in vs.values())):
                raise subject_not_found(subject)
            entries = [vs[v] for v in sorted(vs)]
            if permanent and any(not e.deleted for e in entries):
                msg = f"Subject '{subject}' was not deleted first before being permanently deleted"
                raise SchemaRegistryError(404, 40405, msg)
            for entry in entries if permanent else [e for e in entries if not e.deleted]:
                await self._delete(entry, permanent)
            return [e.version for e in entries]

    async def _delete(self, entry: Entry, permanent: bool) -> None:
        key = schema_key(entry)
        if permanent:
            await self.log.append(key, None)
        else:
            gone = dataclasses.replace(entry, deleted=True)
            await self.log.append(key, json.dumps(gone.to_value()).encode())


def _reads(reader: AvroSchema | JsonSchema, writer: AvroSchema | JsonSchema) -> list[str]:
    if isinstance(reader, JsonSchema) and isinstance(writer, JsonSchema):
        return json_incompatibilities(reader, writer)
    assert isinstance(reader, AvroSchema) and isinstance(writer, AvroSchema)
    return avro_incompatibilities(reader, writer)


def _version_number(version: str | int) -> int:
    try:
        number = int(version)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or number > 2**31 - 1:
        msg = (
            f"The specified version '{version}' is not a valid version id. Allowed values are "
            'between [1, 2^31-1] and the string "latest"'
        )
        raise SchemaRegistryError(422, 42202, msg)
    return number


def _schema_of(body: Any) -> tuple[str, str, tuple[tuple[str, str, int], ...]]:
    """(schemaType, schema, references) of a request body, refused with 42201 when malformed."""
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise invalid_schema('the body must be a JSON object with a "schema" string')
    schema_type = body.get("schemaType") or "AVRO"
    if not isinstance(schema_type, str):
        raise invalid_schema(f"schemaType must be a string; got {schema_type!r}")
    refs = body.get("references") or []
    if not isinstance(refs, list):
        raise invalid_schema(f"references must be a list; got {refs!r}")
    out: list[tuple[str, str, int]] = []
    for ref in refs:
        if not (
            isinstance(ref, dict)
            and isinstance(ref.get("name"), str)
            and isinstance(ref.get("subject"), str)
            and isinstance(ref.get("version"), int)
        ):
            msg = f'each reference needs "name", "subject" (strings) and "version" (an integer); got {ref!r}'
            raise invalid_schema(msg)
        out.append((ref["name"], ref["subject"], ref["version"]))
    return schema_type.upper(), body["schema"], tuple(out)
