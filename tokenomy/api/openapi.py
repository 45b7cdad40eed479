"""The served OpenAPI document: the request bodies the handlers parse by hand (so FastAPI cannot see them) and
the error body for every error status (OpenAI's; Anthropic's under /v1/messages; Ollama's under /api/), so
schema-driven clients and fuzzers can use it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from tokenomy.dialect.chat import ChatCompletionRequest, CompletionRequest
from tokenomy.dialect.embeddings import EmbeddingRequest
from tokenomy.dialect.messages import CountTokensRequest, MessagesRequest
from tokenomy.dialect.ollama import (
    ChatRequest,
    DeleteRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    PullRequest,
    ShowRequest,
)
from tokenomy.dialect.responses import ResponsesRequest

REF = "#/components/schemas/{model}"

ERROR_BODY = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
ANTHROPIC_ERROR_BODY = {
    "type": "object", "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                                         "properties": {"type": {"type": "string"},
                                                                        "message": {"type": "string"}}}},
}
OLLAMA_ERROR_BODY = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
ERRORS = {"400": "Bad input", "401": "Missing or wrong API key", "403": "Not allowed for this key",
          "404": "Unknown model", "405": "Wrong method", "413": "Body too large",
          "429": "Rate limit, budget or full queue (with Retry-After)", "503": "No backend could serve"}


FEEDBACK_BODY = {
    "type": "object", "required": ["request_id", "score"],
    "properties": {"request_id": {"type": "string", "maxLength": 64}, "score": {"type": "number", "minimum": -1,
                                                                               "maximum": 1},
                   "comment": {"type": ["string", "null"]}},
}


def documented(model: type[BaseModel]) -> dict[str, Any]:
    """openapi_extra for a route whose handler parses `model` from the JSON body itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": REF.format(model=model.__name__)}}}}}


def _errors(doc: dict[str, Any]) -> None:
    """Every operation answers errors in its dialect's body, never FastAPI's 422."""
    openai = {"application/json": {"schema": {"$ref": REF.format(model="ErrorResponse")}}}
    anthropic = {"application/json": {"schema": {"$ref": REF.format(model="AnthropicErrorResponse")}}}
    ollama = {"application/json": {"schema": {"$ref": REF.format(model="OllamaErrorResponse")}}}
    for path, ops in doc.get("paths", {}).items():
        error = anthropic if path.startswith("/v1/messages") else ollama if path.startswith("/api/") else openai
        for op in ops.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for code, what in ERRORS.items():
                responses.setdefault(code, {"description": what, "content": error})
            if path == "/v1/feedback" and "requestBody" not in op:
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": FEEDBACK_BODY}}}
    schemas = doc.get("components", {}).get("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)


def install(app: FastAPI) -> None:
    """Serve the document with the body and error schemas in its components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in (ChatCompletionRequest, CompletionRequest, ResponsesRequest, EmbeddingRequest, MessagesRequest,
                          CountTokensRequest, ChatRequest, GenerateRequest, EmbedRequest, EmbeddingsRequest,
                          ShowRequest, PullRequest, DeleteRequest):
                js = model.model_json_schema(ref_template=REF)
                schemas.update(js.pop("$defs", {}))
                schemas[model.__name__] = js
            schemas["ErrorResponse"] = ERROR_BODY
            schemas["AnthropicErrorResponse"] = ANTHROPIC_ERROR_BODY
            schemas["OllamaErrorResponse"] = OLLAMA_ERROR_BODY
            _errors(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
