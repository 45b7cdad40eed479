"""The official openai client, unchanged, against a live tokenomy on the real SmolLM2 model."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.helpers.answers import assert_chat_end
from tests.helpers.noise import assert_same_answer_up_to_noise, assert_same_up_to_noise
from tokenomy.engine.vocab import gpu_offload
from tokenomy.hardware import gpu
from tokenomy.structured.token_tables import load_tokenizer

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Name three colors."}]


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL, "all-minilm-l6-v2"]   # the packaged embedder last
    r = httpx.get(server.root + "/health")
    assert r.status_code == 200 and r.json()["models"][MODEL] is True
    gpus, layers = r.json()["gpu"], r.json()["engines"][MODEL]["n_gpu_layers"]
    if gpu.memory() is None:                       # this machine: no GPU, a CPU build, nothing offloaded
        assert gpus is None
    else:
        assert [g["index"] for g in gpus] == list(range(len(gpus)))
        assert all(0 <= g["used_bytes"] <= g["total_bytes"] for g in gpus)
    assert layers == (-1 if gpu_offload() else 0)
    text = httpx.get(server.root + "/metrics").text
    assert "# TYPE tokenomy_gpu_memory_used_bytes gauge" in text and "# TYPE tokenomy_gpu_memory_total_bytes" in text
    assert ("tokenomy_gpu_memory_total_bytes{gpu=" in text) == (gpus is not None)
    for name in ("tokenomy_queue_depth", "tokenomy_engine_running_seqs", "tokenomy_engine_kv_usage_ratio",
                 "tokenomy_engine_batch_tokens", "tokenomy_engine_prefix_hit_tokens_total",
                 "tokenomy_engine_preemptions_total", "tokenomy_ttft_seconds", "tokenomy_tpot_seconds",
                 "tokenomy_e2e_seconds", "tokenomy_tokens_total"):
        assert name in text, name


def test_chat_stream_and_non_stream_agree(client):
    """Each whole on its own; against each other the same answer up to kernel noise (the stream reads the prompt
    from the prefix cache: tests/helpers/noise.py), word for word where every token agrees."""
    full = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, temperature=0, logprobs=True,
                                          top_logprobs=2)
    assert full.object == "chat.completion" and full.model == MODEL
    assert full.choices[0].message.role == "assistant" and full.choices[0].message.content is not None
    assert_chat_end(full.choices[0].finish_reason, full.usage.completion_tokens, 24)
    assert full.usage.prompt_tokens > 5
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    steps = [(e.token, e.logprob, e.top_logprobs[0].logprob - e.top_logprobs[1].logprob)
             for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(steps)
    assert_chat_end(finishes[0], len(steps), 24)
    assert all(c.usage is None for c in chunks[:-1])
    assert full.usage.completion_tokens == len(full.choices[0].logprobs.content)
    assert_same_answer_up_to_noise(steps, _steps(full.choices[0]), text, full.choices[0].message.content)


def _completion_steps(logprobs) -> list[tuple[str, float, float]]:
    """A greedy completion's (token, logprob, margin to the runner-up) per step (logprobs=2)."""
    margins = [a - b for a, b in (sorted(top.values(), reverse=True)[:2] for top in logprobs.top_logprobs)]
    return list(zip(logprobs.tokens, logprobs.token_logprobs, margins, strict=True))


def test_completions_stream_and_non_stream_agree(client):
    """As the chat test: each whole, and alike up to kernel noise."""
    full = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                                     temperature=0, logprobs=2)
    assert full.object == "text_completion"
    assert_chat_end(full.choices[0].finish_reason, full.usage.completion_tokens, 12)
    chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                                            temperature=0, logprobs=2, stream=True))
    text = "".join(c.choices[0].text for c in chunks)
    steps = [s for c in chunks if c.choices[0].logprobs for s in _completion_steps(c.choices[0].logprobs)]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert_chat_end(finishes[0], len(steps), 12)
    assert_same_answer_up_to_noise(steps, _completion_steps(full.choices[0].logprobs), text, full.choices[0].text)


def test_max_tokens_length_and_stop_strings(client):
    # ignore_eos: the answer runs to its limit whatever the model would say
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    free = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3, temperature=0)
    assert_chat_end(free.choices[0].finish_reason, free.usage.completion_tokens, 3)
    # logit_bias +100 on ' red' makes it every token, whatever the model would write: a stop string it must meet,
    # here one that starts inside a token
    red = load_tokenizer().tokenize_str(" red")
    assert len(red) == 1, red
    kw = dict(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, logit_bias={str(red[0]): 100})
    free = client.completions.create(**kw)
    assert free.choices[0].text == " red" * 12 and free.choices[0].finish_reason == "length"
    cut = client.completions.create(**kw, stop=["zzqx", "d red"])
    assert cut.choices[0].text == " re" and cut.choices[0].finish_reason == "stop"
    assert_chat_end(cut.choices[0].finish_reason, cut.usage.completion_tokens, 12, stop_strings=True)


def test_seeded_sampling_is_reproducible_and_logprobs_are_reported(client):
    kw = dict(model=MODEL, messages=HELLO, max_tokens=10, temperature=1.0, top_p=0.9, seed=7)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4      # greedy picks the top token


