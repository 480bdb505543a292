"""The Redis key layout is a storage format: these spellings change only on purpose.

Existing data in users' Redis (pipelines, versions, model registries, join and allocate
state, dedupe marks) is read back with these keys after an upgrade; a change needs an upgrade
note in the README (the hash tags for Redis Cluster were one). Keys that one script or
transaction touches share a hash tag (one Redis Cluster slot).
"""

from __future__ import annotations

import ast
from pathlib import Path

from eventbus._internal import keys


def test_control_plane_keys() -> None:
    assert keys.PREFIX == "eventbus:"
    assert keys.PIPELINES == "eventbus:{control}:pipelines"
    assert keys.pipeline_versions("orders") == "eventbus:{control}:pipeline-versions:orders"
    assert keys.canary("orders") == "eventbus:{control}:canary:orders"
    assert keys.canary_figures("orders") == "eventbus:{control}:canary-figures:orders"
    assert keys.CANARY_PATTERN == "eventbus:{control}:canary:*"
    assert keys.SCALED_TO_ZERO == "eventbus:{control}:scaled-to-zero"
    assert keys.HOSTS == "eventbus:{control}:hosts"
    assert keys.DEGRADED == "eventbus:{control}:degraded"
    assert keys.WAKE == "eventbus:wake"
    assert keys.PARKED == "eventbus:parked"
    assert keys.PARKED_NOTICE == "eventbus:parked-notice"
    assert keys.doorbell("12-ab/0") == "eventbus:doorbell:12-ab/0"
    assert keys.join_bridge("eventbus-orders") == "eventbus:join-bridge:eventbus-orders"


def test_canary_pattern_finds_canaries_only() -> None:
    from fnmatch import fnmatchcase

    assert fnmatchcase(keys.canary("large-payments"), keys.CANARY_PATTERN)
    assert not fnmatchcase(keys.canary_figures("large-payments"), keys.CANARY_PATTERN)
    assert keys.canary_pipeline(keys.canary("large-payments")) == "large-payments"


def test_observability_and_delivery_keys() -> None:
    assert keys.stats("orders") == "eventbus:stats:{orders}"
    assert keys.history("orders", 1700000000) == "eventbus:history:{orders}:1700000000"
    assert keys.dedupe_prefix("orders") == "eventbus:dedupe:{orders}:"
    assert keys.schedule("orders", "nightly") == "eventbus:schedule:{orders}:nightly"


def test_gateway_keys() -> None:
    assert keys.replay("orders", "ab12") == "eventbus:replay:orders:ab12"


def test_step_state_keys() -> None:
    assert keys.join_prefix("orders", "pair") == "eventbus:join:{orders:pair}:"
    assert keys.aggregate_keys("orders", "per_user") == [
        "eventbus:{agg:orders:per_user}:w",
        "eventbus:{agg:orders:per_user}:due",
        "eventbus:{agg:orders:per_user}:claim",
        "eventbus:{agg:orders:per_user}:hll",
        "eventbus:{agg:orders:per_user}:hll2",
        "eventbus:{agg:orders:per_user}:seen",
        "eventbus:{agg:orders:per_user}:closed",
    ]
    assert keys.allocate_used("ads", "coupon") == "eventbus:allocate:{ads:coupon}:used"
    assert keys.allocate_window("ads", "coupon") == "eventbus:allocate:{ads:coupon}:window"
    assert keys.allocate_seen("ads", "coupon") == "eventbus:allocate:{ads:coupon}:seen"
    assert keys.allocate_plan_lock("ads", "coupon") == "eventbus:allocate:{ads:coupon}:plan-lock"
    assert keys.allocate_pending("ads", "coupon") == "eventbus:allocate:{ads:coupon}:pending"
    assert (
        keys.allocate_pending_times("ads", "coupon")
        == "eventbus:allocate:{ads:coupon}:pending-times"
    )
    assert keys.duals("ads", "coupon") == "eventbus:duals:{ads:coupon}"


def test_model_keys() -> None:
    assert keys.MODELS == "eventbus:models"
    assert keys.model("fraud") == "eventbus:models:{fraud}"
    assert keys.model_blob("fraud", 3) == "eventbus:models:{fraud}:blob:3"
    assert keys.model_recent("fraud") == "eventbus:models:{fraud}:recent"
    assert keys.model_labelled("fraud") == "eventbus:models:{fraud}:labelled"


def test_keeper_key() -> None:
    assert keys.KEEPER_CLUSTERS == "eventbus:keeper:clusters"


def test_users_of_the_layout_spell_it_through_the_module() -> None:
    from eventbus._client._registry import KEEPER_KEY
    from eventbus.eventing._delivery import RedisDeduper
    from eventbus.pipelines.steps._allocate import duals_key

    assert KEEPER_KEY == "eventbus:keeper:clusters"
    assert duals_key("ads", "coupon") == "eventbus:duals:{ads:coupon}"
    deduper = RedisDeduper("redis://127.0.0.1:1/0", "orders", 60.0)  # connects lazily
    assert deduper.digests(["src|id"])[0].startswith("eventbus:dedupe:{orders}:")


def test_keys_imports_nothing_from_eventbus() -> None:
    # Every layer imports it, so it must import none of them.
    tree = ast.parse(Path(keys.__file__).read_text(encoding="utf-8"))
    imported = [
        n.module or "" if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    ]
    assert [m for m in imported if m.split(".")[0] == "eventbus"] == []


def test_keys_of_one_script_or_transaction_share_one_slot() -> None:
    def one_slot(*names: str) -> bool:
        return len({keys.hash_tag(n) for n in names}) == 1

    # controller transactions (deploy, canary end, delete)
    assert one_slot(
        keys.PIPELINES,
        keys.pipeline_versions("orders"),
        keys.canary("orders"),
        keys.canary_figures("orders"),
    )
    prefix = keys.join_prefix("orders", "pair")
    assert one_slot(
        *(prefix + s for s in ("k:a", "due", "claim", "w:b", "x:1:b", "pdue", "pclaim"))
    )
    assert one_slot(
        keys.allocate_used("ads", "coupon"),
        keys.allocate_window("ads", "coupon"),
        keys.allocate_seen("ads", "coupon"),
        keys.allocate_plan_lock("ads", "coupon"),
        keys.allocate_pending("ads", "coupon"),
        keys.allocate_pending_times("ads", "coupon"),
        keys.duals("ads", "coupon"),
    )
    # a writer's stats entry and its history bucket: one pipeline (one round trip)
    assert one_slot(keys.stats("orders"), keys.history("orders", 0), keys.history("orders", 10))
    assert one_slot(keys.dedupe_prefix("orders") + "ab", keys.dedupe_prefix("orders") + "cd")
    assert one_slot(
        keys.model("fraud"),
        keys.model_blob("fraud", 3),
        keys.model_recent("fraud"),
        keys.model_labelled("fraud"),
    )
    # different steps and pipelines spread over the slots
    assert not one_slot(prefix, keys.join_prefix("orders", "other"))
    assert keys.hash_tag("plain") == "plain" and keys.hash_tag("a{}b{c}") == "a{}b{c}"
