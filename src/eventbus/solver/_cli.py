"""``eventbus solve``: solve an allocation problem file (or a generated one) with live progress.

Registered in :mod:`eventbus.cli` as ``app.command("solve")(solve_command)``. Exit codes: 0 solved
to the gap, 1 invalid input or gap not reached, 2 usage.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from eventbus.errors import EventBusError

if TYPE_CHECKING:  # torch loads when the command runs, not when the CLI starts
    from eventbus.solver._problem import AllocationProblem
    from eventbus.solver._solve import SolveProgress, SolveResult

__all__ = ["solve_command"]

_out = Console()
_err = Console(stderr=True)


def _fail(message: str, code: int) -> typer.Exit:
    _err.print("[red]error:[/red] ", end="")
    _err.print(message, markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _parse_sizes(text: str) -> tuple[int, int, int]:
    try:
        n, m, k = (int(float(part)) for part in text.split(","))
    except ValueError:
        raise _fail(
            f"--generate takes n,m,K (users, items, resources), e.g. 100000,100,10; got {text!r}", 2
        ) from None
    if min(n, m, k) < 1:
        raise _fail(f"--generate sizes must be positive; got {text!r}", 2)
    return n, m, k


def solve_command(
    file: Path | None = typer.Argument(
        None, help="Problem file (.npz or .pt; see eventbus.solver.load_problem)."
    ),
    generate: str | None = typer.Option(
        None, "--generate", help="Solve a generated instance: n,m,K."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated instance."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N]."),
    gap: float = typer.Option(1e-4, "--gap", help="Target certified relative primal-dual gap."),
    ray_partitions: int | None = typer.Option(
        None,
        "--ray-partitions",
        min=1,
        help="Solve over this many Ray actors (RAY_ADDRESS or a local Ray).",
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the duals and figures as JSON."
    ),
    max_iterations: int = typer.Option(
        1000, "--max-iterations", min=1, help="Cap on solver steps."
    ),
    publish: str | None = typer.Option(
        None,
        "--publish",
        help="Publish the duals to a pipeline's allocate step: PIPELINE:STEP (needs --redis-url).",
    ),
    redis_url: str | None = typer.Option(
        None, "--redis-url", envvar="EVENTBUS_REDIS_URL", help="Redis of the stack (for --publish)."
    ),
) -> None:
    """Solve an allocation LP (coupons, budgets, inventories) to a certified gap; print the duals' figures."""
    if (file is None) == (generate is None):
        raise _fail("give either a problem FILE or --generate n,m,K (exactly one)", 2)
    if not 0 < gap < 1:
        raise _fail(f"--gap must lie in (0, 1); got {gap!r}", 2)
    if publish is not None and (publish.count(":") != 1 or not redis_url):
        raise _fail(
            "--publish takes PIPELINE:STEP and needs --redis-url (or EVENTBUS_REDIS_URL)", 2
        )
    from eventbus.solver._generate import generate_problem
    from eventbus.solver._io import load_problem

    try:
        if generate is not None:
            n, m, k = _parse_sizes(generate)
            with _out.status(f"generating {n} x {m} x {k} (seed {seed})..."):
                problem = generate_problem(n, m, k, seed=seed)
        else:
            assert file is not None
            if not file.exists():
                raise _fail(f"problem file {str(file)!r} does not exist", 1)
            problem = load_problem(file)
        result = _run(problem, gap, device, ray_partitions, max_iterations)
    except EventBusError as exc:
        raise _fail(str(exc), 1) from None
    _report(problem, result)
    if output is not None:
        output.write_text(json.dumps(_figures(problem, result), indent=2) + "\n", encoding="utf-8")
        _out.print(f"wrote {output}", highlight=False)
    if not result.converged:
        raise _fail(
            f"gap {result.gap:.3g} did not reach {gap:g} in {result.iterations} steps; raise --max-iterations",
            1,
        )
    if publish is not None:
        from eventbus.pipelines._allocate import publish_duals

        pipeline, step = publish.split(":")
        assert redis_url is not None
        publish_duals(redis_url, pipeline, step, result.duals)
        _out.print(f"published the duals to {pipeline}:{step}", highlight=False)


def _run(
    problem: AllocationProblem, gap: float, device: str, partitions: int | None, max_iterations: int
) -> SolveResult:
    from eventbus.solver._solve import solve

    size = (
        f"{problem.num_users} users x {problem.num_items} items, {problem.num_resources} resources"
    )
    if partitions is not None:
        import ray

        from eventbus.solver._distributed import solve_distributed

        started = not ray.is_initialized()
        if started:
            ray.init(
                address=os.environ.get("RAY_ADDRESS") or None,
                include_dashboard=False,
                logging_level="WARNING",
            )
        try:
            with _out.status(f"solving {size} over {partitions} Ray partition(s)..."):
                return solve_distributed(
                    problem, partitions, gap=gap, max_iterations=max_iterations
                )
        finally:
            if started:
                ray.shutdown()
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=_out, transient=False) as progress:
        task = progress.add_task(f"solving {size}", total=1.0, info="")
        start_gap: list[float] = []

        def show(p: SolveProgress) -> None:
            if not start_gap and math.isfinite(p.gap) and p.gap > gap:
                start_gap.append(p.gap)
            done = 0.0
            if start_gap and p.gap > 0:
                done = min(
                    1.0,
                    max(
                        0.0, math.log(start_gap[0] / max(p.gap, gap)) / math.log(start_gap[0] / gap)
                    ),
                )
            info = f"step {p.iteration}  gap {p.gap:.2e}  dual {p.dual_value:.6g}  tau {p.temperature:.1e}"
            progress.update(task, completed=done, info=info)

        result = solve(
            problem, gap=gap, device=device, max_iterations=max_iterations, callback=show
        )
        progress.update(task, completed=1.0 if result.converged else progress.tasks[0].completed)
    return result


def _figures(problem: AllocationProblem, r: SolveResult) -> dict[str, object]:
    return {
        "duals": r.duals.tolist(),
        "primal_value": r.primal_value,
        "dual_value": r.dual_value,
        "gap": r.gap,
        "converged": r.converged,
        "iterations": r.iterations,
        "evaluations": r.evaluations,
        "temperature": r.temperature,
        "seconds": r.seconds,
        "usage": r.usage.tolist(),
        "budget": problem.budget.double().tolist(),
        "num_users": problem.num_users,
        "num_items": problem.num_items,
        "num_resources": problem.num_resources,
    }


def _report(problem: AllocationProblem, r: SolveResult) -> None:
    binding = int(((r.usage / problem.budget.double().cpu()) > 0.999).sum())
    state = "[green]solved[/green]" if r.converged else "[yellow]not converged[/yellow]"
    _out.print(
        f"{state}: gap {r.gap:.2e}, primal {r.primal_value:.8g}, dual bound {r.dual_value:.8g}, "
        f"{r.iterations} steps / {r.evaluations} passes in {r.seconds:.2f} s; "
        f"{binding} of {problem.num_resources} resources binding",
        highlight=False,
    )
