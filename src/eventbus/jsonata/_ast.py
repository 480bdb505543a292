"""The raw tree reshaped for evaluation (jsonata-js ``processAST``): ``a.b[c]`` into a path of
steps with stages, ``@``/``#`` bindings as tuple steps, ``%`` resolved to the step whose
context it names, tail calls in lambdas marked for the trampoline."""

from __future__ import annotations

from typing import Any

from eventbus.jsonata._errors import fail
from eventbus.jsonata._parser import Node

__all__ = ["process"]


class _Slot:
    __slots__ = ("index", "label", "level")

    def __init__(self, label: str, level: int, index: int) -> None:
        self.label = label
        self.level = level
        self.index = index


class _Processor:
    def __init__(self) -> None:
        self.label = 0
        self.ancestry: list[Node] = []

    def seek_parent(self, node: Node, slot: _Slot) -> _Slot:
        t = node.type
        if t in ("name", "wildcard"):
            slot.level -= 1
            if slot.level == 0:
                if node.get("ancestor") is None:
                    node.ancestor = slot
                else:
                    self.ancestry[slot.index].slot.label = node.ancestor.label
                    node.ancestor = slot
                node.tuple = True
        elif t == "parent":
            slot.level += 1
        elif t == "block":
            if node.expressions:
                node.tuple = True
                slot = self.seek_parent(node.expressions[-1], slot)
        elif t == "path":
            node.tuple = True
            i = len(node.steps) - 1
            slot = self.seek_parent(node.steps[i], slot)
            i -= 1
            while slot.level > 0 and i >= 0:
                slot = self.seek_parent(node.steps[i], slot)
                i -= 1
        else:
            msg = f"The parent operator % cannot derive an ancestor from a {t} expression"
            raise fail("S0217", msg, node.position, t)
        return slot

    @staticmethod
    def push_ancestry(result: Node, value: Node | None) -> None:
        if value is None:
            return
        seeking = value.get("seekingParent")
        if seeking is not None or value.type == "parent":
            slots = list(seeking) if seeking is not None else []
            if value.type == "parent":
                slots.append(value.slot)
            if result.get("seekingParent") is None:
                result.seekingParent = slots
            else:
                result.seekingParent.extend(slots)

    def resolve_ancestry(self, path: Node) -> None:
        last = path.steps[-1]
        slots = list(last.get("seekingParent") or [])
        if last.type == "parent":
            slots.append(last.slot)
        for slot in slots:
            i = len(path.steps) - 2
            while slot.level > 0:
                if i < 0:
                    if path.get("seekingParent") is None:
                        path.seekingParent = [slot]
                    else:
                        path.seekingParent.append(slot)
                    break
                step = path.steps[i]
                i -= 1
                while i >= 0 and step.get("focus") and path.steps[i].get("focus"):
                    step = path.steps[i]
                    i -= 1
                slot = self.seek_parent(step, slot)

    def process(self, expr: Node) -> Node:
        t = expr.type
        result: Node
        if t == "binary":
            result = self.binary(expr)
        elif t == "unary":
            result = Node("unary", expr.value, expr.position)
            if expr.value == "[":
                result.expressions = []
                for item in expr.expressions:
                    v = self.process(item)
                    self.push_ancestry(result, v)
                    result.expressions.append(v)
            elif expr.value == "{":
                result.lhs = []
                for k, v in expr.lhs:
                    pk, pv = self.process(k), self.process(v)
                    self.push_ancestry(result, pk)
                    self.push_ancestry(result, pv)
                    result.lhs.append((pk, pv))
            else:
                result.expression = self.process(expr.expression)
                if expr.value == "-" and result.expression.type == "number":
                    result = result.expression
                    result.value = -result.value
                else:
                    self.push_ancestry(result, result.expression)
        elif t in ("function", "partial"):
            result = Node(t, expr.value, expr.position)
            result.arguments = []
            for a in expr.arguments:
                pa = self.process(a)
                self.push_ancestry(result, pa)
                result.arguments.append(pa)
            result.procedure = self.process(expr.procedure)
        elif t == "lambda":
            result = Node("lambda", None, expr.position, arguments=expr.arguments,
                          signature=expr.signature)  # fmt: skip
            result.body = _tail_call(self.process(expr.body))
        elif t == "condition":
            result = Node("condition", None, expr.position)
            result.condition = self.process(expr.condition)
            result.then = self.process(expr.then)
            result.other = self.process(expr.other) if expr.other is not None else None
            for part in (result.condition, result.then, result.other):
                self.push_ancestry(result, part)
        elif t in ("coalesce", "elvis"):
            result = Node(t, expr.value, expr.position)
            result.lhs = self.process(expr.lhs)
            result.rhs = self.process(expr.rhs)
            self.push_ancestry(result, result.lhs)
            self.push_ancestry(result, result.rhs)
        elif t == "transform":
            result = Node("transform", None, expr.position)
            result.pattern = self.process(expr.pattern)
            result.update = self.process(expr.update)
            result.delete = self.process(expr.delete) if expr.delete is not None else None
        elif t == "block":
            result = Node("block", None, expr.position, expressions=[])
            for item in expr.expressions:
                part = self.process(item)
                self.push_ancestry(result, part)
                if part.get("consarray") or (
                    part.type == "path" and part.steps[0].get("consarray")
                ):
                    result.consarray = True
                result.expressions.append(part)
        elif t == "name":
            result = Node("path", None, expr.position, steps=[expr])
            if expr.get("keepArray"):
                result.keepSingletonArray = True
        elif t == "parent":
            result = Node("parent", None, expr.position)
            result.slot = _Slot(f"!{self.label}", 1, len(self.ancestry))
            self.label += 1
            self.ancestry.append(result)
        elif t in ("string", "number", "value", "wildcard", "descendant", "variable", "regex"):
            result = expr
        elif t == "operator":
            if expr.value == "?":
                result = expr
            else:
                raise fail("S0201", f"Syntax error: {expr.value!r}", expr.position, expr.value)
        else:  # pragma: no cover - the parser makes no other node
            raise fail("S0206", f"Unknown expression type: {t}", expr.position, t)
        if expr.get("keepArray"):
            result.keepArray = True
        return result

    def binary(self, expr: Node) -> Node:
        op = expr.value
        if op == ".":
            lstep = self.process(expr.lhs)
            result = (
                lstep if lstep.type == "path" else Node("path", None, lstep.position, steps=[lstep])
            )
            if lstep.type == "parent":
                result.seekingParent = [lstep.slot]
            rest = self.process(expr.rhs)
            if rest.type == "path":
                result.steps.extend(rest.steps)
            else:
                if rest.get("predicate") is not None:
                    rest.stages = rest.predicate
                    rest.predicate = None
                result.steps.append(rest)
            for step in result.steps:
                if step.type in ("number", "value"):
                    msg = f"The literal value {step.value!r} cannot be used as a step within a path expression"
                    raise fail("S0213", msg, step.position, step.value)
                if step.type == "string":
                    step.type = "name"
            if any(s.get("keepArray") for s in result.steps):
                result.keepSingletonArray = True
            first, last = result.steps[0], result.steps[-1]
            if first.type == "unary" and first.value == "[":
                first.consarray = True
            if last.type == "unary" and last.value == "[":
                last.consarray = True
            self.resolve_ancestry(result)
            return result
        if op == "[":
            result = self.process(expr.lhs)
            step = result
            kind = "predicate"
            if result.type == "path":
                step = result.steps[-1]
                kind = "stages"
            if step.get("group") is not None:
                msg = "A predicate cannot follow a grouping expression in a step"
                raise fail("S0209", msg, expr.position)
            if step.get(kind) is None:
                step.__dict__[kind] = []
            pred = self.process(expr.rhs)
            if pred.get("seekingParent") is not None:
                for slot in pred.seekingParent:
                    if slot.level == 1:
                        self.seek_parent(step, slot)
                    else:
                        slot.level -= 1
                self.push_ancestry(step, pred)
            step.__dict__[kind].append(Node("filter", None, expr.position, expr=pred))
            return result
        if op == "{":
            result = self.process(expr.lhs)
            if result.get("group") is not None:
                msg = "Each step can only have one grouping expression"
                raise fail("S0210", msg, expr.position)
            pairs = [(self.process(k), self.process(v)) for k, v in expr.rhs]
            result.group = Node("group", None, expr.position, lhs=pairs)
            return result
        if op == "^":
            result = self.process(expr.lhs)
            if result.type != "path":
                result = Node("path", None, result.position, steps=[result])
            sort = Node("sort", None, expr.position, terms=[])
            for descending, term in expr.rhs:
                e = self.process(term)
                self.push_ancestry(sort, e)
                sort.terms.append((descending, e))
            result.steps.append(sort)
            self.resolve_ancestry(result)
            return result
        if op == ":=":
            result = Node(
                "bind", ":=", expr.position, lhs=self.process(expr.lhs), rhs=self.process(expr.rhs)
            )
            self.push_ancestry(result, result.rhs)
            return result
        if op == "@":
            result = self.process(expr.lhs)
            step = result.steps[-1] if result.type == "path" else result
            if step.get("stages") is not None or step.get("predicate") is not None:
                msg = "A context variable binding must precede any predicates on a step"
                raise fail("S0215", msg, expr.position)
            if step.type == "sort":
                msg = "A context variable binding must precede the 'order-by' clause on a step"
                raise fail("S0216", msg, expr.position)
            if expr.get("keepArray"):
                step.keepArray = True
            step.focus = expr.rhs.value
            step.tuple = True
            return result
        if op == "#":
            result = self.process(expr.lhs)
            step = result
            if result.type == "path":
                step = result.steps[-1]
            else:
                result = Node("path", None, result.position, steps=[result])
                if step.get("predicate") is not None:
                    step.stages = step.predicate
                    step.predicate = None
            if step.get("stages") is None:
                step.index = expr.rhs.value
            else:
                step.stages.append(Node("index", expr.rhs.value, expr.position))
            step.tuple = True
            return result
        if op == "~>":
            result = Node(
                "apply", op, expr.position, lhs=self.process(expr.lhs), rhs=self.process(expr.rhs)
            )
            result.keepArray = bool(result.lhs.get("keepArray") or result.rhs.get("keepArray"))
            return result
        result = Node(
            "binary", op, expr.position, lhs=self.process(expr.lhs), rhs=self.process(expr.rhs)
        )
        self.push_ancestry(result, result.lhs)
        self.push_ancestry(result, result.rhs)
        return result


def _tail_call(expr: Node) -> Node:
    if expr.type == "function" and expr.get("predicate") is None:
        return Node(
            "lambda", None, expr.position, thunk=True, arguments=[], signature=None, body=expr
        )
    if expr.type == "condition":
        expr.then = _tail_call(expr.then)
        if expr.other is not None:
            expr.other = _tail_call(expr.other)
    elif expr.type == "block" and expr.expressions:
        expr.expressions[-1] = _tail_call(expr.expressions[-1])
    return expr


def process(raw: Node) -> Any:
    """The evaluation tree of a raw tree; :class:`JSONataError` for misplaced operators."""
    p = _Processor()
    result = p.process(raw)
    if result.get("seekingParent") or result.type == "parent":
        pos = result.position
        raise fail(
            "S0217", "The parent operator % has no ancestor at the top of the expression", pos
        )
    return result
