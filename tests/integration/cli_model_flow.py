"""``eventbus model push/list/split`` on an embedded stack, as a user runs them.

Deploy the fraud example, publish transactions and tail their scores, push a second version
trained by the example's own train.py, list, split, refuse broken files, delete the pipeline.
Run by ``test_cli_stack.py``'s newcomer flow on the stack its ``eventbus up`` started (one
``up``/``down`` pays for both flows: the suite's time budget).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import torch

from tests.integration.test_cli_stack import ROOT, eb

EXAMPLE = ROOT / "examples" / "fraud_model"
ROWS = [
    [3.9, 0.1, 0.2, 0.6, 1, 0, 3.0, 1],  # large, foreign, card not present, night, new account
    [1.2, 0.5, 3.3, 0.1, 0, 1, 0.9, 0],  # small chip payment on an old account
    [2.5, 0.7, 1.0, 0.3, 0, 0, 1.5, 0],
]


def _direct(path: Path) -> list[float]:
    module = torch.export.load(str(path)).module()
    with torch.no_grad():
        return module(torch.tensor(ROWS)).reshape(-1).tolist()  # type: ignore[no-any-return]


def _publish(home: Path, tmp: Path, prefix: str) -> None:
    lines = [
        json.dumps({"type": "transaction.created", "id": f"{prefix}{i}", "data": {"features": r}})
        for i, r in enumerate(ROWS)
    ]
    (tmp / f"{prefix}.jsonl").write_text("\n".join(lines) + "\n")
    pub = eb(home, "publish", "transactions", "--file", str(tmp / f"{prefix}.jsonl"))
    assert pub.returncode == 0, pub.stderr


def _scored(home: Path, n: int) -> dict[str, dict[str, object]]:
    tail = eb(
        home,
        "tail",
        "transactions-scored",
        "--from-beginning",
        "--max",
        str(n),
        "--timeout",
        "60",
        "--json",
    )
    assert tail.returncode == 0, tail.stderr
    return {e["id"]: e for e in map(json.loads, tail.stdout.splitlines())}


def _rows(listing: str) -> dict[int, str]:
    """``eventbus model list`` table rows by version: the row's text."""
    return {
        int(m.group(1)): line
        for line in listing.splitlines()
        if (m := re.match(r"\W*fraud\W+(\d+)\s", line))
    }


def model_cli_flow(home: Path, tmp_path: Path) -> None:
    """The model commands on the running stack in ``home``; the fraud pipeline is deleted at
    the end (the stack's other pipelines are left as they were)."""
    dep = eb(home, "deploy", "examples/fraud_model/fraud.yaml")
    assert dep.returncode == 0, dep.stderr
    assert "deployed fraud-scoring version 1" in dep.stdout

    # Scores from the model's own Serve application equal a direct call of fraud.pt2.
    _publish(home, tmp_path, "a")
    v1 = _direct(EXAMPLE / "fraud.pt2")
    out = _scored(home, 3)
    for i, score in enumerate(v1):
        e = out[f"a{i}"]
        assert e["type"] == "transaction.scored" and e["data"]["model_version"] == 1  # type: ignore[index]
        assert abs(e["data"]["fraud_score"] - score) < 1e-5, (e, score)  # type: ignore[index]
        assert e["flagged"] == ("true" if score > 0.5 else "false")  # a Kafka header: a string
    assert out["a0"]["flagged"] == "true" and out["a1"]["flagged"] == "false"

    # A second version, trained by the example's own code (deterministic: seed 1).
    train = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            "--out",
            str(tmp_path / "v2"),
            "--seed",
            "1",
            "--epochs",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert train.returncode == 0, train.stderr
    push = eb(home, "model", "push", "fraud", str(tmp_path / "v2" / "fraud.pt2"))
    assert push.returncode == 0, push.stderr
    assert "model fraud version 2 validated and serving" in push.stdout, push.stdout
    _publish(home, tmp_path, "b")
    v2 = _direct(tmp_path / "v2" / "fraud.pt2")
    assert v1 != v2
    out = _scored(home, 6)
    for i, score in enumerate(v2):
        e = out[f"b{i}"]
        assert e["data"]["model_version"] == 2 and abs(e["data"]["fraud_score"] - score) < 1e-5, (
            e,
            score,
        )  # type: ignore[index]

    # A/B: a quarter of the events to version 1; then the split ends.
    split = eb(home, "model", "split", "fraud", "1", "--weight", "0.25")
    assert split.returncode == 0, split.stderr
    assert "model fraud: version 1 takes 25%, version 2 the rest" in split.stdout
    ls = eb(home, "model", "list")
    assert ls.returncode == 0, ls.stderr
    rows = _rows(ls.stdout)
    assert list(rows) == [1, 2] and all("export" in r for r in rows.values()), ls.stdout
    assert "split" in rows[1] and "25%" in rows[1] and "serving" in rows[2] and "75%" in rows[2], (
        ls.stdout
    )
    usage = eb(home, "model", "split", "fraud")
    assert usage.returncode == 2 and "give a VERSION" in usage.stderr
    off = eb(home, "model", "split", "fraud", "--off")
    assert off.returncode == 0 and "model fraud: version 2 takes all events" in off.stdout, (
        off.stderr
    )

    # Broken files are refused: one that is no torch artifact (nothing stored), one whose
    # outputs are not finite on the recorded requests (stored as rejected); v2 serves on.
    (tmp_path / "junk.pt2").write_bytes(b"not a model")
    junk = eb(home, "model", "push", "fraud", str(tmp_path / "junk.pt2"))
    assert junk.returncode == 1, junk.stdout
    assert re.search(r"^error: .*is not a torch artifact", junk.stderr, re.M), junk.stderr
    assert "Traceback" not in junk.stderr and "RayTaskError" not in junk.stderr, junk.stderr

    class NaN(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, :1] * float("nan")

    ep = torch.export.export(
        NaN(), (torch.tensor(ROWS),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(ep, tmp_path / "nan.pt2")
    nan = eb(home, "model", "push", "fraud", str(tmp_path / "nan.pt2"))
    assert nan.returncode == 1, nan.stdout
    assert re.search(r"^rejected: .*non-finite outputs", nan.stderr, re.M), nan.stderr
    assert "Traceback" not in nan.stderr and "RayTaskError" not in nan.stderr, nan.stderr
    ls = eb(home, "model", "list", "fraud")
    rows = _rows(ls.stdout)
    assert list(rows) == [1, 2, 3] and "serving" in rows[2] and "100%" in rows[2], ls.stdout
    assert "rejected" in rows[3] and "non-finite" in rows[3], ls.stdout
    assert eb(home, "delete", "fraud-scoring").returncode == 0
