"""Named models and hardware (data in models.yaml and hardware.yaml), and resolving what a user typed."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import yaml

from tokenomy.models.gguf import GGUFError, read_gguf
from tokenomy.models.hf_config import HFConfigError, read_hf_config
from tokenomy.models.shape import MLA, LinearAttention, ModelShape, MoE
from tokenomy.tools.plan.inputs import HardwareSpec

_HERE = Path(__file__).parent


class PresetError(ValueError):
    """An unknown name or unreadable file; the message lists what would have worked."""


@functools.lru_cache(maxsize=2)
def _load(name: str) -> dict[str, dict[str, Any]]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader when PyYAML has it: the CLI starts faster
    with open(_HERE / name, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)  # a safe loader either way


def model_names() -> list[str]:
    return list(_load("models.yaml"))


def hardware_names() -> list[str]:
    return list(_load("hardware.yaml"))


def _layer_types(layers: int, attention: dict[str, Any] | None) -> tuple[tuple[str, ...], int | None]:
    if not attention:
        return (), None
    every, others = int(attention["full_every"]), str(attention["others"])
    return tuple("full" if (i + 1) % every == 0 else others for i in range(layers)), attention.get("window")


def packaged_gguf(candidates: list[str]) -> Path | None:
    """The first candidate that exists: "pkg:<module>/<file>" is looked up without importing the module."""
    for c in candidates:
        if c.startswith("pkg:"):
            module, _, filename = c[4:].partition("/")
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None:
                continue
            path = Path(spec.origin).parent / filename
        else:
            path = Path(c).expanduser()
        if path.is_file():
            return path
    return None


def preset_model(key: str, use_file: bool = True) -> ModelShape:
    """A ModelShape from models.yaml; with `use_file`, a packaged model takes its real bytes from its GGUF."""
    d = dict(_load("models.yaml")[key])
    layer_types, window = _layer_types(int(d["layers"]), d.pop("attention", None))
    moe = d.pop("moe", None)
    if moe is not None:
        moe = dict(moe)
        moe["dense_layers"] = tuple(range(int(moe.pop("dense_first", 0))))
        moe = MoE(**moe)
    mla = MLA(**d.pop("mla")) if "mla" in d else None
    linear = LinearAttention(**d.pop("linear")) if "linear" in d else None
    # PyYAML reads 8.03e9 (no exponent sign) as a string: convert explicitly
    reported = {k: float(v) for k, v in d.pop("reported_params", {}).items()}
    file = None
    gguf_path = packaged_gguf(d.pop("gguf", []))
    if use_file and gguf_path is not None:
        file = read_gguf(gguf_path).file
    return ModelShape(key=key, layer_types=layer_types, sliding_window=window, moe=moe, mla=mla, linear=linear,
                     file=file, reported_params=reported, **d)


def resolve_model(name: str, use_file: bool = True) -> ModelShape:
    """A preset name, or a path to a HF config.json (or its directory) or a .gguf file."""
    if name in _load("models.yaml"):
        return preset_model(name, use_file)
    path = Path(name).expanduser()
    try:
        if path.suffix.lower() == ".gguf":
            return read_gguf(path)
        if path.suffix.lower() == ".json" or path.is_dir():
            return read_hf_config(path)
    except (GGUFError, HFConfigError) as e:
        raise PresetError(str(e)) from None
    raise PresetError(f"unknown model {name!r}; valid presets: {', '.join(model_names())}; "
                      "or a path to a Hugging Face config.json (or its folder) or a .gguf file")


def preset_hardware(key: str) -> HardwareSpec:
    d = _load("hardware.yaml")[key]
    return HardwareSpec(key=key, name=d["name"], memory_bytes=float(d["memory_gib"]) * 2**30,
                        bandwidth=float(d["bandwidth_tbs"]) * 1e12,
                        flops={k: float(v) * 1e12 for k, v in d["tflops"].items()}, tdp_w=d.get("tdp_w"),
                        source="datasheet (hardware.yaml)")


def resolve_hardware(name: str) -> HardwareSpec:
    """A hardware preset by name; `local` probes this machine."""
    table = _load("hardware.yaml")
    if name not in table:
        raise PresetError(f"unknown hardware {name!r}; valid names: {', '.join(hardware_names())}")
    if table[name].get("probe"):
        from tokenomy.tools.plan.probe import probe

        return probe()
    return preset_hardware(name)
