"""The engine in-process on the real SmolLM2: batching never mixes sequences, preemption recomputes exactly."""

from __future__ import annotations

import threading

import pytest

from tests.helpers.noise import assert_same_up_to_noise
from tests.helpers.wait import wait_until
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.engine import Engine
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.models.catalog import resolve_gguf

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

PROMPTS = ["Count from one to five.", "Spell the word cat.", "What is 2+2?", "Say hello in French.",
           "Name a fruit."]


def run(engine: Engine, prompts: list[str], max_tokens: int = 12) -> list[list[tuple[str, float, float]]]:
    """Greedy answers as (token, logprob, margin to the runner-up) per step."""
    done = threading.Event()
    out: dict[int, list] = {i: [] for i in range(len(prompts))}
    left = [len(prompts)]
    lock = threading.Lock()

    def cb(i):
        def on(ev):
            for e in ev.logprobs:
                out[i].append((e.token, e.logprob, e.top[0][1] - e.top[1][1]))
            if ev.finish_reason:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()
        return on

    for i, p in enumerate(prompts):
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": p}])
        engine.submit(ids, SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=True, top_logprobs=2),
                      cb(i))
    assert done.wait(120)
    return [out[i] for i in range(len(prompts))]


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
        assert len(batched) == len(solo)
        for got, want in zip(batched, solo, strict=True):
            assert_same_up_to_noise(got, want)
        # a sequence that read another's KV or logits would differ from the first token on
        assert all(got[0][0] == want[0][0] for got, want in zip(batched, solo, strict=True))
        assert big.scheduler.layout.prefix.used_cells == 0       # nothing retained without prefix caching
    finally:
        big.stop()
    # KV for about half of the sequences: the scheduler must preempt and recompute, and the text must not change
    tiny = Engine(path, EngineConfig(n_ctx=256, max_running=10, max_retired=0, max_batch_tokens=64, kv_unified=True,
                                     prefix_caching=False)).start()
    try:
        squeezed = run(tiny, PROMPTS * 2)        # ~480 cells wanted, 256 exist
        assert tiny.scheduler.preemptions > 0
        for got, want in zip(squeezed, solo * 2, strict=True):
            assert_same_up_to_noise(got, want)
    finally:
        tiny.stop()


ARTICLES = [
    "The city council met on Tuesday to discuss the new bridge over the river. Engineers said the old bridge, "
    "built in 1932, carries four times the traffic it was designed for, and that repairs would cost almost as "
    "much as a new one. Residents asked about noise during construction and about the bus routes that cross "
    "the river each morning. The council voted seven to two to fund a design study, which is due next spring. "
    "Summarize the article in two sentences.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. It happens in chloroplasts, "
    "where chlorophyll absorbs mostly red and blue light and reflects green. The light reactions split water "
    "and store energy in ATP and NADPH; the Calvin cycle then uses that energy to fix carbon into sugars. "
    "Explain in simple words what the Calvin cycle does.",
    "A bakery sells bread for 3 dollars a loaf and cakes for 12 dollars each. On Monday it sold 40 loaves and "
    "5 cakes; on Tuesday, 35 loaves and 9 cakes. Rent is 200 dollars a day and flour costs a dollar a loaf. "
    "How much more money did the bakery take in on Tuesday than on Monday? Show the steps.",
]


def greedy_ids(engine: Engine, ids: list[int], max_tokens: int = 96) -> tuple[list[int], int]:
    done = threading.Event()
    got: list[int] = []
    cached = [0]

    def on(ev):
        got.extend(ev.token_ids)
        if ev.finish_reason:
            cached[0] = ev.cached_tokens
            done.set()

    engine.submit(ids, SamplingParams(max_tokens=max_tokens, temperature=0), on)
    assert done.wait(120)
    return got, cached[0]


@pytest.mark.parametrize("kv_unified", [True, False], ids=["unified", "streams"])
def test_a_cached_prefix_does_not_change_a_greedy_answer(path, kv_unified):
    """The same request served alone answers the same cold, from the prefix cache, and again. The KV cells a warm
    request decodes into differ from the cold run's, so the attention kernel must not depend on where they lie
    (docs/engine.md: f16 KV takes llama.cpp's split-KV path, which does)."""
    engine = Engine(path, EngineConfig(n_ctx=4096, max_running=4, max_retired=8, max_batch_tokens=256,
                                       kv_unified=kv_unified)).start()
    try:
        for k in range(len(ARTICLES)):
            text = " ".join(ARTICLES[k:] + ARTICLES[:k]) + " Now answer only the last question."
            ids = engine.tokenizer.encode_chat([{"role": "user", "content": text}])
            assert len(ids) > 256                    # cold prefill takes two chunks; attention spans 512+ cells
            engine.run_in_loop(engine.scheduler.clear_cache)
            cold, cached = greedy_ids(engine, ids)
            assert cached == 0
            warm, cached = greedy_ids(engine, ids)
            assert cached == len(ids) - 1            # everything but the token that samples came from the cache
            again, _ = greedy_ids(engine, ids)
            assert cold == warm == again
    finally:
        engine.stop()


