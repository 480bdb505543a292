"""Load pipeline YAML with every problem reported at once, by position.

Problems come out one per line as ``file:line:col: path: message`` (Benthos lint style). The
positions come from ``yaml.compose`` node marks looked up by the pydantic error ``loc``,
skipping the loc segments that are not in the data (union branch tags).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from eventbus.errors import FunctionError, PipelineConfigError
from eventbus.pipelines._config import PipelineConfig
from eventbus.pipelines._routes_config import MISSING_SINK
from eventbus.pipelines._yaml import load_yaml

__all__ = ["Problem", "load_pipeline", "load_pipeline_text", "validate_pipeline_text"]


@dataclass(frozen=True)
class Problem:
    """One problem in a pipeline document, with its position (1-based)."""

    file: str
    line: int
    col: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.path}: {self.message}"


def load_pipeline(path: str | Path, *, check_functions: bool = True) -> PipelineConfig:
    """Read, parse and validate a pipeline file.

    Args:
        path: the YAML file.
        check_functions: also import every ``function:`` reference.

    Returns:
        The validated pipeline.

    Raises:
        PipelineConfigError: listing every problem as ``file:line:col: path: message``.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"{p}:1:1: file: cannot read pipeline file ({exc.strerror or exc})"
        raise PipelineConfigError([msg]) from exc
    return load_pipeline_text(text, str(p), check_functions=check_functions)


def load_pipeline_text(
    text: str, filename: str = "<pipeline>", *, check_functions: bool = True, base_dir: str = ""
) -> PipelineConfig:
    """Parse and validate pipeline YAML text; see :func:`validate_pipeline_text`."""
    config, problems = validate_pipeline_text(
        text, filename, check_functions=check_functions, base_dir=base_dir
    )
    if problems or config is None:
        raise PipelineConfigError([str(p) for p in problems])
    return config


def validate_pipeline_text(
    text: str, filename: str = "<pipeline>", *, check_functions: bool = True, base_dir: str = ""
) -> tuple[PipelineConfig | None, list[Problem]]:
    """Validate pipeline YAML and return the pipeline (if valid) and every problem found;
    relative file references (``value_schema_file``) from ``base_dir``, else ``filename``'s."""
    try:
        root, data = load_yaml(text, filename)  # anchors and aliases refused (alias bombs)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        return None, [Problem(filename, line, col, "yaml", f"{exc.problem or exc}")]
    except yaml.YAMLError as exc:
        return None, [Problem(filename, 1, 1, "yaml", str(exc))]
    if not isinstance(data, dict) or root is None:
        got = type(data).__name__ if data is not None else "an empty document"
        return None, [
            Problem(
                filename,
                1,
                1,
                "document",
                f"a pipeline is a YAML mapping with apiVersion, kind, metadata, spec; got {got}",
            )
        ]
    problems = _semantic_problems(data, root, filename, check_functions=check_functions)
    try:
        base_dir = base_dir or str(Path(filename).parent)  # "<pipeline>": the working directory
        config = PipelineConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        problems = _validation_problems(exc, data, root, filename) + problems
        unique = {(p.path, p.message): p for p in reversed(problems)}  # first of each kept
        problems = list(unique.values())
        problems.sort(key=lambda p: (p.line, p.col))
        return None, problems
    return (None if problems else config), problems


# -- pydantic errors -> positioned problems ------------------------------------------------


def _validation_problems(
    exc: ValidationError, data: Any, root: yaml.Node, filename: str
) -> list[Problem]:
    out: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for err in exc.errors(include_url=False):
        resolved = _resolve_loc(err["loc"], data, root)
        if resolved is None:
            continue  # an error of a union branch that does not match the data's shape
        path, node, value, present = resolved
        message = _message(err, value, present)
        located = _located_lines(err, message, root, filename)
        if located:  # a cross-field check that found several problems, each with its path
            for problem in located:
                if (problem.path, problem.message) not in seen:
                    seen.add((problem.path, problem.message))
                    out.append(problem)
            continue
        if (path, message) in seen:
            continue
        seen.add((path, message))
        mark = node.start_mark
        out.append(Problem(filename, mark.line + 1, mark.column + 1, path or "document", message))
    if not out:  # every error was a union branch; report them unfiltered rather than nothing
        for err in exc.errors(include_url=False):
            out.append(
                Problem(
                    filename,
                    root.start_mark.line + 1,
                    root.start_mark.column + 1,
                    "document",
                    err["msg"],
                )
            )
    out.sort(key=lambda p: (p.line, p.col))
    return out


