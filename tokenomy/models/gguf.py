"""Read a model's shape and its real weight bytes from a `.gguf` file's metadata and tensor table."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from tokenomy.models.shape import MLA, FileWeights, LinearAttention, ModelShape, MoE

# llama.cpp's fixed sliding-window patterns for architectures whose files predate the pattern key.
_SWA_PATTERN = {"gemma3": 6, "gemma2": 2, "gemma3n": 5}
# Tensors whose presence in block i marks layer i as attention (otherwise it is a recurrent/linear layer).
_ATTN_TENSORS = ("attn_k.weight", "attn_qkv.weight", "attn_kv_a_mqa.weight")


class GGUFError(ValueError):
    """The file is not a readable GGUF model; the message says why."""


def _value(fields: dict[str, Any], key: str, default: Any = None) -> Any:
    field = fields.get(key)
    if field is None:
        return default
    value = field.contents()
    if isinstance(value, list):  # per-layer arrays (e.g. head_count_kv on some models): plan for the largest
        return max(value) if value and all(isinstance(v, int | float) for v in value) else value
    return value


def _raw(fields: dict[str, Any], key: str) -> Any:
    field = fields.get(key)
    return None if field is None else field.contents()


@functools.lru_cache(maxsize=8)
def _read(path: str, mtime: float, size: int) -> ModelShape:
    from gguf import GGUFReader  # parsing pulls in numpy memmaps; only when a .gguf is asked for

    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # any parse failure means the same thing to the user: not a GGUF model
        raise GGUFError(f"{path} is not a readable GGUF file: {e}") from None
    fields = reader.fields
    arch = _value(fields, "general.architecture")
    if not arch:
        raise GGUFError(f"{path} has no general.architecture")

    def meta(name: str, default: Any = None) -> Any:
        return _value(fields, f"{arch}.{name}", default)

    layers, hidden = meta("block_count"), meta("embedding_length")
    heads = meta("attention.head_count")
    if not (layers and hidden and heads):
        raise GGUFError(f"{path}: no block_count/embedding_length/attention.head_count for arch {arch!r}")
    tokens = fields.get("tokenizer.ggml.tokens")
    vocab = meta("vocab_size") or (len(tokens.data) if tokens is not None else 0)
    head_dim = meta("attention.key_length") or hidden // heads

    tensors = list(reader.tensors)
    for shard in _other_shards(path, _value(fields, "split.count", 1)):    # a split model: every part's tensors
        try:
            tensors += GGUFReader(shard, "r").tensors
        except Exception as e:
            raise GGUFError(f"{shard} (a part of {path}) is not a readable GGUF file: {e}") from None
    names = {t.name for t in tensors}
    has_attn = [any(f"blk.{i}.{t}" in names for t in _ATTN_TENSORS) for i in range(layers)]
    interval, window = meta("full_attention_interval"), meta("attention.sliding_window")
    if interval:
        kinds = tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(layers))
    elif not all(has_attn):
        kinds = tuple("full" if a else "linear" for a in has_attn)
    elif window and isinstance(flags := _raw(fields, f"{arch}.attention.sliding_window_pattern"), list) \
            and len(flags) == layers:
        kinds = tuple("sliding" if flag else "full" for flag in flags)  # newer files: one flag per layer
    elif window and (pattern := meta("attention.sliding_window_pattern") or _SWA_PATTERN.get(arch)):
        kinds = tuple("full" if (i + 1) % int(pattern) == 0 else "sliding" for i in range(layers))
    else:
        kinds = ()
    linear = None
    if "linear" in kinds:
        value_heads, inner = meta("ssm.time_step_rank", 0), meta("ssm.inner_size", 0)
        if not value_heads:
            raise GGUFError(f"{path}: linear-attention layers but no ssm.time_step_rank")
        linear = LinearAttention(num_key_heads=meta("ssm.group_count", value_heads), num_value_heads=value_heads,
                                 key_head_dim=meta("ssm.state_size", 128), value_head_dim=inner // value_heads,
                                 conv_kernel=meta("ssm.conv_kernel", 4))

    mla = None
    if meta("attention.kv_lora_rank"):
        rope = meta("rope.dimension_count", 64)
        qk = meta("attention.key_length_mla") or head_dim
        mla = MLA(kv_lora_rank=meta("attention.kv_lora_rank"), qk_rope_head_dim=rope, qk_nope_head_dim=qk - rope,
                  v_head_dim=meta("attention.value_length_mla") or meta("attention.value_length") or qk - rope,
                  q_lora_rank=meta("attention.q_lora_rank"))

    moe = None
    if meta("expert_count"):
        moe = MoE(experts=meta("expert_count"), active=meta("expert_used_count", 1),
                  expert_intermediate=meta("expert_feed_forward_length") or meta("feed_forward_length", 0),
                  shared_experts=meta("expert_shared_count", 0),
                  shared_intermediate=meta("expert_shared_feed_forward_length")
                  or meta("expert_feed_forward_length", 0),
                  dense_layers=tuple(range(meta("leading_dense_block_count", 0))))

    params = sum(int(t.n_elements) for t in tensors)
    total = sum(int(t.n_bytes) for t in tensors)
    experts = [t for t in tensors if "_exps." in t.name]
    by_type: Counter[str] = Counter()
    for t in tensors:
        by_type[t.tensor_type.name] += int(t.n_bytes)
    weights = FileWeights(path=path, params=params, bytes=total,
                          expert_params=sum(int(t.n_elements) for t in experts),
                          expert_bytes=sum(int(t.n_bytes) for t in experts),
                          label=by_type.most_common(1)[0][0] if by_type else "?")
    name = _value(fields, "general.name") or Path(path).stem
    return ModelShape(
        key=Path(path).name, name=str(name), layers=int(layers), hidden=int(hidden), vocab=int(vocab),
        heads=int(heads), kv_heads=int(meta("attention.head_count_kv") or heads), head_dim=int(head_dim),
        intermediate=int(meta("feed_forward_length") or 0), tied_embeddings="output.weight" not in names,
        dtype="bf16", layer_types=kinds, sliding_window=int(window) if window and "sliding" in kinds else None,
        attn_output_gate=arch == "qwen3next", moe=moe, mla=mla, linear=linear, file=weights, source=path,
        context_length=int(meta("context_length")) if meta("context_length") else None,
    )


def _other_shards(path: str, count: int) -> list[str]:
    """The other parts of a split GGUF (`NAME-00001-of-0000N.gguf`, named so by llama.cpp's gguf-split), which
    llama.cpp loads from beside the first; none for a whole file. A missing part is a GGUFError."""
    m = re.match(r"^(.*)-00001-of-(\d{5})\.gguf$", path)
    if int(count or 1) <= 1 or m is None:
        return []
    parts = [f"{m[1]}-{i:05d}-of-{m[2]}.gguf" for i in range(2, int(m[2]) + 1)]
    missing = [p for p in parts if not os.path.exists(p)]
    if missing:
        raise GGUFError(f"{path} is part 1 of {m[2]}: missing {', '.join(Path(p).name for p in missing)}")
    return parts


_CACHE_VERSION = 2      # 2: context_length, split files


def cache_dir() -> Path:
    """Where summaries of parsed files are kept: $XDG_CACHE_HOME/tokenomy/plan (default ~/.cache/...)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tokenomy" / "plan"


def _cache_file(path: str, mtime: float, size: int) -> Path:
    import hashlib

    digest = hashlib.sha256(f"{_CACHE_VERSION}|{path}|{mtime}|{size}".encode()).hexdigest()[:24]
    return cache_dir() / f"gguf-{digest}.json"


def _from_dict(d: dict[str, Any]) -> ModelShape:
    nested = {"moe": MoE, "mla": MLA, "linear": LinearAttention, "file": FileWeights}
    for key, cls in nested.items():
        if d.get(key) is not None:
            d[key] = cls(**d[key])
    if d.get("moe") is not None:
        d["moe"] = dataclasses.replace(d["moe"], dense_layers=tuple(d["moe"].dense_layers))
    d["layer_types"] = tuple(d["layer_types"])
    return ModelShape(**d)


def read_gguf(path: str | Path) -> ModelShape:
    """A ModelShape from a .gguf file: shape from its metadata, exact parameters and bytes from its tensors.

    GGUFReader parses every tokenizer entry, which takes seconds for a large vocabulary, so the resulting spec
    is cached per (path, mtime, size) in memory and as a small JSON file under cache_dir().
    """
    p = Path(path).expanduser().absolute()     # not resolve(): a hub cache link names the file, its blob does not
    try:
        st = os.stat(p)
    except OSError as e:
        raise GGUFError(f"cannot open {p}: {e.strerror}") from None
    cached = _cache_file(str(p), st.st_mtime, st.st_size)
    try:
        return _from_dict(json.loads(cached.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        pass  # no cache yet, or one from another version: parse the file
    spec = _read(str(p), st.st_mtime, st.st_size)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(dataclasses.asdict(spec)), encoding="utf-8")
    except OSError:
        pass  # a read-only home only costs the next run the parse again
    return spec


@dataclasses.dataclass(frozen=True)
class GGUFMetadata:
    """A file's key-value metadata as a client reads it (Ollama's /api/show `model_info`): every key with its
    value, arrays longer than MAX_LISTED as None (the tokenizer's vocabulary and merges); the quantization its
    `general.file_type` names (Q4_1, Q4_K_M ...), and the fill-in-the-middle tokens' texts (prefix, suffix,
    middle) when the file names all three."""

    values: dict[str, Any]
    quantization: str | None
    fim: tuple[str, str, str] | None


MAX_LISTED = 64


def read_metadata(path: str | Path) -> GGUFMetadata:
    """The metadata of a .gguf file (a GGUFError when it is not one); parsed once per (path, mtime, size)."""
    p = Path(path).expanduser().absolute()
    try:
        st = os.stat(p)
    except OSError as e:
        raise GGUFError(f"cannot open {p}: {e.strerror}") from None
    return _metadata(str(p), st.st_mtime, st.st_size)


@functools.lru_cache(maxsize=8)
def _metadata(path: str, mtime: float, size: int) -> GGUFMetadata:
    from gguf import GGUFReader, LlamaFileType

    try:
        fields = GGUFReader(path, "r").fields
    except Exception as e:
        raise GGUFError(f"{path} is not a readable GGUF file: {e}") from None
    values: dict[str, Any] = {}
    for key, f in fields.items():
        if key.startswith("GGUF."):
            continue
        is_array = len(f.types) > 1
        values[key] = None if is_array and len(f.data) > MAX_LISTED else f.contents()
    file_type = values.get("general.file_type")
    try:
        quant = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        quant = None
    ids = [values.get(f"tokenizer.ggml.fim_{part}_token_id") for part in ("pre", "suf", "mid")]
    tokens = fields.get("tokenizer.ggml.tokens")
    fim = None
    if tokens is not None and all(isinstance(i, int) and 0 <= i < len(tokens.data) for i in ids):
        fim = (str(tokens.contents(ids[0])), str(tokens.contents(ids[1])), str(tokens.contents(ids[2])))
    return GGUFMetadata(values, quant, fim)
