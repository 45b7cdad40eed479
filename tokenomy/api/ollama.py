"""Ollama's API on tokenomy's port (and on `server.ollama_port`): `/api/chat`, `/api/generate`, `/api/embed`,
`/api/embeddings` through the same pipeline as every dialect (keys, limits, caches, routes, the ledger with the
API recorded as ollama.chat, ollama.generate, ollama.embed or ollama.embeddings); `/api/tags`, `/api/show`,
`/api/ps`, `/api/version` and `GET /` from the gateway's models and their GGUF files; `/api/pull` from the
Hugging Face hub through the hub code `tokenomy pull` uses; the endpoints tokenomy does not serve are a 501 in
Ollama's `{"error": ...}` shape (docs/ollama.md).

Names: a model is listed as NAME:TAG, a configured name without a tag as NAME:latest, and `:latest` is
understood on the way in. A key comes as `Authorization: Bearer`, as the Ollama clients send it; pulling and
deleting need an admin key when keys are configured.

`keep_alive` goes to the fleet (backends/fleet.py), which loads embedded models on demand: a request's keep_alive
is how long its model stays loaded after it; a request with nothing to generate loads the model (`done_reason:
"load"`), or with keep_alive 0 unloads it (`done_reason: "unload"`), as Ollama's do; /api/ps shows the loaded
models with the memory the fleet places them by and when their keep_alive ends them. Without a fleet (server.workers
> 1, each worker its own engines) every model stays loaded and never expires.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from tokenomy.api import openapi
from tokenomy.api import run as serve
from tokenomy.api.body import parse_recorded, read_json
from tokenomy.backends.embedded import EmbeddedBackend
from tokenomy.backends.fleet import FleetFull, FleetModel
from tokenomy.config import EmbeddedModelSpec
from tokenomy.dialect.ollama import (
    LATEST,
    ChatRequest,
    DeleteRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    PullRequest,
    ShowRequest,
    body_error,
)
from tokenomy.dialect.ollama_wire import LineWriter, chat_body, durations, generate_body, line, loaded_body
from tokenomy.errors import APIError
from tokenomy.gateway import Gateway
from tokenomy.models import hub
from tokenomy.models.gguf import GGUFError, read_gguf, read_metadata

log = logging.getLogger("tokenomy.ollama")

# The Ollama release whose API this implements: clients compare it before using newer fields (tools, format).
VERSION = "0.12.6"
NDJSON = "application/x-ndjson"
RUNNING = "Ollama is running"
FOREVER = "2318-01-01T00:00:00Z"        # a model that does not expire, as Ollama shows keep_alive < 0
EPOCH = "1970-01-01T00:00:00Z"          # modified_at of a model without a file (an upstream, the ONNX embedder)
HUB_HOSTS = ("hf.co/", "huggingface.co/")
PROGRESS_S = 0.5        # a pull's status line for the file downloading, this often


# ---- names and model facts ---------------------------------------------------------------------------------------
def listed(name: str) -> str:
    """A configured name as Ollama lists it: NAME:TAG (`:latest` where the name has no tag)."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def served_name(gateway: Gateway, name: str) -> str:
    """The served name an Ollama client's `name` means: itself, or itself without `:latest`; an unknown name as
    it is (the pipeline's route stage refuses it with its 404 and a ledger row)."""
    names = gateway.model_names()
    if name not in names and name.endswith(LATEST) and name.removesuffix(LATEST) in names:
        return name.removesuffix(LATEST)
    return name


def resolve(gateway: Gateway, name: str) -> str:
    """served_name, or a 404 for a name no model has (for the endpoints that do not run the pipeline)."""
    served = served_name(gateway, name)
    if served not in gateway.model_names():
        raise APIError(404, f'model "{name}" not found, try pulling it first', param="model",
                       code="model_not_found")
    return served


def _gguf_path(gateway: Gateway, name: str) -> str | None:
    """The GGUF file of an embedded model, or of a route's first model; None for upstreams and embedders."""
    route = gateway.routes.get(name)
    target = route.models[0] if route is not None else name
    backend = gateway.registry.backends.get(target)
    return backend.path if isinstance(backend, EmbeddedBackend | FleetModel) else None


