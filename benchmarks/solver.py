"""Benchmark: eventbus.solver vs HiGHS interior point (crossover off) on coupon-allocation LPs.

Run: ``python benchmarks/solver.py [--huge] [--skip-highs-above N] [--family single,mixed]
[--variables 1e6] [--only USERSxK] [--threads T]`` (``--variables``: only instances of these
sizes; ``--only``: only these instances; ``--skip-highs-above 0``: no HiGHS, for quick
sparse-vs-factorised runs), or ``python benchmarks/solver.py --distributed [--users N] [--threads T]`` to compare, on one
1e8-variable instance (N = 1e6 users, K = 100, gap 1e-3), the local solve with the Ray solve
split over two partition workers (same threads each): both times, both gaps and the largest
difference between their duals; ``--sampled-vs-cold [--users N] [--threads T]`` times three
solves of that instance from the sampled warm start against one cold solve (wall and CPU);
``--cuda [--users N]`` solves it to a certified 1e-4 on the GPU (three sampled starts, one cold)
against one solve on the CPUs in the same run.
Single-weight instances are generated (``generate_problem(n, 100, K, seed=0)``, float32) at 1e4,
1e5 and 1e6 variables with K = 10 and 100, then 1e7 variables with K = 100 (EventBus alone unless
HiGHS is allowed that far), and with ``--huge`` 1e8 variables with K = 100 in a fresh process
(for an honest peak RSS). The mixed-row family (``mixed=True``: budgets count expected spend,
inventories count coupons) runs at 1e6 variables with K = 10 and 100, factorised and as the same
problem in the sparse ``(n, m, K)`` form, with HiGHS in the same run; the single-weight 1e6
instances are solved in the sparse form too. Both forms are timed alike: each problem object
(factorised, and ``to_sparse()`` of it) is built before any timing, both solve with the same
threads after the same warm-up, ``--repeat`` times (default 3) alternating factorised and
sparse, and the median wall time of ``solve()`` is reported (``*_runs_s``: every run; ``*_cpu_s`` and
``sparse_vs_factorised_cpu``: the median process CPU time, less moved by other jobs). The sparse
time includes building the pass (CSR rows, the row-pattern compression and the user classes;
``sparse_build_s`` on its own, timed once more after the solves).

EventBus's time is its wall time to a certified relative gap (1e-4; 1e-3 at 1e7 and above);
HiGHS's is its ``run()`` time with ``solver=ipm``, ``run_crossover=off`` and
``ipm_optimality_tolerance=1e-4`` (building the model is reported apart). Prints one line per
instance, then one JSON line with the figures and the speedups.
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

try:
    from eventbus.solver import generate_problem, solve
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from eventbus.solver import generate_problem, solve

ITEMS = 100


THREADS: int | None = None  # --threads: torch threads of every EventBus solve (None: all CPUs)


REPEAT = 3  # --repeat: solves per form and instance (the median is reported)


CPU_S: list[float] = []  # the process CPU time of each _timed solve, in order


def _timed(problem: Any, gap: float) -> tuple[float, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    r = solve(problem, gap=gap, device="cpu", num_threads=THREADS)
    CPU_S.append(time.process_time() - c0)
    return time.perf_counter() - t0, r


def _eventbus(
    n: int, k: int, gap: float, *, mixed: bool = False, sparse: bool = False
) -> dict[str, Any]:
    """The factorised solve (and with ``sparse``, the same problem's sparse form), each timed
    ``REPEAT`` times, alternating: both forms' problem objects are built before any timing, both
    run with the same threads after the same warm-up, and each time is the wall time of
    ``solve()`` alone (the sparse form's includes building its pass: CSR rows, patterns)."""
    import statistics

    t0 = time.perf_counter()
    problem = generate_problem(n, ITEMS, k, seed=0, mixed=mixed)
    gen_s = time.perf_counter() - t0
    sp = problem.to_sparse() if sparse else None
    walls: list[float] = []
    sparse_walls: list[float] = []
    cpus: list[float] = []
    sparse_cpus: list[float] = []
    for _ in range(REPEAT):
        wall, r = _timed(problem, gap)
        walls.append(wall)
        cpus.append(CPU_S[-1])
        if sp is not None:
            s_wall, rs = _timed(sp, gap)
            sparse_walls.append(s_wall)
            sparse_cpus.append(CPU_S[-1])
    wall = statistics.median(walls)
    row = {
        "family": "mixed" if mixed else "single",
        "variables": n * ITEMS,
        "users": n,
        "resources": k,
        "target_gap": gap,
        "eventbus_s": round(wall, 4),
        "eventbus_runs_s": [round(w, 4) for w in walls],
        "eventbus_cpu_s": round(statistics.median(cpus), 4),
        "eventbus_gap": r.gap,
        "eventbus_converged": r.converged,
        "eventbus_iterations": r.iterations,
        "eventbus_passes": r.evaluations,
        "eventbus_primal": r.primal_value,
        "eventbus_dual_bound": r.dual_value,
        "generate_s": round(gen_s, 2),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3),
    }
    if sp is not None:
        _sparse(sp, rs, statistics.median(sparse_walls), sparse_walls, row)
        cpu = statistics.median(sparse_cpus)
        # process CPU seconds (all threads): less moved by other jobs than the wall time
        row["sparse_cpu_s"] = round(cpu, 4)
        row["sparse_vs_factorised_cpu"] = round(cpu / row["eventbus_cpu_s"], 2)
    return row


def _sparse(problem: Any, r: Any, wall: float, walls: list[float], row: dict[str, Any]) -> None:
    from eventbus.solver._kernel import Partition
    from eventbus.solver._solve import BLOCK_CHUNKS, chunk_users_for

    t0 = time.perf_counter()
    part = Partition(problem, chunk_users_for(ITEMS), BLOCK_CHUNKS)
    build = time.perf_counter() - t0
    pats = [pat.num_patterns for pat in part._s.pats if pat is not None]
    classes = [pat.classes.num for pat in part._s.pats if pat is not None and pat.classes]
    row.update(
        sparse_s=round(wall, 4),
        sparse_runs_s=[round(w, 4) for w in walls],
        sparse_build_s=round(build, 4),
        sparse_patterns=sum(pats) if pats else None,
        sparse_class_blocks=len(classes),
        sparse_gap=r.gap,
        sparse_iterations=r.iterations,
        sparse_passes=r.evaluations,
        sparse_primal=r.primal_value,
        sparse_dual_bound=r.dual_value,
        sparse_vs_factorised=round(wall / row["eventbus_s"], 2),
    )


def _highs(n: int, k: int, row: dict[str, Any]) -> None:
    from eventbus.solver._highs import solve_with_highs

    problem = generate_problem(n, ITEMS, k, seed=0, mixed=row["family"] == "mixed")
    h = solve_with_highs(problem, solver="ipm", gap=1e-4)
    row.update(
        highs_s=round(h.solve_seconds, 3),
        highs_build_s=round(h.build_seconds, 3),
        highs_status=h.status,
        highs_objective=h.objective,
        speedup=round(h.solve_seconds / row["eventbus_s"], 1),
        primal_vs_highs=(h.objective - row["eventbus_primal"]) / abs(h.objective),
    )


def _distributed(n: int, k: int, gap: float, threads: int | None) -> dict[str, Any]:
    import ray
    import torch

    from eventbus.solver import solve_distributed

    t0 = time.perf_counter()
    problem = generate_problem(n, ITEMS, k, seed=0)
    gen_s = time.perf_counter() - t0
    local = solve(problem, gap=gap, device="cpu", num_threads=threads)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        t0 = time.perf_counter()
        dist = solve_distributed(problem, 2, gap=gap, num_threads=threads)
        dist_wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    diff = float((dist.duals - local.duals).abs().max())
    top = float(torch.maximum(dist.duals.abs(), local.duals.abs()).max())
    return {
        "benchmark": "solver-distributed",
        "variables": n * ITEMS,
        "resources": k,
        "target_gap": gap,
        "threads_each": threads or "default",
        "generate_s": round(gen_s, 2),
        "local_s": round(local.seconds, 3),
        "local_gap": local.gap,
        "local_passes": local.evaluations,
        "distributed_s": round(dist.seconds, 3),
        "distributed_wall_s": round(dist_wall, 3),
        "distributed_gap": dist.gap,
        "distributed_passes": dist.evaluations,
        "max_dual_difference": diff,
        "max_dual_difference_relative": diff / max(top, 1e-300),
        "dual_bound_relative_difference": abs(dist.dual_value - local.dual_value)
        / abs(local.dual_value),
        "same_duals_to_the_gap": diff <= gap * max(top, 1e-300),
    }


def _sampled_vs_cold(n: int, rounds: int) -> dict[str, Any]:
    """1e8 (n users x 100 items, K = 100, gap 1e-3): the sampled warm start (``rounds`` solves)
    against the cold start (one solve) on one instance, wall and CPU seconds (on a shared machine
    the CPU time is the figure: with one thread it is the quiet machine's wall time)."""
    import statistics

    problem = generate_problem(n, ITEMS, 100, seed=0)
    runs = []
    for sampled in [True] * rounds + [False]:
        load = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        r = solve(problem, gap=1e-3, device="cpu", num_threads=THREADS, sample_start=sampled)
        runs.append(
            {
                "sample_start": sampled,
                "wall_s": round(time.perf_counter() - t0, 3),
                "cpu_s": round(time.process_time() - c0, 3),
                "passes": r.evaluations,
                "gap": r.gap,
                "load_average_1m": round(load, 1),
            }
        )
        print(runs[-1], flush=True)
    warm = [x for x in runs if x["sample_start"]]
    cold = runs[-1]
    cpu = statistics.median(x["cpu_s"] for x in warm)
    return {
        "benchmark": "solver-sampled-start",
        "variables": n * ITEMS,
        "threads": THREADS or "all",
        "runs": runs,
        "median_wall_s": statistics.median(x["wall_s"] for x in warm),
        "median_cpu_s": cpu,
        "cold_cpu_s": cold["cpu_s"],
        "cold_over_sampled_cpu": round(cold["cpu_s"] / cpu, 2),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3),
    }


