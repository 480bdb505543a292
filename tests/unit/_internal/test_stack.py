"""The local stack's secret files (created readable by us only, never briefly by others), and
how it starts its Ray head."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from eventbus._internal import ray_head, stack_secrets


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
    path = Path(stack_secrets.make_admin_token(tmp_path))
    assert mode(path) == 0o600 and seen == [0o600]
    assert len(path.read_text()) == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["admin_token"]  # no temp file left


def test_admin_token_is_kept_across_restarts(tmp_path) -> None:
    first = Path(stack_secrets.make_admin_token(tmp_path)).read_text()
    assert Path(stack_secrets.make_admin_token(tmp_path)).read_text() == first


def test_ray_token_and_state_are_replaced_private(tmp_path, monkeypatch, open_umask) -> None:
    monkeypatch.setattr(Path, "chmod", lambda self, m: None)
    first = Path(stack_secrets.make_ray_token(tmp_path)).read_text()
    path = Path(stack_secrets.make_ray_token(tmp_path))
    assert mode(path) == 0o600 and path.read_text() != first
    state = tmp_path / "stack.json"
    assert stack_secrets.write_private(state, "{}") is True
    assert mode(state) == 0o600
    assert stack_secrets.write_private(state, "[]", replace=False) is False
    assert state.read_text() == "{}"


def test_ray_head_starts_with_the_idle_settings_and_the_users_own_win(
    tmp_path, monkeypatch
) -> None:
    # `ray start` is not run: its argv and environment are what `up` decides
    seen: dict[str, Any] = {}

    def run(argv, env, **kwargs):
        seen["argv"], seen["env"] = argv, env
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(ray_head.subprocess, "run", run)
    monkeypatch.setattr(ray_head, "wait_for_port", lambda *a: None)
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "500")  # a user's own setting
    monkeypatch.delenv("REPORTER_UPDATE_INTERVAL_MS", raising=False)
    ray_head.start_ray_head(tmp_path, 2, str(tmp_path / "token"))
    env = seen["env"]
    assert env["RAY_memory_monitor_refresh_ms"] == "500"
    assert env["REPORTER_UPDATE_INTERVAL_MS"] == "30000"
    assert env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.2"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "token")
    assert "--include-log-monitor=false" in seen["argv"]
    assert "--include-dashboard=false" in seen["argv"]