def test_prefix_hit_reports_cached_tokens_and_same_text(client):
    system = "You are a helpful assistant for a bakery. " * 30
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "What do you sell?"}]

    def ask(messages, n=16):
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, temperature=0,
                                           logprobs=True, top_logprobs=2)
        steps = [(e.token, e.logprob, e.top_logprobs[0].logprob - e.top_logprobs[1].logprob)
                 for e in r.choices[0].logprobs.content]
        return r, steps

    cold, cold_steps = ask(msgs)
    warm, warm_steps = ask(msgs)
    assert cold.usage.prompt_tokens_details.cached_tokens < cold.usage.prompt_tokens // 2
    assert warm.usage.prompt_tokens_details.cached_tokens >= warm.usage.prompt_tokens - 1
    # the same greedy answer, up to the kernel noise of computing 1 token instead of the whole prompt
    assert_same_up_to_noise(warm_steps, cold_steps)
    assert warm_steps[0][0] == cold_steps[0][0]
    other = msgs[:1] + [{"role": "user", "content": "Are you open on Sunday?"}]
    part, _ = ask(other, 4)
    assert part.usage.prompt_tokens_details.cached_tokens > 250       # the shared system prompt


def test_concurrent_requests_match_their_solo_answers(client):
    prompts = ["Count from one to five.", "Spell the word cat.", "What is 2+2?", "Say hello in French."]

    def ask(p: str) -> list[tuple[str, float, float]]:
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=12,
                                           temperature=0, logprobs=True, top_logprobs=2)
        return [(e.token, e.logprob, e.top_logprobs[0].logprob - e.top_logprobs[1].logprob)
                for e in r.choices[0].logprobs.content]

    solo = [ask(p) for p in prompts]
    out: dict[int, list] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, ask(prompts[i]))) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(len(prompts)):
        assert_same_up_to_noise(out[i], solo[i])
        assert out[i][0][0] == solo[i][0][0]


def _steps(choice) -> list[tuple[str, float, float]]:
    """A greedy chat choice as (token, logprob, margin to the runner-up) per step (top_logprobs=2)."""
    return [(e.token, e.logprob, e.top_logprobs[0].logprob - e.top_logprobs[1].logprob)
            for e in choice.logprobs.content]


def test_n_choices_of_chat_and_completions_streamed_or_not_with_usage_over_all(client):
    """n = 3: three choices, index 0..2, greedy ones alike; usage counts the prompt once and every choice's tokens;
    a stream carries each choice's pieces under its index, a finish chunk per choice and the same usage last."""
    full = client.chat.completions.create(model=MODEL, messages=HELLO, n=3, max_tokens=8, temperature=0,
                                          logprobs=True, top_logprobs=2)
    one = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0, logprobs=True,
                                         top_logprobs=2)
    assert [c.index for c in full.choices] == [0, 1, 2]
    for c in full.choices:                              # alike, up to the kernel noise of other batch shapes
        assert_same_up_to_noise(_steps(c), _steps(one.choices[0]))
    assert full.usage.prompt_tokens == one.usage.prompt_tokens
    assert full.usage.completion_tokens == sum(len(c.logprobs.content) for c in full.choices) \
        == 3 * one.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, n=3, max_tokens=8, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = 0
    for c in full.choices:          # each choice whole, and alike the unstreamed one up to kernel noise
        mine = [x.choices[0] for x in chunks if x.choices and x.choices[0].index == c.index]
        assert mine[0].delta.role == "assistant"
        steps = [(e.token, e.logprob, e.top_logprobs[0].logprob - e.top_logprobs[1].logprob)
                 for x in mine if x.logprobs for e in x.logprobs.content]
        finishes = [x.finish_reason for x in mine if x.finish_reason]
        assert len(finishes) == 1
        assert_chat_end(finishes[0], len(steps), 8)
        assert_same_answer_up_to_noise(steps, _steps(c), "".join(x.delta.content or "" for x in mine),
                                       c.message.content)
        streamed += len(steps)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == streamed
    kw = dict(model=MODEL, prompt="The capital of France is", n=3, max_tokens=8, temperature=1.0, seed=5)
    texts = [c.text for c in client.completions.create(**kw).choices]
    assert len(set(texts)) > 1                          # each choice its own seed: they differ ...
    streamed = list(client.completions.create(**kw, stream=True))
    assert ["".join(x.choices[0].text for x in streamed if x.choices and x.choices[0].index == i)
            for i in range(3)] == texts                  # ... the same each time


def test_best_of_returns_the_n_likeliest_and_bills_every_candidate(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", n=2, best_of=4, max_tokens=6,
                                  temperature=1.0, seed=3, logprobs=1, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == 4 * 6           # all four generated
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in r.choices]
    assert means[0] >= means[1]                          # the best first
    rest = client.completions.create(model=MODEL, prompt="The capital of France is", n=4, max_tokens=6,
                                     temperature=1.0, seed=3, logprobs=1, extra_body={"ignore_eos": True})
    candidates = sorted((sum(c.logprobs.token_logprobs) / 6 for c in rest.choices), reverse=True)
    assert means == pytest.approx(candidates[:2], abs=0.4)   # the same four candidates, up to kernel noise


def test_a_predicted_output_leaves_a_greedy_answer_as_it_is_and_is_reported_in_usage(client):
    kw = dict(model=MODEL, messages=HELLO, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2)

    plain = client.chat.completions.create(**kw)
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
    for text in (plain.choices[0].message.content, "Stock prices fell sharply on Monday after the report."):
        r = client.chat.completions.create(**kw, prediction={"type": "content", "content": [{"type": "text",
                                                                                            "text": text}]})
        assert_same_up_to_noise(_steps(r.choices[0]), _steps(plain.choices[0]))
        d = r.usage.completion_tokens_details
        assert 0 <= d.accepted_prediction_tokens <= r.usage.completion_tokens and d.rejected_prediction_tokens >= 0
