"""Prompt compression on SmolLM2's surprisal: keeps numbers and names, respects protect, and pays for itself."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import numpy as np
import pytest

from tests.helpers.shared_data import shared_data
from tokenomy.context.compress import Costs, Scored, Scorer, compress_messages, compress_text, decide


@pytest.fixture(scope="module")
def scorer() -> Iterator[Scorer]:
    s = Scorer("smollm2-135m-instruct", window=256)
    yield s
    s.close()


def qa_prompt() -> str:
    path = shared_data("grounded/dev.jsonl", "TOKENOMY_GROUNDED")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return next(r["turns"][0] for r in rows if r["task"] == "context_qa" and 1000 < len(r["turns"][0]) < 2000)


def test_compress_text_drops_predictable_words_and_keeps_numbers_and_names() -> None:
    pieces = ["The", " cat", " sat", " on", " the", " mat", " in", " 1998", " with", " Alice", "."]
    s = Scored(pieces, np.array([np.inf, 5, 1, 0.1, 0.2, 3, 0.3, 0.1, 0.1, 0.1, 0.1]), 0.0)
    out = compress_text(s, 2.0)
    assert " 1998" in out and " Alice" in out and out.startswith("The") and out.endswith(".")
    assert " on" not in out and " the" not in out and len(out) < len("".join(pieces))


def test_the_scorer_runs_in_an_engine_process_and_a_likely_word_surprises_less(scorer: Scorer) -> None:
    assert scorer.engine.pid is not None and scorer.engine.pid != os.getpid()    # no llama context in here
    likely, unlikely = scorer.score("The capital of France is Paris"), scorer.score("The capital of France is soup")
    assert likely.pieces[:-1] == unlikely.pieces[:-1] and likely.pieces[-1] != unlikely.pieces[-1]
    assert likely.surprisal[0] == np.inf and np.isfinite(likely.surprisal[1:]).all() and likely.seconds > 0
    assert likely.surprisal[-1] < unlikely.surprisal[-1]
    with pytest.raises(RuntimeError, match="unknown call"):       # a failed call fails alone
        scorer.engine.call("no_such_call")
    again = scorer.score("The capital of France is Paris").surprisal
    assert np.allclose(again[1:], likely.surprisal[1:], rtol=1e-3, atol=1e-3)


def test_real_prompt_halves_and_keeps_the_question(scorer: Scorer) -> None:
    text = qa_prompt()
    res = compress_messages([{"role": "system", "content": "Answer from the context."},
                             {"role": "user", "content": text}], scorer, 2.0, ["system", "question", "code"], 64)
    out = res.messages[1]["content"]
    assert res.messages[0]["content"] == "Answer from the context."            # system protected
    question = text[text.rindex("Question:"):]
    assert out.endswith(question)                                               # question protected
    assert 1.6 <= res.tokens_read / (res.tokens_read - res.tokens_removed) <= 2.4
    numbers = {w.strip(".,") for w in text[:text.rindex("Question:")].split() if any(c.isdigit() for c in w)}
    assert numbers and all(n in out for n in numbers)


def test_protect_code_and_short_messages(scorer: Scorer) -> None:
    code = "```python\ndef f(x):\n    return x + 1\n```"
    body = "The report says the value went up and then it went down again over the year. " * 12
    res = compress_messages([{"role": "user", "content": body + "\n" + code}], scorer, 2.0, ["code"], 32)
    assert code in res.messages[0]["content"] and res.tokens_removed > 0
    short = compress_messages([{"role": "user", "content": "Say hello."}], scorer, 2.0, [], 32)
    assert short.messages[0]["content"] == "Say hello." and short.tokens_read == 0


def test_it_switches_itself_off_when_it_would_not_pay() -> None:
    # the embedded engine with the same small model: reading n tokens costs what prefilling n costs, and only
    # half of them are removed; measured rates (not timings taken here) decide
    same = decide(1000, 2.0, Costs(compressor_s_per_token=0.004, target_prefill_s_per_token=0.004))
    assert not same.run and same.unit == "s" and same.cost == pytest.approx(2 * same.saving)
    unknown = decide(1000, 2.0, Costs(compressor_s_per_token=0.004))        # no prefill measured yet
    assert not unknown.run
    big = decide(1000, 2.0, Costs(compressor_s_per_token=0.004, target_prefill_s_per_token=0.05))
    assert big.run                                                           # a large model's prefill pays
    priced = decide(1000, 2.0, Costs(0.004, target_usd_per_token=0.2e-6, compressor_usd_per_token=0.02e-6))
    assert priced.run and priced.unit == "usd"
    dear = decide(1000, 2.0, Costs(0.004, target_usd_per_token=0.02e-6, compressor_usd_per_token=0.02e-6))
    assert not dear.run
