"""The x86 instruction sets llama.cpp is built for, read from this CPU.

The build is never `-march=native`: a native build on an AMX machine executes `tileloadd` and dies with SIGILL at
the first decode (llama.cpp PR #26954), and a wheel built natively and cached by pip crashes on the next, older CPU.
Instead the install script (`install.sh`) reads this CPU's features, enables each ggml instruction set the CPU has
except AMX, and caches the wheel under a key naming exactly those sets, so a wheel is only reused on a CPU that
runs it. `docs/engine.md` has the measurements behind the choice.

Standard library only: the install script loads this file before tokenomy or llama-cpp-python is installed.
"""

from __future__ import annotations

import platform
from pathlib import Path

# ggml CMake option -> the /proc/cpuinfo flags it needs (all of them). Order is ggml's, from SSE 4.2 up.
GGML_X86_OPTIONS: dict[str, tuple[str, ...]] = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_F16C": ("f16c",),
    "GGML_FMA": ("fma",),
    "GGML_BMI2": ("bmi2",),
    "GGML_AVX2": ("avx2",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"),
    "GGML_AVX512_VBMI": ("avx512vbmi",),
    "GGML_AVX512_VNNI": ("avx512_vnni",),
    "GGML_AVX512_BF16": ("avx512_bf16",),
}
# Never enabled, whatever the CPU says: the AMX path crashes (see the module docstring).
GGML_DISABLED = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The feature flags of the first processor in /proc/cpuinfo (empty where there is none)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def enabled_options(flags: frozenset[str]) -> list[str]:
    """The ggml x86 options this CPU supports, in ggml's order. AVX-512 needs AVX2 beneath it."""
    on = [opt for opt, need in GGML_X86_OPTIONS.items() if all(f in flags for f in need)]
    if "GGML_AVX2" not in on:
        on = [o for o in on if not o.startswith("GGML_AVX512")]
    if "GGML_AVX512" not in on:
        on = [o for o in on if not o.startswith("GGML_AVX512_")]
    return on


def cmake_args(flags: frozenset[str] | None = None, machine: str | None = None) -> list[str]:
    """CMake arguments for a portable-per-CPU-family ggml build: no -march=native, no AMX, the rest as the CPU has.
    `machine`: platform.machine() unless given."""
    if (machine or platform.machine()) not in ("x86_64", "AMD64"):
        return ["-DGGML_NATIVE=ON", "-DLLAVA_BUILD=OFF"]  # ARM and others: no AMX problem to avoid
    on = set(enabled_options(cpu_flags() if flags is None else flags))
    args = ["-DGGML_NATIVE=OFF", "-DLLAVA_BUILD=OFF"]
    args += [f"-D{opt}={'ON' if opt in on else 'OFF'}" for opt in GGML_X86_OPTIONS]
    args += [f"-D{opt}=OFF" for opt in GGML_DISABLED]
    return args


def build_key(flags: frozenset[str] | None = None, machine: str | None = None) -> str:
    """A short name for the instruction sets a build uses, e.g. `x86_64-avx2-avx512-vnni`: the wheel cache's key
    (a GPU build's adds its backend: scripts/llama_wheel.py)."""
    machine = machine or platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return f"{machine}-native"
    on = enabled_options(cpu_flags() if flags is None else flags)
    short = [o.removeprefix("GGML_").lower().replace("_", "") for o in on]
    return "-".join(["x86_64", *short])
