"""The allocate step on the real stack: duals from the solver, published through Redis,
requests over Kafka; every budget holds end to end (the safeguard in Redis)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from eventbus import CloudEvent
from tests.integration.kafka_helpers import collect, produce

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.ray, pytest.mark.redis]


async def test_allocate_keeps_every_budget(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    import torch

    from eventbus.pipelines.steps._allocate import publish_duals
    from eventbus.solver import generate_problem, save_problem, solve

    n, m, k = 2000, 8, 4
    problem = generate_problem(n, m, k, seed=3)
    catalogue = tmp_path / "catalogue.npz"
    save_problem(problem, catalogue)
    result = solve(problem, gap=1e-3)
    src, sink = topic_factory("alloc-in", partitions=2), topic_factory("alloc-out")
    name = f"alloc-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [
                    {
                        "id": "coupon",
                        "allocate": {
                            "catalogue": str(catalogue),
                            "revenue": "data.revenue",
                            "segment": "data.segment",
                            "refresh_s": 0.2,
                        },
                    }
                ],
                "sink": {"kafka": {"topic": sink}},
                "serving": {"replicas": 2},
            },
        }
    )
    publish_duals(redis_url, name, "coupon", result.duals)
    cons = problem.consumption
    events = [
        CloudEvent.create(
            type="request",
            source="/app",
            id=f"q{i}",
            data={"revenue": problem.revenue[i].tolist(), "segment": int(cons.segment[i])},
        )
        for i in range(n)
    ]
    await produce(kafka_bootstrap, src, events)
    out = await collect(kafka_bootstrap, sink, n, timeout_s=120)
    assert len({e.id for e in out}) == n
    used = torch.zeros(k, dtype=torch.float64)
    allocated = 0
    for e in out:
        j = e.data["item"]
        if j is not None:
            i = int(e.id[1:])
            used += (
                cons.item_cost[:, j].double() * cons.segment_mask[:, int(cons.segment[i])].double()
            )
            allocated += 1
    budget = problem.budget.double()
    assert bool((used <= budget + 1e-6).all()), (
        f"used {used.tolist()} over budget {budget.tolist()}"
    )
    assert allocated > n // 10  # the duals price, they do not starve


async def test_plan_republishes_duals_without_a_redeploy(
    deploy_pipeline: Any, topic_factory: Any, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    import asyncio
    import json
    import time

    import redis

    from eventbus.pipelines.steps._allocate import duals_key
    from eventbus.solver import generate_problem, save_problem

    n, m, k = 1000, 6, 3
    problem = generate_problem(n, m, k, seed=5)
    catalogue = tmp_path / "catalogue.npz"
    save_problem(problem, catalogue)
    src, sink = topic_factory("plan-in"), topic_factory("plan-out")
    name = f"plan-{uuid.uuid4().hex[:6]}"
    deploy_pipeline(
        {
            "apiVersion": "eventbus/v1",
            "kind": "Pipeline",
            "metadata": {"name": name},
            "spec": {
                "sources": [{"kafka": {"topic": src}}],
                "steps": [
                    {
                        "id": "coupon",
                        "allocate": {
                            "catalogue": str(catalogue),
                            "revenue": "data.revenue",
                            "segment": "data.segment",
                            "refresh_s": 0.2,
                            "plan": {"every_s": 1, "window": 500, "expected_requests": 4000},
                        },
                    }
                ],
                "sink": {"kafka": {"topic": sink}},
            },
        }
    )
    r = redis.Redis.from_url(redis_url)
    assert r.get(duals_key(name, "coupon")) is None
    cons = problem.consumption
    await produce(
        kafka_bootstrap,
        src,
        [
            CloudEvent.create(
                type="request",
                source="/app",
                id=f"q{i}",
                data={"revenue": problem.revenue[i].tolist(), "segment": int(cons.segment[i])},
            )
            for i in range(n)
        ],
    )
    await collect(kafka_bootstrap, sink, n, timeout_s=120)
    deadline = time.monotonic() + 30
    while r.get(duals_key(name, "coupon")) is None:
        assert time.monotonic() < deadline, "the planner published no duals"
        await asyncio.sleep(0.2)
    duals = json.loads(r.get(duals_key(name, "coupon")))
    assert len(duals) == k and all(d >= 0 for d in duals) and any(d > 0 for d in duals)
