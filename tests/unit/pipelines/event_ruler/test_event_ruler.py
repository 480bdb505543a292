"""The pattern dialect against aws/event-ruler's documented behaviour.

``cases.json`` is extracted from event-ruler's Java tests by ``extract.py`` (RulerTest's
``Ruler.matchesRule`` cases with their expected booleans; JsonRuleCompilerTest's patterns
that must and must not compile); each case carries ``source`` (file:method). The cases below
``README`` and ``MACHINE`` are transcribed by hand from event-ruler's README.md and
MachineTest.java (commit in ``extract.SOURCE_COMMIT``), one rule per case as a single-rule
machine would answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eventbus.pipelines.steps._pattern import PatternError, compile_pattern, parse_pattern

DATA = json.loads(Path(__file__).with_name("cases.json").read_text())

#: Compile cases that Python's JSON parser cannot tell apart: 1E-325 underflows to 0.0 when
#: parsed (event-ruler rejects the text), so the pattern we see is a valid ``0``.
UNDERFLOW = "1E-325"

README_EVENT: dict[str, Any] = {
    "version": "0",
    "id": "ddddd4-aaaa-7777-4444-345dd43cc333",
    "detail-type": "EC2 Instance State-change Notification",
    "source": "aws.ec2",
    "account": "012345679012",
    "time": "2017-10-02T16:24:49Z",
    "region": "us-east-1",
    "resources": ["arn:aws:ec2:us-east-1:123456789012:instance/i-000000aaaaaa00000"],
    "detail": {
        "c-count": 5,
        "d-count": 3,
        "x-limit": 301.8,
        "source-ip": "10.0.0.33",
        "instance-id": "i-000000aaaaaa00000",
        "state": "running",
    },
}

# README.md, "Ruler by Example": every rule of these sections matches the sample event
# (or not, as marked), and "JSON Array Matching".
README: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = [
    (
        "simple matching",
        {
            "detail-type": ["EC2 Instance State-change Notification"],
            "resources": ["arn:aws:ec2:us-east-1:123456789012:instance/i-000000aaaaaa00000"],
            "detail": {"state": ["initializing", "running"]},
        },
        README_EVENT,
        True,
    ),
    ("prefix", {"time": [{"prefix": "2017-10-02"}]}, README_EVENT, True),
    (
        "prefix ignore case",
        {"source": [{"prefix": {"equals-ignore-case": "AWS.EC"}}]},
        README_EVENT,
        True,
    ),
    ("suffix", {"source": [{"suffix": "ec2"}]}, README_EVENT, True),
    (
        "suffix ignore case",
        {"source": [{"suffix": {"equals-ignore-case": "EC2"}}]},
        README_EVENT,
        True,
    ),
    ("equals-ignore-case", {"source": [{"equals-ignore-case": "AWS.EC2"}]}, README_EVENT, True),
    ("equals-ignore-case miss", {"source": [{"equals-ignore-case": "EC2"}]}, README_EVENT, False),
    ("wildcard", {"source": [{"wildcard": "aws.*2"}]}, README_EVENT, True),
    ("anything-but", {"detail": {"state": [{"anything-but": "initializing"}]}}, README_EVENT, True),
    ("anything-but number", {"detail": {"x-limit": [{"anything-but": 123}]}}, README_EVENT, True),
    (
        "anything-but list",
        {"detail": {"state": [{"anything-but": ["stopped", "overloaded"]}]}},
        README_EVENT,
        True,
    ),
    (
        "anything-but list hit",
        {"detail": {"state": [{"anything-but": ["stopped", "running"]}]}},
        README_EVENT,
        False,
    ),
    (
        "anything-but numbers",
        {"detail": {"x-limit": [{"anything-but": [100, 200, 300]}]}},
        README_EVENT,
        True,
    ),
    (
        "anything-but prefix",
        {"detail": {"state": [{"anything-but": {"prefix": "init"}}]}},
        README_EVENT,
        True,
    ),
    (
        "anything-but prefix list",
        {"detail": {"state": [{"anything-but": {"prefix": ["init", "run"]}}]}},
        README_EVENT,
        False,
    ),
    (
        "anything-but suffix",
        {"detail": {"instance-id": [{"anything-but": {"suffix": "1234"}}]}},
        README_EVENT,
        True,
    ),
    (
        "anything-but suffix list",
        {"detail": {"instance-id": [{"anything-but": {"suffix": ["1234", "000"]}}]}},
        README_EVENT,
        False,
    ),
    (
        "anything-but ignore case",
        {"detail": {"state": [{"anything-but": {"equals-ignore-case": "RUNNING"}}]}},
        README_EVENT,
        False,
    ),
    (
        "anything-but ignore case list",
        {
            "detail": {
                "state": [{"anything-but": {"equals-ignore-case": ["Stopped", "OverLoaded"]}}]
            }
        },
        README_EVENT,
        True,
    ),
    (
        "anything-but wildcard",
        {"detail": {"state": [{"anything-but": {"wildcard": "*/bin/*.jar"}}]}},
        README_EVENT,
        True,
    ),
    (
        "anything-but wildcard list",
        {"detail": {"state": [{"anything-but": {"wildcard": ["*/bin/*.jar", "run*"]}}]}},
        README_EVENT,
        False,
    ),
    (
        "numeric",
        {
            "detail": {
                "c-count": [{"numeric": [">", 0, "<=", 5]}],
                "d-count": [{"numeric": ["<", 10]}],
                "x-limit": [{"numeric": ["=", 3.018e2]}],
            }
        },
        README_EVENT,
        True,
    ),
    ("cidr", {"detail": {"source-ip": [{"cidr": "10.0.0.0/24"}]}}, README_EVENT, True),
    ("exists true", {"detail": {"c-count": [{"exists": True}]}}, README_EVENT, True),
    ("exists false", {"detail": {"c-count": [{"exists": False}]}}, README_EVENT, False),
    (
        "exists false: an object is no leaf",
        {"detail": {"c-count": [{"exists": False}]}},
        {"detail": {"state": "running", "c-count": {"c1": 100}}},
        True,
    ),
    (
        "complex example",
        {
            "time": [{"prefix": "2017-10-02"}],
            "detail": {
                "state": [{"anything-but": "initializing"}],
                "c-count": [{"numeric": [">", 0, "<=", 5]}],
                "d-count": [{"numeric": ["<", 10]}],
                "x-limit": [{"anything-but": [100, 200, 300]}],
                "source-ip": [{"cidr": "10.0.0.0/8"}],
            },
        },
        README_EVENT,
        True,
    ),
    (
        "$or normal",
        {
            "source": ["aws.cloudwatch"],
            "$or": [{"metricName": ["CPUUtilization"]}, {"namespace": ["AWS/EC2"]}],
        },
        {"source": "aws.cloudwatch", "namespace": "AWS/EC2"},
        True,
    ),
    (
        "$or normal miss",
        {
            "source": ["aws.cloudwatch"],
            "$or": [{"metricName": ["CPUUtilization"]}, {"namespace": ["AWS/EC2"]}],
        },
        {"source": "aws.cloudwatch", "namespace": "AWS/ES"},
        False,
    ),
    (
        "$or parallel",
        {
            "$or": [
                {"metricName": ["CPUUtilization", "ReadLatency"]},
                {"namespace": ["AWS/EC2", "AWS/ES"]},
            ],
            "detail": {
                "$or": [
                    {"source": ["aws.cloudwatch"]},
                    {"detail-type": ["CloudWatch Alarm State Change"]},
                ]
            },
        },
        {"metricName": "ReadLatency", "detail": {"detail-type": "CloudWatch Alarm State Change"}},
        True,
    ),
    (
        "$or nested with and",
        {
            "source": ["aws.cloudwatch"],
            "$or": [
                {"metricName": ["CPUUtilization", "ReadLatency"]},
                {
                    "metricType": ["MetricType"],
                    "namespace": ["AWS/EC2", "AWS/ES"],
                    "$or": [{"metricId": [1234]}, {"spaceId": [1000]}],
                },
                {"scope": ["Service"]},
            ],
        },
        {
            "source": "aws.cloudwatch",
            "metricType": "MetricType",
            "namespace": "AWS/ES",
            "spaceId": 1000,
        },
        True,
    ),
    (
        "$or nested with and: inner miss",
        {
            "source": ["aws.cloudwatch"],
            "$or": [
                {"metricName": ["CPUUtilization", "ReadLatency"]},
                {
                    "metricType": ["MetricType"],
                    "namespace": ["AWS/EC2", "AWS/ES"],
                    "$or": [{"metricId": [1234]}, {"spaceId": [1000]}],
                },
            ],
        },
        {
            "source": "aws.cloudwatch",
            "metricType": "MetricType",
            "namespace": "AWS/ES",
            "spaceId": 1001,
        },
        False,
    ),
    (
        "array of objects",
        {"employees": {"firstName": ["Anna"]}},
        {
            "employees": [
                {"firstName": "John", "lastName": "Doe"},
                {"firstName": "Anna", "lastName": "Smith"},
                {"firstName": "Peter", "lastName": "Jones"},
            ]
        },
        True,
    ),
    (
        "multi-level arrays",
        {"employees": {"firstName": ["Peter"]}},
        {
            "employees": [
                [
                    {"firstName": "John", "lastName": "Doe"},
                    {"firstName": "Anna", "lastName": "Smith"},
                ],
                [{"firstName": "Peter", "lastName": "Jones"}],
            ]
        },
        True,
    ),
    (
        "array consistency",
        {"employees": {"firstName": ["Anna"], "lastName": ["Jones"]}},
        {
            "employees": [
                {"firstName": "John", "lastName": "Doe"},
                {"firstName": "Anna", "lastName": "Smith"},
                {"firstName": "Peter", "lastName": "Jones"},
            ]
        },
        False,
    ),
]

# MachineTest.java, one rule at a time.
MACHINE: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = [
    *(
        (f"testPrefixMatching {e}", {k: [{"prefix": p}]}, {k: e}, True)
        for k, p, e in (
            ("a", "zoo", "zookeeper"),
            ("a", "zoo", "zoo"),
            ("b", "child", "childlike"),
            ("b", "child", "childish"),
            ("b", "child", "childhood"),
            ("a", "al", "albert"),
        )
    ),
    ("testPrefixMatching exact too", {"a": ["albert"]}, {"a": "albert"}, True),
    *(
        (f"testSuffixMatching {e}", {k: [{"suffix": s}]}, {k: e}, True)
        for k, s, e in (
            ("a", "er", "zookeeper"),
            ("b", "txt", "amazon.txt"),
            ("a", "er", "checker"),
            ("b", "txt", "Texttxt"),
            ("a", "er", "er"),
            ("b", "txt", "txt"),
        )
    ),
    *(
        (f"testEqualsIgnoreCaseMatching {p} {e}", {k: [{"equals-ignore-case": p}]}, {k: e}, m)
        for k, p, e, m in (
            ("a", "aBc", "abc", True),
            ("b", "XyZ", "XYZ", True),
            ("b", "xyZ", "XYZ", True),
            ("a", "aBc", "AbC", True),
            ("b", "XyZ", "xyzz", False),
            ("a", "aBc", "aabc", False),
            ("b", "XyZ", "ABCXYZ", False),
        )
    ),
    *(
        (f"testWildcardMatching {p} {e}", {k: [{"wildcard": p}]}, {k: e}, m)
        for k, p, e, m in (
            ("a", "*bc", "bc", True),
            ("a", "*bc", "abc", True),
            ("b", "d*f", "dexef", True),
            ("b", "d*ff", "dexef", False),
            ("b", "d*f", "dexeff", True),
            ("b", "d*ff", "dexeff", True),
            ("c", "xy*", "xyzzz", True),
            ("d", "12*4*", "12345", True),
            ("c", "xy*", "abc", False),
            ("c", "xy*", "abcxyz", False),
            ("b", "d*f", "ef", False),
            ("b", "d*f", "de", False),
            ("d", "12*4*", "1235", False),
            ("c", "xy*", "xy", True),
        )
    ),
    *(
        (
            f"testIPAddressOfCIDRIsEqualToMaximumOfRange {c} {ip}",
            {"sourceIPAddress": [{"cidr": c}]},
            {"sourceIPAddress": ip},
            m,
        )
        for c, ip, m in (
            ("220.160.153.171/31", "220.160.153.170", True),
            ("220.160.153.171/31", "220.160.153.171", True),
            ("220.160.153.171/31", "220.160.153.169", False),
            ("220.160.153.171/31", "220.160.153.172", False),
            ("220.160.154.255/24", "220.160.154.0", True),
            ("220.160.154.255/24", "220.160.154.255", True),
            ("220.160.154.255/24", "220.160.153.255", False),
            ("220.160.154.255/24", "220.160.155.0", False),
            ("220.160.59.225/31", "220.160.59.224", True),
            ("220.160.59.225/31", "220.160.59.225", True),
            ("220.160.59.225/31", "220.160.59.223", False),
            ("220.160.59.225/31", "220.160.59.226", False),
        )
    ),
    ("testSimplestPossibleMachine r1", {"a": [1]}, {"a": 1}, True),
    ("testSimplestPossibleMachine r2", {"b": [2]}, {"b": 2}, True),
    ("testSimplestPossibleMachine none", {"a": [1]}, {"x": True}, False),
    ("testExists false", {"abc": [{"exists": False}]}, {"xyz": "abc"}, True),
    ("testExists true", {"abc": [{"exists": True}]}, {"abc": "xyz"}, True),
    ("testExists true miss", {"abc": [{"exists": True}]}, {"xyz": "abc"}, False),
    (
        "testNumericMatch",
        {
            "a": [{"numeric": ["=", 0]}],
            "b": [{"numeric": ["<", 0]}],
            "c": [{"numeric": ["<=", 0]}],
            "x": [{"numeric": [">", 0]}],
            "y": [{"numeric": [">=", 0]}],
            "z": [{"numeric": [">", 0, "<", 1]}],
        },
        {"a": [0], "b": [-0.1], "c": [0], "x": [1], "y": [0], "z": [0.1]},
        True,
    ),
    (
        "JsonRuleCompilerTest testBasicFunctionOfOrRelationshipRules rule2",
        {
            "detail": {
                "detail-type": ["EC2 Instance State-change Notification"],
                "info": {
                    "state-status": ["initializing", "running"],
                    "state-count": {"count": [100]},
                },
                "$or": [
                    {"c-count": [{"numeric": [">", 0, "<=", 5]}]},
                    {"d-count": [{"numeric": ["<", 10]}]},
                    {"x-limit": [{"numeric": ["=", 3.018e2]}]},
                ],
            },
            "news": {
                "newsProviders": ["p1", "p2"],
                "$or": [{"newCondition1": ["news111"]}, {"newCondition2": ["news222"]}],
            },
        },
        {
            "detail": {
                "detail-type": "EC2 Instance State-change Notification",
                "info": {"state-status": "running", "state-count": {"count": 100}},
                "c-count": 1,
                "d-count": 8,
            },
            "news": {"newsProviders": "p1", "newCondition1": "news111", "newCondition2": "news222"},
        },
        True,
    ),
]

# MachineTest.CIDRTest: for /22../31 every address in the block matches and none beside it.
for bits in (22, 24, 28, 31):
    size = 1 << (32 - bits)
    for offset, inside in ((-1, False), (0, True), (size - 1, True), (size, False)):
        n = 0x0A000000 + offset
        ip = ".".join(str((n >> s) & 255) for s in (24, 16, 8, 0))
        MACHINE.append(
            (f"CIDRTest /{bits} {ip}", {"a": [{"cidr": f"10.0.0.0/{bits}"}]}, {"a": ip}, inside)
        )


def _id(case: dict[str, Any]) -> str:
    return case["source"].split(":")[1]


def _closures(pattern: Any) -> Any:
    """The matcher without the code generator (what generated code calls for arrays)."""
    return parse_pattern(pattern).match_object


COMPILERS = pytest.mark.parametrize(
    "compile_", [compile_pattern, _closures], ids=["generated", "closures"]
)


@COMPILERS
@pytest.mark.parametrize("case", DATA["matches"], ids=_id)
def test_ruler_matches_rule(case: dict[str, Any], compile_: Any) -> None:
    assert compile_(case["pattern"])(case["event"]) is case["match"], case


@COMPILERS
@pytest.mark.parametrize(
    ("pattern", "event", "match"),
    [c[1:] for c in README + MACHINE],
    ids=[c[0] for c in README + MACHINE],
)
def test_documented_cases(
    pattern: dict[str, Any], event: dict[str, Any], match: bool, compile_: Any
) -> None:
    assert compile_(pattern)(event) is match


@pytest.mark.parametrize("case", DATA["compiles"], ids=_id)
def test_rule_compiler(case: dict[str, Any]) -> None:
    if case["valid"] or case.get("operand_text", "").endswith(UNDERFLOW + "]"):
        compile_pattern(case["pattern"])
    else:
        with pytest.raises(PatternError):
            compile_pattern(case["pattern"])


def test_the_case_counts() -> None:
    assert len(DATA["matches"]) == 69 and len(DATA["compiles"]) == 137
    assert len(README) + len(MACHINE) >= 90
