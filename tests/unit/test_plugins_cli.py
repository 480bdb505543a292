"""`eventbus plugins` and the "Write a plugin" guide's commands, run as written; a broken
plugin is named by `plugins` and by `validate`, and breaks nothing else."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_plugin_guide_commands_run_as_written() -> None:
    guide = (ROOT / "docs" / "how-to" / "plugins.md").read_text()
    block = re.findall(r"```bash\n(.*?)```", guide, re.S)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    commands = [c for c in commands if c and "pip install" not in c]  # make setup installs it
    assert len(commands) == 3
    for command in commands:
        argv = command.split()
        argv[0] = str(BIN / Path(argv[0]).name)
        done = run(argv)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"


def test_plugins_lists_kinds_with_their_origin_as_json() -> None:
    done = run([str(BIN / "eventbus"), "plugins", "--json"])
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    by_name = {(k["family"], k["name"]): k for k in listing["kinds"]}
    assert by_name[("step", "filter")]["origin"] == "builtin"
    assert by_name[("step", "redact")]["origin"] == "eventbus-example-plugin"
    assert by_name[("sink", "jsonl")]["module"] == "eventbus_example_plugin.jsonl"
    assert listing["problems"] == []


def test_a_broken_plugin_is_named_by_plugins_and_validate(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "ebbroken_plugin.py").write_text("raise RuntimeError('the plugin is broken')\n")
    info = site / "eb_broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eb-broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[eventbus.steps]\nshout = ebbroken_plugin\n")
    env = {"PYTHONPATH": str(site)}
    done = run([str(BIN / "eventbus"), "plugins"], env)
    assert done.returncode == 1
    assert "plugin 'eb-broken' (eventbus.steps: shout) could not be loaded" in done.stderr
    assert "RuntimeError: the plugin is broken" in done.stderr
    assert "redact" in done.stdout  # the other kinds still work
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        textwrap.dedent("""\
            apiVersion: eventbus/v1
            kind: Pipeline
            metadata: {name: p}
            spec:
              sources: [{kafka: {topic: a}}]
              steps:
                - id: s
                  shout: {}
              sink: {kafka: {topic: b}}
            """)
    )
    done = run([str(BIN / "eventbus"), "validate", str(pipeline)], env)
    assert done.returncode == 1
    assert (
        "p.yaml:8:14: spec.steps[0].shout: step kind 'shout' comes from plugin 'eb-broken', "
        "which could not be loaded" in done.stdout + done.stderr
    )
    ok = run([str(BIN / "eventbus"), "validate", "examples/plugin/cards.yaml"], env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
