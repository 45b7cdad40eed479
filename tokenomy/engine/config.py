"""The engine's one configuration: validated once (it is the YAML file's `engine:` section), read by the engine,
its scheduler and its runner."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_ctx: int = Field(98304, ge=256, description="KV cells in all; with kv_unified false each of the n_seqs "
                       "streams gets n_ctx / n_seqs of them (rounded up to 256), a sequence's length limit")
    max_model_len: int = Field(8192, ge=64)
    max_running: int = Field(16, ge=1, le=128)
    max_retired: int = Field(8, ge=0, le=128, description="sequence ids beyond max_running, for finished sequences "
                             "kept as reusable prefixes (with KV streams, every stream not running keeps one)")
    max_retired_cells: int | None = Field(None, ge=0, description="KV cells held by finished sequences alone "
                                          "(None: a quarter of n_ctx) in the unified buffer; more slows every "
                                          "decode step, fewer makes prompts that share a long prefix recompute it "
                                          "(docs/engine.md)")
    retire_outputs: bool = Field(False, description="keep a finished answer's own tokens as a prefix too, for the "
                                 "next turn of a conversation; off: only its prompt stays cached")
    max_batch_tokens: int = Field(512, ge=1, description="tokens per llama_decode step (chunked prefill)")
    max_waiting: int = Field(256, ge=1)
    batch_max_running: int = Field(8, ge=1, le=128, description="batch-priority sequences running at once; they "
                                   "run only in steps without interactive work")
    batch_step_ms: float = Field(20.0, ge=0, description="a step of batch work is cut to the tokens the measured "
                                 "step cost says take about this long (at least one), since an interactive arrival "
                                 "waits for the step in flight; 0: batch_step_tokens alone (docs/batch.md)")
    batch_step_tokens: int = Field(64, ge=1, description="tokens batch sequences get in one step: bounds how long an "
                                   "interactive arrival waits for the step in flight")
    n_threads: int = Field(0, ge=0, description="0 = all cores")
    kv_type: str = Field("q8_0/f16", pattern=r"^(f16|q8_0|q4_0)(/(f16|q8_0|q4_0))?$",
                         description="KV cache types as K/V (one name sets both); both f16 makes a cached prefix "
                         "able to change a greedy answer (docs/engine.md)")
    kv_unified: bool = Field(False, description="true: one KV buffer for all sequences, where shared prefixes "
                             "share cells but every decode row's attention scans every cached cell; false: one "
                             "stream of n_ctx / n_seqs cells per sequence id (llama-server's layout), where a row "
                             "scans its own stream and a shared prefix is copied (docs/engine.md, \"KV streams\")")
    prefix_caching: bool = True
    kv_tier_ram_mb: int = Field(1024, ge=0, description="host RAM for the KV of evicted cached prefixes, restored "
                                "instead of recomputed when a prompt shares one (engine/kv_tier.py); 0: off")
    kv_tier_disk_dir: str | None = Field(None, description="a directory for a disk tier below the RAM one "
                                         "(emptied at start); none: no disk tier")
    kv_tier_disk_mb: int = Field(8192, ge=0, description="bytes the disk tier may hold, in MiB")
    speculative: bool = Field(True, description="draft from the sequence's own tokens (prompt lookup), as many as "
                              "the measured cost of a step says pay (engine/speculate.py); never for a seeded "
                              "sampled request or a grammar-constrained one")
    draft_model: str | None = Field(None, description="a smaller model with the same vocabulary (a packaged model's "
                                    "name or a GGUF path) that drafts tokens for speculation instead of prompt "
                                    "lookup, as many as the measured cost of its steps and the target's says pay "
                                    "(engine/draft.py); its context has as many cells as this one")
    flash_attn: bool = Field(True, description="flash attention skips masked cells of the unified KV buffer")
    watchdog_s: float = Field(120.0, gt=0, description="an engine process that holds requests and finishes no "
                              "step for this long is killed and restarted")
    start_timeout_s: float = Field(300.0, gt=0, description="time for an engine process to load its model and "
                                   "pass its self-check")
    context_overflow: Literal["error", "shift"] = Field(
        "error", description="a sequence reaching max_model_len: error (finish with length; a max_tokens that "
        "cannot fit is refused) or shift (keep its first tokens and the most recent half, drop the middle and "
        "go on, as StreamingLLM does: lossy, docs/engine.md); shift needs kv_unified false")
    in_place_tokens: int | None = Field(None, ge=1, description="with kv_unified false, a cached prefix at least "
                                        "this long is used where it lies even on a stream apart from the running "
                                        "ones (every step then computes one more run of streams until a gap "
                                        "closes); none: it is copied or restored next to them, which measured "
                                        "faster (docs/bench.md, bench/stream_placement.py)")

    @model_validator(mode="after")
    def _shift_needs_streams(self) -> EngineConfig:
        if self.context_overflow == "shift" and self.kv_unified:
            raise ValueError("context_overflow shift needs kv_unified false (one KV stream per sequence)")
        return self

    @property
    def n_seqs(self) -> int:
        """llama.cpp sequence ids: running sequences plus retired prefix holders."""
        return self.max_running + self.max_retired
