"""SequenceOutput: tokens to text, stop strings held back and cut, length and end-of-generation, logprobs."""

from __future__ import annotations

import numpy as np
import pytest

from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.sequence_output import SequenceOutput
from tokenomy.engine.vocab import Vocab
from tokenomy.models.catalog import resolve_gguf


@pytest.fixture(scope="module")
def vocab():
    v = Vocab(str(resolve_gguf("smollm2-135m-instruct")), vocab_only=True)
    yield v
    v.close()


def row(vocab: Vocab, token: int) -> np.ndarray:
    x = np.zeros(vocab.n_vocab, dtype=np.float32)
    x[token] = 20.0
    return x


def feed(vocab: Vocab, out: SequenceOutput, text: str):
    """Drive `out` greedily through the tokens of `text` until it finishes; the Emitted of each step."""
    steps = []
    for t in vocab.tokenize(text, add_special=False):
        steps.append(out.after_logits(row(vocab, t)))
        if steps[-1].finish_reason:
            break
    return steps


def test_text_is_released_as_it_decodes(vocab):
    out = SequenceOutput(SamplingParams(temperature=0, max_tokens=50), [1], [], vocab, 4096)
    steps = feed(vocab, out, "Hello world, how are you")
    assert "".join(e.text for e in steps) == "Hello world, how are you"
    assert all(e.finish_reason is None for e in steps)
    assert out.tokens == vocab.tokenize("Hello world, how are you", add_special=False)


def test_a_stop_string_is_held_back_then_cut(vocab):
    out = SequenceOutput(SamplingParams(temperature=0, max_tokens=50, stop=["END!"]), [1], [], vocab, 4096)
    steps = feed(vocab, out, "one two END! three")
    assert steps[-1].finish_reason == "stop"
    assert "".join(e.text for e in steps) == "one two "
    # while "E", "EN", "END" could still become the stop string, none of it was released
    assert all("E" not in e.text for e in steps)
    assert out.text == "one two "


def test_a_prefix_of_a_stop_string_that_does_not_complete_is_released(vocab):
    out = SequenceOutput(SamplingParams(temperature=0, max_tokens=50, stop=["ENDX"]), [1], [], vocab, 4096)
    steps = feed(vocab, out, "a END b")
    assert "".join(e.text for e in steps) == "a END b"


def test_a_handover_releases_a_held_back_stop_string_start(vocab):
    """Whoever continues a handed-over answer matches stop strings over the whole text, so none is held back."""
    params = SamplingParams(temperature=0, max_tokens=50, stop=["END!"], signal="top1", handover_below=0.5)
    out = SequenceOutput(params, [1], [], vocab, 4096)
    steps = feed(vocab, out, "one END")
    assert "".join(e.text for e in steps) == "one " and all(e.finish_reason is None for e in steps)
    e = out.after_logits(np.zeros(vocab.n_vocab, dtype=np.float32))    # every token as likely: unsure
    assert e.finish_reason == "handover" and e.tokens == [] and e.text == "END"
    assert out.text == "one END"


def test_max_tokens_ends_with_length(vocab):
    out = SequenceOutput(SamplingParams(temperature=0, max_tokens=3), [1], [], vocab, 4096)
    steps = feed(vocab, out, "one two three four five")
    assert [e.finish_reason for e in steps[:3]] == [None, None, "length"]
    assert len(out.tokens) == 3


def test_the_model_length_ends_with_length(vocab):
    out = SequenceOutput(SamplingParams(temperature=0, max_tokens=50), [1, 2, 3], [], vocab, 5)
    steps = feed(vocab, out, "one two three")
    assert [e.finish_reason for e in steps[:2]] == [None, "length"]


def test_end_of_generation_stops_without_emitting_it_unless_ignored(vocab):
    eos = vocab.eos
    out = SequenceOutput(SamplingParams(temperature=0, max_tokens=5, logprobs=True), [1], [], vocab, 4096)
    e = out.after_logits(row(vocab, eos))
    assert e.finish_reason == "stop" and e.tokens == [] and e.logprobs == [] and e.token_logprobs == []
    kept = SequenceOutput(SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), [1], [], vocab, 4096)
    assert kept.after_logits(row(vocab, eos)).tokens == [eos]


def test_logprobs_come_with_each_token_when_asked(vocab):
    out = SequenceOutput(SamplingParams(temperature=0, max_tokens=5, logprobs=True, top_logprobs=2), [1], [],
                         vocab, 4096)
    e = feed(vocab, out, "Hi")[0]
    assert len(e.logprobs) == len(e.tokens) == len(e.token_logprobs) == 1
    assert e.logprobs[0].token == e.tokens[0] and len(e.logprobs[0].top) == 2
    assert e.logprobs[0].top[0][0] == e.tokens[0]
    assert out.mean_logprob == pytest.approx(e.token_logprobs[0]) and out.min_logprob <= 0
