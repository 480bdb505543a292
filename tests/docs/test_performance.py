"""The performance page is built from the benchmarks' JSON lines in ``benchmarks/results/``:
every record says where and when it ran, every recorded benchmark has its table on the page,
``benchmarks/record.py`` keeps a run's last line with that metadata (and refuses what it
cannot keep), and the page's table is the latest record's."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import DOCS, ROOT, blocks, docs_hook

gen = docs_hook("gen_performance")
RESULTS = ROOT / "benchmarks" / "results"
RECORD = ROOT / "benchmarks" / "record.py"
PAGE = (DOCS / "performance" / "index.md").read_text(encoding="utf-8")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2}Z)?$")
FILES = sorted(RESULTS.glob("*.jsonl"))


def test_the_results_are_seeded() -> None:
    assert {p.stem for p in FILES} >= {"kafka_pipeline", "peers", "latency"}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_record_says_where_and_when_it_ran(path: Path) -> None:
    records = gen.load(path.stem)
    assert records, f"{path} is empty"
    assert (ROOT / "benchmarks" / f"{path.stem}.py").is_file(), f"no benchmark for {path}"
    for record in records:
        assert record["benchmark"] == path.stem
        assert record["broker"] in ("kafka", "tansu")
        assert DATE.match(record["date"]), record["date"]
        for key in ("machine", "commit", "broker_version"):
            assert isinstance(record[key], str) and record[key].strip(), (path, key)
        assert isinstance(record["figures"], dict) and record["figures"]
        assert record["figures"].get("broker", record["broker"]) == record["broker"]


def test_every_recorded_benchmark_has_its_table_on_the_page() -> None:
    marked = set(gen.MARKER.findall(PAGE))
    assert {p.stem for p in FILES} <= marked
    assert all((ROOT / "benchmarks" / f"{name}.py").is_file() for name in marked)


def test_the_tables_state_machine_broker_commit_and_date() -> None:
    built = gen.render(PAGE)
    assert gen.MARKER.search(built) is None
    for path in FILES:
        for record in gen.latest(gen.load(path.stem)).values():
            for key in ("broker_version", "commit", "date", "machine"):
                assert gen._cell(record[key]) in built, (path.stem, key)
    # the seeded run, from brokers.py --quick's published table
    assert "102,041 / 74,516 = **1.37**" in built and "**1.38** (Bytewax)" in built


def _record(stdin: str, results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RECORD), "--results", str(results), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_record_keeps_a_run_s_last_line_and_the_page_shows_the_latest(tmp_path: Path) -> None:
    first = {"broker": "tansu", "doorbell": "both", "idle_0": {"cpu_pct": 5.4}}
    log = "0 pipelines: {...}\nnot json {\n" + json.dumps(first) + "\n"
    done = _record(log, tmp_path, "--benchmark", "idle", "--command", "benchmarks/idle.py")
    assert done.returncode == 0, done.stderr
    later = {**first, "idle_0": {"cpu_pct": 4.9}, "zero_50": {"cpu_pct": 3.1}}
    later["targets"] = {"zero_50_cpu_pct": 5.0}
    assert _record(json.dumps(later), tmp_path, "--benchmark", "idle").returncode == 0
    lines = (tmp_path / "idle.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["figures"] for r in records] == [first, later]
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=10", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for record in records:
        assert record["benchmark"] == "idle" and record["broker"] == "tansu"
        assert record["commit"].startswith(head)
        assert DATE.match(record["date"]) and "T" in record["date"]
        assert "cores" in record["machine"] and record["broker_version"].startswith("Tansu")
    assert records[0]["command"] == "benchmarks/idle.py"
    table = gen.table("idle", tmp_path)
    assert "| the stack alone, % of a core | 4.9 |" in table
    assert "| pipelines at zero, % of a core | 3.1 (target < 5.0) |" in table
    assert records[1]["commit"] in table and records[1]["date"] in table


@pytest.mark.parametrize(
    ("stdin", "args", "says"),
    [
        ("no json here\n", [], "no JSON object line"),
        ('{"broker": "tansu", "error": "exit 1"}', ["--benchmark", "idle"], "the run failed"),
        ('{"broker": "tansu"}', [], "pass --benchmark"),
        ('{"broker": "tansu"}', ["--benchmark", "../etc"], "'../etc'"),
        ('{"benchmark": "peers", "broker": "redpanda"}', [], "'redpanda'"),
        ('{"benchmark": "peers", "broker": "kafka"}', ["--broker", "tansu"], "the JSON says"),
        ('{"benchmark": "peers", "broker": "kafka"}', ["--benchmark", "idle"], "the JSON says"),
    ],
)
def test_record_refuses_what_it_cannot_keep(
    tmp_path: Path, stdin: str, args: list[str], says: str
) -> None:
    done = _record(stdin, tmp_path, *args)
    assert done.returncode != 0
    assert says in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_broken_results_line_names_its_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "peers.jsonl").write_text(RESULTS.joinpath("peers.jsonl").read_text() + "{oops\n")
    with pytest.raises(gen.ResultsError, match=r"peers\.jsonl:3: not JSON"):
        gen.table("peers", tmp_path)
    (tmp_path / "peers.jsonl").write_text('{"broker": "kafka"}\n')
    with pytest.raises(gen.ResultsError, match=r"peers\.jsonl:1: .*missing \['commit'"):
        gen.table("peers", tmp_path)


def test_an_unrecorded_benchmark_says_so() -> None:
    assert "No run of `idle` recorded yet" in gen.table("idle", ROOT / "no-such-folder")


def test_a_benchmark_without_a_view_shows_every_number(tmp_path: Path) -> None:
    figures = {"benchmark": "join", "broker": "kafka", "eventbus": {"events_per_s": 1234}}
    record = {"benchmark": "join", "broker": "kafka", "machine": "m", "commit": "c"}
    record |= {"date": "2026-11-27T20:00:00Z", "figures": figures}
    (tmp_path / "join.jsonl").write_text(json.dumps(record) + "\n")
    assert "| `eventbus.events_per_s` | 1,234 |" in gen.table("join", tmp_path)


def test_the_page_s_benchmark_commands_exist() -> None:
    page_blocks = [b for b in blocks("bash") if b.path.parent.name == "performance"]
    seen = 0
    for block in page_blocks:
        for line in block.text.splitlines():
            argv = shlex.split(line.split("#")[0].replace("|", " ").replace("<", " "))
            for i, token in enumerate(argv):
                if token.startswith("benchmarks/") and token.endswith(".py"):
                    source = (ROOT / token).read_text()
                    if "add_broker_arg" in source:  # --broker comes from _broker.py
                        source += (ROOT / "benchmarks" / "_broker.py").read_text()
                    seen += 1
                    for option in (t for t in argv[i + 1 :] if t.startswith("--")):
                        assert f'"{option}"' in source, f"{block.where}: {token} {option}"
    assert seen >= 3
