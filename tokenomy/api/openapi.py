"""The served OpenAPI document: the request bodies the handlers parse by hand (so FastAPI cannot see them) and
the error body for every error status (OpenAI's; Anthropic's under /v1/messages; Ollama's under /api/), so
schema-driven clients and fuzzers can use it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from tokenomy.dialect.chat import ChatCompletionRequest, CompletionRequest
from tokenomy.dialect.conversations import ConversationCreate, ConversationUpdate, ItemsCreate
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
from tokenomy.dialect.responses_compact import CompactRequest

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


BATCH_BODY = {
    "type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
    "properties": {"input_file_id": {"type": "string"},
                   "endpoint": {"type": "string", "enum": ["/v1/chat/completions", "/v1/completions"]},
                   "completion_window": {"type": "string", "enum": ["24h"]},
                   "metadata": {"type": ["object", "null"], "maxProperties": 16,
                                "additionalProperties": {"type": "string", "maxLength": 512}}},
}
FILE_FORM = {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"type": "string", "enum": ["batch"]}},
}
# the bodies and query strings the handlers read by hand, by (path, method)
HAND_READ: dict[tuple[str, str], dict[str, Any]] = {
    ("/v1/feedback", "post"): {"requestBody": {"required": True, "content": {"application/json": {
        "schema": FEEDBACK_BODY}}}},
    ("/v1/batches", "post"): {"requestBody": {"required": True, "content": {"application/json": {
        "schema": BATCH_BODY}}}},
    ("/v1/files", "post"): {"requestBody": {"required": True, "content": {"multipart/form-data": {
        "schema": FILE_FORM}}}},
    ("/dashboard/data", "get"): {"parameters": [
        {"name": name, "in": "query", "required": False, "schema": {"type": "string"}, "description": what}
        for name, what in (("since", "a duration before now (24h), an ISO date or time, 'now' or UNIX seconds"),
                           ("until", "as since"), ("by", "model | route | tenant | key"))]},
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
        for method, op in ops.items():
            for key, value in HAND_READ.get((path, method), {}).items():
                op.setdefault(key, value)
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for code, what in ERRORS.items():
                responses.setdefault(code, {"description": what, "content": error})
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
                          CountTokensRequest, CompactRequest, ConversationCreate, ConversationUpdate, ItemsCreate,
                          ChatRequest, GenerateRequest, EmbedRequest, EmbeddingsRequest, ShowRequest, PullRequest,
                          DeleteRequest):
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
