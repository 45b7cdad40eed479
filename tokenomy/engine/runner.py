"""Runs batches on llama.cpp: one model, one context, many sequences; with vocab.py, the only code touching llama_cpp.

One `decode` call is one `llama_decode`: every sequence's chunk of tokens goes into a single batch, and only the
last token of each sequence that will sample asks for logits.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import llama_cpp
import numpy as np

from tokenomy.engine import tuning
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.vocab import Vocab, gpu_offload

KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}


def kv_types(spec: str) -> tuple[str, str]:
    """"q8_0/f16" -> (K type, V type); one name sets both. Raises ValueError for an unknown type.

    The default quantizes K only. With K and V both f16, a single-query decode over 512+ cells takes
    llama.cpp's split-KV flash attention, which divides the cells between threads by index, so a request
    decoding into other cells (after a prefix-cache hit) sums in another order and a greedy answer can change.
    Any other pair takes the per-head path, which does not depend on where the cells lie. q8_0 K costs about
    15% of a 512-token prefill here, q8_0 K and V about 28% (docs/engine.md)."""
    k, _, v = spec.partition("/")
    v = v or k
    for t in (k, v):
        if t not in KV_TYPES:
            raise ValueError(f"unknown KV cache type {t!r}; choose from {', '.join(KV_TYPES)}")
    return k, v


@dataclass
class Chunk:
    """A slice of one sequence fed in a step: tokens at positions start..start+len-1 of llama seq `slot`."""

    slot: int
    tokens: list[int]
    start: int
    logits: int         # logits rows wanted, for the last `logits` tokens (0: none; 1: the last token's)


class ModelRunner(Vocab):
    """One model with one llama.cpp context over it (the vocabulary methods come from Vocab)."""

    def __init__(self, path: str, cfg: EngineConfig) -> None:
        """A context of cfg.kv_cells cells for cfg.n_seqs sequences, fed up to cfg.max_batch_tokens per decode; the
        model's layers on the GPU as cfg.gpu_layers says (none on a CPU build)."""
        self.gpu_layers = cfg.gpu_layers(gpu_offload())
        super().__init__(path, gpu_layers=self.gpu_layers, main_gpu=cfg.main_gpu)
        self.cfg = cfg
        self.ctx = None
        self._context(cfg.start_cells)
        grows = cfg.start_cells < cfg.kv_cells
        self.max_ctx_seq = max(cfg.stream_cells, self.n_ctx_seq) if grows else self.n_ctx_seq   # when grown fully
        self._pending: set[int] = set()     # streams a copy_stream reads or writes at the next decode
        self._scratch = bytearray()          # copy_stream's state buffer
        self.grown = 0                       # times the context was made again with larger streams (grow)
        n = cfg.max_batch_tokens
        self._tok = np.zeros(n, dtype=np.int32)
        self._pos = np.zeros(n, dtype=np.int32)
        self._nseq = np.ones(n, dtype=np.int32)
        self._seq = np.zeros(n, dtype=np.int32)
        self._out = np.zeros(n, dtype=np.int8)
        base = self._seq.ctypes.data
        p_i32 = ctypes.POINTER(ctypes.c_int32)
        self._seq_ptrs = (p_i32 * n)(*[ctypes.cast(base + 4 * i, p_i32) for i in range(n)])

    def _context(self, n_ctx: int) -> None:
        """Create the llama.cpp context with `n_ctx` KV cells (n_ctx / n_seqs a stream with KV streams)."""
        cfg = self.cfg
        cparams = llama_cpp.llama_context_default_params()
        threads = cfg.n_threads or os.cpu_count() or 1
        cparams.n_ctx = n_ctx
        cparams.n_batch = cfg.max_batch_tokens
        cparams.n_ubatch = cfg.max_batch_tokens
        cparams.n_seq_max = cfg.n_seqs
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.kv_unified = cfg.kv_unified
        cparams.swa_full = True        # sliding-window models keep full KV so prefixes stay reusable
        cparams.no_perf = True
        k, v = kv_types(cfg.kv_type)
        cparams.type_k, cparams.type_v = KV_TYPES[k], KV_TYPES[v]
        flash = cfg.flash_attn or v != "f16"      # llama.cpp needs flash attention for a quantized V
        cparams.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context (out of memory?)")
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(self.ctx)   # cells one sequence can hold now (its stream's)
        self.mem = llama_cpp.llama_get_memory(self.ctx)

    def grow(self, cells: int) -> bool:
        """Make the context again with KV streams of `cells` cells (padded to 256, at most max_ctx_seq), each
        sequence's KV carried over through its sequence state (the KV tiers' save and restore): llama.cpp cannot
        grow a context in place. The old context is freed before the new one is made, so the peak is the new
        context plus the states (the cells in use). False, with nothing changed, when the streams are that large
        already or a stream copy waits for the next decode (its state is not yet what its cells say); RuntimeError
        when the new context cannot be made (the old size is made again, its KV restored) or a state does not go
        back in."""
        cells = min(-(-cells // 256) * 256, self.max_ctx_seq)
        if self.cfg.kv_unified or cells <= self.n_ctx_seq or self._pending:
            return False
        states = {}
        for slot in range(self.cfg.n_seqs):
            if llama_cpp.llama_memory_seq_pos_max(self.mem, slot) >= 0:
                got = self._get_state(slot)
                if got is None:
                    return False
                states[slot] = got[0]
        before, failed = self.n_ctx, False
        llama_cpp.llama_free(self.ctx)
        self.ctx = None
        try:
            self._context(self.cfg.n_seqs * cells)
        except RuntimeError:
            self._context(before)          # the old size again, its KV restored, before saying so
            failed = True
        for slot, blob in states.items():
            if not self._set_state(slot, blob, len(blob)):
                raise RuntimeError(f"growing the KV streams: stream {slot}'s KV did not go back")
        if failed:
            raise RuntimeError(f"llama.cpp could not make KV streams of {cells} cells (out of memory?)")
        self.grown += 1
        return True

    # ---- KV memory ------------------------------------------------------------------------------------
    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, 0, length)

    def copy_stream(self, src: int, dst: int) -> None:
        """Make `dst` hold all of `src`'s KV; `dst`'s own KV is dropped. Across KV streams llama.cpp's own copy
        moves the whole stream's buffers, whatever its cells hold, at the next decode (in the order asked). A
        stream holding at most STATE_COPY_SHARE of its cells is copied now instead, through llama.cpp's sequence
        state, which moves only the cells in use; while a copy into or out of either stream waits, so does this."""
        llama_cpp.llama_memory_seq_rm(self.mem, dst, -1, -1)
        if self.cfg.kv_unified:
            llama_cpp.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
            return
        used = llama_cpp.llama_memory_seq_pos_max(self.mem, src) + 1
        if not {src, dst} & self._pending and used <= tuning.STATE_COPY_SHARE * self.n_ctx_seq:
            got = self._get_state(src, scratch=True)
            if got is not None and self._set_state(dst, *got):
                return
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        self._pending |= {src, dst}

    def save(self, slot: int) -> bytearray | None:
        """The slot's KV as llama.cpp's sequence state, or None while a stream copy into or out of it waits for
        the next decode (its buffer is not yet what its cells say)."""
        got = None if slot in self._pending else self._get_state(slot)
        return got[0] if got is not None else None

    def restore(self, slot: int, blob: bytes | bytearray) -> bool:
        """Load a state from `save` into the (empty) slot; False if llama.cpp found no room or a stream copy
        into or out of the slot waits for the next decode."""
        return slot not in self._pending and self._set_state(slot, blob, len(blob))

    def _get_state(self, slot: int, scratch: bool = False) -> tuple[bytearray, int] | None:
        """(a buffer holding the slot's state in its first n bytes, n); in the runner's reused scratch buffer
        (kept as large as the largest state copied, so a copy faults in no fresh pages; None for a state over
        STATE_COPY_MAX_BYTES) or in a new one."""
        n = llama_cpp.llama_state_seq_get_size(self.ctx, slot)
        if scratch and n > tuning.STATE_COPY_MAX_BYTES:
            return None
        if scratch and len(self._scratch) < n:
            self._scratch = bytearray(n)
        buf = self._scratch if scratch else bytearray(n)
        if llama_cpp.llama_state_seq_get_data(self.ctx, (ctypes.c_uint8 * n).from_buffer(buf), n, slot) != n:
            return None
        return buf, n

    def _set_state(self, slot: int, buf: bytes | bytearray, n: int) -> bool:
        src = ((ctypes.c_uint8 * n).from_buffer(buf) if isinstance(buf, bytearray)
               else (ctypes.c_uint8 * n).from_buffer_copy(buf))
        if llama_cpp.llama_state_seq_set_data(self.ctx, src, n, slot) == 0:
            llama_cpp.llama_memory_seq_rm(self.mem, slot, -1, -1)
            return False
        return True

    def shift(self, slot: int, keep: int, discard: int) -> None:
        """Context shift: drop positions keep..keep+discard-1 of the slot and move the later ones down by
        `discard` (llama.cpp re-applies RoPE to their keys at the next decode)."""
        llama_cpp.llama_memory_seq_rm(self.mem, slot, keep, keep + discard)
        llama_cpp.llama_memory_seq_add(self.mem, slot, keep + discard, -1, -discard)
        self._pending.add(slot)

    @property
    def can_shift(self) -> bool:
        return bool(llama_cpp.llama_memory_can_shift(self.mem))

    def remove(self, slot: int, start: int = 0) -> None:
        """Drop the slot's KV from position `start` on (all of it by default)."""
        llama_cpp.llama_memory_seq_rm(self.mem, slot, start if start > 0 else -1, -1)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)

    # ---- the step ---------------------------------------------------------------------------------------
    def decode(self, chunks: list[Chunk]) -> np.ndarray:
        """One llama_decode over all chunks; returns logits rows (float32, n_out x n_vocab) in chunk order
        for the chunks that asked for them. Raises KVFull if llama.cpp found no room."""
        i = 0
        for c in chunks:
            n = len(c.tokens)
            self._tok[i:i + n] = c.tokens
            self._pos[i:i + n] = np.arange(c.start, c.start + n, dtype=np.int32)
            self._seq[i:i + n] = c.slot
            self._out[i:i + n] = 0
            if c.logits:
                self._out[i + n - c.logits:i + n] = 1
            i += n
        p_i32 = ctypes.POINTER(ctypes.c_int32)
        batch = llama_cpp.llama_batch(
            n_tokens=i,
            token=self._tok.ctypes.data_as(p_i32),
            embd=None,
            pos=self._pos.ctypes.data_as(p_i32),
            n_seq_id=self._nseq.ctypes.data_as(p_i32),
            seq_id=self._seq_ptrs,
            logits=self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )
        rc = llama_cpp.llama_decode(self.ctx, batch)
        self._pending.clear()
        if rc == 1:
            raise KVFull("llama.cpp found no KV slot for the batch")
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        n_out = int(self._out[:i].sum())
        if n_out == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        ptr = llama_cpp.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))

    def close(self) -> None:
        if getattr(self, "ctx", None):
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        super().close()


class KVFull(RuntimeError):
    pass
