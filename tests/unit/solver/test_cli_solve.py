"""``eventbus solve`` and the package surface."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from eventbus.cli import app
from eventbus.solver import generate_problem, save_problem

runner = CliRunner()


def test_solve_generated_writes_duals(tmp_path: Path) -> None:
    out = tmp_path / "lambda.json"
    res = runner.invoke(
        app,
        ["solve", "--generate", "300,10,5", "--seed", "2", "--device", "cpu", "--output", str(out)],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert len(doc["duals"]) == 5 and doc["converged"] and doc["gap"] <= 1e-4


def test_solve_file(tmp_path: Path) -> None:
    save_problem(generate_problem(100, 6, 4, seed=1, sparse=True), tmp_path / "p.npz")
    res = runner.invoke(app, ["solve", str(tmp_path / "p.npz"), "--gap", "1e-3"])
    assert res.exit_code == 0, res.output
    assert "solved: gap" in res.output


def test_solve_mixed_file_and_generated(tmp_path: Path) -> None:
    save_problem(generate_problem(150, 8, 9, seed=3, mixed=True), tmp_path / "mixed.pt")
    res = runner.invoke(app, ["solve", str(tmp_path / "mixed.pt"), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "solved: gap" in res.output
    res = runner.invoke(app, ["solve", "--generate", "150,8,9", "--mixed", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["solve", str(tmp_path / "mixed.pt"), "--mixed"])
    assert res.exit_code == 2 and "--mixed applies to --generate only" in res.output


def test_solve_exit_codes(tmp_path: Path) -> None:
    assert runner.invoke(app, ["solve"]).exit_code == 2
    assert runner.invoke(app, ["solve", "--generate", "3,x"]).exit_code == 2
    assert runner.invoke(app, ["solve", str(tmp_path / "missing.npz")]).exit_code == 1
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    res = runner.invoke(app, ["solve", str(tmp_path / "bad.npz")])
    assert res.exit_code == 1 and "cannot read problem file" in res.output


def test_surface_sorted_and_lazy() -> None:
    import eventbus.solver as solver

    assert solver.__all__ == sorted(solver.__all__)
    assert all(hasattr(solver, name) for name in solver.__all__)
    code = "import sys, eventbus.solver, eventbus.cli; print('torch' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    code = "import sys; from eventbus.solver import solve, solve_distributed; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
