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
]
