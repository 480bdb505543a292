"""What ``models_many.py`` measures beside latency: the memory of Serve replicas, the CPU of
the Ray cluster's processes, and the comparison's phase, one application per model for as
many models as fit.

Processes are found with psutil: the Ray cluster is every process this benchmark started
(``ray.init``'s GCS, raylet and its workers) except the ones given (the broker, Redis) and the
benchmark's own process (it produces and consumes). A Serve replica's process carries its
title, ``ray::ServeReplica:<app>:<deployment>``, which names its application. ``targets`` turns the run's figures into the issue's targets.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import psutil


def ray_processes(exclude: set[int]) -> list[psutil.Process]:
    """This process's descendants, less those in ``exclude`` and their own descendants."""
    me = psutil.Process()
    skip = set(exclude)
    for pid in exclude:
        with contextlib.suppress(psutil.Error):
            skip.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    return [p for p in me.children(recursive=True) if p.pid not in skip]


def cpu_seconds(exclude: set[int]) -> dict[int, float]:
    """User + system CPU seconds of each Ray cluster process, by pid."""
    out: dict[int, float] = {}
    for p in ray_processes(exclude):
        with contextlib.suppress(psutil.Error):  # a process that just ended
            t = p.cpu_times()
            out[p.pid] = t.user + t.system + t.children_user + t.children_system
    return out


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two :func:`cpu_seconds` snapshots (a process started between them
    counts whole; one that ended between them is lost, and none should)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def replica_memory_mb(app_prefix: str) -> dict[str, float]:
    """RSS and USS (MB) summed over the Serve replica processes of the applications whose
    name starts with ``app_prefix``, and how many there are."""
    rss = uss = 0
    n = 0
    for p in psutil.process_iter(["cmdline"]):
        title = " ".join(p.info.get("cmdline") or [])
        if f"ServeReplica:{app_prefix}" not in title:
            continue
        with contextlib.suppress(psutil.Error):
            m = p.memory_full_info()
            rss += m.rss
            uss += m.uss
            n += 1
    return {"rss_mb": round(rss / 2**20), "uss_mb": round(uss / 2**20), "replicas": n}


def _deploy(app: Any, name: str, timeout_s: float) -> str | None:
    """``serve.run`` of one application, given ``timeout_s``; None when it runs, else why not."""
    from ray import serve

    failure: list[str] = []

    def run() -> None:
        try:
            serve.run(app, name=name, route_prefix=None)
        except Exception as exc:  # noqa: BLE001 - reported as the reason it did not fit
            failure.append(f"{type(exc).__name__}: {exc}"[:200])

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return f"not running within {timeout_s:.0f} s"
    return failure[0] if failure else None


def apps_phase(
    redis_url: str,
    models: list[str],
    *,
    memory_bound_mb: float,
    deploy_timeout_s: float,
    budget_s: float,
) -> dict[str, Any]:
    """One application per model, the product's own (``eventbus-model-<name>``, default
    serving settings), added one at a time until one fails to run within
    ``deploy_timeout_s``, their replicas' RSS passes ``memory_bound_mb``, the machine has less
    than 1 GB available, ``budget_s`` is spent, or every model runs. Each is called once (its
    replica answers ``info``). Every application is deleted at the end."""
    from ray import serve

    from eventbus.models._serve import MODEL_APP_PREFIX, build_model_app, model_app_name
    from eventbus.pipelines.steps._model_config import ModelServingConfig

    options = {**ModelServingConfig().model_dump(), "num_gpus": 0}
    started = time.monotonic()
    deployed: list[str] = []
    stop = "every model runs"
    memory = replica_memory_mb(MODEL_APP_PREFIX)
    deploy_s: list[float] = []
    try:
        for name in models:
            if time.monotonic() - started > budget_s:
                stop = f"time budget ({budget_s:.0f} s) spent"
                break
            t0 = time.monotonic()
            why = _deploy(
                build_model_app(name, redis_url, options), model_app_name(name), deploy_timeout_s
            )
            if why is not None:
                stop = f"application {len(deployed) + 1} did not run: {why}"
                deployed.append(name)  # deleted below
                break
            serve.get_app_handle(model_app_name(name)).info.remote().result(timeout_s=60)
            deploy_s.append(time.monotonic() - t0)
            deployed.append(name)
            memory = replica_memory_mb(MODEL_APP_PREFIX)
            if memory["rss_mb"] > memory_bound_mb:
                stop = f"replica RSS {memory['rss_mb']} MB passed {memory_bound_mb:.0f} MB"
                break
            if psutil.virtual_memory().available < 2**30:
                stop = "the machine had under 1 GB available"
                break
    finally:
        for name in deployed:
            with contextlib.suppress(Exception):
                serve.delete(model_app_name(name))
    fit = len(deploy_s)
    over = stop.startswith("replica RSS")  # the last one added did not fit
    return {
        "apps_run": fit,
        "apps_fit": fit - 1 if over else fit,
        "apps_stop": stop,
        "apps_rss_mb": memory["rss_mb"],
        "apps_uss_mb": memory["uss_mb"],
        "apps_rss_mb_per_model": round(memory["rss_mb"] / fit) if fit else None,
        "apps_deploy_s_median": round(sorted(deploy_s)[len(deploy_s) // 2], 2)
        if deploy_s
        else None,
    }


def pct(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (seconds) in ms."""
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def targets(f: dict[str, Any], bound_mb: float) -> dict[str, Any]:
    """Each of the issue's targets: the figure and whether it passes."""
    hot = ratio(f["hot_p99_ms"], f["single_p99_ms"])
    cpu = ratio(f["cpu_s_per_1k_shadow"], f["cpu_s_per_1k_no_shadow"])
    first = f["cold_first_answer_max_ms"]
    served = f["delivered"] == f["events"]
    return {
        "models_within_4gb": {
            "models": f["models"],
            "replica_rss_mb": f["pool_replica_rss_mb"],
            "all_delivered": served,
            "pass": served and f["pool_replica_rss_mb"] <= bound_mb and f["models"] >= 300,
        },
        "hot_p99_vs_single": {"ratio": hot, "pass": hot is not None and hot <= 1.5},
        "cold_first_answer_ms": {"max": first, "pass": first is not None and first < 1000},
        "shadow_cpu_ratio": {"ratio": cpu, "pass": cpu is not None and cpu <= 1.3},
    }
