"""The NVIDIA GPUs NVML sees and their memory: the one reader behind `/health`'s `gpu`, the metrics'
`tokenomy_gpu_memory_*_bytes`, the energy meter's NVML source (hardware/energy.py) and the engine's VRAM check
(models/memory.py).

NVML is initialised once, on first use; where it cannot be (no driver, no nvidia-ml-py, no GPU) every reader says
None from then on, without trying again. Indices are NVML's (PCI bus order), which CUDA_VISIBLE_DEVICES and
CUDA_DEVICE_ORDER may renumber for llama.cpp.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("tokenomy.hardware.gpu")

_lock = threading.Lock()
_state: tuple[Any, list[Any]] | None = None     # (pynvml, device handles), once tried
_tried = False


@dataclass(frozen=True)
class GpuMemory:
    index: int
    name: str
    used_bytes: int
    total_bytes: int
    free_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def nvml() -> tuple[Any, list[Any]] | None:
    """(the initialised pynvml module, a handle per GPU), or None where NVML cannot say (logged once)."""
    global _state, _tried
    with _lock:
        if not _tried:
            _tried = True
            try:
                import pynvml  # nvidia-ml-py

                pynvml.nvmlInit()
                handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
                _state = (pynvml, handles) if handles else None
                if not handles:
                    log.info("gpu: NVML sees no GPU")
            except Exception as e:       # no driver, no library: a machine without an NVIDIA GPU
                log.info("gpu: no NVML (%s: %s)", type(e).__name__, e)
        return _state


def memory() -> list[GpuMemory] | None:
    """Each GPU's memory now, in NVML's order; None without NVML or a GPU."""
    state = nvml()
    if state is None:
        return None
    lib, handles = state
    out = []
    for i, h in enumerate(handles):
        info = lib.nvmlDeviceGetMemoryInfo(h)
        name = lib.nvmlDeviceGetName(h)
        out.append(GpuMemory(i, name.decode() if isinstance(name, bytes) else str(name), int(info.used),
                             int(info.total), int(info.free)))
    return out


def process_memory(pid: int) -> int | None:
    """The GPU memory process `pid` holds, summed over the GPUs (NVML's running compute processes); None where NVML
    cannot say: no GPU, no such process on one, or a driver or container that does not show it (NVML lists the
    host's pids, which a container's pid namespace renumbers)."""
    state = nvml()
    if state is None:
        return None
    lib, handles = state
    held: int | None = None
    for handle in handles:
        try:
            running = lib.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            return None
        for proc in running:
            if proc.pid == pid and proc.usedGpuMemory is not None:
                held = (held or 0) + int(proc.usedGpuMemory)
    return held