def submit_wait(engine: Engine, ids: list[int], params: SamplingParams) -> list:
    events, done = [], threading.Event()

    def on(ev):
        events.append(ev)
        if ev.finish_reason:
            done.set()

    engine.submit(ids, params, on)
    assert done.wait(120)
    return events


@pytest.mark.parametrize("kv_unified", [True, False], ids=["unified", "streams"])
def test_a_handover_ends_before_the_unsure_token_and_keeps_the_answer_cached(path, kv_unified):
    engine = Engine(path, EngineConfig(n_ctx=4096, max_running=4, max_retired=4, max_batch_tokens=256,
                                       kv_unified=kv_unified)).start()
    try:
        prompt = engine.tokenizer.encode_chat([{"role": "user", "content": "Write a short poem about rain."}])
        # top1 is a probability, always below 1.01, and ignore_eos keeps the model from ending first: the sequence
        # hands over at its fourth token, whatever the model would write
        evs = submit_wait(engine, prompt, SamplingParams(max_tokens=40, temperature=0, signal="top1",
                                                         handover_below=1.01, handover_after=3, ignore_eos=True))
        last = evs[-1]
        out = [t for e in evs for t in e.token_ids]
        signals = [c for e in evs for c in e.signals]
        assert last.finish_reason == "handover" and len(out) == 3
        assert len(signals) == len(out) and all(0.0 < c <= 1.0 for c in signals)
        # the tokens so far, resumed: prompt and answer come from the cache, only the last token is computed
        evs = submit_wait(engine, prompt + out, SamplingParams(max_tokens=4, temperature=0))
        assert evs[-1].cached_tokens == len(prompt) + len(out) - 1
        # an ordinary finish keeps its answer where the layout keeps answers (KV streams), else only its prompt
        other = engine.tokenizer.encode_chat([{"role": "user", "content": "Name three fruits."}])
        evs = submit_wait(engine, other, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
        ans = [t for e in evs for t in e.token_ids]
        assert len(ans) == 6                    # an answer to leave out of the cache, however the model would end
        evs = submit_wait(engine, other + ans, SamplingParams(max_tokens=2, temperature=0))
        kept = len(ans) - 1 if engine.cfg.keeps_outputs else 0        # the last answer token was never fed back
        assert evs[-1].cached_tokens == len(other) + kept and engine.cfg.keeps_outputs is not kv_unified
    finally:
        engine.stop()


class CopyLog:
    """The runner, with the whole-stream copies the scheduler asks for recorded."""

    def __init__(self, runner):
        self.runner, self.copies = runner, []

    def copy_stream(self, src, dst):
        self.copies.append((src, dst))
        self.runner.copy_stream(src, dst)

    def __getattr__(self, name):
        return getattr(self.runner, name)


@pytest.mark.parametrize("tier_mb", [0, 64], ids=["copied", "restored"])
def test_with_a_kv_stream_per_sequence_a_prefix_in_place_or_copied_gives_the_same_answer(path, tier_mb):
    """kv_unified false: a greedy answer is the same cold, from the prompt its own stream still holds, and from a
    copy of the stream that holds it (while another sequence runs where the prompt was), or with a RAM tier, from
    the state saved there (a restore is cheaper than a stream copy); and sequences batched together answer as
    they do alone."""
    engine = Engine(path, EngineConfig(n_ctx=4096, max_running=4, max_retired=4, max_batch_tokens=256,
                                       kv_unified=False, kv_tier_ram_mb=tier_mb, retire_outputs=False)).start()
    log = engine.scheduler.layout.kv = CopyLog(engine.runner)
    try:
        assert engine.max_model_len == engine.runner.n_ctx_seq == 512      # 8 streams of 512 cells
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": " ".join(ARTICLES)}])
        assert 256 < len(ids) < 400
        cold, cached = greedy_ids(engine, ids, 48)
        assert cached == 0
        warm, cached = greedy_ids(engine, ids, 48)
        assert cached == len(ids) - 1 and not log.copies
        busy = engine.tokenizer.encode_chat([{"role": "user", "content": "Tell a long story."}])
        done = threading.Event()
        engine.submit(busy, SamplingParams(max_tokens=120, temperature=0, ignore_eos=True),
                      lambda ev: ev.finish_reason and done.set())
        copied, cached = greedy_ids(engine, ids, 48)
        assert done.wait(60)
        assert cached == len(ids) - 1
        if tier_mb:                                               # moved out of stream 0, then restored
            assert len(log.copies) >= 1 and engine.tiers.stats.hits["ram"] >= 1
        else:                                                     # moved out of stream 0, then copied back in
            assert len(log.copies) >= 2 and not engine.tiers.enabled
        assert cold == warm == copied
        solo = [run(engine, [p])[0] for p in PROMPTS[:4]]
        for got, want in zip(run(engine, PROMPTS[:4]), solo, strict=True):
            assert_same_up_to_noise(got, want)
        with pytest.raises(ValueError, match="limit is 511"):
            engine.submit(list(range(1, 600)), SamplingParams(max_tokens=4), lambda ev: None)
    finally:
        engine.stop()


def test_with_context_shift_a_generation_runs_past_the_window_and_leaves_a_clean_stream(path):
    """A 256-token window: with `shift` an answer of 480 tokens completes (the window shifts three times);
    with `error` it stops at the window. The shifted stream keeps only its sinks: the next ask of the same prompt
    answers as the first did."""
    with pytest.raises(ValueError, match="kv_unified"):
        EngineConfig(context_overflow="shift", kv_unified=True)
    ids_of = {}
    for mode in ("error", "shift"):
        engine = Engine(path, EngineConfig(n_ctx=4 * 256, max_running=2, max_retired=2, max_batch_tokens=256,
                                           context_overflow=mode, speculative=False)).start()
        try:
            assert engine.max_model_len == 256
            ids = engine.tokenizer.encode_chat([{"role": "user", "content": "Tell a long story about a cat."}])
            first, _ = greedy_ids(engine, ids, max_tokens=16)
            events = submit_wait(engine, ids, SamplingParams(max_tokens=480, temperature=0, ignore_eos=True))
            last = events[-1]
            ids_of[mode] = [t for e in events for t in e.token_ids]
            assert last.finish_reason == "length"
            if mode == "shift":
                assert last.completion_tokens == 480 and engine.scheduler.running == []
            else:
                assert last.completion_tokens == 256 - len(ids)
            again, _ = greedy_ids(engine, ids, max_tokens=16)
            assert again == first
        finally:
            engine.stop()
    n = 256 - len(ids)
    assert ids_of["shift"][:n] == ids_of["error"]     # the same answer until the window is full


def test_a_batch_step_is_cut_to_the_tokens_the_measured_cost_fits_in_batch_step_ms(path):
    engine = Engine(path, EngineConfig(n_ctx=2048, max_running=2, max_retired=0, batch_step_ms=20))
    try:
        assert engine._batch_tokens() == 64             # nothing measured yet: batch_step_tokens
        for n, dt in ((1, 0.009), (2, 0.018), (8, 0.06), (64, 0.4)):
            engine.step_cost.observe(n, dt)
        assert engine._batch_tokens() == 2              # 64, 32, 16, 8, 4 take longer than 20 ms
        engine.cfg.batch_step_ms = 0
        assert engine._batch_tokens() == 64
    finally:
        engine.stop()


def test_a_max_model_len_asked_for_is_granted_by_streams_that_hold_it(path):
    """Without n_ctx the context gets a stream of max_model_len cells per sequence id, so the window asked for is
    the window served: a 250-token prompt is answered in a 256-token window, a 256-token one is refused. (Until
    2026-12-02 n_ctx stayed 98,304 whatever max_model_len said, and the default 8,192 was quietly cut to a
    stream's 4,096.)"""
    engine = Engine(path, EngineConfig(max_model_len=256, max_running=2, max_retired=2, speculative=False)).start()
    try:
        assert engine.max_model_len == engine.runner.n_ctx_seq == 256 and engine.runner.n_ctx == 4 * 256
        events = submit_wait(engine, list(range(1000, 1250)), SamplingParams(max_tokens=4, temperature=0,
                                                                              ignore_eos=True))
        assert events[-1].finish_reason == "length" and events[-1].completion_tokens == 4
        with pytest.raises(ValueError, match="limit is 255"):
            engine.submit(list(range(1000, 1256)), SamplingParams(max_tokens=4), lambda ev: None)
    finally:
        engine.stop()


@pytest.mark.parametrize(("cfg", "says"), [
    ({"n_ctx": 16384, "max_model_len": 8192},        # the default 24 streams get 768 cells each, not 8,192
     ["max_model_len 8192 does not fit a KV stream", "24 sequence ids", "n_ctx 16384", "at least 196608"]),
    ({"max_model_len": 16384, "max_running": 1, "max_retired": 0},
     ["max_model_len 16384 is over the 8192 tokens this model was trained for"]),
], ids=["streams-too-small", "over-training-context"])
def test_a_max_model_len_that_cannot_be_granted_stops_the_engine_at_start_naming_the_numbers(path, cfg, says):
    with pytest.raises(ValueError) as err:
        Engine(path, EngineConfig(**cfg))
    for part in says:
        assert part in str(err.value)


def choices(engine: Engine, ids: list[int], params: list[SamplingParams]) -> tuple[list[list[int]], list]:
    """The tokens of each of one request's sequences (Engine.submit_n), and their final events."""
    done = threading.Event()
    out: list[list[int]] = [[] for _ in params]
    finals: dict[int, object] = {}

    def cb(i):
        def on(ev):
            out[i] += ev.token_ids
            if ev.finish_reason:
                finals[i] = ev
                if len(finals) == len(params):
                    done.set()
        return on

    engine.submit_n(ids, params, [cb(i) for i in range(len(params))])
    assert done.wait(120)
    return out, [finals[i] for i in range(len(params))]


@pytest.mark.parametrize("kv_unified", [True, False], ids=["unified", "streams"])
def test_the_choices_of_one_request_share_one_prefill(path, kv_unified):
    """n = 3 greedy choices: the prompt's tokens are fed to the model once (the engine's count of prompt tokens
    fed), the other two start from a copy of its KV, and all three answer alike; seeded sampled choices differ from
    each other, the same each time. With running places for only two, the third waits and shares the prompt
    through the prefix cache (its last token computed again, as any cache hit)."""
    engine = Engine(path, EngineConfig(n_ctx=8192, max_running=4, max_retired=4, max_batch_tokens=256,
                                       kv_unified=kv_unified)).start()
    try:
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": "Name three colors."}])
        greedy, finals = choices(engine, ids, [SamplingParams(max_tokens=10, temperature=0)] * 3)
        assert engine.stats.prompt_tokens == len(ids)
        assert greedy[0] == greedy[1] == greedy[2] and len(greedy[0]) > 3
        assert [f.cached_tokens for f in finals] == [0, len(ids), len(ids)]
        assert all(f.prompt_tokens == len(ids) for f in finals)
        seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=11)
        sampled, _ = choices(engine, ids, [seeded.for_choice(i) for i in range(3)])
        again, _ = choices(engine, ids, [seeded.for_choice(i) for i in range(3)])
        assert sampled == again and len({tuple(x) for x in sampled}) > 1
    finally:
        engine.stop()
    tight = Engine(path, EngineConfig(n_ctx=8192, max_running=2, max_retired=4, max_batch_tokens=256,
                                      kv_unified=kv_unified)).start()
    try:
        out, finals = choices(tight, ids, [SamplingParams(max_tokens=10, temperature=0)] * 3)
        assert out == greedy
        assert tight.stats.prompt_tokens == len(ids) + 1 and finals[2].cached_tokens == len(ids) - 1
    finally:
        tight.stop()


