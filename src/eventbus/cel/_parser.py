"""CEL parser: tokens to AST, with macro expansion (in ``_macros``).

Recursive descent over the CEL grammar (cel-spec ``langdef.md``), including the
optional-syntax extensions (``.?field``, ``[?index]``, ``[?elem]``, ``{?key: v}``)
and the macros of the standard library and of the bindings, block and
two-variable comprehension extensions.
"""

from __future__ import annotations

from typing import Final

from eventbus.cel import _ast as ast
from eventbus.cel._errors import CELError
from eventbus.cel._lexer import RESERVED, Token, tokenize
from eventbus.cel._macros import make_call
from eventbus.cel._values import UInt

__all__ = ["MAX_EXPRESSION_LENGTH", "parse"]

_MAX_DEPTH: Final = 100
# Nesting the parser recurses through: parentheses, brackets, braces, call arguments,
# conditionals and chains of unary '!'/'-'. One level of brackets costs ~10 Python frames,
# so this keeps the parser well inside Python's recursion limit (cel-spec asks for 32).
_MAX_NESTING: Final = 50
#: The longest expression accepted, in code points (cel-go's default limit).
MAX_EXPRESSION_LENGTH: Final = 100_000
_RELOPS: Final = frozenset({"<", "<=", ">", ">=", "==", "!=", "in"})


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.i = 0
        self.depth = 0

    # -- helpers ---------------------------------------------------------
    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "EOF":
            self.i += 1
        return tok

    def accept(self, kind: str) -> Token | None:
        if self.tokens[self.i].kind == kind:
            return self.next()
        return None

    def expect(self, kind: str) -> Token:
        tok = self.peek()
        if tok.kind != kind:
            raise self.error(f"syntax error: expected '{kind}', got {_describe(tok)}", tok.pos)
        return self.next()

    def error(self, message: str, pos: int) -> CELError:
        return CELError(message, self.source, pos + 1)

    # -- grammar -----------------------------------------------------------
    def parse(self) -> ast.Node:
        node = self.expr()
        tok = self.peek()
        if tok.kind != "EOF":
            raise self.error(f"syntax error: unexpected {_describe(tok)}", tok.pos)
        return node

    def nest(self) -> None:
        self.depth += 1
        if self.depth > _MAX_NESTING:
            msg = f"expression nesting exceeds the maximum depth of {_MAX_NESTING} levels"
            raise self.error(msg, self.peek().pos)

    def expr(self) -> ast.Node:
        self.nest()
        cond = self.or_expr()
        tok = self.accept("?")
        if tok is not None:
            then = self.or_expr()
            self.expect(":")
            otherwise = self.expr()
            cond = ast.Cond(tok.pos, cond, then, otherwise)
        self.depth -= 1
        return cond

    def or_expr(self) -> ast.Node:
        first = self.and_expr()
        terms = [first]
        while self.accept("||"):
            terms.append(self.and_expr())
        return first if len(terms) == 1 else ast.Or(first.pos, terms)

    def and_expr(self) -> ast.Node:
        first = self.relation()
        terms = [first]
        while self.accept("&&"):
            terms.append(self.relation())
        return first if len(terms) == 1 else ast.And(first.pos, terms)

    def relation(self) -> ast.Node:
        node = self.addition()
        while True:
            tok = self.peek()
            op = tok.kind if tok.kind != "IDENT" else tok.value
            if op not in _RELOPS or (tok.kind == "IDENT" and tok.value != "in"):
                return node
            self.next()
            node = ast.Binary(tok.pos, str(op), node, self.addition())

    def addition(self) -> ast.Node:
        node = self.multiplication()
        while self.peek().kind in ("+", "-"):
            tok = self.next()
            node = ast.Binary(tok.pos, tok.kind, node, self.multiplication())
        return node

    def multiplication(self) -> ast.Node:
        node = self.unary()
        while self.peek().kind in ("*", "/", "%"):
            tok = self.next()
            node = ast.Binary(tok.pos, tok.kind, node, self.unary())
        return node

    def unary(self) -> ast.Node:
        tok = self.peek()
        if tok.kind == "!":
            self.next()
            self.nest()
            node = ast.Unary(tok.pos, "!", self.unary())
            self.depth -= 1
            return node
        if tok.kind == "-":
            nxt = self.peek(1)
            if nxt.kind in ("INT", "FLOAT"):
                # A signed literal (the grammar's `-? NUM_INT`), then member suffixes.
                self.next()
                self.next()
                value = -nxt.value  # type: ignore[operator]
                if nxt.kind == "INT" and value < -(2**63):
                    raise self.error("int literal out of range", nxt.pos)
                return self.member_suffix(ast.Lit(tok.pos, value))
            self.next()
            self.nest()
            node = ast.Unary(tok.pos, "-", self.unary())
            self.depth -= 1
            return node
        return self.member()

    def member(self) -> ast.Node:
        return self.member_suffix(self.primary())

    def member_suffix(self, node: ast.Node) -> ast.Node:
        while True:
            tok = self.peek()
            if tok.kind in (".", ".?"):
                self.next()
                name_tok = self.next()
                if name_tok.kind not in ("IDENT", "QIDENT"):
                    raise self.error(
                        f"syntax error: expected a field name, got {_describe(name_tok)}",
                        name_tok.pos,
                    )
                name = str(name_tok.value)
                if tok.kind == "." and name_tok.kind == "IDENT" and self.peek().kind == "(":
                    self.next()
                    args = self.expr_list(")")
                    node = make_call(self.source, name, node, args, name_tok.pos)
                else:
                    node = ast.Select(name_tok.pos, node, name, optional=tok.kind == ".?")
            elif tok.kind in ("[", "[?"):
                self.next()
                index = self.expr()
                self.expect("]")
                node = ast.Index(tok.pos, node, index, optional=tok.kind == "[?")
            else:
                return node

    def primary(self) -> ast.Node:
        tok = self.next()
        kind = tok.kind
        if kind == "INT":
            if tok.value == 2**63:
                raise self.error("int literal out of range", tok.pos)
            return ast.Lit(tok.pos, tok.value)
        if kind == "UINT":
            return ast.Lit(tok.pos, UInt(tok.value))
        if kind in ("FLOAT", "STRING", "BYTES"):
            return ast.Lit(tok.pos, tok.value)
        if kind == "IDENT":
            name = str(tok.value)
            if name == "true":
                return ast.Lit(tok.pos, True)
            if name == "false":
                return ast.Lit(tok.pos, False)
            if name == "null":
                return ast.Lit(tok.pos, None)
            if name in RESERVED:
                raise self.error(f"reserved identifier '{name}'", tok.pos)
            if self.accept("("):
                args = self.expr_list(")")
                return make_call(self.source, name, None, args, tok.pos)
            return ast.Ident(tok.pos, name)
        if kind == ".":
            ident = self.expect("IDENT")
            name = str(ident.value)
            if name in RESERVED:
                raise self.error(f"reserved identifier '{name}'", ident.pos)
            if self.accept("("):
                return make_call(self.source, name, None, self.expr_list(")"), ident.pos)
            return ast.Ident(ident.pos, name)
        if kind == "(":
            node = self.expr()
            self.expect(")")
            return node
        if kind in ("[", "[?"):
            return self.list_literal(tok)
        if kind == "{":
            return self.map_literal(tok)
        raise self.error(f"syntax error: unexpected {_describe(tok)}", tok.pos)

    def list_literal(self, tok: Token) -> ast.Node:
        items: list[ast.Node] = []
        optional: set[int] = set()
        first_optional = tok.kind == "[?"
        while True:
            if not first_optional and self.peek().kind == "]":
                break
            if first_optional or self.accept("?"):
                optional.add(len(items))
                first_optional = False
            items.append(self.expr())
            if not self.accept(","):
                break
        self.expect("]")
        return ast.ListLit(tok.pos, items, frozenset(optional))

    def map_literal(self, tok: Token) -> ast.Node:
        entries: list[tuple[ast.Node, ast.Node, bool]] = []
        while self.peek().kind != "}":
            opt = self.accept("?") is not None
            key = self.expr()
            self.expect(":")
            value = self.expr()
            entries.append((key, value, opt))
            if not self.accept(","):
                break
        self.expect("}")
        return ast.MapLit(tok.pos, entries)

    def expr_list(self, close: str) -> list[ast.Node]:
        args: list[ast.Node] = []
        if self.accept(close):
            return args
        while True:
            args.append(self.expr())
            if self.accept(close):
                return args
            if not self.accept(","):
                tok = self.peek()
                raise self.error(
                    f"syntax error: expected ',' or '{close}', got {_describe(tok)}", tok.pos
                )
            if self.accept(close):  # trailing comma
                return args


