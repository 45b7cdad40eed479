"""The engine's one configuration: validated once (it is the YAML file's `engine:` section), read by the engine,
its scheduler and its runner."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_N_CTX = 98304      # KV cells when neither n_ctx nor max_model_len is set: 24 streams of 4,096


class EngineConfig(BaseModel):
    """The embedded engine: KV cache, scheduling, speculation and its process (docs/engine.md)."""

    model_config = ConfigDict(extra="forbid")

    n_ctx: int | None = Field(None, ge=256, description="KV cells in all; with kv_unified false each of the n_seqs "
                              "(max_running + max_retired) streams gets n_ctx / n_seqs of them (rounded up to 256); "
                              "none: room for every sequence id at max_model_len (n_seqs x max_model_len); when "
                              "max_model_len is not set either, the model's trained context for each, cut to what "
                              "memory holds (docs/models.md; "
                              f"{DEFAULT_N_CTX} for an engine built without the server)")
    kv_start_cells: int | None = Field(1024, ge=256, description="with kv_unified false, the KV cells each stream "
                                       "starts with (rounded up to 256, at most max_model_len): the context is "
                                       "made again with streams twice as large, up to max_model_len, each stream's "
                                       "KV carried over, when a sequence needs more (engine/runner.py grow); an "
                                       "idle engine then holds n_seqs x this, not n_seqs windows. None: every "
                                       "stream holds the whole window from the start (docs/engine.md, \"KV that "
                                       "grows\")")
    max_model_len: int | None = Field(None, ge=64, description="the longest sequence, prompt and answer, in tokens; "
                                      "granted, or the engine refuses to start and says why: it must fit a "
                                      "sequence's KV (a stream's n_ctx / n_seqs cells with kv_unified false, n_ctx "
                                      "with true) and the model's training context; none: as long as a sequence's "
                                      "KV can be, at most the training context (with n_ctx unset too: the training "
                                      "context, cut to what memory holds: docs/models.md)")
    kv_budget_mb: int = Field(4096, ge=64, description="with neither n_ctx nor max_model_len set, the window is "
                              "the model's trained context cut to what memory holds and to this much KV for all "
                              "streams together, in MiB: a larger cache costs every start its allocation (about "
                              "2 s per GB on 2 cores) for windows few requests fill (docs/models.md)")
    max_running: int = Field(16, ge=1, le=128, description="sequences decoded together in one step; more: higher "
                             "throughput, slower steps (each gets a KV stream with kv_unified false)")
    max_retired: int = Field(8, ge=0, le=128, description="sequence ids beyond max_running, for finished sequences "
                             "kept as reusable prefixes (with KV streams, every stream not running keeps one)")
    max_retired_cells: int | None = Field(None, ge=0, description="KV cells held by finished sequences alone "
                                          "(None: a quarter of n_ctx) in the unified buffer; more slows every "
                                          "decode step, fewer makes prompts that share a long prefix recompute it "
                                          "(docs/engine.md)")
    retire_outputs: bool | None = Field(None, description="keep a finished answer's own tokens as a prefix too, for "
                                        "the next turn of a conversation; off: only its prompt stays cached; "
                                        "none: on with KV streams (a finished stream's cells slow no other "
                                        "sequence's step), off with kv_unified true (every cached cell is scanned "
                                        "by every step: docs/engine.md)")
    max_batch_tokens: int = Field(512, ge=1, description="tokens per llama_decode step (chunked prefill)")
    max_waiting: int = Field(256, ge=1, description="requests queued for a place among max_running; one more is "
                             "refused (429) rather than queued")
    batch_max_running: int = Field(8, ge=1, le=128, description="batch-priority sequences running at once; they "
                                   "run only in steps without interactive work")
    batch_step_ms: float = Field(20.0, ge=0, description="a step of batch work is cut to the tokens the measured "
                                 "step cost says take about this long (at least one), since an interactive arrival "
                                 "waits for the step in flight; 0: batch_step_tokens alone (docs/batch.md)")
    batch_step_tokens: int = Field(64, ge=1, description="tokens batch sequences get in one step: bounds how long an "
                                   "interactive arrival waits for the step in flight")
    n_threads: int = Field(0, ge=0, description="threads a decode step runs on; 0: all cores (on a machine with "
                           "other work, leave one free: docs/engine.md)")
    kv_type: str = Field("q8_0/f16", pattern=r"^(f16|q8_0|q4_0)(/(f16|q8_0|q4_0))?$",
                         description="KV cache types as K/V (one name sets both); both f16 makes a cached prefix "
                         "able to change a greedy answer (docs/engine.md)")
    kv_unified: bool = Field(False, description="true: one KV buffer for all sequences, where shared prefixes "
                             "share cells but every decode row's attention scans every cached cell; false: one "
                             "stream of n_ctx / n_seqs cells per sequence id (llama-server's layout), where a row "
                             "scans its own stream and a shared prefix is copied (docs/engine.md, \"KV streams\")")
    prefix_caching: bool = Field(True, description="reuse the KV of a cached prompt prefix instead of recomputing "
                                 "it; off only to measure what it saves")
    kv_tier_ram_mb: int = Field(1024, ge=0, description="host RAM for the KV of evicted cached prefixes, restored "
                                "instead of recomputed when a prompt shares one (engine/kv/tier.py); 0: off")
    kv_tier_disk_dir: str | None = Field(None, description="a directory for a disk tier below the RAM one "
                                         "(emptied at start); none: no disk tier")
    kv_tier_disk_mb: int = Field(8192, ge=0, description="bytes the disk tier may hold, in MiB")
    speculative: bool = Field(True, description="draft from the sequence's own tokens (prompt lookup), as many as "
                              "the measured cost of a step says pay (engine/spec/speculate.py); never for a seeded "
                              "sampled request or a grammar-constrained one")
    draft_model: str | None = Field(None, description="a smaller model with the same vocabulary (a packaged model's "
                                    "name or a GGUF path) that drafts tokens for speculation instead of prompt "
                                    "lookup, as many as the measured cost of its steps and the target's says pay "
                                    "(engine/spec/draft.py); its context has as many cells as this one")
    n_gpu_layers: int | None = Field(None, ge=-1, description="model layers offloaded to the GPU, the rest run on "
                                     "the CPU; -1: all; none: all when llama-cpp-python was built with a GPU "
                                     "backend (CUDA, Metal, Vulkan: install.sh, docs/models.md \"GPU\"), else 0. "
                                     "A CPU build offloads none whatever this says")
    main_gpu: int | None = Field(0, ge=0, description="the GPU (llama.cpp's device index) that holds the whole "
                                 "model; none: its layers split over all visible GPUs (llama.cpp's split by layer)")
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

    def gpu_layers(self, offload: bool) -> int:
        """The layers llama.cpp is asked to offload, given whether the build can (vocab.gpu_offload): n_gpu_layers,
        all (-1) when it is none, and 0 on a build without a GPU backend."""
        if not offload:
            return 0
        return -1 if self.n_gpu_layers is None else self.n_gpu_layers

    @property
    def n_seqs(self) -> int:
        """llama.cpp sequence ids: running sequences plus retired prefix holders."""
        return self.max_running + self.max_retired

    @property
    def kv_cells(self) -> int:
        """The KV cells asked of llama.cpp: n_ctx, else room for every sequence id at max_model_len, else
        DEFAULT_N_CTX."""
        if self.n_ctx is not None:
            return self.n_ctx
        return self.n_seqs * self.max_model_len if self.max_model_len is not None else DEFAULT_N_CTX

    @property
    def keeps_outputs(self) -> bool:
        """Whether a finished answer's tokens stay cached with its prompt: retire_outputs, by layout when unset."""
        return (not self.kv_unified) if self.retire_outputs is None else self.retire_outputs

    @property
    def stream_cells(self) -> int:
        """Cells of one KV stream at most (kv_unified false): kv_cells / n_seqs, padded to 256 as llama.cpp pads."""
        return -(-self.kv_cells // self.n_seqs // 256) * 256

    @property
    def start_cells(self) -> int:
        """KV cells asked of llama.cpp at start: n_seqs streams of kv_start_cells (padded to 256, at most a stream
        at its largest, `stream_cells`) with KV streams and a kv_start_cells; else kv_cells."""
        if self.kv_unified or self.kv_start_cells is None:
            return self.kv_cells
        return self.n_seqs * min(-(-self.kv_start_cells // 256) * 256, self.stream_cells)

    def window(self, seq_cells: int, n_ctx_train: int) -> int:
        """The engine's max_model_len, given the KV cells llama.cpp gave one sequence (a stream's, or the whole
        unified buffer) and the model's training context: max_model_len when both hold it, else a ValueError that
        names the numbers; without max_model_len, the smaller of the two."""
        if self.max_model_len is None:
            return min(seq_cells, n_ctx_train)
        if self.max_model_len > n_ctx_train:
            raise ValueError(f"max_model_len {self.max_model_len} is over the {n_ctx_train} tokens this model was "
                             "trained for: lower max_model_len (or leave it out)")
        if self.max_model_len <= seq_cells:
            return self.max_model_len
        if self.kv_unified:
            raise ValueError(f"max_model_len {self.max_model_len} does not fit in n_ctx {seq_cells} KV cells: raise "
                             f"n_ctx to at least {self.max_model_len} (or leave it out) or lower max_model_len")
        raise ValueError(
            f"max_model_len {self.max_model_len} does not fit a KV stream: with kv_unified false each of the "
            f"{self.n_seqs} sequence ids (max_running {self.max_running} + max_retired {self.max_retired}) has a "
            f"stream of its own, and n_ctx {self.kv_cells} gives each {seq_cells} cells; raise n_ctx to at least "
            f"{self.n_seqs * self.max_model_len} (or leave it out), lower max_model_len, max_running or max_retired, "
            "or set kv_unified true")
