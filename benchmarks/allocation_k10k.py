"""Benchmark: the allocation LP with K = 10,000 resources (issue #44, part 1) against HiGHS.

Run: ``python benchmarks/allocation_k10k.py [--quick] [--users N] [--items M] [--resources K]
[--segments G] [--gap 1e-3] [--highs-limit-s 1800] [--highs-users 1000,3000,...]
[--skip-highs] [--threads T]``.

Instances come from ``eventbus.solver._segments.generate_segment_problem``: budgets on expected
spend per (user segment, item category) and inventories per (item, segment cluster), plus one
global budget; defaults 1e5 users x 100 items (1e7 variables), K = 10,000, 100 segments.
EventBus solves it to a certified relative gap (1e-3) in the factorised and in the sparse
``(n, m, K)`` form, each in a fresh process (its peak RSS includes generating the instance).
Targets: < 60 s and < 8 GB each.

HiGHS (IPM, crossover off, ``ipm_optimality_tolerance`` = the same gap, ``time_limit``
``--highs-limit-s``) runs on the same family with K = 10,000 at growing user counts
(``--highs-users``), each in a fresh process (solved: status ``Optimal``, or ``Unknown`` as
IPM without crossover ends at its tolerance, within the limit), stopping before a size whose
predicted time (the last time times the growth in variables, to the power 1.2) passes the
limit; EventBus (factorised) solves the largest instance HiGHS solved in the same run: both
times, both objectives and the ratio. ``--quick``: 20,000 users x 50 items, K = 3,001 (the
L-BFGS-B path), 30 segments, HiGHS at 1,000 and 3,000 users: a smoke run of a minute or two.

Prints one line per measurement, then, as its LAST line, one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

GROWTH_POWER = 1.2  # HiGHS IPM's time grows at least this fast in the variables (K fixed)


def _instance(args: argparse.Namespace, users: int, sparse: bool) -> Any:
    from eventbus.solver._segments import generate_segment_problem

    return generate_segment_problem(
        users,
        args.items,
        args.resources,
        num_segments=args.segments,
        seed=0,
        sparse=sparse,
    )


def _peak_gb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3)


def child_eventbus(args: argparse.Namespace) -> dict[str, Any]:
    """One EventBus solve in this (fresh) process."""
    from eventbus.solver import solve

    t0 = time.perf_counter()
    problem = _instance(args, args.users, args.form == "sparse")  # (not timed)
    gen_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    r = solve(problem, gap=args.gap, device="cpu", num_threads=args.threads)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    over = float((r.usage - problem.budget.double()).clamp_min(0).max())
    return {
        "form": args.form,
        "users": args.users,
        "variables": args.users * args.items,
        "resources": args.resources,
        "seconds": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "load_average": round(os.getloadavg()[0], 2),
        "gap": r.gap,
        "converged": r.converged,
        "iterations": r.iterations,
        "passes": r.evaluations,
        "primal": r.primal_value,
        "dual_bound": r.dual_value,
        "max_budget_excess": over,
        "generate_s": round(gen_s, 2),
        "peak_rss_gb": _peak_gb(),
    }


def child_highs(args: argparse.Namespace) -> dict[str, Any]:
    """One HiGHS solve in this (fresh) process."""
    from eventbus.solver._highs import solve_with_highs

    problem = _instance(args, args.users, False)
    h = solve_with_highs(
        problem, solver="ipm", gap=args.gap, threads=args.threads, time_limit=args.highs_limit_s
    )
    return {
        "users": args.users,
        "variables": args.users * args.items,
        "resources": args.resources,
        "status": h.status,
        "seconds": round(h.solve_seconds, 3),
        "build_s": round(h.build_seconds, 3),
        "objective": h.objective,
        "peak_rss_gb": _peak_gb(),
    }


def _run_child(args: argparse.Namespace, kind: str, users: int, form: str = "") -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, "--users", str(users)]
    cmd += ["--items", str(args.items), "--resources", str(args.resources)]
    cmd += ["--segments", str(args.segments), "--gap", str(args.gap)]
    cmd += ["--highs-limit-s", str(args.highs_limit_s)]
    if form:
        cmd += ["--form", form]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        msg = f"{kind} child ({users} users) failed, exit {out.returncode}: {out.stderr[-2000:]}"
        raise RuntimeError(msg)
    row: dict[str, Any] = json.loads(lines[-1])
    print(kind, form, json.dumps(row), flush=True)
    return row


def _highs_ladder(args: argparse.Namespace) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """HiGHS at growing sizes; the largest it solved (optimal within the limit) and every row."""
    rows: list[dict[str, Any]] = []
    best = None
    last: dict[str, Any] | None = None
    for users in args.highs_users:
        if last is not None:
            predicted = last["seconds"] * (users / last["users"]) ** GROWTH_POWER
            if predicted > args.highs_limit_s:
                print(f"highs: {users} users skipped (predicted {predicted:.0f} s)", flush=True)
                break
        row = _run_child(args, "highs", users)
        rows.append(row)
        # IPM without crossover often ends "Unknown" at its tolerance, with its objective
        if row["status"] not in ("Optimal", "Unknown") or row["seconds"] >= args.highs_limit_s:
            break
        best = last = row
    return best, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--resources", type=int, default=10_000)
    ap.add_argument("--segments", type=int, default=100)
    ap.add_argument("--gap", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--highs-limit-s", type=float, default=1800.0)
    ap.add_argument(
        "--highs-users",
        type=lambda s: [int(float(x)) for x in s.split(",")],
        default=[1000, 3000, 10_000, 30_000, 100_000],
    )
    ap.add_argument("--skip-highs", action="store_true")
    ap.add_argument("--forms", default="factorised,sparse", help="'' for HiGHS alone")
    ap.add_argument("--child", choices=["eventbus", "highs"], help=argparse.SUPPRESS)
    ap.add_argument("--form", default="factorised", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "eventbus":
        print(json.dumps(child_eventbus(args)))
        return
    if args.child == "highs":
        print(json.dumps(child_highs(args)))
        return
    if args.quick:
        args.users, args.items, args.resources, args.segments = 20_000, 50, 3001, 30
        args.highs_users = [1000, 3000]
    forms = [f for f in args.forms.split(",") if f]
    out: dict[str, Any] = {
        "benchmark": "allocation_k10k",
        "quick": args.quick,
        "variables": args.users * args.items,
        "users": args.users,
        "items": args.items,
        "resources": args.resources,
        "segments": args.segments,
        "target_gap": args.gap,
    }
    for form in forms:
        row = _run_child(args, "eventbus", args.users, form)
        out[f"{form}_s"] = row["seconds"]
        out[f"{form}_cpu_s"] = row["cpu_s"]
        out[f"{form}_load_average"] = row["load_average"]
        out[f"{form}_gap"] = row["gap"]
        out[f"{form}_passes"] = row["passes"]
        out[f"{form}_peak_rss_gb"] = row["peak_rss_gb"]
        out[f"{form}_meets_target"] = (
            row["converged"] and row["seconds"] < 60 and row["peak_rss_gb"] < 8
        )
    if not args.skip_highs:
        best, rows = _highs_ladder(args)
        out["highs_runs"] = [{k: r[k] for k in ("users", "status", "seconds")} for r in rows]
        if best is not None:
            eb = _run_child(args, "eventbus", best["users"], "factorised")
            out.update(
                highs_largest_variables=best["variables"],
                highs_s=best["seconds"],
                highs_objective=best["objective"],
                eventbus_same_instance_s=eb["seconds"],
                eventbus_same_instance_cpu_s=eb["cpu_s"],
                eventbus_same_instance_primal=eb["primal"],
                eventbus_same_instance_gap=eb["gap"],
                speedup_vs_highs=round(best["seconds"] / max(eb["seconds"], 1e-9), 1),
                primal_vs_highs=(best["objective"] - eb["primal"]) / abs(best["objective"]),
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
