"""Install llama-cpp-python built for this machine (its CPU family, and its GPU backend where there is one), reusing a
wheel built before for the same build.

    python scripts/llama_wheel.py            # into the running interpreter's environment
    TOKENOMY_LLAMA_BACKEND=cpu|cuda|vulkan|metal python scripts/llama_wheel.py    # another backend than chosen

pip's own wheel cache keys a wheel by the sdist, not by the machine it was compiled for, so a build from one machine
can SIGILL on the next. This script builds with `tokenomy/hardware/cpu.py`'s flags (no -march=native, no AMX), plus
the GPU backend `choose_build` picks (docs/models.md, "GPU"), and keeps each wheel under
~/.cache/tokenomy/wheels/<version>/<build key>/: the CPU build's key is cpu.py's (x86_64-sse42-...-avx2), a GPU
build's adds the backend (x86_64-...-avx2-cuda12.4-sm90).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

VERSION = "0.3.36"  # the one pin: pyproject.toml's llama-cpp-python==VERSION must match (a test checks)
ROOT = Path(__file__).resolve().parent.parent
BACKEND_ENV = "TOKENOMY_LLAMA_BACKEND"
BACKENDS = ("cpu", "cuda", "vulkan", "metal")


def load_cpu():
    spec = importlib.util.spec_from_file_location("tokenomy_cpu", ROOT / "tokenomy" / "hardware" / "cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Build(NamedTuple):     # not a dataclass: this file is loaded by path, outside sys.modules
    backend: str                   # cpu | cuda | vulkan | metal
    cmake_args: tuple[str, ...]    # CMAKE_ARGS for llama-cpp-python's build
    key: str                       # the wheel cache's directory name: what the wheel runs on
    note: str = ""                 # why a GPU that seems to be here is not built for, and how to ask for it


class NoBackend(RuntimeError):
    """The backend asked for (TOKENOMY_LLAMA_BACKEND) cannot be built here; the message says what is missing."""


def _run(argv: list[str], env: Mapping[str, str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=dict(env)).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def find_nvcc(env: Mapping[str, str]) -> str | None:
    """nvcc on PATH, else in $CUDA_HOME/bin (or $CUDA_PATH/bin)."""
    found = shutil.which("nvcc", path=env.get("PATH", ""))
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            candidate = Path(env[var]) / "bin" / "nvcc"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def cuda_version(nvcc: str, env: Mapping[str, str]) -> str | None:
    """'12.4' from `nvcc --version` ("Cuda compilation tools, release 12.4, V12.4.131")."""
    m = re.search(r"release (\d+\.\d+)", _run([nvcc, "--version"], env))
    return m.group(1) if m else None


def nvidia_gpus(env: Mapping[str, str]) -> tuple[int, list[str]]:
    """The NVIDIA GPUs the driver shows (`nvidia-smi -L`) and their compute capabilities as CMake architectures
    ('9.0' -> '90', sorted, unique; empty where nvidia-smi cannot say: CMake then builds llama.cpp's default list).
    (0, []) without nvidia-smi, which comes with the driver."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH", ""))
    if not smi:
        return 0, []
    gpus = sum(1 for line in _run([smi, "-L"], env).splitlines() if line.startswith("GPU "))
    out = _run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], env)
    caps = {line.strip().replace(".", "") for line in out.splitlines() if re.fullmatch(r"\d+\.\d+", line.strip())}
    return gpus, sorted(caps, key=int)


def vulkan_missing(env: Mapping[str, str]) -> list[str]:
    """What a Vulkan build needs and this machine lacks: the glslc shader compiler and the Vulkan headers."""
    missing = [] if shutil.which("glslc", path=env.get("PATH", "")) else ["glslc (Debian: apt-get install glslc)"]
    includes = [Path(env["VULKAN_SDK"]) / "include"] if env.get("VULKAN_SDK") else []
    includes += [Path("/usr/include"), Path("/usr/local/include")]
    if not any((d / "vulkan" / "vulkan.h").is_file() for d in includes):
        missing.append("the Vulkan headers (Debian: apt-get install libvulkan-dev; or set VULKAN_SDK)")
    return missing


