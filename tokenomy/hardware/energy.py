"""Energy: a joule counter from the best source this machine has, and its share per request.

Sources, best first:
- `nvml`: NVIDIA's total-energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since driver load, Volta and
  newer), summed over the visible GPUs. Measured.
- `rapl`: Intel/AMD RAPL package counters (/sys/class/powercap/intel-rapl:N/energy_uj, wrapping at
  max_energy_range_uj), summed over packages; subzones (intel-rapl:N:M) are inside their package and skipped.
  Measured, but only when readable (often root-only).
- `estimate`: this process's CPU time (user + system) x a per-core power figure (default 15 W/core). An estimate,
  and labelled so everywhere it shows.

A batched engine step's energy is shared among its sequences by the tokens each one had in the step:
    share_i = joules * tokens_i / sum(tokens)
"""

from __future__ import annotations

import logging
import os
import re
import resource
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from cachetools import LRUCache

log = logging.getLogger("tokenomy.energy")

MEASURED_SOURCES = frozenset({"nvml", "rapl"})
DEFAULT_WATTS_PER_CORE = 15.0
POWERCAP = Path("/sys/class/powercap")

K = TypeVar("K", bound=Hashable)


def label(source: str | None) -> str | None:
    """'measured' for nvml and rapl, 'estimate' for anything else, None when there is no figure."""
    if source is None:
        return None
    return "measured" if source in MEASURED_SOURCES else "estimate"


@dataclass(frozen=True)
class Energy:
    joules: float
    source: str                 # nvml | rapl | estimate

    @property
    def label(self) -> str:
        return "measured" if self.source in MEASURED_SOURCES else "estimate"


class EnergySource(Protocol):
    name: str

    def read_joules(self) -> float:
        """A monotonic joule counter (any origin)."""
        ...

    def memory_bytes(self) -> int | None: ...

    def power_watts(self) -> float | None:
        """Instantaneous power when the source has it, else None (the meter derives it from the counter)."""
        ...


