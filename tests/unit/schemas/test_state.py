"""The replay rules of the ``_schemas`` records: every server applying the same log agrees,
also after compaction, and the loser of a race never overwrites the winner."""

from __future__ import annotations

import dataclasses
import json

from eventbus.schemas._state import Entry, RegistryState, config_key, schema_key


def record(entry: Entry) -> tuple[bytes, bytes]:
    return schema_key(entry), json.dumps(entry.to_value()).encode()


def replay(log: list[tuple[bytes, bytes | None]]) -> RegistryState:
    state = RegistryState()
    for key, value in log:
        state.apply(key, value)
    return state


def compacted(log: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
    """What compaction keeps: the last record of each key, in log order."""
    last = {key: i for i, (key, _) in enumerate(log)}
    return [r for i, r in enumerate(log) if last[r[0]] == i]


X = Entry("s", 1, 1, '"string"', "AVRO", ())
Y = Entry("s", 1, 1, '"int"', "AVRO", ())  # another server's pick for the same version and id
Z = Entry("t", 1, 1, '"long"', "AVRO", ())  # the same id for another schema


def test_the_first_record_of_a_version_or_an_id_wins() -> None:
    state = RegistryState()
    assert state.apply(*record(X))
    assert not state.apply(*record(Y))
    assert not state.apply(*record(Z))
    assert state.versions["s"][1].schema == '"string"'
    assert "t" not in state.versions
    assert state.rejected == [schema_key(Y), schema_key(Z)]
    assert schema_key(X) != schema_key(Y)  # the loser's tombstone cannot remove the winner


def test_tombstoning_a_rejected_record_keeps_the_winner_also_after_compaction() -> None:
    log: list[tuple[bytes, bytes | None]] = [record(X), record(Y), (schema_key(Y), None)]
    for state in (replay(log), replay(compacted(log))):
        assert state.versions["s"][1] == X
        assert state.by_id[1] == X


def test_soft_then_permanent_delete_survives_compaction() -> None:
    gone = dataclasses.replace(X, deleted=True)
    log: list[tuple[bytes, bytes | None]] = [
        record(X),
        record(gone),
        (config_key("s"), b'{"compatibilityLevel": "FULL"}'),
        (config_key(None), b'{"compatibilityLevel": "NONE"}'),
    ]
    for state in (replay(log), replay(compacted(log))):
        assert state.versions["s"][1].deleted
        assert state.subjects() == [] and state.subjects(deleted=True) == ["s"]
        assert (state.level("s"), state.level("other")) == ("FULL", "NONE")
    log += [(schema_key(X), None), (config_key("s"), None)]
    for state in (replay(log), replay(compacted(log))):
        assert state.versions == {} and state.by_id == {}
        assert state.level("s") == "NONE"


def test_records_of_no_registry_are_ignored() -> None:
    state = RegistryState()
    for key, value in [
        (b"not json", b"{}"),
        (None, b"{}"),
        (b'{"keytype": "NOOP"}', b"{}"),
        (b"[1]", b"{}"),
        (schema_key(X), b"not json"),
        (schema_key(X), b'{"subject": "s"}'),
        (config_key("s"), b'{"compatibilityLevel": "SIDEWAYS"}'),
    ]:
        state.apply(key, value)
    assert state.versions == {} and state.levels == {}
