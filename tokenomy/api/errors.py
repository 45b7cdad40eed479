"""OpenAI error bodies: {"error": {"message", "type", "param", "code"}} with the right status."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenomy.dialect.schemas import body_error
from tokenomy.errors import APIError

__all__ = ["APIError", "error_response"]



def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def validation_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(body_error(list(exc.errors())))


async def http_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(APIError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {})))


async def unhandled_handler(_: Request, exc: Exception) -> JSONResponse:
    return error_response(APIError(500, f"internal error: {type(exc).__name__}"))