@lru_cache(maxsize=64)
def _sha256(path: str, mtime: float, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _file_facts(path: str) -> dict[str, Any]:
    """size, digest (the file's own sha256) and modified_at of a GGUF file (first part of a split model)."""
    st = os.stat(path)
    return {"size": st.st_size, "digest": _sha256(path, st.st_mtime, st.st_size),
            "modified_at": datetime.fromtimestamp(st.st_mtime, UTC).isoformat().replace("+00:00", "Z")}


def _details(path: str | None, embedding: bool = False) -> dict[str, Any]:
    if path is None:
        family = "bert" if embedding else ""
        return {"parent_model": "", "format": "onnx" if embedding else "", "family": family,
                "families": [family] if family else None, "parameter_size": "", "quantization_level": ""}
    meta = read_metadata(path)
    arch = str(meta.values.get("general.architecture", ""))
    label = meta.values.get("general.size_label")
    if not label:
        params = read_gguf(path).file
        label = f"{params.params / 1e6:.0f}M" if params is not None and params.params < 1e9 else \
            f"{params.params / 1e9:.1f}B" if params is not None else ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch], "parameter_size": str(label),
            "quantization_level": meta.quantization or ""}


def _entry(gateway: Gateway, name: str) -> dict[str, Any]:
    """One model of /api/tags (and the common part of /api/ps)."""
    path = _gguf_path(gateway, name)
    facts = _file_facts(path) if path is not None else {"size": 0, "digest": "", "modified_at": EPOCH}
    return {"name": listed(name), "model": listed(name), **facts,
            "details": _details(path, name in gateway.packaged_embedders)}


def _capabilities(gateway: Gateway, name: str, path: str | None) -> list[str]:
    if name in gateway.packaged_embedders:
        return ["embedding"]
    caps = ["completion", "tools"]         # tools by grammar, for every model (tokenomy/structured/tools.py)
    if path is not None and read_metadata(path).fim is not None:
        caps.append("insert")
    return caps


def _show(gateway: Gateway, name: str, verbose: bool) -> dict[str, Any]:
    path = _gguf_path(gateway, name)
    body: dict[str, Any] = {"modelfile": f"# served by tokenomy\nFROM {path or name}\n",
                            "details": _details(path, name in gateway.packaged_embedders),
                            "capabilities": _capabilities(gateway, name, path)}
    window = gateway.window(_gguf_target(gateway, name))
    body["parameters"] = f"num_ctx {window}" if window else ""
    if path is None:
        body["model_info"] = {}
        body["template"] = ""
        return body
    meta = read_metadata(path)
    info = {k: v for k, v in meta.values.items() if k != "tokenizer.chat_template"}
    weights = read_gguf(path).file
    if weights is not None:
        info["general.parameter_count"] = weights.params
    if not verbose:     # as Ollama: the tokenizer's long lists only when asked (verbose), else null
        info = {k: (None if isinstance(v, list) and k.startswith("tokenizer.") else v) for k, v in info.items()}
    body["model_info"] = info
    body["template"] = str(meta.values.get("tokenizer.chat_template") or "")
    body["modified_at"] = _file_facts(path)["modified_at"]
    return body


def _gguf_target(gateway: Gateway, name: str) -> str:
    route = gateway.routes.get(name)
    return route.models[0] if route is not None else name


# ---- parsing -----------------------------------------------------------------------------------------------------
def _authorization(request: Request) -> str | None:
    return request.headers.get("authorization")


def _keyed(gateway: Gateway, request: Request, admin: bool = False) -> None:
    if gateway.keyring.enabled:
        (gateway.keyring.admin if admin else gateway.keyring.lookup)(_authorization(request))


async def _parse(gateway: Gateway, request: Request, cls: type[BaseModel], admin: bool = False) -> BaseModel:
    """Authenticate (an admin key for pull and delete), then read and validate the body (no ledger row: nothing
    is generated)."""
    _keyed(gateway, request, admin)
    data = await read_json(request, gateway.config.server.max_body_bytes)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise body_error(e.errors()) from None


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _allowed(request: Request, gateway: Gateway, model: str) -> str:
    """The served name of `model` (a 404 for none), which the request's key may use (a 403 otherwise)."""
    name = resolve(gateway, model)
    if name not in gateway.models_for(_authorization(request)):
        raise APIError(403, f"This key may not use the model '{model}'.", param="model", code="model_not_allowed")
    return name


async def _load_or_unload(gateway: Gateway, name: str, keep_alive: Any) -> str:
    """A request with nothing to generate: the fleet loads `name` (or, with keep_alive 0, unloads it); the
    done_reason to answer. A model outside the fleet is loaded already."""
    backend = gateway.registry.backends.get(name)
    fleet = gateway.fleet
    if not isinstance(backend, FleetModel) or fleet is None:
        return "load"
    try:
        done = await fleet.keep(name, keep_alive)
    except FleetFull as e:
        raise APIError(503, str(e), code="model_unavailable") from None
    return "load" if done == "loaded" else "unload"


