"""The llama-cpp-python build each machine gets (scripts/llama_wheel.py: choose_build): CUDA where nvcc and an NVIDIA
GPU are, Metal on an Apple Silicon Mac, Vulkan only when asked, the CPU build (today's arguments and key) everywhere
else. The machines are made of fake `nvcc` / `nvidia-smi` scripts on a PATH of their own; nothing is built."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from tokenomy.hardware import cpu

ROOT = Path(__file__).resolve().parents[1]
EPYC = cpu.cpu_flags("flags\t\t: fpu sse4_2 avx f16c fma bmi2 avx2 sha_ni\n")
EPYC_KEY = "x86_64-sse42-avx-f16c-fma-bmi2-avx2"
NVCC = 'echo "Cuda compilation tools, release 12.4, V12.4.131"'
SMI = """case "$1" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"; echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)";;
  --query-gpu=compute_cap) echo 9.0; echo 9.0;;
esac"""


def _load():
    spec = importlib.util.spec_from_file_location("llama_wheel", ROOT / "scripts" / "llama_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheel = _load()


def tool(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def linux(env: dict[str, str]):
    return wheel.choose_build(env, system="Linux", machine="x86_64", flags=EPYC)


def test_without_nvcc_the_build_is_todays_cpu_build(tmp_path: Path) -> None:
    build = linux({"PATH": str(tmp_path)})
    assert build.backend == "cpu" and build.key == EPYC_KEY == cpu.build_key(EPYC, machine="x86_64")
    assert list(build.cmake_args) == cpu.cmake_args(EPYC, machine="x86_64") and build.note == ""


def test_nvcc_and_a_gpu_make_a_cuda_build_for_its_architecture(tmp_path: Path) -> None:
    tool(tmp_path, "nvcc", NVCC)
    tool(tmp_path, "nvidia-smi", SMI)
    build = linux({"PATH": str(tmp_path)})
    assert build.backend == "cuda" and build.key == f"{EPYC_KEY}-cuda12.4-sm90"
    args = list(build.cmake_args)
    assert args[:len(cpu.cmake_args(EPYC, machine="x86_64"))] == cpu.cmake_args(EPYC, machine="x86_64")
    assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=90" in args
    assert f"-DCMAKE_CUDA_COMPILER={tmp_path / 'nvcc'}" in args


def test_gpus_of_two_architectures_are_both_built_for(tmp_path: Path) -> None:
    tool(tmp_path, "nvcc", NVCC)
    tool(tmp_path, "nvidia-smi", 'case "$1" in -L) echo "GPU 0: A"; echo "GPU 1: B";; *) echo 8.9; echo 8.0;; esac')
    build = linux({"PATH": str(tmp_path)})
    assert build.key.endswith("-cuda12.4-sm80-sm89") and "-DCMAKE_CUDA_ARCHITECTURES=80;89" in build.cmake_args


def test_nvcc_in_cuda_home_counts_and_cmake_picks_architectures_nvidia_smi_does_not_give(tmp_path: Path) -> None:
    home = tmp_path / "cuda-12.4"
    tool(home / "bin", "nvcc", NVCC)
    path = tmp_path / "bin"
    tool(path, "nvidia-smi", 'case "$1" in -L) echo "GPU 0: Tesla K80";; *) echo "no compute_cap" >&2; exit 2;; esac')
    build = linux({"PATH": str(path), "CUDA_HOME": str(home)})
    assert build.backend == "cuda" and build.key == f"{EPYC_KEY}-cuda12.4-smdefault"
    assert not any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in build.cmake_args)
    assert f"-DCMAKE_CUDA_COMPILER={home / 'bin' / 'nvcc'}" in build.cmake_args


def test_nvcc_without_a_gpu_stays_on_the_cpu_and_says_how_to_ask(tmp_path: Path) -> None:
    """A toolkit without a driver (this machine, a CI runner): a CUDA wheel would not load here (no libcuda)."""
    tool(tmp_path, "nvcc", NVCC)
    build = linux({"PATH": str(tmp_path)})
    assert build.backend == "cpu" and build.key == EPYC_KEY and "TOKENOMY_LLAMA_BACKEND=cuda" in build.note
    forced = linux({"PATH": str(tmp_path), "TOKENOMY_LLAMA_BACKEND": "cuda"})
    assert forced.backend == "cuda" and forced.key == f"{EPYC_KEY}-cuda12.4-smdefault"


def test_a_gpu_without_nvcc_stays_on_the_cpu_and_says_why(tmp_path: Path) -> None:
    tool(tmp_path, "nvidia-smi", SMI)
    build = linux({"PATH": str(tmp_path)})
    assert build.backend == "cpu" and build.key == EPYC_KEY and "no nvcc" in build.note


def test_the_override_wins_and_names_what_is_missing(tmp_path: Path) -> None:
    tool(tmp_path, "nvcc", NVCC)
    tool(tmp_path, "nvidia-smi", SMI)
    assert linux({"PATH": str(tmp_path), "TOKENOMY_LLAMA_BACKEND": "cpu"}).key == EPYC_KEY
    with pytest.raises(wheel.NoBackend, match="no nvcc"):
        linux({"PATH": str(tmp_path / "empty"), "TOKENOMY_LLAMA_BACKEND": "cuda"})
    with pytest.raises(wheel.NoBackend, match="choose one of cpu, cuda, vulkan, metal"):
        linux({"PATH": str(tmp_path), "TOKENOMY_LLAMA_BACKEND": "rocm"})
    with pytest.raises(wheel.NoBackend, match="Metal is macOS's"):
        linux({"PATH": str(tmp_path), "TOKENOMY_LLAMA_BACKEND": "metal"})


def test_vulkan_only_when_asked_and_with_glslc_and_headers(tmp_path: Path) -> None:
    tool(tmp_path / "bin", "glslc", "true")
    assert linux({"PATH": str(tmp_path / "bin")}).backend == "cpu"       # never chosen unasked
    sdk = tmp_path / "sdk"
    (sdk / "include" / "vulkan").mkdir(parents=True)
    (sdk / "include" / "vulkan" / "vulkan.h").write_text("")
    build = linux({"PATH": str(tmp_path / "bin"), "VULKAN_SDK": str(sdk), "TOKENOMY_LLAMA_BACKEND": "vulkan"})
    assert build.backend == "vulkan" and build.key == f"{EPYC_KEY}-vulkan" and "-DGGML_VULKAN=ON" in build.cmake_args
    with pytest.raises(wheel.NoBackend, match="glslc"):
        linux({"PATH": str(tmp_path / "empty"), "VULKAN_SDK": str(sdk), "TOKENOMY_LLAMA_BACKEND": "vulkan"})


def test_an_apple_silicon_mac_gets_metal_and_a_cpu_build_there_says_no_metal(tmp_path: Path) -> None:
    build = wheel.choose_build({"PATH": str(tmp_path)}, system="Darwin", machine="arm64")
    assert (build.backend, build.key) == ("metal", "arm64-native-metal") and "-DGGML_METAL=ON" in build.cmake_args
    assert "-DGGML_NATIVE=ON" in build.cmake_args
    cpu_only = wheel.choose_build({"PATH": str(tmp_path), "TOKENOMY_LLAMA_BACKEND": "cpu"}, system="Darwin",
                                  machine="arm64")
    assert cpu_only.key == "arm64-native-nometal" and "-DGGML_METAL=OFF" in cpu_only.cmake_args


def test_this_machine_gets_the_cpu_build_under_todays_key() -> None:
    """No GPU here: the wheels cached under cpu.py's key stay valid."""
    if shutil.which("nvidia-smi") or sys.platform == "darwin" or os.environ.get("TOKENOMY_LLAMA_BACKEND"):
        pytest.skip("a machine with a GPU backend (or one asked for)")
    build = wheel.choose_build()
    assert build.backend == "cpu" and build.key == cpu.build_key() and list(build.cmake_args) == cpu.cmake_args()