def test_kv_streams_grow_to_serve_what_the_first_ones_cannot_hold(path):
    """An engine whose 6 streams start at 256 cells (1,536 in all, a quarter of the 6 windows of 1,024) serves a
    prompt longer than a stream, with the greedy answer of an engine that holds whole windows from the start, and
    then 12 concurrent sequences of 40 to 590 tokens (far more than the first pool); its streams grow to twice their
    cells or what a sequence needs, never past the window."""
    small = EngineConfig(max_model_len=1024, kv_start_cells=256, max_running=4, max_retired=2, max_batch_tokens=256)
    text = " ".join(ARTICLES * 3) + " Now answer only the last question."
    engine = Engine(path, small).start()
    full = Engine(path, small.model_copy(update={"kv_start_cells": None})).start()
    try:
        assert (engine.runner.n_ctx, full.runner.n_ctx) == (6 * 256, 6 * 1024)
        assert engine.max_model_len == full.max_model_len == 1024     # the window is the grown streams'
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": text}])[:600]
        grown, _ = greedy_ids(engine, ids, max_tokens=32)
        assert len(ids) == 600 and (engine.runner.n_ctx_seq, engine.runner.grown) == (768, 1)   # 600 + a draft
        assert grown == greedy_ids(full, ids, max_tokens=32)[0]
        engine.stop()
        engine = Engine(path, small).start()
        lengths = [40 + 50 * i for i in range(12)]
        events: list[list] = [[] for _ in lengths]
        for n, got in zip(lengths, events, strict=True):
            engine.submit(ids[:n], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True), got.append)
        wait_until(lambda: all(e and e[-1].finish_reason for e in events), timeout=300,
                   what="12 sequences to finish")
        assert [e[-1].finish_reason for e in events] == ["length"] * 12
        assert [sum(len(x.token_ids) for x in e) for e in events] == [24] * 12
        assert sum(n + 24 for n in lengths) > small.start_cells
        assert 256 < engine.runner.n_ctx_seq <= 1024 and engine.runner.n_ctx <= small.kv_cells
        assert engine.runner.grown >= 1
    finally:
        engine.stop()
        full.stop()
