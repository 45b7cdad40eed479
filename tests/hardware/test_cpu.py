"""Build flags come from the CPU's features: never -march=native, never AMX, and a cache key per instruction set."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tokenomy.hardware import cpu

ROOT = Path(__file__).resolve().parents[2]
EPYC = "flags\t\t: fpu sse4_2 avx f16c fma bmi2 avx2 sha_ni\n"
XEON_AMX = ("flags\t\t: sse4_2 avx f16c fma bmi2 avx2 avx_vnni avx512f avx512dq avx512cd avx512bw avx512vl "
            "avx512vbmi avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16\n")


def args_for(cpuinfo: str) -> dict[str, str]:
    return dict(a.removeprefix("-D").split("=") for a in cpu.cmake_args(cpu.cpu_flags(cpuinfo)))


def test_amx_is_off_even_where_the_cpu_has_it() -> None:
    a = args_for(XEON_AMX)
    assert a["GGML_NATIVE"] == "OFF"
    assert a["GGML_AMX_TILE"] == a["GGML_AMX_INT8"] == a["GGML_AMX_BF16"] == "OFF"
    assert a["GGML_AVX512"] == a["GGML_AVX512_VNNI"] == a["GGML_AVX512_BF16"] == "ON"


def test_an_avx2_machine_gets_no_avx512_and_another_key() -> None:
    a = args_for(EPYC)
    assert a["GGML_AVX2"] == a["GGML_FMA"] == a["GGML_F16C"] == "ON"
    assert a["GGML_AVX512"] == a["GGML_AVX512_VNNI"] == a["GGML_AVX_VNNI"] == "OFF"
    epyc, xeon = cpu.build_key(cpu.cpu_flags(EPYC)), cpu.build_key(cpu.cpu_flags(XEON_AMX))
    assert epyc != xeon and "avx512" not in epyc and "amx" not in xeon


def test_avx512_extensions_need_avx512f() -> None:
    partial = "flags : sse4_2 avx f16c fma bmi2 avx2 avx512_vnni avx512_bf16\n"   # no avx512f: not usable
    a = args_for(partial)
    assert a["GGML_AVX512"] == a["GGML_AVX512_VNNI"] == a["GGML_AVX512_BF16"] == "OFF"


def test_the_install_script_pins_the_version_pyproject_does() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = next(d for d in deps if d.startswith("llama-cpp-python=="))
    script = (ROOT / "scripts" / "llama_wheel.py").read_text()
    assert re.search(r'^VERSION = "([^"]+)"', script, re.M).group(1) == pinned.split("==")[1]
