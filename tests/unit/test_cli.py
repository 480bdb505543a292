"""The CLI's offline verbs: validate, test, schema; usage errors exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from eventbus.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_validate_ok_and_bad(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["validate", str(ROOT / "examples/payments/payments.yaml")])
    assert ok.exit_code == 0, ok.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: eventbus/v1\nkind: Pipeline\nmetadata: {name: Bad}\nspec:\n"
        "  sources: [{kafka: {topic: a}}]\n  steps:\n    - id: x\n      filter: 'data.a >'\n  sink: {kafka: {topic: b}}\n"
    )
    res = runner.invoke(app, ["validate", str(bad)])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.startswith(str(bad))]
    assert len(lines) == 2, res.output
    assert lines[0].startswith(f"{bad}:3:18: metadata.name: must match")


def test_test_command_passes_on_examples() -> None:
    res = runner.invoke(app, ["test", str(ROOT / "examples/payments/payments.yaml")])
    assert res.exit_code == 0, res.output
    assert "3 passed, 0 failed" in res.output


def test_test_command_shows_a_diff_on_failure(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text((ROOT / "examples/payments/payments.yaml").read_text())
    (tmp_path / "fraud.py").write_text((ROOT / "examples/payments/fraud.py").read_text())
    (tmp_path / "p_test.yaml").write_text(
        "tests:\n  - name: wrong expectation\n    input:\n"
        "      - {type: payment.created, data: {amount: 200, currency: CNY}}\n"
        "    output:\n      - {type: payment.small}\n"
    )
    res = runner.invoke(app, ["test", str(tmp_path)])
    assert res.exit_code == 1
    assert "FAIL" in res.output and "-  type: payment.small" in res.output.replace(
        "- type", "-  type"
    )
    assert "+" in res.output and "payment.large" in res.output
    assert "0 passed, 1 failed" in res.output


def test_schema_command_prints_json() -> None:
    res = runner.invoke(app, ["schema"])
    assert res.exit_code == 0
    assert json.loads(res.output)["properties"]["apiVersion"]["const"] == "eventbus/v1"


def test_usage_error_exits_2() -> None:
    res = runner.invoke(app, ["deploy"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["no-such-verb"])
    assert res.exit_code == 2


def test_deploy_without_a_stack_says_how_to_start_one(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "EVENTBUS_HOME": str(tmp_path),
        "RAY_ADDRESS": "",
        "EVENTBUS_KAFKA_BOOTSTRAP": "",
        "EVENTBUS_REDIS_URL": "",
    }
    res = subprocess.run(
        [sys.executable, "-m", "eventbus.cli", "list"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert res.returncode == 1
    assert "start one with `eventbus up`" in res.stderr


def test_publish_needs_type_with_data(tmp_path: Path) -> None:
    env = {**os.environ, "EVENTBUS_HOME": str(tmp_path)}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventbus.cli",
            "publish",
            "t",
            "--data",
            "{}",
            "--kafka-bootstrap",
            "127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert res.returncode == 1
    assert "--type is required with --data" in res.stderr


def test_test_command_runs_sql_and_pattern_filters(tmp_path: Path) -> None:
    """``eventbus test`` runs the CloudEvents SQL and EventBridge pattern dialects as a
    deployment would: events kept and dropped by each."""
    (tmp_path / "p.yaml").write_text(
        "apiVersion: eventbus/v1\nkind: Pipeline\nmetadata: {name: dialects}\nspec:\n"
        "  sources: [{kafka: {topic: a}}]\n  steps:\n"
        "    - id: orders\n      filter: {sql: \"type LIKE 'order.%'\"}\n"
        "    - id: big\n      filter: {pattern: {data: {amount: [{numeric: ['>', 100]}]}}}\n"
        "  sink: {kafka: {topic: b}}\n"
    )
    (tmp_path / "p_test.yaml").write_text(
        "tests:\n  - name: kept and dropped\n    input:\n"
        "      - {type: order.created, data: {amount: 200}}\n"
        "      - {type: order.created, data: {amount: 50}}\n"
        "      - {type: refund.created, data: {amount: 500}}\n"
        "    output:\n      - {type: order.created, data: {amount: 200}}\n"
    )
    res = runner.invoke(app, ["test", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "1 passed, 0 failed" in res.output


def test_test_command_runs_a_jsonata_convert(tmp_path: Path) -> None:
    """``eventbus test`` runs a JSONata convert (the whole event in, the whole event out)."""
    (tmp_path / "p.yaml").write_text(
        "apiVersion: eventbus/v1\nkind: Pipeline\nmetadata: {name: reshape}\nspec:\n"
        "  sources: [{kafka: {topic: a}}]\n  steps:\n"
        "    - id: total\n      convert:\n        jsonata: >-\n"
        "          {'specversion': '1.0', 'id': id, 'source': source, 'type': type & '.priced',\n"
        "          'data': {'total': data.price * data.qty}}\n"
        "  sink: {kafka: {topic: b}}\n"
    )
    (tmp_path / "p_test.yaml").write_text(
        "tests:\n  - name: priced\n    input:\n"
        "      - {type: order, data: {price: 2.5, qty: 4}}\n"
        "    output:\n      - {type: order.priced, data: {total: 10}}\n"
    )
    res = runner.invoke(app, ["test", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "1 passed, 0 failed" in res.output
