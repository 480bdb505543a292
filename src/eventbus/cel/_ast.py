"""CEL abstract syntax tree (macros already expanded by the parser)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "And",
    "Binary",
    "Block",
    "Call",
    "Comprehension",
    "Cond",
    "Ident",
    "Index",
    "ListLit",
    "Lit",
    "MapLit",
    "Node",
    "Or",
    "Select",
    "Unary",
]


@dataclass(eq=False, slots=True)
class Node:
    """Base node; ``pos`` is the 0-based offset of the node's token in the source."""

    pos: int


@dataclass(eq=False, slots=True)
class Lit(Node):
    """A literal: None, bool, int, UInt, float, str or bytes."""

    value: object


@dataclass(eq=False, slots=True)
class Ident(Node):
    """A (possibly qualified, for block slots) identifier reference."""

    name: str


@dataclass(eq=False, slots=True)
class Select(Node):
    """``operand.field``; ``test_only`` for ``has()``; ``optional`` for ``.?field``."""

    operand: Node
    field: str
    test_only: bool = False
    optional: bool = False


@dataclass(eq=False, slots=True)
class Index(Node):
    """``operand[index]``, or ``operand[?index]`` when ``optional``."""

    operand: Node
    index: Node
    optional: bool = False


@dataclass(eq=False, slots=True)
class Call(Node):
    """A function call; ``target`` is the receiver of a method-style call."""

    name: str
    target: Node | None
    args: list[Node]


@dataclass(eq=False, slots=True)
class Unary(Node):
    """``!x`` (op ``!``) or ``-x`` (op ``-``)."""

    op: str
    operand: Node


@dataclass(eq=False, slots=True)
class Binary(Node):
    """Arithmetic, comparison and ``in`` operators."""

    op: str
    left: Node
    right: Node


@dataclass(eq=False, slots=True)
class And(Node):
    """``a && b && ...``: flattened conjunction."""

    terms: list[Node]


@dataclass(eq=False, slots=True)
class Or(Node):
    """``a || b || ...``: flattened disjunction."""

    terms: list[Node]


@dataclass(eq=False, slots=True)
class Cond(Node):
    """``cond ? then : otherwise``."""

    cond: Node
    then: Node
    otherwise: Node


@dataclass(eq=False, slots=True)
class ListLit(Node):
    """``[a, ?b]``: ``optional`` holds the indices of ``?``-marked elements."""

    items: list[Node]
    optional: frozenset[int] = frozenset()


@dataclass(eq=False, slots=True)
class MapLit(Node):
    """``{k: v, ?k2: v2}``: entries of (key, value, optional)."""

    entries: list[tuple[Node, Node, bool]]


@dataclass(eq=False, slots=True)
class Comprehension(Node):
    """An expanded macro over ``range``.

    ``kind`` is one of all, exists, exists_one, map, filter, transformList,
    transformMap, transformMapEntry, bind (``range`` is the bound value and
    ``var`` its name), optMap, optFlatMap.
    """

    kind: str
    range: Node
    var: str
    var2: str | None
    body: Node
    pred: Node | None = None


@dataclass(eq=False, slots=True)
class Block(Node):
    """``cel.block([slot0, slot1, ...], body)``: slots named ``@index0``..."""

    slots: list[Node] = field(default_factory=list)
    body: Node | None = None
