"""The allocate step on in-memory state: argmax of reduced costs at the published duals,
declines, the budget safeguard, bad requests, config errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus.eventing._event import CloudEvent
from eventbus.eventing._outcome import Failure
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._runner import PipelineRunner
from eventbus.solver import AllocationProblem, FactorisedConsumption, save_problem


@pytest.fixture
def catalogue(tmp_path: Path) -> Path:
    # 3 items, 2 resources: resource 0 is a money budget (costs 1, 2, 0 per item), resource 1
    # the inventory of item 2 (one unit each); segment 1 is outside resource 0.
    cons = FactorisedConsumption(
        torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 1.0]]),
        torch.tensor([[1.0, 0.0], [1.0, 1.0]]),
        torch.zeros(1, dtype=torch.long),
    )
    problem = AllocationProblem(torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([10.0, 3.0]), cons)
    path = tmp_path / "catalogue.npz"
    save_problem(problem, path)
    return path


def runner(catalogue: Path, **spec: Any) -> PipelineRunner:
    doc = {
        "apiVersion": "eventbus/v1",
        "kind": "Pipeline",
        "metadata": {"name": "coupons"},
        "spec": {
            "sources": [{"kafka": {"topic": "in"}}],
            "steps": [
                {
                    "id": "coupon",
                    "allocate": {
                        "catalogue": catalogue.name,
                        "revenue": "data.scores",
                        "segment": "data.segment",
                        **spec,
                    },
                }
            ],
            "sink": {"kafka": {"topic": "out"}},
        },
    }
    return PipelineRunner(PipelineConfig.model_validate(doc), base_dirs=[str(catalogue.parent)])


def req(i: int, scores: list[float], segment: int = 0) -> CloudEvent:
    return CloudEvent.create(
        type="request", source="/app", id=f"r{i}", data={"scores": scores, "segment": segment}
    )


def test_picks_the_best_reduced_cost_at_the_duals(catalogue: Path) -> None:
    r = runner(catalogue)
    step = r.steps[0]
    step.memory_duals = [1.0, 0.0]
    step.expire_duals()  # read now
    [[a], [b], [c]] = r.run(
        [req(0, [3.0, 5.0, 0.5]), req(1, [0.5, 1.0, -1.0]), req(2, [3.0, 5.0, 0.5], segment=1)]
    )
    assert a.data["item"] == 1  # 5 - 2*1 = 3 beats 3 - 1 = 2
    assert b.data["item"] is None  # every reduced cost negative: declined
    assert c.data["item"] == 1  # segment 1 does not use resource 0: no price


def test_no_budget_is_ever_exceeded(catalogue: Path) -> None:
    r = runner(catalogue)
    outs = r.run([req(i, [0.0, 0.0, 9.0]) for i in range(10)])  # all want item 2, 3 in stock
    got = [o[0].data["item"] for o in outs]
    assert got.count(2) == 3 and got.count(None) == 7
    step = r.steps[0]
    assert step.used_budget()[1] == 3.0
    money = r.run([req(100 + i, [0.0, 1.0, 0.0]) for i in range(8)])  # item 1 costs 2 of 10
    assert [o[0].data["item"] for o in money].count(1) == 5
    assert step.used_budget()[0] == 10.0
    assert step.stats()["refused_by_budget"] == 7 + 3


def test_bad_requests_fail_alone(catalogue: Path) -> None:
    r = runner(catalogue)
    bad_len, bad_seg, ok = r.run(
        [req(0, [1.0, 2.0]), req(1, [1.0, 2.0, 3.0], segment=5), req(2, [1.0, 2.0, 3.0])]
    )
    assert isinstance(bad_len, Failure) and "a list of 3 numbers" in bad_len.message
    assert (
        isinstance(bad_seg, Failure) and "segment must be an integer in [0, 2)" in bad_seg.message
    )
    assert ok[0].data["item"] == 2


def test_missing_catalogue_is_a_clear_error(tmp_path: Path) -> None:
    from eventbus.errors import SolverError

    with pytest.raises(SolverError, match="nope.npz"):
        runner(tmp_path / "nope.npz")


def test_the_planner_prices_a_scarce_budget_from_recent_requests(catalogue: Path) -> None:
    r = runner(catalogue, plan={"every_s": 0.001, "window": 100, "expected_requests": 1000})
    step = r.steps[0]
    [planner] = r.timers()
    assert not planner.tick()  # nothing recorded yet
    # Everyone prefers item 2 (3 in stock for 1,000 expected requests): it must get a price.
    r.run([req(i, [1.0, 1.5, 4.0]) for i in range(50)])
    planner._last = 0.0
    assert planner.tick() and planner.solves == 1
    assert step.memory_duals is not None and step.memory_duals[1] > 0
    [[after]] = r.run([req(999, [1.0, 1.5, 4.0])])
    assert after.data["item"] != 2  # priced out: the scarce item is kept for later requests


@pytest.fixture
def mixed_catalogue(tmp_path: Path) -> Path:
    # resource 0: a money budget of 10 counting expected spend (face 1, 2, 0 x the request's
    # redemption probability); resource 1: the inventory of item 2, counting coupons
    cons = FactorisedConsumption(
        torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 1.0]]),
        torch.ones(2, 1),
        torch.zeros(1, dtype=torch.long),
        weights={"redeem": torch.ones(1, 3)},
        row_weight=("redeem", "count"),
    )
    problem = AllocationProblem(torch.ones(1, 3), torch.tensor([10.0, 3.0]), cons)
    path = tmp_path / "mixed.npz"
    save_problem(problem, path)
    return path


def wreq(i: int, scores: list[float], redeem: list[float]) -> CloudEvent:
    return CloudEvent.create(
        type="request",
        source="/app",
        id=f"w{i}",
        data={"scores": scores, "segment": 0, "redeem": redeem},
    )


def test_mixed_catalogue_prices_and_counts_expected_spend(mixed_catalogue: Path) -> None:
    r = runner(mixed_catalogue, weights={"redeem": "data.redeem"})
    step = r.steps[0]
    step.memory_duals = [1.0, 0.0]
    step.expire_duals()
    # weighted price of item 1: 2 x 0.1 = 0.2, so 3.5 - 0.2 beats 3 - 1 (unweighted it would not)
    [[a]] = r.run([wreq(0, [3.0, 3.5, 0.0], [1.0, 0.1, 1.0])])
    assert a.data["item"] == 1
    assert step.used_budget() == pytest.approx([0.2, 0.0])
    step.memory_duals = [0.0, 0.0]
    step.expire_duals()
    # item 1 at probability 0.5 spends 1 of the 9.8 left: 9 fit; item 2 counts coupons: 3 fit
    outs = r.run([wreq(1 + i, [0.0, 1.0, 0.0], [0.5, 0.5, 0.5]) for i in range(12)])
    assert [o[0].data["item"] for o in outs].count(1) == 9
    outs = r.run([wreq(20 + i, [0.0, 0.0, 1.0], [0.01] * 3) for i in range(5)])
    assert [o[0].data["item"] for o in outs].count(2) == 3
    assert step.used_budget()[1] == 3.0


def test_mixed_catalogue_planner(mixed_catalogue: Path) -> None:
    r = runner(
        mixed_catalogue,
        weights={"redeem": "data.redeem"},
        plan={"every_s": 0.001, "window": 100, "expected_requests": 1000},
    )
    [planner] = r.timers()
    r.run([wreq(i, [1.0, 3.0, 4.0], [0.9, 0.9, 0.9]) for i in range(50)])
    planner._last = 0.0
    assert planner.tick()
    duals = r.steps[0].memory_duals
    assert duals is not None and duals[0] > 0 and duals[1] > 0


@pytest.mark.parametrize(
    ("weights", "expect"),
    [
        ({}, "has resources counting in weights ['redeem'] and the step gives no CEL for them"),
        (
            {"redeem": "data.redeem", "cost": "data.redeem"},
            "weights ['cost'] are not weights of catalogue 'mixed.npz'",
        ),
    ],
)
def test_mixed_catalogue_config_errors(
    mixed_catalogue: Path, weights: dict[str, str], expect: str
) -> None:
    import re

    from eventbus.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(expect)):
        runner(mixed_catalogue, weights=weights)


def test_bad_weight_fails_the_request_alone(mixed_catalogue: Path) -> None:
    r = runner(mixed_catalogue, weights={"redeem": "data.redeem"})
    bad, ok = r.run(
        [wreq(0, [1.0, 2.0, 3.0], [0.5, -1.0, 0.5]), wreq(1, [1.0, 2.0, 3.0], [1.0] * 3)]
    )
    assert (
        isinstance(bad, Failure)
        and "weights.redeem must be a list of 3 non-negative" in bad.message
    )
    assert ok[0].data["item"] == 2


def test_redis_state_is_shared_by_replicas_and_the_planner_publishes_there(
    catalogue: Path, redis_url: str
) -> None:
    import uuid

    from eventbus._internal.redis_client import connect
    from eventbus.pipelines.steps._allocate import AllocateConfig, AllocateStep, duals_key

    spec = AllocateConfig(
        catalogue=str(catalogue),
        revenue="data.scores",
        segment="data.segment",
        plan={"every_s": 0.001, "window": 100, "expected_requests": 1000},  # type: ignore[arg-type]
    )
    pipeline = f"alloc-{uuid.uuid4().hex[:8]}"
    a, b = (AllocateStep("coupon", spec, pipeline=pipeline, redis_url=redis_url) for _ in "ab")
    # two replicas, 3 of item 2 in stock between them: the Lua safeguard holds it
    got = [o.data["item"] for o in a.process([req(i, [0.0, 0.0, 9.0]) for i in range(4)])]
    got += [o.data["item"] for o in b.process([req(10 + i, [0.0, 0.0, 9.0]) for i in range(4)])]
    assert got.count(2) == 3 and got.count(None) == 5
    assert a.used_budget()[1] == b.used_budget()[1] == 3.0
    a.process([req(20 + i, [1.0, 1.5, 4.0]) for i in range(50)])
    [planner] = b.timers()  # b re-solves from the window a recorded
    assert planner.tick() and planner.solves == 1
    duals = connect(redis_url).get(duals_key(pipeline, "coupon"))
    assert duals is not None and len(json.loads(duals)) == 2
    a.expire_duals()
    [after] = a.process([req(999, [1.0, 1.5, 4.0])])
    assert a.duals.tolist() == pytest.approx(json.loads(duals))
    assert after.data["item"] != 2  # priced out (and out of stock)
