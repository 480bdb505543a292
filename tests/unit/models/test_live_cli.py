"""``eventbus model shadow``, ``model list`` with a shadow comparison and rollbacks, and
``model history``, rendered from a controller double (no Ray, no Redis)."""

from __future__ import annotations

from typing import Any

import pytest

from eventbus.cli._models import shadow_text
from eventbus.models._compare import summarize


def test_shadow_text_shows_figures_and_unknowns() -> None:
    assert shadow_text(None) == ""
    text = shadow_text({**summarize({"rows": 3, "share": 0.2}), "active": False})
    assert "20% mirrored (stopped)" in text and "live -/- ms" in text and "dropped 0 rows" in text


# -- the CLI ------------------------------------------------------------------------------------
class _Client:
    """What `model list`, `model shadow` and `model history` ask the controller, in memory."""

    def list_models(self, name: str | None) -> list[dict[str, Any]]:
        base = {"name": "fraud", "format": "export", "size": 10, "pushed_at": 0.0, "error": None}
        shadow = {**summarize({"rows": "40", "agree": "30", "labelled": "40", "share": "0.2"})}
        return [
            {**base, "version": 1, "status": "serving", "traffic": 1.0, "shadow": None},
            {
                **base,
                "version": 2,
                "status": "candidate",
                "traffic": 0.0,
                "shadow": {**shadow, "active": True},
            },
            {
                **base,
                "version": 3,
                "status": "rolled-back",
                "traffic": 0.0,
                "shadow": None,
                "error": "rolled back to version 1: error rate 50.0%",
            },
        ]

    def shadow_model(self, name: str, version: int | None, share: float) -> dict[str, Any]:
        return {
            "shadow": {"version": version, "share": share} if version else None,
            # version 4 is one the model's replica could not load
            "mirroring": version is not None and version != 4,
        }

    def model_history(self, name: str) -> list[dict[str, Any]]:
        return [
            {
                "at": 1.0,
                "kind": "rollback",
                "from": "serving",
                "version": 3,
                "to": 1,
                "reason": "error rate 50.0%",
                "figures": {
                    "version": {"rows": 40, "error_rows": 20, "p99_ms": None},
                    "previous": {"rows": 90, "error_rows": 0, "p99_ms": 1.2},
                },
            },
            {"at": 0.5, "kind": "shadow-start", "version": 2, "share": 0.2},
            {"kind": "unreadable", "raw": "{"},
        ]


def test_cli_shadow_list_and_history(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import eventbus.cli._models as cli_models
    from eventbus.cli import app

    monkeypatch.setattr(cli_models, "_client", lambda *a: _Client())
    runner = CliRunner()
    bad = runner.invoke(app, ["model", "shadow", "fraud"])
    assert bad.exit_code == 2 and "give a VERSION (and --share), or --off" in bad.output
    ok = runner.invoke(app, ["model", "shadow", "fraud", "2", "--share", "0.2"])
    assert ok.exit_code == 0 and "20% of the calls mirrored to version 2" in ok.output
    assert "does not mirror" not in ok.output
    unloaded = runner.invoke(app, ["model", "shadow", "fraud", "4"])
    assert unloaded.exit_code == 0
    assert "its replica does not mirror to version 4 (the version did not load" in unloaded.output
    off = runner.invoke(app, ["model", "shadow", "fraud", "--off"])
    assert off.exit_code == 0 and "no shadow experiment" in off.output
    listed = runner.invoke(app, ["model", "list", "fraud"], env={"COLUMNS": "400"})
    assert listed.exit_code == 0, listed.output
    assert "shadow comparison" in listed.output and "agree 75.0%" in listed.output
    assert "rolled-back" in listed.output and "shadow " in listed.output
    hist = runner.invoke(app, ["model", "history", "fraud"], env={"COLUMNS": "400"})
    assert hist.exit_code == 0, hist.output
    assert "serving -> version 1: error rate 50.0%" in hist.output
    assert "20/40 rows failed" in hist.output and "unreadable" in hist.output
