"""The served /openapi.json describes the request bodies and the error responses, and schemathesis, generating
requests from it, finds no 5xx and no undocumented status (a bounded, deterministic run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import NO_CACHE, live_server

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


def test_the_openapi_document_declares_bodies_and_openai_errors(server):
    doc = httpx.get(server.root + "/openapi.json").json()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    assert {"400", "401", "404", "413", "429", "503"} <= set(chat["responses"])
    assert "422" not in chat["responses"] and "messages" in doc["components"]["schemas"]["ChatCompletionRequest"][
        "properties"]
    ollama = doc["paths"]["/api/chat"]["post"]         # Ollama's endpoints, with Ollama's error body, are fuzzed too
    assert ollama["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatRequest")
    assert ollama["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/OllamaErrorResponse")
    assert {"/api/generate", "/api/embed", "/api/embeddings", "/api/show", "/api/tags", "/api/ps", "/api/pull",
            "/api/delete", "/api/version"} <= set(doc["paths"])
    refs: set[str] = set()
    stack = [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            refs |= {x["$ref"].rsplit("/", 1)[-1]} if isinstance(x.get("$ref"), str) else set()
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    assert refs - set(doc["components"]["schemas"]) == set()      # every body a route names is in the document


def test_schemathesis_finds_no_server_error_and_no_undocumented_status():
    st = Path(sys.executable).parent / "st"
    # a 128-token window keeps every generated answer short on two cores
    with live_server({"cache": NO_CACHE, "engine": {"n_ctx": 2048, "max_model_len": 128, "max_running": 4}}) as srv:
        run = subprocess.run([str(st), "run", srv.root + "/openapi.json", "-c",
                              "not_a_server_error,status_code_conformance", "-n", "20", "--request-timeout", "60",
                              "--generation-deterministic", "--exclude-path-regex", "metrics|admin"],
                             capture_output=True, text=True, timeout=600)
    tail = run.stdout[-3000:]
    assert run.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail.split("SUMMARY")[-1], tail
