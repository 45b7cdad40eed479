"""The engine in-process on the real SmolLM2: batching never mixes sequences, preemption recomputes exactly."""

from __future__ import annotations

import threading

import pytest

from tokenomy.engine.engine import Engine, EngineConfig
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.models import resolve_gguf

PROMPTS = ["Count from one to five.", "Spell the word cat.", "What is 2+2?", "Say hello in French.",
           "Name a fruit.", "What color is the sky?"]


def run(engine: Engine, prompts: list[str], max_tokens: int = 16) -> list[str]:
    done = threading.Event()
    texts = {i: "" for i in range(len(prompts))}
    left = [len(prompts)]
    lock = threading.Lock()

    def cb(i):
        def on(ev):
            texts[i] += ev.text
            if ev.finish_reason:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()
        return on

    for i, p in enumerate(prompts):
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": p}])
        engine.submit(ids, SamplingParams(max_tokens=max_tokens, temperature=0), cb(i))
    assert done.wait(120)
    return [texts[i] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def path() -> str:
    return str(resolve_gguf("smollm2-135m-instruct"))


def test_batched_greedy_equals_solo_and_preemption_recomputes_exactly(path):
    big = Engine(path, EngineConfig(n_ctx=4096, max_running=8, max_retired=0, max_batch_tokens=256,
                                    prefix_caching=False)).start()
    try:
        solo = [run(big, [p])[0] for p in PROMPTS]
        batched = run(big, PROMPTS)
        assert big.stats.last_batch_seqs >= 1
        assert batched == solo
        assert big.scheduler.prefix.used_cells == 0       # nothing retained without prefix caching
    finally:
        big.stop()
    # KV for ~2.5 sequences only: the scheduler must preempt and recompute, and the text must not change
    tiny = Engine(path, EngineConfig(n_ctx=256, max_running=6, max_retired=0, max_batch_tokens=64,
                                     prefix_caching=False)).start()
    try:
        squeezed = run(tiny, PROMPTS, max_tokens=16)
        assert tiny.scheduler.preemptions > 0
        assert squeezed == solo
    finally:
        tiny.stop()