#: ``routes[1].sinks[0]: message``: a line of a cross-field check, led by its relative path.
_LINE_PATH = re.compile(r"^([a-z_]+(?:\[\d+\]|\.[a-z_][a-z0-9_]*)*): (.+)$", re.DOTALL)
_SEGMENT = re.compile(r"\[(\d+)\]|\.?([a-z_][a-z0-9_]*)")


def _located_lines(err: Any, message: str, root: yaml.Node, filename: str) -> list[Problem]:
    """Problems of a model validator's message whose lines each start with a path relative
    to the model (``route_problems``), positioned at that path; [] for other messages."""
    if err["type"] != "value_error":
        return []
    out = []
    for line in message.split("\n"):
        m = _LINE_PATH.match(line)
        if m is None:
            return []
        rel: list[int | str] = [int(i) if i else k for i, k in _SEGMENT.findall(m.group(1))]
        loc = (*err["loc"], *rel)
        out.append(_problem_at(root, filename, loc, m.group(2)))
    return out


_SCALAR_TAGS = {"str": str, "constrained-str": str, "int": int, "float": float, "bool": bool}


def _resolve_loc(
    loc: tuple[int | str, ...], data: Any, root: yaml.Node
) -> tuple[str, yaml.Node, Any, bool] | None:
    """Walk ``loc`` through data and nodes; None when a branch tag contradicts the data."""
    path = ""
    node: yaml.Node = root
    value: Any = data
    present = True
    for seg in loc:
        if isinstance(value, dict) and isinstance(seg, str) and seg in value:
            value = value[seg]
            node = _child(node, seg) or node
            path = f"{path}.{seg}" if path else seg
        elif isinstance(value, list) and isinstance(seg, int) and 0 <= seg < len(value):
            value = value[seg]
            node = _child(node, seg) or node
            path = f"{path}[{seg}]"
        elif isinstance(seg, str) and (seg in _SCALAR_TAGS or seg[:1].isupper() or "[" in seg):
            # A union tag: keep only the branch matching the data's shape.
            if seg in _SCALAR_TAGS and not isinstance(value, _SCALAR_TAGS[seg]):
                return None
            if seg[:1].isupper() and not isinstance(value, dict):
                return None
        elif isinstance(value, dict) and isinstance(seg, str):
            # A missing field (or an alias like 'not'): name it under its parent.
            key = seg.rstrip("_") if seg.endswith("_") else seg
            path = f"{path}.{key}" if path else key
            present = False
            value = None
        else:
            continue
    return path, node, value, present


def _child(node: yaml.Node, seg: int | str) -> yaml.Node | None:
    key_node: yaml.Node
    value_node: yaml.Node
    if isinstance(node, yaml.MappingNode) and isinstance(seg, str):
        for key_node, value_node in node.value:
            if getattr(key_node, "value", None) == seg:
                # Point at the key for extra fields, at the value otherwise (see _message).
                return (
                    value_node
                    if not isinstance(value_node, yaml.ScalarNode) or value_node.value != ""
                    else key_node
                )
    if isinstance(node, yaml.SequenceNode) and isinstance(seg, int) and seg < len(node.value):
        item: yaml.Node = node.value[seg]
        return item
    return None


def _all_field_names() -> list[str]:
    names: set[str] = set()
    stack: list[type[BaseModel]] = [PipelineConfig]
    seen: set[type[BaseModel]] = set()
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            names.add(field.alias or name)
            for arg in _model_args(field.annotation):
                stack.append(arg)
    return sorted(names)


def _model_args(annotation: Any) -> list[type[BaseModel]]:
    out: list[type[BaseModel]] = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    for arg in getattr(annotation, "__args__", ()) or ():
        out.extend(_model_args(arg))
    meta = getattr(annotation, "__origin__", None)
    if meta is not None and isinstance(meta, type) and issubclass(meta, BaseModel):
        out.append(meta)
    return out


