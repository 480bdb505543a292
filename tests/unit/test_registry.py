"""The component registry: built-ins in order, lookups with hints, entry-point plugins and
what happens when one is broken (each test builds its own registry and its own fake installed
distributions on sys.path)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventbus.errors import UnknownComponentError
from eventbus.pipelines import load_pipeline_text
from eventbus.registry import Registry, sinks, sources, steps


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("ebtest_")]:
        del sys.modules[name]


def install(site: Path, dist: str, group: str, entry: str, module: str, code: str) -> None:
    """A fake installed distribution: its module and a dist-info with one entry point."""
    (site / f"{module}.py").write_text(textwrap.dedent(code))
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry} = {module}\n")


def test_builtins_in_their_order() -> None:
    assert steps.names()[:8] == [
        "filter",
        "convert",
        "function",
        "join",
        "aggregate",
        "allocate",
        "model",
        "ensemble",
    ]
    assert sources.names()[:5] == ["kafka", "http", "grpc", "schedule", "pipeline"]
    assert sinks.names()[:3] == ["kafka", "http", "pipeline"]
    assert all(r.origin == "builtin" for r in steps if r.name in steps.names()[:8])


def test_unknown_kind_names_the_closest() -> None:
    with pytest.raises(
        UnknownComponentError, match=r"unknown step kind 'joinn' \(did you mean 'join'\?\)"
    ):
        steps.get("joinn")


def test_a_plugin_registers_through_its_entry_point(site: Path) -> None:
    install(
        site,
        "eb-good",
        "ebtest.steps",
        "shout",
        "ebtest_good",
        """
        from pydantic import BaseModel
        from eventbus.registry import Registration
        from ebtest_reg import REG
        class ShoutConfig(BaseModel):
            word: str = "hey"
        @REG.register("shout", config=ShoutConfig, description="Shout.")
        def build(step_id, config, context):
            return None
    """,
    )
    reg = Registry("step", "ebtest.steps", {})
    (site / "ebtest_reg.py").write_text("REG = None\n")
    import ebtest_reg  # type: ignore[import-not-found]

    ebtest_reg.REG = reg
    assert reg.names() == ["shout"]
    assert reg.get("shout").origin == "eb-good"
    assert reg.problems() == []


def test_a_plugin_that_fails_to_import_is_reported_not_raised(site: Path) -> None:
    install(
        site, "eb-broken", "ebtest.steps", "broken", "ebtest_broken", "import not_a_module_at_all\n"
    )
    reg = Registry("step", "ebtest.steps", {})
    assert reg.names() == []
    [problem] = reg.problems()
    assert problem.distribution == "eb-broken" and problem.name == "broken"
    assert "ModuleNotFoundError" in problem.error and "ebtest_broken" in problem.error
    with pytest.raises(
        UnknownComponentError, match="comes from plugin 'eb-broken', which could not be loaded"
    ):
        reg.get("broken")


def test_a_plugin_taking_a_builtin_name_is_refused(site: Path) -> None:
    install(
        site,
        "eb-thief",
        "ebtest.steps",
        "filter",
        "ebtest_thief",
        """
        from ebtest_reg2 import REG
        @REG.register("filter", config=dict, description="Not the real filter.")
        def build(step_id, config, context):
            return None
    """,
    )
    (site / "ebtest_builtin.py").write_text(
        textwrap.dedent("""
        from ebtest_reg2 import REG
        @REG.register("filter", config=str, description="The real one.")
        def build(step_id, config, context):
            return None
    """)
    )
    (site / "ebtest_reg2.py").write_text("REG = None\n")
    import ebtest_reg2  # type: ignore[import-not-found]

    reg = Registry("step", "ebtest.steps", {"filter": "ebtest_builtin"})
    ebtest_reg2.REG = reg
    assert reg.get("filter").description == "The real one."
    [problem] = reg.problems()
    assert problem.distribution == "eb-thief"
    assert "already registered" in problem.error


def test_an_entry_point_that_registers_nothing_is_reported(site: Path) -> None:
    install(site, "eb-empty", "ebtest.sinks", "void", "ebtest_empty", "X = 1\n")
    reg = Registry("sink", "ebtest.sinks", {})
    assert reg.names() == []
    [problem] = reg.problems()
    assert "registered no sink kind named 'void'" in problem.error


def test_kind_names_must_be_snake_case() -> None:
    reg = Registry("step", None, {})
    with pytest.raises(ValueError, match="must be snake_case"):
        reg.register("Bad-Name", config=str)(lambda *a: None)


def test_the_example_plugin_is_registered_with_its_distribution() -> None:
    assert steps.get("redact").origin == "eventbus-example-plugin"
    assert sinks.get("jsonl").origin == "eventbus-example-plugin"


def test_a_missing_plugin_kind_in_yaml_is_a_positioned_problem() -> None:
    from eventbus.errors import PipelineConfigError

    text = textwrap.dedent("""\
        apiVersion: eventbus/v1
        kind: Pipeline
        metadata: {name: p}
        spec:
          sources: [{kafka: {topic: a}}]
          steps:
            - id: s
              redactt: {fields: [x]}
          sink: {kafka: {topic: b}}
        """)
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_text(text, "p.yaml")
    assert (
        "p.yaml:8:16: spec.steps[0].redactt: field not recognised (did you mean 'redact'?)"
        in str(info.value)
    )


def test_a_factory_that_raises_or_returns_junk_names_the_step_and_kind() -> None:
    from eventbus.errors import ConfigError
    from eventbus.pipelines import StepConfig, build_step

    config = StepConfig.model_validate({"id": "s", "redact": {"fields": ["x"]}})
    kind = steps.get("redact")
    original = kind.factory

    def boom(step_id: str, cfg: object, context: object) -> object:
        raise ZeroDivisionError("plugin bug")

    try:
        object.__setattr__(kind, "factory", boom)
        with pytest.raises(
            ConfigError,
            match=r"step 's' of kind 'redact' \(eventbus-example-plugin: .*ZeroDivisionError: plugin bug",
        ):
            build_step(config)
        object.__setattr__(kind, "factory", lambda *a: "not a step")
        with pytest.raises(TypeError, match="built str for step 's'; a step factory returns"):
            build_step(config)
    finally:
        object.__setattr__(kind, "factory", original)


def test_concurrent_first_lookups_all_see_every_kind(site: Path) -> None:
    import threading

    (site / "ebtest_slow_reg.py").write_text("REG = None\n")
    import ebtest_slow_reg  # type: ignore[import-not-found]

    (site / "ebtest_slow.py").write_text(
        textwrap.dedent("""
        import time
        from ebtest_slow_reg import REG
        time.sleep(0.3)  # a slow import: the other threads ask meanwhile
        for name in ("a", "b", "c"):
            REG.register(name, config=str, description=name)(lambda *a: None)
        """)
    )
    reg = Registry("step", None, {"a": "ebtest_slow", "b": "ebtest_slow", "c": "ebtest_slow"})
    ebtest_slow_reg.REG = reg
    seen: list[list[str]] = []
    threads = [threading.Thread(target=lambda: seen.append(reg.names())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [["a", "b", "c"]] * 8
