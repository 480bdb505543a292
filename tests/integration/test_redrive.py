"""Dead-letter redrive on the real stack: ``eventbus redrive`` sends a deployed pipeline's dead
letters back through its steps once the bug is fixed, dedupes what the sink has, and answers
hostile input (unknown pipeline, bad CEL, bad time, empty and large dead-letter topics)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from eventbus import CloudEvent
from eventbus.cli import app
from eventbus.pipelines._config import PipelineConfig
from eventbus.serving._redrive import redrive
from tests.integration.kafka_helpers import collect, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]

N = 200


def _doc(name: str, src: str, sink: str, dlq: str) -> dict[str, Any]:
    return {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"kafka": {"topic": src}}],
            "steps": [{"id": "work", "function": "tests.integration.funcs:fails_while_flagged"}],
            "sink": {"kafka": {"topic": sink}},
            "dead_letter": {"kafka": {"topic": dlq}},
            "delivery": {"dedupe": {"window_s": 600}},
        },
    }


def _report(result: Any) -> Any:
    # the JSON report is the last line (this process is a Ray driver: replica logs interleave)
    return json.loads(result.output.strip().splitlines()[-1])


def test_redrive_after_a_fix_with_filter_since_dry_run_and_dedupe(
    deploy_pipeline: Any,
    topic_factory: Any,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    src, sink, dlq = topic_factory("rd-in"), topic_factory("rd-out"), topic_factory("rd-dlq")
    name = f"redrive-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(_doc(name, src, sink, dlq))
    flag = tmp_path / "bug"
    flag.write_text("on")
    events = [
        CloudEvent.create(
            type="t",
            source="/rd",
            id=f"e{i}",
            data={"n": i, "kind": "a" if i % 20 == 0 else "b"}
            | ({"flag": str(flag)} if i % 10 == 0 else {}),
        )
        for i in range(N)
    ]
    asyncio.run(produce(kafka_bootstrap, src, events))
    assert len(asyncio.run(collect(kafka_bootstrap, sink, N - N // 10))) == N - N // 10
    dead = asyncio.run(collect(kafka_bootstrap, dlq, N // 10))
    assert len(dead) == N // 10 and all(d["ebstep"] == "work" for d in dead)
    addresses = [
        "--ray-address",
        "attached",
        "--kafka-bootstrap",
        kafka_bootstrap,
        "--redis-url",
        redis_url,
    ]
    cli = CliRunner()

    def run(*args: str) -> Any:
        return cli.invoke(app, ["redrive", *args, *addresses])

    # hostile input answers clearly, exit 1, before anything is sent
    bad = run("no-such-pipeline")
    assert bad.exit_code == 1 and "no-such-pipeline" in bad.output
    bad = run(name, "--filter", "data.kind ==")
    assert (
        bad.exit_code == 1 and "--filter 'data.kind ==' is not a valid CEL expression" in bad.output
    )
    bad = run(name, "--filter", "dat.kind == 'a'")
    assert bad.exit_code == 1 and "did you mean 'data'" in bad.output
    bad = run(name, "--since", "yesterday")
    assert bad.exit_code == 1 and "--since 'yesterday' is neither RFC 3339" in bad.output
    # a dry run counts and sends nothing
    dry = run(name, "--filter", "data.kind == 'a' && ebstep == 'work'", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    report = _report(dry)
    assert (report["redriven"], report["not_matched"], report["outputs"]) == (10, 10, 0)
    assert report["by_step"] == {"work": 10} and report["dry_run"] is True
    # before the fix, the 'b' dead letters fail again: dead-lettered anew, with fresh eb* attributes
    again = run(name, "--filter", "data.kind == 'b'", "--json")
    assert again.exit_code == 0, again.output
    report = _report(again)
    assert (report["redriven"], report["dead_lettered"], report["outputs"]) == (10, 10, 0)
    assert len(asyncio.run(collect(kafka_bootstrap, dlq, 30))) == 30
    # the bug is fixed: the 'a' dead letters go through, then all of them (the 'a' outputs
    # deduped; each 'b' event runs once although it is in the topic twice)
    flag.unlink()
    first = run(name, "--filter", "data.kind == 'a'", "--since", "2020-01-01T00:00:00Z", "--json")
    assert first.exit_code == 0, first.output
    report = _report(first)
    assert (report["redriven"], report["outputs"], report["dead_lettered"]) == (10, 10, 0)
    second = run(name)
    assert second.exit_code == 0, second.output
    assert f"redrove 20 of 30 dead letters in {dlq} through {name}" in second.output
    assert (
        "10 to the sink, 10 already there (dedupe), 0 filtered, 0 dead-lettered again"
        in second.output
    )
    assert "10 repeats of one dead letter" in second.output
    out = asyncio.run(collect(kafka_bootstrap, sink, N))
    counts = Counter(e.id for e in out)
    assert set(counts) == {f"e{i}" for i in range(N)} and max(counts.values()) == 1
    redriven = [e for e in out if e.data["n"] % 10 == 0]
    assert all(e.data["ok"] and not any(k.startswith("eb") for k in e.attributes) for e in redriven)
    # a time after every dead letter: nothing matches
    late = run(name, "--since", str(int(time.time() * 1000) + 60_000), "--json")
    assert (_report(late)["before_since"], _report(late)["redriven"]) == (30, 0)


async def test_empty_missing_and_large_dead_letter_topics(
    topic_factory: Any, kafka_bootstrap: str, redis_url: str
) -> None:
    async def never(events: list[CloudEvent]) -> Any:
        raise AssertionError("nothing to dispatch")

    def config(dlq: str) -> PipelineConfig:
        return PipelineConfig.model_validate(_doc("rd-lib", "in", "out", dlq))

    empty = topic_factory("rd-empty")
    for topic in (empty, f"rd-never-written-{uuid.uuid4().hex[:6]}"):
        started = time.monotonic()
        report = await redrive(
            config(topic), bootstrap=kafka_bootstrap, redis_url=redis_url, dispatch=never
        )
        assert report.read == 0 and report.redriven == 0
        assert time.monotonic() - started < 10
    # 20,000 dead letters, in bounded batches: counted by step, other pipelines' left alone
    large = topic_factory("rd-large", partitions=2)
    dead = [
        CloudEvent.create(
            type="t",
            source="/big",
            id=f"d{i}",
            data={"n": i},
            ebpipeline="rd-lib" if i % 4 else "another",
            ebstep="work" if i % 2 else "parse",
            eberror="boom",
        )
        for i in range(20_000)
    ]
    await produce(kafka_bootstrap, large, dead)
    seen: list[int] = []
    report = await redrive(
        config(large),
        bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        dispatch=never,
        dry_run=True,
        where="data.n < 19000",
        progress=lambda r: seen.append(r.read),
    )
    assert report.read == 20_000 and report.other_pipeline == 5_000, report.as_dict()
    assert report.redriven == 15_000 - 750 and report.not_matched == 750
    assert report.by_step == {"work": 10_000 - 500, "parse": 5_000 - 250}
    assert len(seen) >= 20_000 // 500  # progress after every bounded batch
