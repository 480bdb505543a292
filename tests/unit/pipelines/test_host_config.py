"""``serving.host``: what a pipeline sharing a host process may and may not set."""

from __future__ import annotations

import pytest

from eventbus.pipelines import load_pipeline_text
from tests.unit.pipelines.test_loader import GOOD, problems


def with_serving(serving: str) -> str:
    return GOOD + f"  serving: {serving}\n"


def test_host_member_loads_with_a_fixed_replica_count() -> None:
    config = load_pipeline_text(with_serving("{host: shared, replicas: 2}"), "p.yaml")
    assert config.spec.serving.host == "shared"
    assert config.spec.serving.replica_bounds.max == 2
    assert load_pipeline_text(GOOD, "p.yaml").spec.serving.host is None


@pytest.mark.parametrize(
    ("serving", "expect"),
    [
        (
            "{host: shared, runtime_env: {pip: [six]}}",
            "serving.runtime_env is {'pip': ['six'], 'env_vars': {}, 'working_dir': None} but "
            "serving.host is 'shared': a shared process has one Python environment; drop it, or "
            "drop serving.host to run the pipeline in replicas of its own",
        ),
        (
            "{host: shared, memory_mb: 512}",
            "serving.memory_mb is 512 but serving.host is 'shared': memory is reserved per process",
        ),
        (
            "{host: shared, num_cpus: 0.5}",
            "serving.num_cpus is 0.5 but serving.host is 'shared': CPUs are reserved per process",
        ),
        (
            "{host: shared, source_placement: actor}",
            "serving.source_placement is 'actor' but serving.host is 'shared': a host runs its "
            "members' sources",
        ),
        (
            "{host: shared, replicas: {min: 0, max: 1}}",
            "serving.replicas is {min: 0, max: 1} but serving.host is 'shared': a host runs a "
            "fixed replica count shared by its members (no scale to zero, no autoscaling); give "
            "replicas: N (N >= 1), or drop it",
        ),
        (
            "{host: shared, replicas: {min: 1, max: 4}, autoscaling: {}}",
            "serving.autoscaling is {",
        ),
        (
            "{host: shared, replicas: {min: 1, max: 4}}",
            "serving.replicas is {min: 1, max: 4} but serving.host is 'shared'",
        ),
    ],
)
def test_settings_a_shared_process_cannot_hold_are_rejected_with_the_fix(
    serving: str, expect: str
) -> None:
    found = problems(with_serving(serving))
    assert len(found) == 1, found
    assert found[0].startswith("p.yaml:")
    assert expect in found[0]


@pytest.mark.parametrize("host", ["Shared", "1host", "a" * 44, "has_underscore", ""])
def test_bad_host_names_are_rejected(host: str) -> None:
    found = problems(with_serving(f"{{host: {host!r}}}"))
    assert any("serving.host: must match ^[a-z][a-z0-9-]{0,42}$" in p for p in found), found


def test_pipeline_name_may_not_take_a_host_application_name() -> None:
    found = problems(GOOD.replace("orders}", "host-shared}"))
    assert found == [
        "p.yaml:3:18: metadata.name: must not start with 'host-' (its Serve application "
        "eventbus-host-shared would clash with the one of host 'shared'); got 'host-shared'; "
        "rename the pipeline, e.g. 'shared-pipeline'"
    ]
