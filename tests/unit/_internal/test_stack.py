"""The local stack's secret files: created readable by us only, never briefly by others."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from eventbus._internal import stack


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0o022)  # the usual umask: a plain write gives 0644
    yield
    os.umask(old)


def test_admin_token_is_never_readable_by_others(tmp_path, monkeypatch, open_umask) -> None:
    # Between a plain write and a chmod the token is world-readable: with chmod a no-op (the
    # state in that window) the file must still be 0600.
    monkeypatch.setattr(Path, "chmod", lambda self, m: None)
    seen: list[int] = []
    real_link = os.link

    def link(src, dst, *a, **k):
        seen.append(stat.S_IMODE(os.stat(src).st_mode))  # before it gets its name
        return real_link(src, dst, *a, **k)

    monkeypatch.setattr(os, "link", link)
    path = Path(stack._make_admin_token(tmp_path))
    assert mode(path) == 0o600 and seen == [0o600]
    assert len(path.read_text()) == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["admin_token"]  # no temp file left


def test_admin_token_is_kept_across_restarts(tmp_path) -> None:
    first = Path(stack._make_admin_token(tmp_path)).read_text()
    assert Path(stack._make_admin_token(tmp_path)).read_text() == first


def test_ray_token_and_state_are_replaced_private(tmp_path, monkeypatch, open_umask) -> None:
    monkeypatch.setattr(Path, "chmod", lambda self, m: None)
    first = Path(stack._make_token(tmp_path)).read_text()
    path = Path(stack._make_token(tmp_path))
    assert mode(path) == 0o600 and path.read_text() != first
    state = tmp_path / "stack.json"
    assert stack.write_private(state, "{}") is True
    assert mode(state) == 0o600
    assert stack.write_private(state, "[]", replace=False) is False
    assert state.read_text() == "{}"
