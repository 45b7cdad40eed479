"""The engine's settings: the KV cells asked of llama.cpp and the window granted from what it gave."""

import pytest

from tokenomy.engine.config import DEFAULT_N_CTX, EngineConfig


def test_without_n_ctx_every_stream_holds_max_model_len():
    assert EngineConfig().kv_cells == DEFAULT_N_CTX == 24 * 4096        # 24 streams of 4,096: a 4,096-token window
    assert EngineConfig(max_model_len=8192).kv_cells == 24 * 8192
    assert EngineConfig(max_model_len=1024, max_running=2, max_retired=1, kv_unified=True).kv_cells == 3 * 1024
    assert EngineConfig(n_ctx=4096, max_model_len=512).kv_cells == 4096


def test_kv_streams_start_at_kv_start_cells_and_grow_to_the_window():
    cfg = EngineConfig(max_model_len=8192)                    # 24 streams of 8,192 cells at most, 1,024 at start
    assert (cfg.stream_cells, cfg.start_cells) == (8192, 24 * 1024)
    assert EngineConfig(max_model_len=8192, kv_start_cells=1000).start_cells == 24 * 1024   # padded as llama.cpp pads
    assert EngineConfig(max_model_len=512).start_cells == 24 * 512      # never more than a stream at its largest
    assert EngineConfig(max_model_len=8192, kv_start_cells=None).start_cells == 24 * 8192   # the whole window at once
    assert EngineConfig(n_ctx=4096, kv_unified=True).start_cells == 4096                   # the unified buffer: all


def test_the_window_is_what_a_sequence_holds_unless_one_is_asked_for():
    assert EngineConfig().window(seq_cells=4096, n_ctx_train=8192) == 4096
    assert EngineConfig().window(seq_cells=16384, n_ctx_train=8192) == 8192
    assert EngineConfig(max_model_len=2048).window(seq_cells=4096, n_ctx_train=8192) == 2048


def test_a_window_the_unified_buffer_cannot_hold_is_refused_naming_the_numbers():
    cfg = EngineConfig(n_ctx=4096, max_model_len=8192, kv_unified=True)
    with pytest.raises(ValueError, match="max_model_len 8192 does not fit in n_ctx 4096 KV cells: raise n_ctx"):
        cfg.window(seq_cells=4096, n_ctx_train=32768)


def test_gpu_layers_are_all_on_a_gpu_build_and_none_on_a_cpu_build():
    assert EngineConfig().gpu_layers(offload=True) == -1                       # llama.cpp's "all"
    assert EngineConfig().gpu_layers(offload=False) == 0
    assert EngineConfig(n_gpu_layers=20).gpu_layers(offload=True) == 20
    assert EngineConfig(n_gpu_layers=20).gpu_layers(offload=False) == 0         # a CPU build offloads nothing
    assert EngineConfig().main_gpu == 0
    with pytest.raises(ValueError):
        EngineConfig(n_gpu_layers=-2)


def test_this_cpu_build_offloads_no_layer():
    from tokenomy.engine.vocab import gpu_offload

    if gpu_offload():
        pytest.skip("llama-cpp-python here is built with a GPU backend")
    assert EngineConfig().gpu_layers(gpu_offload()) == 0


def test_a_model_can_set_its_own_gpu_layers_and_gpu(tmp_path):
    from tokenomy.config import load_config

    p = tmp_path / "c.yaml"
    p.write_text("engine: {n_gpu_layers: 20}\n"
                 "models:\n  - {name: a, gguf: smollm2-135m-instruct, engine: {main_gpu: 1}}\n"
                 "  - {name: b, gguf: gemma3-270m, engine: {n_gpu_layers: 0, main_gpu: null}}\n")
    cfg = load_config(p)
    a, b = cfg.model("a").engine, cfg.model("b").engine
    assert (a.n_gpu_layers, a.main_gpu) == (20, 1) and (b.n_gpu_layers, b.main_gpu) == (0, None)
