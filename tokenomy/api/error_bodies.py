"""Error bodies with the right status, in the shape of the dialect the client speaks: OpenAI's
{"error": {"message", "type", "param", "code"}}, or Anthropic's {"type": "error", "error": {"type", "message"}}
for anything under /v1/messages (and /v1/models asked with an `anthropic-version` header, as Anthropic's SDK asks),
or Ollama's {"error": "..."} for `/` and anything under /api/.
The handlers choose by the request's path, so validation errors, unknown paths and methods, 413s and 500s are
shaped like the dialect's own errors."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenomy.dialect import messages, ollama
from tokenomy.dialect.chat import body_error
from tokenomy.dialect.messages_wire import error_body
from tokenomy.errors import APIError

__all__ = ["APIError", "error_response", "messages_error_response"]


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def messages_error_response(err: APIError) -> JSONResponse:
    """Anthropic's error body, with tokenomy's status and headers (Retry-After ...)."""
    return JSONResponse(error_body(err), status_code=err.status, headers=err.headers)


def anthropic_shaped(request: Request) -> bool:
    path = request.url.path
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return True
    return path.startswith("/v1/models") and "anthropic-version" in request.headers


def ollama_shaped(request: Request) -> bool:
    path = request.url.path
    return path == "/" or path.startswith("/api/")


def _respond(request: Request, err: APIError) -> JSONResponse:
    if ollama_shaped(request):
        return JSONResponse(ollama.error_body(err), status_code=err.status, headers=err.headers)
    return messages_error_response(err) if anthropic_shaped(request) else error_response(err)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return _respond(request, exc)


async def validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if ollama_shaped(request):
        return _respond(request, ollama.body_error(errors))
    return _respond(request, messages.body_error(errors) if anthropic_shaped(request) else body_error(errors))


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return _respond(request, APIError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {})))


async def unhandled_handler(request: Request, exc: Exception) -> JSONResponse:
    """A 500 for what no handler expected. Starlette re-raises the exception once this answer is sent, and uvicorn
    then closes the connection: `Connection: close` says so, so a pooled client opens a new one for its next
    request instead of failing on a connection the server has dropped."""
    return _respond(request, APIError(500, f"internal error: {type(exc).__name__}", headers={"connection": "close"}))