# ---- the endpoints -----------------------------------------------------------------------------------------------
async def running(request: Request) -> Response:
    return PlainTextResponse(RUNNING)


async def version(request: Request) -> JSONResponse:
    return JSONResponse({"version": VERSION})


async def tags(request: Request) -> JSONResponse:
    gateway = _gateway(request)
    names = gateway.models_for(_authorization(request))
    models = await asyncio.to_thread(lambda: [_entry(gateway, n) for n in names])
    return JSONResponse({"models": models})


async def show(request: Request) -> JSONResponse:
    gateway = _gateway(request)
    body = await _parse(gateway, request, ShowRequest)
    assert isinstance(body, ShowRequest)
    name = _allowed(request, gateway, body.model)
    try:
        return JSONResponse(await asyncio.to_thread(_show, gateway, name, body.verbose))
    except GGUFError as e:
        raise APIError(500, str(e)) from e


async def ps(request: Request) -> JSONResponse:
    """The models loaded now, with the memory each holds and when its keep_alive ends it: the fleet's loaded
    models (the bytes it places them by), or, outside a fleet, every embedded model whose engine answers (weights and
    KV as checked before it loaded; never expiring)."""
    gateway = _gateway(request)
    names = gateway.models_for(_authorization(request))
    models = []
    now = time.monotonic()
    for name in names:
        backend = gateway.registry.backends.get(name)
        if isinstance(backend, FleetModel):
            if backend.state != "loaded":
                continue
            held, vram = backend.memory_bytes, backend.vram_bytes
            left = backend.keep_alive_left(now)
            expires = FOREVER if left is None else _in(left)
        elif isinstance(backend, EmbeddedBackend) and await backend.health():
            fit = gateway.fits.get(name)
            held = fit.weight_bytes + fit.kv_bytes if fit is not None else 0
            vram, expires = held if fit is not None and fit.on_gpu else 0, FOREVER
        else:
            continue
        entry = await asyncio.to_thread(_entry, gateway, name)
        entry.pop("modified_at", None)
        models.append({**entry, "size": held or entry["size"], "size_vram": vram,
                       "expires_at": expires, "context_length": gateway.window(name) or 0})
    return JSONResponse({"models": models})


