"""The file's `fleet:` section: which embedded models are loaded, when, and within how much memory
(tokenomy/backends/fleet.py), and Ollama's keep_alive durations."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from tokenomy.config.section import Section

KeepAlive = str | int | float

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")


def keep_alive_seconds(value: KeepAlive) -> float | None:
    """Seconds an idle model stays loaded for an Ollama keep_alive: a number of seconds or a Go duration ("5m",
    "1h30m", "250ms"); 0: unload once idle; any negative value: keep loaded (None). ValueError naming the value
    for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"keep_alive {value!r} is not a duration")
    if isinstance(value, (int, float)):
        return None if value < 0 else float(value)
    text = value.strip()
    if text.startswith("-"):
        if keep_alive_seconds(text[1:]) is None:
            raise ValueError(f"keep_alive {value!r} is not a duration")
        return None
    try:
        return float(text)
    except ValueError:
        pass
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"keep_alive {value!r} is not a duration: give seconds, or e.g. 10s, 5m, 1h, -1 (keep)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


class FleetSettings(Section):
    """Embedded models are available, and loaded on their first request (docs/fleet.md): within `memory_limit_gb`,
    evicting idle models by what their reload would cost, and unloaded after their keep_alive."""

    memory_limit_gb: float | None = Field(None, gt=0, description="GiB of RAM the loaded models may take together "
                                          "(their planned figures, models/memory.py: weights, KV and KV tier, or "
                                          "only the KV tier for a model whose layers are all on a GPU); null: "
                                          "`memory_share` of the RAM free when tokenomy starts")
    gpu_memory_limit_gb: float | None = Field(None, gt=0, description="GiB of each GPU's memory the weights and KV "
                                              "of the models fully offloaded to it may take together; null: "
                                              "`memory_share` of its free VRAM when its first model is placed")
    memory_share: float = Field(0.8, gt=0, le=1, description="the share of the free memory at start that "
                                "memory_limit_gb and gpu_memory_limit_gb default to")
    engine_overhead_mb: int = Field(96, ge=0, description="MiB placement adds to each model's weights, KV and KV "
                                    "tier for its engine process itself (the interpreter, llama.cpp's compute "
                                    "buffers; about 90 MiB measured beside SmolLM2-135M)")
    keep_alive: KeepAlive = Field("5m", description="how long a model stays loaded after its last request, as "
                                  "Ollama's keep_alive: seconds or a duration (10s, 5m, 1h); 0: unload once idle; "
                                  "-1: keep loaded. A model's own keep_alive, then a request's, override it")
    max_waiting: int = Field(64, ge=0, description="requests that may wait for one model's load; more get a 503 "
                             "with Retry-After")
    load_wait_s: float = Field(120.0, gt=0, description="the longest a request waits for its model to load "
                               "(a 503 with Retry-After after it)")
    rate_window_s: float = Field(600.0, gt=0, description="eviction cost = a model's load seconds measured at its "
                                 "last load x its requests per second over this many seconds")
    eviction: Literal["cost", "lru"] = Field("cost", description="which idle model makes room: `cost`, the lowest "
                                             "expected reload cost (load seconds x request rate); `lru`, the least "
                                             "recently used (llama.cpp's router; the baseline bench/fleet.py "
                                             "measures against)")
    max_loaded: int | None = Field(None, ge=1, description="at most this many models loaded at once, besides the "
                                   "memory limit (llama.cpp router's --models-max); null: memory alone decides")
    keep_conversations: bool = Field(True, description="on unload, the prefixes a model's KV tier saved (its "
                                     "recent conversations; engine.kv_tier_ram_mb > 0) are written to disk under "
                                     "the data directory's fleet-kv/, and its next load takes them back, so a "
                                     "conversation's next turn after a swap is not prefilled again")
    discover: bool = Field(False, description="also make available every GGUF in the Hugging Face hub cache and "
                           "in `models_dir`, each under its file's name")
    models_dir: str | None = Field(None, description="a folder of .gguf files made available with discover")