class NvmlSource:
    name = "nvml"

    def __init__(self) -> None:
        from tokenomy.hardware import gpu

        state = gpu.nvml()
        if state is None:
            raise RuntimeError("no NVML or no GPU")
        self._nvml, self.handles = state
        self.read_joules()      # raises NVMLError_NotSupported on GPUs without the energy counter

    def read_joules(self) -> float:
        return sum(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1e3

    def memory_bytes(self) -> int | None:
        from tokenomy.hardware import gpu

        return sum(m.used_bytes for m in gpu.memory() or [])

    def power_watts(self) -> float | None:
        return sum(self._nvml.nvmlDeviceGetPowerUsage(h) for h in self.handles) / 1e3


class RaplSource:
    name = "rapl"

    def __init__(self, root: Path | str = POWERCAP) -> None:
        zones = sorted(p for p in Path(root).glob("intel-rapl:*") if re.fullmatch(r"intel-rapl:\d+", p.name))
        if not zones:
            raise RuntimeError(f"no RAPL package zones under {root}")
        self.zones = zones
        self._ranges = [self._read(z / "max_energy_range_uj") if (z / "max_energy_range_uj").exists() else 0
                        for z in zones]
        self._last = [self._read(z / "energy_uj") for z in zones]   # raises PermissionError when root-only
        self._total_uj = 0
        self._lock = threading.Lock()

    @staticmethod
    def _read(path: Path) -> int:
        return int(path.read_text().strip())

    def read_joules(self) -> float:
        with self._lock:
            for i, z in enumerate(self.zones):
                now = self._read(z / "energy_uj")
                delta = now - self._last[i]
                if delta < 0:          # the counter wrapped at max_energy_range_uj
                    delta += self._ranges[i]
                self._total_uj += max(delta, 0)
                self._last[i] = now
            return self._total_uj / 1e6

    def memory_bytes(self) -> int | None:
        return None

    def power_watts(self) -> float | None:
        return None


class CpuEstimateSource:
    name = "estimate"

    def __init__(self, watts_per_core: float = DEFAULT_WATTS_PER_CORE) -> None:
        if not watts_per_core > 0:
            raise ValueError(f"watts_per_core must be positive, got {watts_per_core!r}")
        self.watts_per_core = float(watts_per_core)

    def read_joules(self) -> float:
        # One core busy for one second at W watts per core is W joules.
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return (ru.ru_utime + ru.ru_stime) * self.watts_per_core

    def memory_bytes(self) -> int | None:
        return None

    def power_watts(self) -> float | None:
        return None


def detect(watts_per_core: float = DEFAULT_WATTS_PER_CORE, powercap: Path | str = POWERCAP,
           prefer: str | None = None) -> EnergySource:
    """The best readable source: NVML, then RAPL, then the CPU-time estimate. `prefer` forces one by name."""
    tried: list[str] = []
    if prefer not in (None, "nvml", "rapl", "estimate"):
        raise ValueError(f"unknown energy source {prefer!r}; use nvml, rapl or estimate")
    if prefer in (None, "nvml"):
        try:
            return NvmlSource()
        except Exception as e:     # no driver, no GPU, no energy counter: fall through
            tried.append(f"nvml: {type(e).__name__}: {e}")
    if prefer in (None, "rapl"):
        try:
            return RaplSource(powercap)
        except Exception as e:
            tried.append(f"rapl: {type(e).__name__}: {e}")
    if prefer not in (None, "estimate"):
        raise RuntimeError(f"energy source {prefer!r} is not available here ({'; '.join(tried)})")
    log.info("energy: estimating from CPU time at %.1f W/core (%s)", watts_per_core, "; ".join(tried))
    return CpuEstimateSource(watts_per_core)


class EnergyMeter:
    """Joules since the meter started, power, and the energy of one engine step.

    `step_joules(dt_s)` is the step's share, by time, of the energy read since the previous reading:
        E_step = (J_now - J_prev) * min(1, dt_s / (t_now - t_prev))
    so back-to-back steps get all the energy they used, and a step after a long idle pause is not charged for
    the idle time before it (that energy still counts in `total_joules`).
    """

    def __init__(self, source: EnergySource | None = None, watts_per_core: float = DEFAULT_WATTS_PER_CORE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source if source is not None else detect(watts_per_core)
        self._clock = clock
        self._lock = threading.Lock()
        self._start = self.source.read_joules()
        t = clock()
        self._step_last = (t, self._start)
        self._power_last = (t, self._start)

    @property
    def source_name(self) -> str:
        return self.source.name

    @property
    def label(self) -> str:
        return "measured" if self.source.name in MEASURED_SOURCES else "estimate"

    def total_joules(self) -> float:
        return self.source.read_joules() - self._start

    def step_joules(self, dt_s: float) -> float:
        with self._lock:
            t, j = self._clock(), self.source.read_joules()
            t0, j0 = self._step_last
            self._step_last = (t, j)
        used, span = max(j - j0, 0.0), t - t0
        if span <= 0 or dt_s <= 0:
            return 0.0
        return used * min(1.0, dt_s / span)

    def power_watts(self) -> float | None:
        """The source's instantaneous power, else the mean power since the previous call."""
        p = self.source.power_watts()
        if p is not None:
            return p
        with self._lock:
            t, j = self._clock(), self.source.read_joules()
            t0, j0 = self._power_last
            self._power_last = (t, j)
        return (j - j0) / (t - t0) if t > t0 else None

    def memory_bytes(self) -> int | None:
        return self.source.memory_bytes()


def process_rss_bytes() -> int | None:
    """Resident memory of this process (Linux /proc), None elsewhere."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def share(joules: float, tokens_by_seq: Mapping[K, int]) -> dict[K, float]:
    """Split a step's joules among its sequences by tokens processed; equal shares when no tokens were counted."""
    if joules < 0:
        raise ValueError(f"joules must be non-negative, got {joules!r}")
    if any(n < 0 for n in tokens_by_seq.values()):
        raise ValueError("token counts must be non-negative")
    total = sum(tokens_by_seq.values())
    if not tokens_by_seq:
        return {}
    if total == 0:
        return {k: joules / len(tokens_by_seq) for k in tokens_by_seq}
    return {k: joules * n / total for k, n in tokens_by_seq.items()}


class EnergyAccount:
    """Joules accumulated per request (any hashable key) until the request is recorded. Thread-safe: the engine
    thread adds, the record stage pops."""

    def __init__(self, meter: EnergyMeter, max_entries: int = 100_000) -> None:
        self.meter = meter
        self.max_entries = max_entries
        # A step that ran after its request was recorded (a cancelled sequence's last step) leaves a key nobody
        # pops; the one added to least recently goes rather than the table growing without bound.
        self._joules: LRUCache[Hashable, float] = LRUCache(max_entries)
        self._lock = threading.Lock()

    def add(self, shares: Mapping[Hashable, float]) -> None:
        with self._lock:
            for k, j in shares.items():
                self._joules[k] = self._joules.get(k, 0.0) + j

    def on_step(self, dt_s: float, tokens_by_seq: Mapping[Hashable, int]) -> None:
        """The engine hook: measure the step and share it among its sequences."""
        self.add(share(self.meter.step_joules(dt_s), tokens_by_seq))

    def pop(self, key: Hashable) -> Energy | None:
        with self._lock:
            j = self._joules.pop(key, None)
        return None if j is None else Energy(j, self.meter.source_name)

    def __len__(self) -> int:
        return len(self._joules)
