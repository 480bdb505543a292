"""Regenerate ``cases.json`` from aws/event-ruler's Java tests (commit in ``SOURCE_COMMIT``).

Run: ``python tests/unit/pipelines/event_ruler/extract.py /path/to/event-ruler``. Reads the
string literals of ``RulerTest.java`` (``Ruler.matchesRule(event, rule)`` with the expected
booleans, the static single-rule matcher) and ``JsonRuleCompilerTest.java`` (patterns that
must compile and must not); each case names its file and test method. The cases transcribed
by hand from the README and ``MachineTest.java`` live in ``test_event_ruler.py``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

SOURCE_COMMIT = "337e8d99026d3f6687f783535f157be8bf4ebbb7"
TESTS = "src/test/software/amazon/event/ruler"
_TOKEN = re.compile(
    r'"(?P<lit>(?:[^"\\]|\\.)*)"|(?P<comment>//[^\n]*)|(?P<space>\s+)|(?P<other>.)', re.S
)


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m[1], m[1]), s)


def _strings(body: str) -> list[str]:
    """The string expressions of a Java body, in order: literals joined by ``+`` (comments
    between them ignored) make one string."""
    out: list[str] = []
    joining = after_literal = False
    for m in _TOKEN.finditer(body):
        if m["lit"] is not None:
            text = _unescape(m["lit"])
            if joining:
                out[-1] += text
            else:
                out.append(text)
            joining, after_literal = False, True
        elif m["comment"] is None and m["space"] is None:
            joining = m["other"] == "+" and after_literal
            after_literal = False
    return out


def _method(src: str, name: str) -> str:
    start = src.index(f"void {name}(")
    nxt = src.find("@Test", start)
    return src[start : nxt if nxt > 0 else len(src)]


def _json(texts: list[str]) -> list[Any]:
    out = []
    for t in texts:
        try:
            out.append(json.loads(t))
        except json.JSONDecodeError:
            continue
    return out


def _assigned(body: str) -> dict[str, str]:
    """``String name = <string expression>;`` in a body."""
    found = {}
    for m in re.finditer(r"String (\w+) = (.*?);\n", body, re.S):
        found[m[1]] = "".join(_strings(m[2]))
    return found


def ruler_cases(src: str) -> list[dict[str, Any]]:
    where = "RulerTest.java"
    consts = _assigned(src[: src.index("@Test")])
    cases: list[dict[str, Any]] = []

    def add(method: str, rule: Any, event: Any, match: bool) -> None:
        cases.append(
            {"source": f"{where}:{method}", "pattern": rule, "event": event, "match": match}
        )

    m = "WHEN_RulesFromReadmeAreTried_THEN_TheyWork"
    readme_event = json.loads(consts["JSON_FROM_README"])
    for rule in _json(_strings(_method(src, m))):
        add(m, rule, readme_event, True)
    for m, event_name, n_match in (
        ("WHEN_WeWriteRulesToMatchVariousFieldCombos_THEN_TheyWork", "JSON_FROM_RFC", 6),
        ("WHEN_JSONContainsArrays_THEN_RulerNoCompileMatchesWork", "JSON_WITH_COMPLEX_ARRAYS", 3),
    ):
        event = json.loads(consts[event_name])
        rules = _json(_strings(_method(src, m)))
        for i, rule in enumerate(rules):
            add(m, rule, event, i < n_match)
    for m in (
        "WHEN_WeTryToMatchExistsRules_THEN_TheyWork",
        "WHEN_WeTryReallySimpleRules_THEN_TheyWork",
    ):
        body = _method(src, m)
        names = _assigned(body)
        for a in re.finditer(
            r"assert(True|False)\(\"[^\"]*\", Ruler\.matchesRule\((\w+), (\w+)\)\)", body
        ):
            add(m, json.loads(names[a[3]]), json.loads(names[a[2]]), a[1] == "True")
    for m in (
        "WHEN_WeTryAnythingButRules_THEN_Theywork",
        "WHEN_WeTryEqualsIgnoreCaseRules_THEN_TheyWork",
        "WHEN_WeTryWildcardRules_THEN_TheyWork",
    ):
        body = _method(src, m)
        rule_text = body[body.index("String rule =") : body.index("String[] events")]
        rule = json.loads("".join(_strings(rule_text)))
        events_text = body[body.index("String[] events") : body.index("boolean[] result")]
        events = _json(_strings(events_text))
        results = re.search(r"boolean\[\] result = \{(.*?)\}", body, re.S)
        assert results is not None
        flags = [x.strip() == "true" for x in results[1].split(",") if x.strip()]
        assert len(flags) == len(events), m
        for event, flag in zip(events, flags, strict=True):
            add(m, rule, event, flag)
    return cases


def compiler_cases(src: str) -> list[dict[str, Any]]:
    where = "JsonRuleCompilerTest.java"
    cases: list[dict[str, Any]] = []
    body = _method(src, "testCompile")
    good_part, bad_part = body.split("String[] badPatternTypes")
    bad_part = bad_part[: bad_part.index("for (String badPattern")]
    for m in re.finditer(r'j = (".*?");\s*\n\s*assert(Null|NotNull)\((".*?",\s*)?', good_part):
        text = "".join(_strings(m[1]))
        try:
            rule = json.loads(text)
        except json.JSONDecodeError:
            continue
        cases.append({"source": f"{where}:testCompile", "pattern": rule, "valid": m[2] == "Null"})
    for text in _strings(bad_part):
        try:  # malformed JSON is the JSON parser's business, not the pattern's
            rule = json.loads(text)
        except json.JSONDecodeError:
            continue
        cases.append({"source": f"{where}:testCompile", "pattern": rule, "valid": False})
    for method, key in (("testNumericExpressions", "numeric"), ("testExistsExpression", "exists")):
        body = _method(src, method)
        goods = body[body.index("String[] goods") : body.index("String[] bads")]
        bads = body[body.index("String[] bads") : body.index("for (String good")]
        for part, valid in ((goods, True), (bads, False)):
            for text in _strings(part):
                try:
                    operand = json.loads(text)
                except json.JSONDecodeError:
                    continue  # e.g. `true, "extraKey": ...`: not JSON on its own
                cases.append(
                    {
                        "source": f"{where}:{method}",
                        "pattern": {"x": [{key: operand}]},
                        "valid": valid,
                        "operand_text": text,
                    }
                )
    return cases


def main() -> None:
    root = Path(sys.argv[1])
    ruler = (root / TESTS / "RulerTest.java").read_text()
    compiler = (root / TESTS / "JsonRuleCompilerTest.java").read_text()
    data = {
        "source": f"https://github.com/aws/event-ruler/tree/{SOURCE_COMMIT}/{TESTS}",
        "matches": ruler_cases(ruler),
        "compiles": compiler_cases(compiler),
    }
    out = Path(__file__).with_name("cases.json")
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['matches'])} match cases, {len(data['compiles'])} compile cases -> {out}")


if __name__ == "__main__":
    main()
