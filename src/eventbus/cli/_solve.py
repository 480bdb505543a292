"""``eventbus solve``: solve an allocation problem file (or a generated one) with live progress.

Exit codes: 0 solved to the gap, 1 invalid input or gap not reached, 2 usage. Torch (and Ray,
with ``--ray-partitions``) load when the command runs, not when the CLI starts.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from eventbus.cli._common import (
    EXIT_FAILED,
    EXIT_USAGE,
    RAY_ADDRESS_ENV,
    REDIS_URL_ENV,
    fail,
    out,
)
from eventbus.errors import EventBusError

if TYPE_CHECKING:
    from eventbus.solver import AllocationProblem, SolveProgress, SolveResult

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add this group's command to the ``eventbus`` app.

    Args:
        app: The root app.
    """
    app.command("solve")(solve_command)


def _parse_sizes(text: str) -> tuple[int, int, int]:
    try:
        n, m, k = (int(float(part)) for part in text.split(","))
    except ValueError:
        fail(
            f"--generate takes n,m,K (users, items, resources), e.g. 100000,100,10; got {text!r}",
            EXIT_USAGE,
        )
    if min(n, m, k) < 1:
        fail(f"--generate sizes must be positive; got {text!r}", EXIT_USAGE)
    return n, m, k


def solve_command(
    file: Path | None = typer.Argument(
        None, help="Problem file (.npz or .pt; see eventbus.solver.load_problem)."
    ),
    generate: str | None = typer.Option(
        None, "--generate", help="Solve a generated instance: n,m,K."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated instance."),
    mixed: bool = typer.Option(
        False,
        "--mixed",
        help="Generated instance with mixed rows: budgets count expected spend, inventories count coupons.",
    ),
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
        None, "--redis-url", envvar=REDIS_URL_ENV, help="Redis of the stack (for --publish)."
    ),
) -> None:
    """Solve an allocation LP (coupons, budgets, inventories) to a certified gap; print the duals' figures."""
    if (file is None) == (generate is None):
        fail("give either a problem FILE or --generate n,m,K (exactly one)", EXIT_USAGE)
    if not 0 < gap < 1:
        fail(f"--gap must lie in (0, 1); got {gap!r}", EXIT_USAGE)
    if mixed and generate is None:
        fail("--mixed applies to --generate only (a problem file says its own rows)", EXIT_USAGE)
    if publish is not None and (publish.count(":") != 1 or not redis_url):
        fail(
            f"--publish takes PIPELINE:STEP and needs --redis-url (or {REDIS_URL_ENV})",
            EXIT_USAGE,
        )
    from eventbus.solver import generate_problem, load_problem

    try:
        if generate is not None:
            n, m, k = _parse_sizes(generate)
            with out.status(f"generating {n} x {m} x {k} (seed {seed})..."):
                problem = generate_problem(n, m, k, seed=seed, mixed=mixed)
        else:
            assert file is not None
            if not file.exists():
                fail(f"problem file {str(file)!r} does not exist", EXIT_FAILED)
            problem = load_problem(file)
        result = _run(problem, gap, device, ray_partitions, max_iterations)
    except EventBusError as exc:
        fail(str(exc), EXIT_FAILED)
    _report(problem, result)
    if output is not None:
        output.write_text(json.dumps(_figures(problem, result), indent=2) + "\n", encoding="utf-8")
        out.print(f"wrote {output}", highlight=False)
    if not result.converged:
        fail(
            f"gap {result.gap:.3g} did not reach {gap:g} in {result.iterations} steps; raise --max-iterations",
            EXIT_FAILED,
        )
    if publish is not None:
        from eventbus.pipelines.steps._allocate_config import publish_duals

        pipeline, step = publish.split(":")
        assert redis_url is not None
        publish_duals(redis_url, pipeline, step, result.duals)
        out.print(f"published the duals to {pipeline}:{step}", highlight=False)


def _run(
    problem: AllocationProblem, gap: float, device: str, partitions: int | None, max_iterations: int
) -> SolveResult:
    from eventbus.solver import solve

    size = (
        f"{problem.num_users} users x {problem.num_items} items, {problem.num_resources} resources"
    )
    if partitions is not None:
        import ray

        from eventbus.solver import solve_distributed

        started = not ray.is_initialized()
        if started:
            ray.init(
                address=os.environ.get(RAY_ADDRESS_ENV) or None,
                include_dashboard=False,
                logging_level=logging.WARNING,
            )
        try:
            with out.status(f"solving {size} over {partitions} Ray partition(s)..."):
                return solve_distributed(
                    problem, partitions, gap=gap, max_iterations=max_iterations
                )
        finally:
            if started:
                ray.shutdown()
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out, transient=False) as progress:
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
    out.print(
        f"{state}: gap {r.gap:.2e}, primal {r.primal_value:.8g}, dual bound {r.dual_value:.8g}, "
        f"{r.iterations} steps / {r.evaluations} passes in {r.seconds:.2f} s; "
        f"{binding} of {problem.num_resources} resources binding",
        highlight=False,
    )
