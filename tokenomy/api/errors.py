"""OpenAI error bodies: {"error": {"message", "type", "param", "code"}} with the right status."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenomy.errors import APIError

__all__ = ["APIError", "error_response"]



def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def validation_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errs = exc.errors()
    first = errs[0] if errs else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        msg = "We could not parse the JSON body of your request: " + str(first.get("ctx", {}).get("error", ""))
        return error_response(APIError(400, msg.strip(), code="invalid_json"))
    if first.get("type") == "model_attributes_type" or (not loc and first.get("type") == "dict_type"):
        return error_response(APIError(400, "The request body must be a JSON object.", code="invalid_body"))
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "missing":
        msg = f"Missing required parameter: '{param}'."
    elif param:
        msg = f"Invalid value for '{param}': {msg}"
    return error_response(APIError(400, msg, param=param, code="invalid_value"))


async def http_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(APIError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {})))


async def unhandled_handler(_: Request, exc: Exception) -> JSONResponse:
    return error_response(APIError(500, f"internal error: {type(exc).__name__}"))
