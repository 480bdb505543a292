"""CESQL parser: tokens to a small AST, by precedence climbing without deep recursion.

Precedence follows the spec's ANTLR grammar (``CESQLParser.g4``), highest first: function
calls and literals; unary ``NOT`` and ``-``; ``LIKE``/``IN`` (and their ``NOT`` forms);
``* / %``; ``+ -``; comparisons; ``AND``/``OR``/``XOR`` (one level, right-associative).
Chains of one operator become one n-ary node, so a long ``a OR b OR c ...`` costs no depth;
nesting (parentheses, unary operators, calls, alternating operators) is bounded by
:data:`MAX_DEPTH`, well inside Python's recursion limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from eventbus.cesql._errors import CESQLError
from eventbus.cesql._lexer import Token, error, tokenize
from eventbus.cesql._values import Like

__all__ = ["MAX_DEPTH", "Node", "parse"]

#: Nesting levels an expression may have (parentheses, NOT, -, calls, operator changes).
MAX_DEPTH: Final = 48
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1
_ATTRIBUTE = re.compile(r"[A-Za-z0-9]+")
_FUNCTION = re.compile(r"[A-Za-z][A-Za-z_]*")

_LOGIC: Final = frozenset({"AND", "OR", "XOR"})
_COMPARE: Final = frozenset({"=", "!=", "<>", "<", "<=", ">", ">="})
_ADD: Final = frozenset({"+", "-"})
_MUL: Final = frozenset({"*", "/", "%"})


@dataclass(slots=True)
class Node:
    """One AST node.

    ``op``: ``lit`` (``value``), ``attr`` (``value``: the lower-cased name), ``exists``,
    ``not``, ``neg``, ``logic`` (``value``: AND/OR/XOR over ``args``), ``fold`` (``value``:
    the operators between ``args``, applied left to right), ``like`` (``value``: the
    compiled pattern), ``in`` (``args[0]`` in ``args[1:]``), ``call`` (``value``: the upper-cased
    name). ``negate``: ``NOT LIKE``/``NOT IN``. ``type``: bool, int, str or any.
    """

    op: str
    pos: int
    value: Any = None
    args: tuple[Node, ...] = ()
    negate: bool = False
    type: str = "any"
    depth: int = 1
    #: characters a growing function's result may have (set by the compiler)
    limit: int = 0


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.i = 0
        self.nesting = 0

    def peek(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def fail(self, tok: Token, expected: str) -> CESQLError:
        got = "the end of the expression" if tok.kind == "EOF" else repr(tok.text)
        return error(f"expected {expected}; got {got}", self.source, tok.pos)

    def expect(self, kind: str, expected: str) -> Token:
        tok = self.take()
        if tok.kind != kind:
            raise self.fail(tok, expected)
        return tok

    def node(self, op: str, pos: int, args: tuple[Node, ...] = (), **kw: Any) -> Node:
        depth = 1 + max((a.depth for a in args), default=0)
        if depth > MAX_DEPTH:
            msg = (
                f"the expression nests deeper than {MAX_DEPTH} levels (parentheses, NOT, -, "
                "function calls, alternating operators); simplify it or split it into "
                "several filters"
            )
            raise error(msg, self.source, pos)
        return Node(op, pos, args=args, depth=depth, **kw)

    # -- levels, lowest first --------------------------------------------------------------

    def expression(self) -> Node:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            msg = (
                f"the expression nests deeper than {MAX_DEPTH} levels (parentheses, NOT, -, "
                "function calls); remove the extra parentheses or split the condition"
            )
            raise error(msg, self.source, self.peek().pos)
        operands = [self.comparison()]
        ops: list[Token] = []
        while self.peek().kind in _LOGIC:
            ops.append(self.take())
            operands.append(self.comparison())
        self.nesting -= 1
        # right-associative: a o1 (b o2 (c ...)); runs of one operator become one node
        acc = operands[-1]
        run: list[Node] = [acc]
        for k in range(len(ops) - 1, -1, -1):
            if k + 1 < len(ops) and ops[k].kind != ops[k + 1].kind:
                acc = self._logic(ops[k + 1], run)
                run = [acc]
            run.insert(0, operands[k])
        if ops:
            acc = self._logic(ops[0], run)
        return acc

    def _logic(self, tok: Token, run: list[Node]) -> Node:
        if len(run) == 1:
            return run[0]
        return self.node("logic", tok.pos, tuple(run), value=tok.kind, type="bool")

    def _fold(self, sub: Any, kinds: frozenset[str], result: str) -> Node:
        first = sub()
        operands, ops = [first], []
        while self.peek().kind in kinds:
            ops.append(self.take().kind)
            operands.append(sub())
        if not ops:
            return first  # type: ignore[no-any-return]
        return self.node("fold", first.pos, tuple(operands), value=tuple(ops), type=result)

    def comparison(self) -> Node:
        return self._fold(self.additive, _COMPARE, "bool")

    def additive(self) -> Node:
        return self._fold(self.multiplicative, _ADD, "int")

    def multiplicative(self) -> Node:
        return self._fold(self.postfix, _MUL, "int")

    def postfix(self) -> Node:
        left = self.unary()
        while True:
            tok = self.peek()
            negate = False
            if tok.kind == "NOT" and self.tokens[self.i + 1].kind in ("LIKE", "IN"):
                self.take()
                negate = True
                tok = self.peek()
            if tok.kind == "LIKE":
                self.take()
                pat = self.take()
                if pat.kind != "STRING":
                    raise self.fail(pat, "a string literal pattern after LIKE, e.g. 'abc%'")
                like = Like(pat.value)  # type: ignore[arg-type]
                left = self.node("like", tok.pos, (left,), value=like, negate=negate, type="bool")
            elif tok.kind == "IN":
                self.take()
                self.expect("(", "'(' and a list of values after IN, e.g. IN ('a', 'b')")
                items = [self.expression()]
                while self.peek().kind == ",":
                    self.take()
                    items.append(self.expression())
                self.expect(")", "',' or ')' in the IN list")
                left = self.node("in", tok.pos, (left, *items), negate=negate, type="bool")
            else:
                return left

    def unary(self) -> Node:
        tok = self.peek()
        if tok.kind == "NOT":
            self.take()
            return self.node("not", tok.pos, (self._nested(self.unary),), type="bool")
        if tok.kind == "-":
            self.take()
            nxt = self.peek()
            if nxt.kind == "INT":
                self.take()
                return self._int(nxt, -int(nxt.value))  # type: ignore[call-overload]
            return self.node("neg", tok.pos, (self._nested(self.unary),), type="int")
        return self.primary()

    def _nested(self, sub: Any) -> Node:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            msg = f"the expression nests deeper than {MAX_DEPTH} levels (NOT, -); simplify it"
            raise error(msg, self.source, self.peek().pos)
        out = sub()
        self.nesting -= 1
        return out  # type: ignore[no-any-return]

    def _int(self, tok: Token, value: int) -> Node:
        if not _INT_MIN <= value <= _INT_MAX:
            msg = (
                f"integer literal {tok.text} is out of range: CESQL integers are 32-bit, "
                f"{_INT_MIN} to {_INT_MAX}"
            )
            raise error(msg, self.source, tok.pos)
        return Node("lit", tok.pos, value=value, type="int")

    def primary(self) -> Node:
        tok = self.take()
        kind = tok.kind
        if kind == "INT":
            return self._int(tok, tok.value)  # type: ignore[arg-type]
        if kind == "STRING":
            return Node("lit", tok.pos, value=tok.value, type="str")
        if kind in ("TRUE", "FALSE"):
            return Node("lit", tok.pos, value=kind == "TRUE", type="bool")
        if kind == "(":
            inner = self.expression()
            self.expect(")", "')' to close the '(' opened before")
            return inner
        if kind == "EXISTS":
            name = self.take()
            if name.kind != "IDENT" or not _ATTRIBUTE.fullmatch(name.text):
                raise self.fail(name, "an attribute name after EXISTS, e.g. EXISTS subject")
            return Node("exists", tok.pos, value=name.text.lower(), type="bool")
        if kind == "IDENT":
            if self.peek().kind == "(":
                return self.call(tok)
            if not _ATTRIBUTE.fullmatch(tok.text):
                msg = (
                    f"{tok.text!r} is not an attribute name: CloudEvents attribute names are "
                    "letters and digits only (a function call needs '(')"
                )
                raise error(msg, self.source, tok.pos)
            return Node("attr", tok.pos, value=tok.text.lower())
        raise self.fail(tok, "a value: an attribute name, a literal, a function call or '('")

    def call(self, name: Token) -> Node:
        from eventbus.cesql._functions import FUNCTIONS

        if not _FUNCTION.fullmatch(name.text):
            raise error(f"{name.text!r} is not a function name", self.source, name.pos)
        self.take()  # (
        args: list[Node] = []
        if self.peek().kind != ")":
            args.append(self.expression())
            while self.peek().kind == ",":
                self.take()
                args.append(self.expression())
        self.expect(")", "',' or ')' in the function's arguments")
        upper = name.text.upper()
        fn = FUNCTIONS.get(upper)
        if fn is None or not fn.accepts(len(args)):
            known = ", ".join(sorted(FUNCTIONS))
            what = (
                f"unknown function {name.text!r}"
                if fn is None
                else f"{upper} takes {fn.arity_text()}; got {len(args)}"
            )
            msg = f"{what}; the functions are {known}"
            line_col = error(msg, self.source, name.pos)
            line_col.kind = "missingFunction"
            line_col.args = (msg, "missingFunction", *line_col.args[2:])
            raise line_col
        return self.node("call", name.pos, tuple(args), value=upper, type=fn.result)


def parse(source: str) -> Node:
    """Parse a CESQL expression.

    Raises:
        CESQLError: kind ``parse`` (syntax, with line and column) or ``missingFunction``.
    """
    p = _Parser(source)
    tree = p.expression()
    tok = p.peek()
    if tok.kind != "EOF":
        raise p.fail(tok, "an operator or the end of the expression")
    return tree
