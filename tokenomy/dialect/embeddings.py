"""OpenAI's embeddings request and response bodies (POST /v1/embeddings).

`input` is a string, a list of strings, a list of token ids or a list of token-id lists (at most MAX_INPUTS, none
empty), checked here by hand so that each refusal names what is wrong; `encoding_format` is float (default) or
base64 (the vector's little-endian float32 bytes, which the openai SDK asks for by default and decodes);
`dimensions` and `user` go to the model. Unknown fields are ignored, as in the chat bodies."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from tokenomy.generation import GenRequest
from tokenomy.pipeline.request import RequestContext

MAX_INPUTS = 2048       # OpenAI's limit on the inputs of one request

_TOKENS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
INPUT_SCHEMA = {"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": MAX_INPUTS},
    _TOKENS,
    {"type": "array", "items": _TOKENS, "minItems": 1, "maxItems": MAX_INPUTS},
]}


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)     # as the chat bodies (schemas.py)

    model: str
    input: Annotated[Any, WithJsonSchema(INPUT_SCHEMA)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, v: Any) -> list[str] | list[list[int]]:
        """The inputs as a list of texts or a list of token-id lists."""
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list):
            raise _invalid("input must be a string, a list of strings, a list of token ids or a list of "
                             "token-id lists")
        if not v:
            raise _invalid("input must not be empty")
        if all(_token(t) for t in v):
            v = [v]                                     # one token-id list
        if len(v) > MAX_INPUTS:
            raise _invalid(f"input holds {len(v)} items; at most {MAX_INPUTS} are allowed in one request")
        if all(isinstance(x, str) for x in v):
            empty = next((i for i, x in enumerate(v) if x == ""), None)
            if empty is not None:
                raise _invalid(f"input[{empty}] is an empty string")
            return v
        for i, x in enumerate(v):
            if not isinstance(x, list) or not all(_token(t) for t in x):
                raise _invalid(f"input[{i}] is not a token-id list (non-negative integers): a list of inputs "
                                 "holds either strings or token-id lists, not both")
            if not x:
                raise _invalid(f"input[{i}] is an empty token-id list")
        return v

    def gen_request(self, priority: str = "interactive") -> GenRequest:
        params: dict[str, Any] = {"encoding_format": self.encoding_format}
        if self.dimensions is not None:
            params["dimensions"] = self.dimensions
        return GenRequest(model=self.model, kind="embedding", api="embeddings", inputs=self.input, params=params,
                          user=self.user, priority=priority, stream=False)


def _invalid(message: str) -> PydanticCustomError:
    """A refusal of `input` whose message reaches the client as written (a ValueError's gets a prefix)."""
    return PydanticCustomError("invalid_input", message)


def _token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def embeddings_body(ctx: RequestContext, encoding_format: str) -> dict[str, Any]:
    """The response: one `embedding` per input, in order, as floats or base64; usage counts the tokens read."""
    vectors = np.asarray(ctx.embeddings, dtype="<f4")
    if encoding_format == "base64":
        data: list[Any] = [base64.b64encode(v.tobytes()).decode("ascii") for v in vectors]
    else:
        data = vectors.tolist()
    tokens = ctx.usage.prompt_tokens if ctx.usage is not None else 0
    return {"object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
            "model": ctx.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
