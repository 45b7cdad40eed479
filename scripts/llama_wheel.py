"""Install llama-cpp-python built for this CPU family, reusing a wheel built before for the same instruction sets.

    python scripts/llama_wheel.py            # into the running interpreter's environment

pip's own wheel cache keys a wheel by the sdist, not by the CPU it was compiled for, so a build from one machine
can SIGILL on the next. This script builds with `tokenomy/engine/cpu.py`'s flags (no -march=native, no AMX) and
keeps each wheel under ~/.cache/tokenomy/wheels/<version>/<build key>/.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

VERSION = "0.3.36"  # the one pin: pyproject.toml's llama-cpp-python==VERSION must match (a test checks)
ROOT = Path(__file__).resolve().parent.parent


def load_cpu():
    spec = importlib.util.spec_from_file_location("tokenomy_cpu", ROOT / "tokenomy" / "engine" / "cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def installed_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:
        return None


def main() -> int:
    cpu = load_cpu()
    key = cpu.build_key()
    cache = Path(os.environ.get("TOKENOMY_CACHE", Path.home() / ".cache" / "tokenomy"))
    wheel_dir = cache / "wheels" / f"llama-cpp-python-{VERSION}" / key
    marker = Path(sys.prefix) / "tokenomy-llama-build"
    if installed_version() == VERSION and marker.exists() and marker.read_text().strip() == key:
        print(f"llama-cpp-python {VERSION} ({key}) already installed")
        return 0
    wheels = sorted(wheel_dir.glob("llama_cpp_python-*.whl"))
    if not wheels:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CMAKE_ARGS=" ".join(cpu.cmake_args()), FORCE_CMAKE="1")
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        print(f"building llama-cpp-python {VERSION} for {key} (about 10 minutes on 2 cores)", flush=True)
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
