"""The model's own tokenizer and chat template (the Jinja template stored in the GGUF metadata)."""

from __future__ import annotations

import codecs
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenomy.engine.vocab import Vocab

# Used only when a GGUF carries no template (e.g. some base models): ChatML.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TemplateError(ValueError):
    pass


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TemplateError(message)


class Tokenizer:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        stored = vocab.meta("tokenizer.chat_template")
        template = stored or CHATML
        self.has_template = stored is not None
        env = ImmutableSandboxedEnvironment(
            loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
            extensions=[jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
        self._template = env.from_string(template)
        self.bos_text = vocab.special_text(vocab.bos) if vocab.bos >= 0 else ""
        self.eos_text = vocab.special_text(vocab.eos) if vocab.eos >= 0 else ""

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=add_special)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        try:
            return self._template.render(
                messages=messages, tools=tools, add_generation_prompt=True,
                bos_token=self.bos_text, eos_token=self.eos_text,
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"the model's chat template rejected the messages: {e}") from e

    def encode_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        text = self.render_chat(messages, tools)
        add_bos = self.vocab.add_bos and not (self.bos_text and text.startswith(self.bos_text))
        ids = self.vocab.tokenize(text, add_special=False, parse_special=True)
        return ([self.vocab.bos] if add_bos else []) + ids

    def decode(self, tokens: list[int]) -> str:
        return b"".join(self.vocab.piece(t) for t in tokens).decode("utf-8", errors="replace")


class IncrementalDetokenizer:
    """Turns a stream of tokens into text without splitting multi-byte UTF-8 characters."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int) -> str:
        return self._dec.decode(self.vocab.piece(token))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