def _in(seconds: float) -> str:
    """The wall-clock time `seconds` from now, as Ollama writes expires_at."""
    return datetime.fromtimestamp(time.time() + seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


async def chat(request: Request) -> Response:
    gateway = _gateway(request)
    body = await parse_recorded(gateway, request, ChatRequest, "ollama.chat")
    assert isinstance(body, ChatRequest)
    name = served_name(gateway, body.model)
    if not body.messages:
        done = await _load_or_unload(gateway, _allowed(request, gateway, body.model), body.keep_alive)
        return JSONResponse(loaded_body(body.model, chat=True, reason=done))
    return await _generate(request, gateway, body.gen_request(name), body.model, body.stream, chat=True)


async def generate(request: Request) -> Response:
    gateway = _gateway(request)
    body = await parse_recorded(gateway, request, GenerateRequest, "ollama.generate")
    assert isinstance(body, GenerateRequest)
    name = served_name(gateway, body.model)
    fim = None
    if body.suffix:
        path = _gguf_path(gateway, resolve(gateway, name))
        fim = (await asyncio.to_thread(read_metadata, path)).fim if path is not None else None
        if fim is None:
            raise APIError(400, f'model "{body.model}" does not support insert: its GGUF has no fill-in-the-middle '
                           "tokens", param="suffix")
    if not body.prompt and not body.suffix:
        done = await _load_or_unload(gateway, _allowed(request, gateway, body.model), body.keep_alive)
        return JSONResponse(loaded_body(body.model, chat=False, reason=done))
    return await _generate(request, gateway, body.gen_request(name, fim), body.model, body.stream, chat=False)


async def _generate(request: Request, gateway: Gateway, gen: Any, model: str, stream: bool, chat: bool) -> Response:
    try:
        ctx = await serve.run(request, gateway, gen, stream)
    except serve.ClientLeft:
        return serve.client_left()
    if not stream:
        body = chat_body(ctx, model) if chat else generate_body(ctx, model)
        return JSONResponse(body, headers=serve.tokenomy_headers(ctx, with_cost=True))
    writer = LineWriter(ctx, model, chat)
    return serve.stream_response(ctx, writer.chunks, writer.end, media_type=NDJSON)


async def embed(request: Request) -> JSONResponse:
    gateway = _gateway(request)
    body = await parse_recorded(gateway, request, EmbedRequest, "ollama.embed")
    assert isinstance(body, EmbedRequest)
    name = served_name(gateway, body.model)
    try:
        ctx = await serve.run(request, gateway, body.gen_request(name), stream=False)
    except serve.ClientLeft:
        return serve.client_left()         # type: ignore[return-value]
    vectors = np.asarray(ctx.embeddings, dtype=np.float32).tolist()
    d = durations(ctx, ctx.usage)
    return JSONResponse({"model": body.model, "embeddings": vectors, "total_duration": d["total_duration"],
                         "load_duration": 0, "prompt_eval_count": d["prompt_eval_count"]},
                        headers=serve.tokenomy_headers(ctx, with_cost=True))


async def embeddings(request: Request) -> JSONResponse:
    gateway = _gateway(request)
    body = await parse_recorded(gateway, request, EmbeddingsRequest, "ollama.embeddings")
    assert isinstance(body, EmbeddingsRequest)
    name = served_name(gateway, body.model)
    try:
        ctx = await serve.run(request, gateway, body.gen_request(name), stream=False)
    except serve.ClientLeft:
        return serve.client_left()         # type: ignore[return-value]
    vector = np.asarray(ctx.embeddings, dtype=np.float32)[0].tolist()
    return JSONResponse({"embedding": vector}, headers=serve.tokenomy_headers(ctx, with_cost=True))


def hub_ref(name: str) -> str | None:
    """The hub reference an Ollama name means: `hf.co/ORG/REPO[:QUANT]` (Ollama's own spelling for the Hugging
    Face hub; `:latest` for no quantization named) or `hf:ORG/REPO[:QUANT]`; None for any other name."""
    if hub.is_hub_ref(name):
        return name
    for host in HUB_HOSTS:
        if name.startswith(host):
            rest = name[len(host):].removesuffix(LATEST)
            return hub.PREFIX + rest
    return None


async def pull(request: Request) -> Response:
    """Download a hub model into the hub cache as `tokenomy pull` does, with Ollama's status lines: the manifest
    (the repo's files, which file the name means), each file (the bytes written so far every PROGRESS_S, of the
    size the hub declares; its size when done), success. A client that leaves stops the lines, not the download
    (a thread that finishes into the cache, where the next pull finds it). A name the gateway
    serves already is a success at once. A pulled model is served from then on under the name pulled (Gateway.
    add_model: the fleet loads it on its first request), until it is deleted or tokenomy stops; to keep it across
    restarts, give it a config entry."""
    gateway = _gateway(request)
    body = await _parse(gateway, request, PullRequest, admin=True)
    assert isinstance(body, PullRequest)
    try:
        resolve(gateway, body.model)
        served = True
    except APIError:
        served = False
    ref_text = None if served else hub_ref(body.model)
    if not served and ref_text is None:
        raise APIError(404, f'pull model manifest: "{body.model}" is not a hub model: tokenomy pulls from the '
                       "Hugging Face hub, named hf.co/ORG/REPO:QUANT", param="model", code="model_not_found")
    parts: list[str] = []
    ref = None
    if ref_text is not None:
        try:
            ref = hub.parse(ref_text)
            parts = await asyncio.to_thread(lambda: hub.choose(ref, hub.repo_files(ref)))
        except hub.HubError as e:
            raise APIError(404, f"pull model manifest: {e}", param="model", code="model_not_found") from None

    async def statuses() -> AsyncIterator[dict[str, Any]]:
        yield {"status": "pulling manifest"}
        for part in parts:
            assert ref is not None
            status = f"pulling {Path(part).name}"
            total = await asyncio.to_thread(hub.file_size, ref, part) or 0
            download = asyncio.ensure_future(asyncio.to_thread(hub.download, ref, part))
            while not (await asyncio.wait({download}, timeout=PROGRESS_S))[0]:
                written = hub.partial_bytes(ref)
                yield {"status": status, "digest": part, "total": total,
                       "completed": min(written, total) if total else written}
            size = Path(download.result()).stat().st_size
            yield {"status": status, "digest": part, "total": size, "completed": size}
        if parts:
            yield {"status": "verifying sha256 digest"}
            yield {"status": "writing manifest"}
        if not served:                  # served from now on, as Ollama serves what it pulled
            assert ref_text is not None
            spec = EmbeddedModelSpec(name=body.model.removesuffix(LATEST), gguf=ref_text, preload=False)
            try:
                await asyncio.to_thread(gateway.add_model, spec)
            except APIError as e:
                yield {"error": f"pulled into the hub cache, but not served: {e.message}"}
                return
        yield {"status": "success"}

    if not body.stream:
        last: dict[str, Any] = {}
        try:
            async for status in statuses():
                last = status
        except Exception as e:      # a download that failed: the hub's error, in Ollama's shape
            raise APIError(502, f"pull failed: {e}") from e
        if "error" in last:
            raise APIError(400, last["error"], param="model")
        return JSONResponse(last)

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for status in statuses():
                yield line(status)
        except Exception as e:
            yield line({"error": f"pull failed: {e}"})

    return StreamingResponse(lines(), media_type=NDJSON)


async def delete(request: Request) -> Response:
    """Delete a pulled hub model from the hub cache, serving it no longer if it was pulled here (Ollama's delete);
    a model the config serves (by its name, or a hub name whose file it serves) is refused with a 400: its file
    stays until it is no longer served."""
    gateway = _gateway(request)
    body = await _parse(gateway, request, DeleteRequest, admin=True)
    assert isinstance(body, DeleteRequest)
    await gateway.remove_model(served_name(gateway, body.model))
    if served_name(gateway, body.model) in gateway.model_names():
        raise APIError(400, f'model "{body.model}" is served by this gateway: remove it from the config (or the '
                       "serve command) and restart tokenomy; its file stays where it is", param="model")
    ref_text = hub_ref(body.model)
    try:
        paths = await asyncio.to_thread(hub.cached_paths, hub.parse(ref_text)) if ref_text is not None else []
    except hub.HubError as e:
        raise APIError(400, str(e), param="model") from None
    served = {os.path.realpath(b.path) for b in gateway.registry.backends.values()
              if isinstance(b, EmbeddedBackend | FleetModel)}
    if any(os.path.realpath(p) in served for p in paths):
        raise APIError(400, f'model "{body.model}" is served by this gateway: remove it from the config and '
                       "restart tokenomy first", param="model")
    if not paths:
        raise APIError(404, f'model "{body.model}" not found', param="model", code="model_not_found")
    await asyncio.to_thread(hub.remove, hub.parse(ref_text or ""))
    return Response(status_code=200)


async def not_served(request: Request) -> Response:
    """An Ollama endpoint tokenomy does not serve (create, push, copy, blobs): 501, never a hang."""
    what = request.url.path.removeprefix("/api/").split("/")[0]
    raise APIError(501, f"/api/{what} is not supported by tokenomy: it serves GGUF models named in its config or "
                   "pulled from the Hugging Face hub (docs/ollama.md)", code="not_supported")


async def blob(digest: str, request: Request) -> Response:
    """HEAD /api/blobs/DIGEST: tokenomy keeps no blobs (Ollama's answer for a blob it does not have)."""
    return Response(status_code=404)


ROUTES = [
    APIRoute("/", running, methods=["GET", "HEAD"], include_in_schema=False),
    APIRoute("/api/version", version, methods=["GET", "HEAD"]),
    APIRoute("/api/tags", tags, methods=["GET", "HEAD"]),
    APIRoute("/api/show", show, methods=["POST"], openapi_extra=openapi.documented(ShowRequest)),
    APIRoute("/api/ps", ps, methods=["GET"]),
    APIRoute("/api/chat", chat, methods=["POST"], openapi_extra=openapi.documented(ChatRequest)),
    APIRoute("/api/generate", generate, methods=["POST"], openapi_extra=openapi.documented(GenerateRequest)),
    APIRoute("/api/embed", embed, methods=["POST"], openapi_extra=openapi.documented(EmbedRequest)),
    APIRoute("/api/embeddings", embeddings, methods=["POST"], openapi_extra=openapi.documented(EmbeddingsRequest)),
    APIRoute("/api/pull", pull, methods=["POST"], openapi_extra=openapi.documented(PullRequest)),
    APIRoute("/api/delete", delete, methods=["DELETE"], openapi_extra=openapi.documented(DeleteRequest)),
    APIRoute("/api/blobs/{digest}", blob, methods=["HEAD"], include_in_schema=False),
    APIRoute("/api/blobs/{digest}", not_served, methods=["POST"], include_in_schema=False),
    APIRoute("/api/create", not_served, methods=["POST"], include_in_schema=False),
    APIRoute("/api/push", not_served, methods=["POST"], include_in_schema=False),
    APIRoute("/api/copy", not_served, methods=["POST"], include_in_schema=False),
]
