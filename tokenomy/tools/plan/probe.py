"""The `local` hardware: this machine's memory bandwidth and FLOP/s, measured with numpy in about two seconds."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

import numpy as np

from tokenomy.tools.plan.inputs import HardwareSpec


def _best_seconds(fn: Callable[[], object], budget_s: float, min_reps: int = 3) -> float:
    """Fastest of repeated runs (the least disturbed by other work), within a time budget."""
    fn()  # warm-up: page faults, thread pool start
    best, start, reps = float("inf"), time.perf_counter(), 0
    while reps < min_reps or time.perf_counter() - start < budget_s:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        reps += 1
        if reps >= 50:
            break
    return best


def read_bandwidth(megabytes: int = 128, budget_s: float = 0.8) -> float:
    """Read bandwidth in bytes/s: a BLAS dot product of two float32 vectors `megabytes` in total, far larger than
    any cache, streams both from memory once; bytes / best time. Decode streams weights the same way.
    """
    n = megabytes * 1024 * 1024 // 8
    a = np.ones(n, dtype=np.float32)
    b = np.ones(n, dtype=np.float32)
    return (a.nbytes + b.nbytes) / _best_seconds(lambda: np.dot(a, b), budget_s)


def matmul_flops(n: int = 1024, budget_s: float = 0.8) -> float:
    """Dense fp32 FLOP/s: 2 n^3 / best time of an n x n matmul (numpy's BLAS, all its threads)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return 2.0 * n**3 / _best_seconds(lambda: a @ b, budget_s)


def memory_bytes() -> float:
    """Physical memory: page size x physical pages."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


@functools.lru_cache(maxsize=1)
def probe() -> HardwareSpec:
    """Measure this machine once per process. Only fp32 is measured: every math dtype falls back to it."""
    bandwidth = read_bandwidth()
    flops = matmul_flops()
    return HardwareSpec(
        key="local",
        name=f"{cpu_name()}, {os.cpu_count()} cores (probed)",
        memory_bytes=memory_bytes(),
        bandwidth=bandwidth,
        flops={"fp32": flops},
        tdp_w=None,
        measured=True,
        source="numpy probe: fp32 dot (bandwidth), fp32 1024^3 matmul (FLOP/s)",
    )
