"""JSONata's Pratt parser (after jsonata-js ``parser.js``): tokens to a raw syntax tree, which
:mod:`eventbus.jsonata._ast` then reshapes into paths, predicates and stages."""

from __future__ import annotations

from typing import Any

from eventbus.jsonata._errors import fail
from eventbus.jsonata._lexer import OPERATORS, Lexer, Token
from eventbus.jsonata._signature import Signature

__all__ = ["MAX_NESTING", "Node", "parse_raw"]

#: deepest nesting the parser accepts: brackets, prefix operators and each operator of a
#: chain (``a + b + c`` nests left-deep) count one level (keeps the Python stack safe)
MAX_NESTING = 500

#: symbols that end an expression (binding power 0 in jsonata-js's symbol table)
_TERMINATORS = frozenset([":", ";", ",", ")", "]", "}", "..", "|"])
_INFIX = frozenset(
    ["+", "-", "*", "/", "%", "=", "<", ">", "!=", "<=", ">=", "&", "and", "or", "in",
     "~>", "."]
)  # fmt: skip


class Node:
    """A syntax-tree node; attributes vary by ``type`` (as jsonata-js's plain objects)."""

    def __init__(self, type: str, value: Any = None, position: int = 0, **kw: Any) -> None:
        self.type = type
        self.value = value
        self.position = position
        self.__dict__.update(kw)

    def __getattr__(self, name: str) -> Any:  # attributes vary by node type
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__[name] = value

    def get(self, name: str, default: Any = None) -> Any:
        """An optional attribute."""
        return self.__dict__.get(name, default)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Node({self.__dict__})"


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.lexer = Lexer(source)
        self.depth = 0
        self.token: Token = Token("operator", "(start)", 0)
        self.advance()

    @property
    def id(self) -> Any:
        t = self.token
        return t.value if t.type in ("operator", "end") else f"({t.type})"

    def advance(self, expect: str | None = None, infix: bool = False) -> Token:
        t = self.token
        if expect is not None and not (t.type in ("operator", "end") and t.value == expect):
            if t.type == "end":
                raise fail(
                    "S0203", f"Expected {expect!r} before end of expression", t.position, expect
                )
            raise fail("S0202", f"Expected {expect!r}, got {t.value!r}", t.position, t.value)
        nxt = self.lexer.next(infix)
        if nxt is None:
            self.token = Token("end", "(end)", len(self.source))
        else:
            if nxt.type == "operator" and nxt.value in ("!", "~"):
                raise fail("S0204", f"Unknown operator: {nxt.value!r}", nxt.position, nxt.value)
            self.token = nxt
        return t

    def lbp(self) -> int:
        t = self.token
        if t.type != "operator" or t.value in _TERMINATORS:
            return 0
        return OPERATORS.get(t.value, 0)

    def expression(self, rbp: int) -> Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            msg = f"Expression nested deeper than {MAX_NESTING} levels; split it into variables"
            raise fail("U1002", msg, self.token.position)
        start = self.depth
        t = self.advance(None, True)
        left = self.nud(t)
        while rbp < self.lbp():
            self.depth += 1
            if self.depth > MAX_NESTING:
                msg = f"Expression nested deeper than {MAX_NESTING} levels; split it into variables"
                raise fail("U1002", msg, self.token.position)
            t = self.advance()
            left = self.led(t, left)
        self.depth = start - 1
        return left

    # --- prefix positions -------------------------------------------------------------------
    def nud(self, t: Token) -> Node:
        ty, v, pos = t
        if ty in ("string", "number", "value", "variable", "regex", "name"):
            return Node(ty, v, pos)
        if ty == "end":
            raise fail("S0207", "Unexpected end of expression", pos)
        if v == "-":
            return Node("unary", "-", pos, expression=self.expression(70))
        if v == "*":
            return Node("wildcard", "*", pos)
        if v == "**":
            return Node("descendant", "**", pos)
        if v == "%":
            return Node("parent", "%", pos)
        if v in ("and", "or", "in"):
            return Node("name", v, pos)
        if v == "?":
            return Node("operator", "?", pos)
        if v == "(":
            exprs: list[Node] = []
            while self.id != ")":
                exprs.append(self.expression(0))
                if self.id != ";":
                    break
                self.advance(";")
            self.advance(")", True)
            return Node("block", None, pos, expressions=exprs)
        if v == "[":
            items: list[Node] = []
            if self.id != "]":
                while True:
                    item = self.expression(0)
                    if self.id == "..":
                        rpos = self.token.position
                        self.advance("..")
                        item = Node("binary", "..", rpos, lhs=item, rhs=self.expression(0))
                    items.append(item)
                    if self.id != ",":
                        break
                    self.advance(",")
            self.advance("]", True)
            return Node("unary", "[", pos, expressions=items)
        if v == "{":
            return Node("unary", "{", pos, lhs=self.object_pairs())
        if v == "|":
            pattern = self.expression(0)
            self.advance("|")
            update = self.expression(0)
            delete = None
            if self.id == ",":
                self.advance(",")
                delete = self.expression(0)
            self.advance("|")
            return Node("transform", None, pos, pattern=pattern, update=update, delete=delete)
        raise fail("S0211", f"The symbol {v!r} cannot be used as a unary operator", pos, v)

    def object_pairs(self) -> list[tuple[Node, Node]]:
        pairs: list[tuple[Node, Node]] = []
        if self.id != "}":
            while True:
                key = self.expression(0)
                self.advance(":")
                pairs.append((key, self.expression(0)))
                if self.id != ",":
                    break
                self.advance(",")
        self.advance("}", True)
        return pairs

    # --- infix positions ----------------------------------------------------------------------
    def led(self, t: Token, left: Node) -> Node:
        _, v, pos = t
        if t.type != "operator":
            raise fail("S0201", f"Syntax error: {v!r}", pos, v)
        bp = OPERATORS[v]
        if v in _INFIX:
            return Node("binary", v, pos, lhs=left, rhs=self.expression(bp))
        if v == "??":
            return Node("coalesce", v, pos, lhs=left, rhs=self.expression(0))
        if v == "?:":
            return Node("elvis", v, pos, lhs=left, rhs=self.expression(0))
        if v == "(":
            return self.call(left, pos)
        if v == "[":
            if self.id == "]":
                step = left
                while step.type == "binary" and step.value == "[":
                    step = step.lhs
                step.keepArray = True
                self.advance("]")
                return left
            rhs = self.expression(OPERATORS["]"])
            self.advance("]", True)
            return Node("binary", "[", pos, lhs=left, rhs=rhs)
        if v == "^":
            self.advance("(")
            terms: list[tuple[bool, Node]] = []
            while True:
                descending = False
                if self.id == "<":
                    self.advance("<")
                elif self.id == ">":
                    descending = True
                    self.advance(">")
                terms.append((descending, self.expression(0)))
                if self.id != ",":
                    break
                self.advance(",")
            self.advance(")")
            return Node("binary", "^", pos, lhs=left, rhs=terms)
        if v == "{":
            return Node("binary", "{", pos, lhs=left, rhs=self.object_pairs())
        if v == ":=":
            if left.type != "variable":
                raise fail(
                    "S0212", "The left side of := must be a variable name (start with $)", pos, v
                )
            return Node("binary", ":=", pos, lhs=left, rhs=self.expression(bp - 1))
        if v in ("@", "#"):
            rhs = self.expression(bp)
            if rhs.type != "variable":
                msg = f"The right side of {v} must be a variable name (start with $)"
                raise fail("S0214", msg, rhs.position, v)
            return Node("binary", v, pos, lhs=left, rhs=rhs)
        if v == "?":
            then = self.expression(0)
            other = None
            if self.id == ":":
                self.advance(":")
                other = self.expression(0)
            return Node("condition", None, pos, condition=left, then=then, other=other)
        raise fail("S0201", f"Syntax error: {v!r}", pos, v)

    def call(self, left: Node, pos: int) -> Node:
        args: list[Node] = []
        partial = False
        if self.id != ")":
            while True:
                if self.token.type == "operator" and self.token.value == "?":
                    partial = True
                    args.append(Node("operator", "?", self.token.position))
                    self.advance("?")
                else:
                    args.append(self.expression(0))
                if self.id != ",":
                    break
                self.advance(",")
        self.advance(")", True)
        if left.type == "name" and left.value in ("function", "\u03bb"):
            for a in args:
                if a.type != "variable":
                    raise fail(
                        "S0208",
                        f"Parameter {a.value!r} of function definition must be a variable name (start with $)",
                        a.position,
                        a.value,
                    )
            signature = None
            if self.id == "<":
                sig_pos = self.token.position
                depth = 1
                sig = "<"
                while depth > 0 and self.id not in ("{", "(end)"):
                    tok = self.advance()
                    if self.id == ">":
                        depth -= 1
                    elif self.id == "<":
                        depth += 1
                    sig += str(self.token.value) if self.token.type != "end" else ""
                    del tok
                self.advance(">")
                signature = Signature(sig, sig_pos)
            self.advance("{")
            body = self.expression(0)
            self.advance("}")
            return Node("lambda", None, pos, arguments=args, signature=signature, body=body)
        kind = "partial" if partial else "function"
        return Node(kind, "(", pos, procedure=left, arguments=args)


def parse_raw(source: str) -> Node:
    """Parse ``source`` into the raw tree; :class:`JSONataError` on a syntax error."""
    p = _Parser(source)
    tree = p.expression(0)
    if p.token.type != "end":
        t = p.token
        raise fail("S0201", f"Syntax error: {t.value!r}", t.position, t.value)
    return tree