def _describe(tok: Token) -> str:
    if tok.kind == "EOF":
        return "end of input"
    if tok.kind in ("IDENT", "QIDENT"):
        return f"'{tok.value}'"
    if tok.kind in ("INT", "UINT", "FLOAT", "STRING", "BYTES"):
        return f"literal {tok.value!r}"
    return f"'{tok.kind}'"


def parse(source: str) -> ast.Node:
    """Parse CEL ``source`` into an AST with macros expanded.

    Raises:
        CELError: On a syntax error, with the 1-based column.
    """
    if len(source) > MAX_EXPRESSION_LENGTH:
        msg = (
            f"expression is {len(source):,} characters long; the limit is "
            f"{MAX_EXPRESSION_LENGTH:,}: split it into smaller expressions or steps"
        )
        raise CELError(msg, source, MAX_EXPRESSION_LENGTH + 1)
    parser = _Parser(source)
    try:
        tree = parser.parse()
    except RecursionError:
        # Only when the caller already used most of the stack: the nesting limit keeps the
        # parser's own recursion well inside Python's limit.
        msg = "expression nesting exceeds the maximum depth (Python recursion limit)"
        raise CELError(msg, source, parser.peek().pos + 1) from None
    deepest = _deepest(tree, 0)
    if deepest is not None:
        msg = f"expression nesting exceeds the maximum depth of {_MAX_DEPTH} levels"
        raise CELError(msg, source, deepest.pos + 1)
    return tree


def _deepest(node: object, depth: int) -> ast.Node | None:
    """The first node found beyond ``_MAX_DEPTH`` levels (bounded recursion)."""
    if isinstance(node, ast.Node):
        if depth > _MAX_DEPTH:
            return node
        for slot in type(node).__slots__:
            found = _deepest(getattr(node, slot), depth + 1)
            if found is not None:
                return found
    elif isinstance(node, list | tuple):
        for item in node:
            found = _deepest(item, depth)
            if found is not None:
                return found
    return None