def choose_build(env: Mapping[str, str] | None = None, system: str | None = None, machine: str | None = None,
                 flags: frozenset[str] | None = None) -> Build:
    """The build for a machine: its environment (PATH, CUDA_HOME, TOKENOMY_LLAMA_BACKEND), its OS and architecture
    (platform's by default) and its CPU flags (/proc/cpuinfo's by default).

    - TOKENOMY_LLAMA_BACKEND names one of cpu, cuda, vulkan, metal: that one, or NoBackend saying what it lacks;
    - else CUDA when nvcc is found (PATH, then $CUDA_HOME/bin) and the driver shows a GPU (nvidia-smi -L), for
      the compute capabilities nvidia-smi gives: a CUDA build links the driver's libcuda, so on a machine with the
      toolkit and no GPU (a build box, a CI runner) it would not even load; TOKENOMY_LLAMA_BACKEND=cuda builds it
      anyway (for another machine), for CMake's default architectures when no GPU says its own;
    - else Metal on macOS arm64 (llama.cpp's own default there);
    - else the CPU build, exactly as before (same CMake arguments, same key).
    Vulkan is never chosen unasked. Every build keeps cpu.py's CPU flags: the layers left on the CPU run there."""
    env = os.environ if env is None else env
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    cpu = load_cpu()
    base = cpu.cmake_args(flags, machine=machine)
    key = cpu.build_key(flags, machine=machine)
    apple = system == "Darwin" and machine == "arm64"
    asked = env.get(BACKEND_ENV, "").strip().lower()
    if asked and asked not in BACKENDS:
        raise NoBackend(f"{BACKEND_ENV}={asked!r}: choose one of {', '.join(BACKENDS)}")
    nvcc = find_nvcc(env) if asked in ("", "cuda") else None
    gpus, archs = nvidia_gpus(env) if asked in ("", "cuda") else (0, [])
    backend = asked or ("cuda" if nvcc and gpus else "metal" if apple else "cpu")
    note = ""
    if backend == "cpu" and not asked and nvcc:
        note = (f"nvcc is here ({nvcc}) but no NVIDIA GPU (nvidia-smi lists none): building for the CPU; "
                f"{BACKEND_ENV}=cuda builds for CUDA anyway")
    elif backend == "cpu" and not asked and gpus:
        note = (f"{gpus} NVIDIA GPU(s) here but no nvcc on PATH or in $CUDA_HOME/bin: building for the CPU; "
                "install the CUDA toolkit or set CUDA_HOME for a CUDA build")
    if backend == "cuda":
        if not nvcc:
            raise NoBackend(f"{BACKEND_ENV}=cuda, but no nvcc on PATH or in $CUDA_HOME/bin: install the CUDA toolkit "
                            "or set CUDA_HOME (for example CUDA_HOME=/usr/local/cuda)")
        version = cuda_version(nvcc, env)
        args = [*base, "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
        if archs:
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}")
        tag = f"cuda{version or 'unknown'}" + ("".join(f"-sm{a}" for a in archs) if archs else "-smdefault")
        return Build("cuda", tuple(args), f"{key}-{tag}")
    if backend == "vulkan":
        missing = vulkan_missing(env)
        if missing:
            raise NoBackend(f"{BACKEND_ENV}=vulkan needs {' and '.join(missing)}")
        return Build("vulkan", (*base, "-DGGML_VULKAN=ON"), f"{key}-vulkan")
    if backend == "metal":
        if system != "Darwin":
            raise NoBackend(f"{BACKEND_ENV}=metal: Metal is macOS's; this is {system}")
        return Build("metal", (*base, "-DGGML_METAL=ON"), f"{key}-metal")
    if system == "Darwin":        # llama.cpp turns Metal on by itself on a Mac: a CPU build there says no
        return Build("cpu", (*base, "-DGGML_METAL=OFF"), f"{key}-nometal", note)
    return Build("cpu", tuple(base), key, note)


def installed_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:
        return None


def main() -> int:
    try:
        build = choose_build()
    except NoBackend as e:
        print(f"llama_wheel: {e}", file=sys.stderr)
        return 1
    key = build.key
    if build.note:
        print(f"llama_wheel: {build.note}", flush=True)
    cache = Path(os.environ.get("TOKENOMY_CACHE", Path.home() / ".cache" / "tokenomy"))
    wheel_dir = cache / "wheels" / f"llama-cpp-python-{VERSION}" / key
    marker = Path(sys.prefix) / "tokenomy-llama-build"
    if installed_version() == VERSION and marker.exists() and marker.read_text().strip() == key:
        print(f"llama-cpp-python {VERSION} ({key}) already installed")
        return 0
    wheels = sorted(wheel_dir.glob("llama_cpp_python-*.whl"))
    if not wheels:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CMAKE_ARGS=" ".join(build.cmake_args), FORCE_CMAKE="1")
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        took = "about 10 minutes on 2 cores" + (", longer with a GPU backend" if build.backend != "cpu" else "")
        print(f"building llama-cpp-python {VERSION} for {key} ({took})", flush=True)
        print(f"CMAKE_ARGS={env['CMAKE_ARGS']}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
             f"llama-cpp-python=={VERSION}", "-w", str(wheel_dir)],
            env=env, check=True,
        )
        wheels = sorted(wheel_dir.glob("llama_cpp_python-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(wheels[-1])], check=True
    )
    marker.write_text(key + "\n")
    print(f"installed llama-cpp-python {VERSION} for {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
