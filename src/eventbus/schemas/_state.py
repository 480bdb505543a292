"""The registry's state, rebuilt from the ``_schemas`` records in log order.

Every server replays the same compacted topic and applies the same rules, so all agree:

- a ``SCHEMA`` record binds ``(subject, version)`` to a schema id; the first record for a
  version or for an id wins, a later one that binds either differently is *rejected* (two
  servers that raced for the next id: the loser sees its record rejected and tries again,
  and tombstones it so that compaction drops it);
- a ``SCHEMA`` tombstone (a null value) removes that version for good (a permanent delete);
- a ``CONFIG`` record sets (or, null, clears) the compatibility level of a subject, or the
  global one (subject null).

Keys are JSON (sorted), values JSON, as Confluent's own ``_schemas`` topic; the key of a
schema record carries its id too, so that a rejected record never shares a key with the
record that won (compaction keeps the last record of a key).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_LEVEL",
    "LEVELS",
    "Entry",
    "RegistryState",
    "canonical",
    "config_key",
    "schema_key",
]

LEVELS = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)
DEFAULT_LEVEL = "BACKWARD"


@dataclass(frozen=True)
class Entry:
    """One version of a subject."""

    subject: str
    version: int
    id: int
    schema: str
    schema_type: str
    references: tuple[tuple[str, str, int], ...]  # (name, subject, version)
    deleted: bool = False

    @functools.cached_property
    def canon(self) -> str:
        return canonical(self.schema_type, self.schema, self.references)

    def to_value(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "subject": self.subject,
            "version": self.version,
            "id": self.id,
            "schema": self.schema,
            "deleted": self.deleted,
            "references": [{"name": n, "subject": s, "version": v} for n, s, v in self.references],
        }
        if self.schema_type != "AVRO":
            value["schemaType"] = self.schema_type
        return value


def canonical(schema_type: str, schema: str, references: tuple[tuple[str, str, int], ...]) -> str:
    """The text two registrations must share to be the same schema: the JSON re-serialized
    with sorted keys and no spaces (formatting alone does not make a new version)."""
    try:
        text = json.dumps(json.loads(schema), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):
        text = schema
    return json.dumps([schema_type, text, [list(r) for r in references]])


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def schema_key(entry: Entry) -> bytes:
    """A version's key; the schema's digest in it keeps two servers' records for one version
    on different keys (compaction must not let the loser's overwrite the winner's)."""
    return _dumps(
        {
            "keytype": "SCHEMA",
            "subject": entry.subject,
            "version": entry.version,
            "id": entry.id,
            "digest": _digest(entry.canon),
            "magic": 1,
        }
    )


def _digest(canon: str) -> str:
    return hashlib.sha256(canon.encode()).hexdigest()[:32]


def config_key(subject: str | None) -> bytes:
    return _dumps({"keytype": "CONFIG", "subject": subject, "magic": 0})


def _entry(value: dict[str, Any]) -> Entry:
    return Entry(
        subject=str(value["subject"]),
        version=int(value["version"]),
        id=int(value["id"]),
        schema=str(value["schema"]),
        schema_type=str(value.get("schemaType") or "AVRO"),
        references=tuple(
            (str(r["name"]), str(r["subject"]), int(r["version"]))
            for r in value.get("references") or ()
        ),
        deleted=bool(value.get("deleted", False)),
    )


class RegistryState:
    """Subjects, versions, ids and levels, as the records applied so far say.

    Example:
        >>> state = RegistryState()
        >>> e = Entry("s", 1, 1, '"int"', "AVRO", ())
        >>> state.apply(schema_key(e), json.dumps(e.to_value()).encode())
        True
        >>> state.subjects()
        ['s']
    """

    def __init__(self) -> None:
        self.versions: dict[str, dict[int, Entry]] = {}
        self.by_id: dict[int, Entry] = {}  # the first entry that bound the id
        self.id_of: dict[str, int] = {}  # canon -> id
        self.levels: dict[str | None, str] = {}
        self.max_id = 0
        self.rejected: list[bytes] = []  # keys of rejected records, to tombstone

    def apply(self, key: bytes | None, value: bytes | None) -> bool:
        """Apply one record; False: it was rejected (or is not the registry's)."""
        try:
            k = json.loads(key or b"null")
            kind = k.get("keytype") if isinstance(k, dict) else None
            if kind == "CONFIG":
                return self._apply_config(k, value)
            if kind == "SCHEMA":
                return self._apply_schema(key or b"", k, value)
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        return False  # not a record this registry writes: ignored, as Confluent's does

    def _apply_config(self, key: dict[str, Any], value: bytes | None) -> bool:
        subject = key.get("subject")
        level = json.loads(value)["compatibilityLevel"] if value else None
        if level is None:
            self.levels.pop(subject, None)
        elif level in LEVELS:
            self.levels[subject] = level
        return True

    def _apply_schema(self, raw: bytes, key: dict[str, Any], value: bytes | None) -> bool:
        subject, version, schema_id = str(key["subject"]), int(key["version"]), int(key["id"])
        held = self.versions.get(subject, {}).get(version)
        if value is None:  # a permanent delete, or the cleanup of a rejected record
            if (
                held is not None
                and held.id == schema_id
                and _digest(held.canon) == key.get("digest")
            ):
                del self.versions[subject][version]
                if not self.versions[subject]:
                    del self.versions[subject]
                self._forget_id(held)
            return True
        entry = _entry(json.loads(value))
        bound = self.by_id.get(schema_id)
        if (bound is not None and bound.canon != entry.canon) or (
            held is not None and held.id != schema_id
        ):
            self.rejected.append(raw)
            return False
        self.versions.setdefault(subject, {})[version] = entry
        if bound is None:
            self.by_id[schema_id] = entry
            self.id_of[entry.canon] = schema_id
        self.max_id = max(self.max_id, schema_id)
        return True

    def _forget_id(self, gone: Entry) -> None:
        """After a permanent delete: the id stays bound while another version uses it."""
        others = [e for vs in self.versions.values() for e in vs.values() if e.id == gone.id]
        if others:
            self.by_id[gone.id] = others[0]
        else:
            self.by_id.pop(gone.id, None)
            self.id_of.pop(gone.canon, None)

    # queries

    def subjects(self, deleted: bool = False) -> list[str]:
        return sorted(s for s, vs in self.versions.items() if deleted or _live(vs))

    def live(self, subject: str) -> list[Entry]:
        """The subject's versions that are not soft-deleted, oldest first."""
        vs = self.versions.get(subject, {})
        return [vs[v] for v in sorted(vs) if not vs[v].deleted]

    def level(self, subject: str | None) -> str:
        if subject is not None and subject in self.levels:
            return self.levels[subject]
        return self.levels.get(None, DEFAULT_LEVEL)

    def next_version(self, subject: str) -> int:
        held = self.versions.get(subject)
        return (max(held) if held else 0) + 1


def _live(versions: dict[int, Entry]) -> bool:
    return any(not e.deleted for e in versions.values())
