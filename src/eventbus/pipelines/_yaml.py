"""Parse user YAML (pipelines, ``eventbus test`` case files) with anchors and aliases refused.

An alias lets a few hundred bytes stand for an exponentially large document (the "billion
laughs"): PyYAML shares the aliased node, but everything that walks the data afterwards
(pydantic, the loader's checks, JSON encoding) pays for the expansion; a 712-byte document
took 25 s to validate inside the controller's lock. Pipeline files gain little from anchors,
so every anchor and alias is refused at its position, before anything is built from it.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError

__all__ = ["MAX_YAML_DEPTH", "YAMLAliasError", "YAMLDepthError", "load_yaml"]

#: Nested collections a document may hold: PyYAML composes recursively (three frames a
#: level), so a deeper document would end in a RecursionError instead of a positioned error.
MAX_YAML_DEPTH = 100

_WHY = (
    "YAML anchors and aliases are not allowed in EventBus pipeline and test files "
    "(an alias can expand exponentially); write the value out in full where it is used"
)


class YAMLAliasError(ComposerError):
    """An anchor or alias in user YAML; ``problem_mark`` is its position."""


class YAMLDepthError(ComposerError):
    """User YAML nested deeper than :data:`MAX_YAML_DEPTH`; ``problem_mark`` is where."""


class _NoAliasLoader(yaml.SafeLoader):
    """The safe loader, refusing the first anchor or alias it meets, and documents nested
    deeper than :data:`MAX_YAML_DEPTH`."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        anchor = getattr(event, "anchor", None)  # set on every alias, and on anchored nodes
        if anchor is not None:
            what = f"alias *{anchor}" if isinstance(event, yaml.AliasEvent) else f"anchor &{anchor}"
            problem = f"{what}: {_WHY}"
            raise YAMLAliasError(None, None, problem, event.start_mark)
        if self._depth >= MAX_YAML_DEPTH:
            problem = f"the document nests deeper than {MAX_YAML_DEPTH} levels; flatten it"
            raise YAMLDepthError(None, None, problem, event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, filename: str = "<yaml>") -> tuple[yaml.Node | None, Any]:
    """Compose and construct one YAML document, refusing anchors and aliases.

    Args:
        text: the document.
        filename: the name marks carry (``problem_mark.name``).

    Returns:
        The node tree (positions for error messages; None for an empty document) and the data.

    Raises:
        yaml.YAMLError: the text is not YAML, or holds an anchor or alias
            (:class:`YAMLAliasError`, a ``MarkedYAMLError``).
    """
    loader = _NoAliasLoader(text)
    loader.name = filename
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    return node, data