def _broken_plugin(name: str) -> str | None:
    """The message for a key that a plugin failed to register, if one did."""
    from eventbus.registry import all_registries

    for family, kinds in all_registries().items():
        for problem in kinds.problems():
            if problem.name == name:
                return (
                    f"{family} kind {name!r} comes from plugin {problem.distribution!r}, "
                    f"which could not be loaded: {problem.error}"
                )
    return None


def _message(err: Any, value: Any, present: bool) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        name = str(err["loc"][-1])
        broken = _broken_plugin(name)
        if broken is not None:
            return broken
        close = difflib.get_close_matches(name, _all_field_names(), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"field not recognised{hint}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}; got {value!r}"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}; got {value!r}"
    if kind == "value_error":
        msg = str(err["msg"])
        return msg.removeprefix("Value error, ")
    text = str(err["msg"])
    text = text[0].lower() + text[1:] if text else text
    return f"{text}; got {value!r}" if present and not isinstance(value, (dict, list)) else text


# -- semantic checks: CEL expressions and function references -------------------------------


def _semantic_problems(
    data: dict[str, Any], root: yaml.Node, filename: str, *, check_functions: bool
) -> list[Problem]:
    """Compile every CEL expression and import every function, on the raw data, so that these
    problems are reported together with the schema problems."""
    spec = data.get("spec")
    problems: list[Problem] = []
    if isinstance(spec, dict) and "sink" not in spec and "sinks" not in spec:
        # reported with the schema's problems (a model validator runs only when they are none)
        at = _problem_at(root, filename, ("spec",), MISSING_SINK)
        problems.append(Problem(at.file, at.line, at.col, "spec.sink", MISSING_SINK))
    steps = spec.get("steps") if isinstance(spec, dict) else None
    if not isinstance(steps, list):
        return problems
    from eventbus.registry import steps as kinds

    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        step_id = str(step.get("id", i))
        for key, raw in step.items():
            if key in ("id", "retries") or key not in kinds:
                continue
            kind = kinds.get(key)
            expressions = kind.trait("expressions")
            for rel_loc, source, output in expressions(raw) if expressions else ():
                loc = ("spec", "steps", i, key, *rel_loc)
                problem = _check_expression(source, loc, root, filename, step_id, output=output)
                if problem is not None:
                    problems.append(problem)
            imports = kind.trait("imports")
            for rel_loc, ref in imports(raw) if imports and check_functions else ():
                from eventbus.functions import resolve_function

                try:
                    resolve_function(ref)
                except FunctionError as exc:
                    loc = ("spec", "steps", i, key, *rel_loc)
                    problems.append(_problem_at(root, filename, loc, f"step {step_id!r}: {exc}"))
    return problems


def _check_expression(
    source: str,
    loc: tuple[int | str, ...],
    root: yaml.Node,
    filename: str,
    step_id: str,
    *,
    output: bool | str = False,
) -> Problem | None:
    from eventbus.pipelines._languages import (
        EXPRESSION_ERRORS,
        check_expression_source,
        error_message,
        error_position,
    )

    try:
        check_expression_source(source, output)
    except EXPRESSION_ERRORS as exc:
        node = _node_at(root, loc)
        col_in_expr, at = error_position(exc)
        line, col = node.start_mark.line + 1, node.start_mark.column + 1
        style = getattr(node, "style", None)
        if isinstance(node, yaml.ScalarNode) and style in (None, "'", '"') and "\n" not in source:
            col += col_in_expr - 1 + (1 if style in ("'", '"') else 0)
        where = f"line {at}, column" if at not in (None, 1) else "column"
        return Problem(
            filename,
            line,
            col,
            _path(loc),
            f"step {step_id!r}: {error_message(exc)} ({where} {col_in_expr} of the expression)",
        )
    return None


def _problem_at(
    root: yaml.Node, filename: str, loc: tuple[int | str, ...], message: str
) -> Problem:
    node = _node_at(root, loc)
    return Problem(
        filename, node.start_mark.line + 1, node.start_mark.column + 1, _path(loc), message
    )


def _node_at(root: yaml.Node, loc: tuple[int | str, ...]) -> yaml.Node:
    node = root
    for seg in loc:
        child = _child(node, seg)
        if child is None:
            break
        node = child
    return node


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for seg in loc:
        out = f"{out}[{seg}]" if isinstance(seg, int) else (f"{out}.{seg}" if out else str(seg))
    return out
