import random

import pytest

from tests.helpers.shared_data import shared_data
from tokenomy.engine import tuning
from tokenomy.engine.tokenizer import Tokenizer
from tokenomy.engine.vocab import Vocab, _overlapping, piece_cache
from tokenomy.models.catalog import resolve_gguf
from tokenomy.tools.bench.workload import grounded


@pytest.fixture(scope="module")
def smollm():
    v = Vocab(str(resolve_gguf("smollm2-135m-instruct")), vocab_only=True)
    yield v
    v.close()


def whole(v, text):
    """llama.cpp's tokens for the whole text at once: what the piece cache must give."""
    return v._tokenize(text, False, True)


TRICKY = [
    "",
    "<|im_start|>",
    "<|im_start|><|im_end|><|im_start|>",
    "plain text, no special token at all",
    "<|im_start|>user\n  spaces before and after  <|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b<|endoftext|>c",
    "half a token: <|im_sta and <|im_end| and |im_end|>",
    "<|im_start|>user\nünïcödé 日本語 🙂 and <|im_end|> inside the content<|im_end|>\n",
    "\n\n<|im_end|>\n\n",
    "<file_sep><filename>x.py\n<gh_stars>10\ncode<jupyter_code>",
]


def test_a_chat_is_tokenized_piece_by_piece_with_exactly_llama_cpps_tokens(smollm):
    """Two passes (the second all cache hits) over real grounded prompts and texts with special tokens in odd
    places give llama.cpp's own tokens for the whole text."""
    assert smollm._cuts[1] is not None        # a BPE vocabulary whose special tokens cannot overlap
    tok = Tokenizer(smollm)
    path = shared_data("grounded/dev.jsonl", "TOKENOMY_GROUNDED")
    texts = [tok.render_chat(r.body["messages"]) for r in grounded({"path": str(path)}, random.Random(0))][:20]
    texts += TRICKY
    for _ in range(2):
        for text in texts:
            assert smollm.tokenize(text, add_special=False, parse_special=True) == whole(smollm, text), text
    assert len(smollm._piece_ids) > 20
    again = texts[0] + "<|im_start|>user\nand one more turn<|im_end|>\n"
    assert smollm.tokenize(again, add_special=False, parse_special=True) == whole(smollm, again)


def test_the_piece_cache_stays_within_its_bound_and_stays_exact(smollm, monkeypatch):
    monkeypatch.setattr(tuning, "PIECE_CACHE_CHARS", 64)
    monkeypatch.setattr(smollm, "_piece_ids", piece_cache())
    texts = [f"<|im_start|>user\nquestion number {i} about something<|im_end|>\n" for i in range(20)]
    for text in texts + texts:
        assert smollm.tokenize(text, add_special=False, parse_special=True) == whole(smollm, text)
        assert smollm._piece_ids.currsize <= 64
    assert smollm._piece_ids.currsize == sum(len(p) for p in smollm._piece_ids)


def test_vocabularies_where_pieces_would_not_be_exact_tokenize_the_whole_text():
    """Gemma's SentencePiece vocabulary prefixes a piece with a space by what precedes it: no piece cache."""
    g = Vocab(str(resolve_gguf("gemma3-270m")), vocab_only=True)
    try:
        assert g._cuts[1] is None
        text = "<start_of_turn>user\nhello there<end_of_turn>\n<start_of_turn>model\n"
        assert g.tokenize(text, add_special=False, parse_special=True) == whole(g, text)
    finally:
        g.close()


@pytest.mark.parametrize(("texts", "overlap"), [
    (["<|a|>", "<|b|>"], False),
    (["<a>", "a>x"], True),                 # "<a>x" could be cut either way
    (["<ab", "<a"], True),                  # one inside the other
    (["aXa"], True),                        # a text's end is its own start: "aXaXa"
    (["<s>", "</s>"], False),
])
def test_special_texts_that_could_cut_a_text_two_ways_are_found(texts, overlap):
    assert _overlapping(texts) is overlap
