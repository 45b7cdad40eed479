"""The packaged all-MiniLM-L6-v2 as an embedding model (/v1/embeddings): the same process-wide embedder the semantic
cache and the router use (tokenomy/embedding/embedder.py), so it is loaded once and its one-encode-at-a-time lock covers
every caller.

A request's inputs are tokenized, checked and embedded in one job on this backend's own worker thread, never on
the event loop; jobs run one after another (the embedder would serialise them anyway), and a job still queued
when its client leaves is dropped. Inside a job the embedder is taken one batch of 64 inputs at a time, so a
semantic-cache lookup waits for at most one batch, not for a whole long request.

Inputs, as the model reads them (docs/embeddings.md):
- a text is tokenized to [CLS] wordpieces [SEP];
- a token-id list is taken as the model's own wordpiece ids and embedded as they are, with [CLS] and [SEP] put
  around them unless the list already starts with [CLS] and ends with [SEP] (so the ids of `tokenize(text)`, with
  or without the special tokens, give the text's vector);
- an input longer than the model's max_seq_length (256 tokens, special tokens included) is refused, as OpenAI
  refuses one over its model's limit, rather than truncated as sentence-transformers would: a vector never
  silently stands for only the start of its text. So is a request over MAX_REQUEST_TOKENS in all.
Usage counts the tokens the model read, [CLS] and [SEP] included.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tokenomy.backends.base import Embeddings, InvalidRequest, Overloaded
from tokenomy.generation import GenRequest, Usage

MAX_REQUEST_TOKENS = 300_000    # OpenAI's limit on the tokens of all inputs of one embeddings request
MAX_QUEUED = 64                 # requests waiting for the worker; more are refused with a 429


class MiniLMBackend:
    def __init__(self, name: str, dimensions: int, threads: int = 1, embedder: Any = None) -> None:
        """`threads`: the embedder's threads (the semantic cache's embed_threads, so both share one instance);
        `embedder`: a tokenomy.embedding.embedder.Embedder to use instead of the process-wide one."""
        self.name = name
        self.dimensions = dimensions
        self.threads = threads
        self._embedder = embedder
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=f"embed-{name}")
        self.pending = 0            # requests in the worker or waiting for it

    def __repr__(self) -> str:
        return f"MiniLMBackend({self.name!r})"

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from tokenomy.embedding.embedder import default_embedder

            self._embedder = default_embedder(self.threads)
        return self._embedder

    async def embed(self, req: GenRequest) -> Embeddings:
        asked = req.params.get("dimensions")
        if asked is not None and asked != self.dimensions:
            raise InvalidRequest(f"The model '{self.name}' makes {self.dimensions}-dimensional vectors and cannot "
                                 f"shorten them; leave 'dimensions' out (or set it to {self.dimensions}).",
                                 param="dimensions", code="invalid_value")
        if self.pending >= MAX_QUEUED:
            raise Overloaded(f"{MAX_QUEUED} embeddings requests are already waiting for {self.name}", 1.0)
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, self._run, req.inputs or [],
                                                                    time.perf_counter())
        finally:
            self.pending -= 1

    def _run(self, inputs: list[Any], t0: float) -> Embeddings:
        start = time.perf_counter()
        rows = self.rows(inputs)
        vectors = self.embedder.embed_ids(rows)
        end = time.perf_counter()
        return Embeddings(vectors, Usage(prompt_tokens=sum(map(len, rows)), queue_s=start - t0, e2e_s=end - t0))

    def rows(self, inputs: list[Any]) -> list[list[int]]:
        """The token ids the model reads for each input (see the module's docstring); InvalidRequest naming the
        first input it cannot take."""
        e = self.embedder
        tok = e.tokenizer
        cls, sep, vocab = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]"), tok.get_vocab_size()
        texts = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        rows: list[list[int]] = [[] for _ in inputs]
        for i, ids in zip(texts, e.tokenize([inputs[i] for i in texts]), strict=True):
            rows[i] = ids
        for i, x in enumerate(inputs):
            if isinstance(x, str):
                continue
            bad = next((t for t in x if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidRequest(f"input[{i}] holds the token id {bad}; {self.name}'s ids run from 0 to "
                                     f"{vocab - 1}.", param="input", code="invalid_value")
            rows[i] = list(x) if len(x) >= 2 and x[0] == cls and x[-1] == sep else [cls, *x, sep]
        total = 0
        for i, r in enumerate(rows):
            if len(r) > e.max_tokens:
                raise InvalidRequest(f"input[{i}] is {len(r)} tokens; {self.name} reads at most {e.max_tokens} "
                                     "(its [CLS] and [SEP] included). Split the text into shorter pieces.",
                                     param="input", code="input_too_long")
            total += len(r)
        if total > MAX_REQUEST_TOKENS:
            raise InvalidRequest(f"The inputs are {total} tokens in all; one request may hold at most "
                                 f"{MAX_REQUEST_TOKENS}. Send them in several requests.", param="input",
                                 code="input_too_long")
        return rows

    async def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
