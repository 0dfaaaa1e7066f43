"""Timing helpers: an untimed warm-up pass, then repeated timed passes; medians reported.

Follows PISA's ``extract_times``: the first run is not timed, latency is per query, and QPS and
percentiles come from several passes so one noisy pass does not decide the figure.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from typing import Any, Callable


def timed_pass(fn: Callable[[], Any], min_seconds: float = 0.0) -> tuple[float, float]:
    """One timed pass: calls ``fn`` until it has run for at least ``min_seconds`` (at least once).

    Returns:
        ``(wall seconds per call, process CPU seconds / wall seconds)``; a CPU ratio near 1.0 for
        a 2-thread call means the second core was busy elsewhere.
    """
    calls = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while True:
        fn()
        calls += 1
        el = time.perf_counter() - t0
        if el >= min_seconds:
            return el / calls, (time.process_time() - c0) / el


def timed_runs(fn: Callable[[], Any], repeats: int = 3, warmup: int = 1, min_seconds: float = 0.0,
               collect: bool = True) -> list[float]:
    """Wall seconds per call of ``fn`` in each of ``repeats`` timed passes (:func:`timed_pass`),
    after ``warmup`` untimed calls: a 1 ms batch timed once is at the mercy of one scheduler tick.
    Each pass starts with ``gc.collect()`` (unless ``collect`` is false), so a full collection of
    an earlier step's garbage (tens of ms in a benchmark process holding several engines) does not
    land in one engine's pass; collections the timed code itself causes still count (``timeit``
    disables the collector outright)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        if collect:
            gc.collect()
        out.append(timed_pass(fn, min_seconds)[0])
    return out


def qps(n_queries: int, seconds: list[float]) -> dict[str, float]:
    """Median QPS over runs, plus min/max for the spread."""
    rates = [n_queries / s for s in seconds]
    return {"qps_median": statistics.median(rates), "qps_min": min(rates), "qps_max": max(rates),
            "runs": len(rates)}


def machine() -> dict[str, Any]:
    """A short description of the machine the figures came from."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (bytes)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