def _cuda(n: int, rounds: int) -> dict[str, Any]:
    """1e8 (n users x 100 items, K = 100) to a certified 1e-4 on CUDA: ``rounds`` solves from the
    sampled warm start and one cold solve on the GPU, the problem already on the device (its
    host-to-device copy timed apart), against one solve of the same instance on this machine's
    CPUs (all threads) in the same run."""
    import statistics

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--cuda needs a CUDA GPU (torch.cuda.is_available() is false)")
    problem = generate_problem(n, ITEMS, 100, seed=0)
    # warm-up, unmeasured: CUDA context, kernels' first launches
    solve(generate_problem(10_000, ITEMS, 100, seed=1), gap=1e-3, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    on_gpu = problem.to(torch.device("cuda"))
    torch.cuda.synchronize()
    copy_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    runs = []
    for sampled in [True] * rounds + [False]:
        t0 = time.perf_counter()
        r = solve(on_gpu, gap=1e-4, device="cuda", sample_start=sampled)
        torch.cuda.synchronize()
        runs.append(
            {
                "sample_start": sampled,
                "wall_s": round(time.perf_counter() - t0, 3),
                "passes": r.evaluations,
                "gap": r.gap,
                "converged": r.converged,
            }
        )
        print(runs[-1], flush=True)
    gpu_peak = torch.cuda.max_memory_allocated() / 1e9
    t0 = time.perf_counter()
    cpu = solve(problem, gap=1e-4, device="cpu", num_threads=THREADS)
    cpu_s = time.perf_counter() - t0
    print({"device": "cpu", "wall_s": round(cpu_s, 3), "passes": cpu.evaluations}, flush=True)
    warm = statistics.median(x["wall_s"] for x in runs if x["sample_start"])
    return {
        "benchmark": "solver-cuda",
        "gpu": torch.cuda.get_device_name(0),
        "variables": n * ITEMS,
        "gap": 1e-4,
        "runs": runs,
        "median_wall_s": warm,
        "cold_wall_s": runs[-1]["wall_s"],
        "host_to_device_copy_s": round(copy_s, 3),
        "gpu_peak_memory_gb": round(gpu_peak, 2),
        "cpu_threads": torch.get_num_threads(),
        "cpu_wall_s": round(cpu_s, 3),
        "cpu_gap": cpu.gap,
        "cpu_over_gpu": round(cpu_s / warm, 1),
    }


def _fresh_process(n: int, k: int, gap: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", f"{n},{k},{gap}", "--repeat", "1"]
    if THREADS:
        cmd += ["--threads", str(THREADS)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy())
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _ratio(x: float) -> str:
    """A speedup for display: whole numbers from 10 up, two significant digits below (0.5, 0.043)."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def _line(row: dict[str, Any]) -> str:
    text = (
        f"{row['family']:<6} {row['variables']:>11,} vars K={row['resources']:<3} eventbus {row['eventbus_s']:8.3f} s "
        f"gap {row['eventbus_gap']:.1e} ({row['eventbus_iterations']} steps, {row['eventbus_passes']} passes)"
    )
    if "sparse_s" in row:
        text += (
            f" | sparse form {row['sparse_s']:8.3f} s ({row['sparse_vs_factorised']}x,"
            f" gap {row['sparse_gap']:.1e}, build {row['sparse_build_s']:.2f} s)"
        )
    if "highs_s" in row:
        text += f" | HiGHS ipm {row['highs_s']:8.2f} s ({row['highs_status']}) speedup {_ratio(row['highs_s'] / row['eventbus_s'])}x"
    elif "highs_skipped" in row:
        text += f" | HiGHS skipped: {row['highs_skipped']}"
    return text + f" | peak RSS {row['peak_rss_gb']:.2f} GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--huge", action="store_true", help="also 1e8 variables (K=100), in a fresh process"
    )
    ap.add_argument(
        "--skip-highs-above", type=float, default=1e6, help="no HiGHS above this many variables"
    )
    ap.add_argument(
        "--family",
        default="single,mixed",
        help="instance families to run: single (one weight), mixed (mixed rows), or both",
    )
    ap.add_argument(
        "--variables",
        default="",
        help="only instances of these sizes (comma-separated variable counts, e.g. 1e6)",
    )
    ap.add_argument(
        "--distributed",
        action="store_true",
        help="compare the local and the two-worker Ray solve on one instance (see --users)",
    )
    ap.add_argument(
        "--sampled-vs-cold",
        action="store_true",
        help="1e8 (see --users): 3 solves from the sampled warm start against one cold solve",
    )
    ap.add_argument(
        "--users", type=int, default=1_000_000, help="users of --distributed's instance"
    )
    ap.add_argument("--threads", type=int, help="torch threads of each solve (default: all CPUs)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="EventBus solves per form and instance (median)"
    )
    ap.add_argument(
        "--only",
        help="run only these instances of the plan, as USERSxK (e.g. 10000x100 for 1e6, K=100)",
    )
    ap.add_argument(
        "--cuda",
        action="store_true",
        help="1e8 (see --users) to a certified 1e-4 on the GPU against the same solve on the CPUs",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global THREADS, REPEAT
    THREADS = args.threads
    REPEAT = max(1, args.repeat)
    if args.sampled_vs_cold:
        print(json.dumps(_sampled_vs_cold(args.users, 3)))
        return
    if args.cuda:
        print(json.dumps(_cuda(args.users, 3)))
        return
    if args.distributed:
        print(json.dumps(_distributed(args.users, 100, 1e-3, args.threads)))
        return
    if args.one:
        n, k, gap = args.one.split(",")
        print(json.dumps(_eventbus(int(n), int(k), float(gap))))
        return
    # warm-up, unmeasured: both forms (the sparse form's first solve imports scipy.sparse)
    solve(generate_problem(500, 20, 5), gap=1e-3, device="cpu")
    solve(generate_problem(500, 20, 5, sparse=True), gap=1e-3, device="cpu")
    rows = []
    families = set(args.family.split(","))
    plan: list[tuple[int, int, float, bool]] = []
    if "single" in families:
        plan += [(n, k, 1e-4, False) for n in (100, 1000, 10_000) for k in (10, 100)]
        plan += [(100_000, 100, 1e-3, False)]
        if args.huge:
            plan.append((1_000_000, 100, 1e-3, False))
    if "mixed" in families:
        plan += [(10_000, k, 1e-4, True) for k in (10, 100)]
    if args.variables:
        sizes = {int(float(v)) for v in args.variables.split(",")}
        plan = [c for c in plan if c[0] * ITEMS in sizes]
    if args.only:
        keep = {tuple(int(x) for x in item.split("x")) for item in args.only.split(",")}
        plan = [p for p in plan if (p[0], p[1]) in keep]
    for n, k, gap, mixed in plan:
        sparse = mixed or n * ITEMS == 1_000_000
        if n * ITEMS <= 1e7:
            row = _eventbus(n, k, gap, mixed=mixed, sparse=sparse)
        else:
            row = _fresh_process(n, k, gap)
        if n * ITEMS <= args.skip_highs_above:
            _highs(n, k, row)
        else:
            row["highs_skipped"] = (
                f"above {args.skip_highs_above:.0e} variables (HiGHS ipm needs ~84 s at 1e6, K=100; 1e7 would exceed minutes)"
            )
        rows.append(row)
        print(_line(row), flush=True)
    at = {(r["variables"], r["resources"]): r for r in rows if r["family"] == "single"}
    mx = {(r["variables"], r["resources"]): r for r in rows if r["family"] == "mixed"}
    summary: dict[str, Any] = {
        "benchmark": "solver",
        "cpus": len(os.sched_getaffinity(0)),
        "threads": THREADS or "all",
        "load_average_1m": round(os.getloadavg()[0], 1),
        "instances": rows,
        "speedup_1e6_k100": at.get((1_000_000, 100), {}).get("speedup"),
        "speedup_1e6_k10": at.get((1_000_000, 10), {}).get("speedup"),
        "speedup_mixed_1e6_k100": mx.get((1_000_000, 100), {}).get("speedup"),
        "speedup_mixed_1e6_k10": mx.get((1_000_000, 10), {}).get("speedup"),
        "sparse_vs_factorised_mixed_1e6_k100": mx.get((1_000_000, 100), {}).get(
            "sparse_vs_factorised"
        ),
        "sparse_vs_factorised_mixed_1e6_k10": mx.get((1_000_000, 10), {}).get(
            "sparse_vs_factorised"
        ),
        "sparse_vs_factorised_single_1e6_k100": at.get((1_000_000, 100), {}).get(
            "sparse_vs_factorised"
        ),
        "sparse_vs_factorised_single_1e6_k10": at.get((1_000_000, 10), {}).get(
            "sparse_vs_factorised"
        ),
        **{
            f"sparse_vs_factorised_cpu_{fam}_1e6_k{k}": rows_.get((1_000_000, k), {}).get(
                "sparse_vs_factorised_cpu"
            )
            for fam, rows_ in (("single", at), ("mixed", mx))
            for k in (10, 100)
        },
        "seconds_1e7_k100_gap1e-3": at.get((10_000_000, 100), {}).get("eventbus_s"),
        "seconds_1e8_k100_gap1e-3": at.get((100_000_000, 100), {}).get("eventbus_s"),
        "peak_rss_gb_1e8": at.get((100_000_000, 100), {}).get("peak_rss_gb"),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
