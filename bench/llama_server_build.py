"""Build llama.cpp's own C++ server from the sources vendored in the llama-cpp-python sdist that tokenomy pins,
with the same CPU flags and GPU backend as tokenomy's wheel (scripts/llama_wheel.py: choose_build), and cache the
binary.

    .venv/bin/python bench/llama_server_build.py        # prints the path of llama-server

The binary lands in ~/.cache/tokenomy/llama-server/<version>/<build key>/llama-server; a second call reuses it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build() -> Path:
    wheel = _load("llama_wheel", ROOT / "scripts" / "llama_wheel.py")   # one pin, one choice of build
    version, chosen = wheel.VERSION, wheel.choose_build()
    cache = Path(os.environ.get("TOKENOMY_CACHE", Path.home() / ".cache" / "tokenomy"))
    out = cache / "llama-server" / version / chosen.key / "llama-server"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        print(f"downloading the llama-cpp-python {version} sdist", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", tmp], check=True, stdout=sys.stderr)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build_dir = Path(tmp) / "build"
        args = [a for a in chosen.cmake_args if not a.startswith("-DLLAVA")]
        print(f"building llama-server for {chosen.key} (several minutes on 2 cores)", file=sys.stderr,
              flush=True)
        subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                        "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                        "-DLLAMA_BUILD_SERVER=ON", "-DBUILD_SHARED_LIBS=OFF", *args],
                       check=True, stdout=sys.stderr)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-server", "-j",
                        str(os.cpu_count() or 2)], check=True, stdout=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build_dir / "bin" / "llama-server", out)
    return out


if __name__ == "__main__":
    print(build())
