"""Root test configuration: shared fixture modules (real services, the Ray session)."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0")  # as eventbus up runs Ray

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.ray_stack",
    "tests.fixtures.http_receiver",
    "tests.fixtures.redis_secure",
    "tests.fixtures.kafka_tls",
    "tests.fixtures.netns_hosts",
]


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """Tests of one broker's own mechanism run on that broker's pass only: ``tansu_only``
    (the doorbell, which only Tansu needs) in the Tansu pass, ``kafka_only`` (transactions,
    replication, broker faults, the broker's own TLS and SCRAM) in the Apache Kafka pass.
    They are deselected, not skipped, in the other pass: each runs in one of make test's two."""
    from tests.fixtures.services import BROKER

    other = "tansu_only" if BROKER == "kafka" else "kafka_only"
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker(other) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
