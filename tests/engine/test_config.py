"""The engine's settings: the KV cells asked of llama.cpp and the window granted from what it gave."""

import pytest

from tokenomy.engine.config import DEFAULT_N_CTX, EngineConfig


def test_without_n_ctx_every_stream_holds_max_model_len():
    assert EngineConfig().kv_cells == DEFAULT_N_CTX == 24 * 4096        # 24 streams of 4,096: a 4,096-token window
    assert EngineConfig(max_model_len=8192).kv_cells == 24 * 8192
    assert EngineConfig(max_model_len=1024, max_running=2, max_retired=1, kv_unified=True).kv_cells == 3 * 1024
    assert EngineConfig(n_ctx=4096, max_model_len=512).kv_cells == 4096


def test_the_window_is_what_a_sequence_holds_unless_one_is_asked_for():
    assert EngineConfig().window(seq_cells=4096, n_ctx_train=8192) == 4096
    assert EngineConfig().window(seq_cells=16384, n_ctx_train=8192) == 8192
    assert EngineConfig(max_model_len=2048).window(seq_cells=4096, n_ctx_train=8192) == 2048


def test_a_window_the_unified_buffer_cannot_hold_is_refused_naming_the_numbers():
    cfg = EngineConfig(n_ctx=4096, max_model_len=8192, kv_unified=True)
    with pytest.raises(ValueError, match="max_model_len 8192 does not fit in n_ctx 4096 KV cells: raise n_ctx"):
        cfg.window(seq_cells=4096, n_ctx_train=32768)
