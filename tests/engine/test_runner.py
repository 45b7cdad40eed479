"""The runner's KV operations on the real SmolLM2: copying a KV stream, saving and restoring a sequence's state."""

from __future__ import annotations

import numpy as np
import pytest

from tokenomy.engine import tuning
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.runner import Chunk, ModelRunner
from tokenomy.models.catalog import resolve_gguf


@pytest.fixture(scope="module")
def runner():
    # 4 streams of 256 cells: a stream copy goes through the state up to 128 tokens
    r = ModelRunner(str(resolve_gguf("smollm2-135m-instruct")),
                    EngineConfig(n_ctx=1024, max_running=4, max_retired=0, max_batch_tokens=256, kv_unified=False))
    yield r
    r.close()


def fill(r: ModelRunner, slot: int, tokens: list[int]) -> None:
    r.remove(slot)
    r.decode([Chunk(slot, tokens, 0, 0)])


def next_logits(r: ModelRunner, slot: int, token: int, pos: int) -> np.ndarray:
    return np.array(r.decode([Chunk(slot, [token], pos, 1)])[0])


@pytest.mark.parametrize("n", [100, 200])      # copied through the state, and as the whole stream
def test_a_copied_stream_gives_the_logits_its_source_gives(runner, n):
    toks = runner.tokenize("The quick brown fox jumps over the lazy dog. " * 40)[:n + 1]
    fill(runner, 0, toks[:n])
    runner.copy_stream(0, 1)
    assert bool(runner._pending) == (n > tuning.STATE_COPY_SHARE * runner.n_ctx_seq)   # the state copy is done at once
    copied = next_logits(runner, 1, toks[n], n)
    assert not runner._pending
    source = next_logits(runner, 0, toks[n], n)
    assert np.array_equal(copied, source)


def test_a_stream_a_waiting_copy_writes_is_copied_after_it(runner):
    toks = runner.tokenize("One two three four five six seven eight nine ten. " * 20)[:61]
    other = runner.tokenize("Colourless green ideas sleep furiously. " * 20)[:60]
    fill(runner, 0, toks[:60])
    fill(runner, 2, other)
    big = runner.tokenize("The quick brown fox jumps over the lazy dog. " * 40)[:200]
    fill(runner, 3, big)
    runner.copy_stream(3, 1)                 # a whole-stream copy, waiting for the next decode
    runner.copy_stream(0, 1)                 # must land after it, so it waits too: llama.cpp keeps the order
    assert runner._pending == {0, 1, 3}
    assert np.array_equal(next_logits(runner, 1, toks[60], 60), next_logits(runner, 0, toks[60], 60))


def test_a_saved_state_restores_from_ram_and_from_bytes_read_off_disk(runner):
    toks = runner.tokenize("Pack my box with five dozen liquor jugs. " * 20)[:81]
    fill(runner, 0, toks[:80])
    state = runner.save(0)
    assert isinstance(state, bytearray)
    want = next_logits(runner, 0, toks[80], 80)
    for blob in (state, bytes(state)):
        runner.remove(1)
        assert runner.restore(1, blob)
        assert np.array_equal(next_logits(runner, 1, toks[80], 80), want)


def test_a_state_over_the_byte_cap_is_copied_as_the_whole_stream(runner, monkeypatch):
    toks = runner.tokenize("Sphinx of black quartz, judge my vow. " * 20)[:41]
    fill(runner, 0, toks[:40])
    monkeypatch.setattr(tuning, "STATE_COPY_MAX_BYTES", 1024)
    runner.copy_stream(0, 1)
    assert runner._pending == {0, 1}
    assert np.array_equal(next_logits(runner, 1, toks[40], 40), next_logits(runner, 0, toks[40], 40))


def test_growing_the_streams_keeps_every_sequence_s_kv():
    """The context made again with streams four times as large: each stream's KV goes over, and the next token's
    logits are those of the context before."""
    r = ModelRunner(str(resolve_gguf("smollm2-135m-instruct")),
                    EngineConfig(max_model_len=1024, kv_start_cells=256, max_running=2, max_retired=0,
                                 max_batch_tokens=256))
    try:
        assert (r.n_ctx_seq, r.max_ctx_seq) == (256, 1024)
        toks = r.tokenize("The quick brown fox jumps over the lazy dog. " * 40)
        fill(r, 0, toks[:200])
        fill(r, 1, toks[50:150])
        before = [next_logits(r, 0, toks[200], 200), next_logits(r, 1, toks[150], 100)]
        r.remove(0, 200)
        r.remove(1, 100)
        assert r.grow(600) and (r.n_ctx_seq, r.n_ctx, r.grown) == (768, 2 * 768, 1)
        after = [next_logits(r, 0, toks[200], 200), next_logits(r, 1, toks[150], 100)]
        for b, a in zip(before, after, strict=True):
            assert np.argmax(a) == np.argmax(b) and np.max(np.abs(a - b)) < 1e-3
        assert not r.grow(700)                      # as large already: nothing to do
        assert r.grow(5000) and r.n_ctx_seq == 1024  # never past the window
        r.remove(0, 200)
        r.max_ctx_seq = 1 << 26                      # streams no memory holds: refused, the old context kept
        with pytest.raises(RuntimeError, match="could not make KV streams"):
            r.grow(1 << 26)
        assert (r.n_ctx_seq, r.grown) == (1024, 2)
        assert np.argmax(next_logits(r, 0, toks[200], 200)) == np.argmax(before[0])
    finally:
        r.close()
