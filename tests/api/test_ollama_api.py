"""The official `ollama` Python client, unchanged, against a live tokenomy on its own port: Ollama's API on the real
SmolLM2 model (chat, streamed chat, generate, structured format, tools, embeddings old and new, list, show, ps,
errors in Ollama's shape), the ledger recording the dialect, and keys sent as a bearer token."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import httpx
import ollama
import pytest

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.answers import assert_chat_end
from tests.helpers.wait import wait_until
from tokenomy.models.catalog import resolve_gguf
from tokenomy.structured.validate import validate

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
EMBEDDER = "all-minilm-l6-v2"
HELLO = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0, "num_predict": 12}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.root, timeout=120)


def assert_final(r: ollama.ChatResponse | ollama.GenerateResponse, max_tokens: int) -> None:
    """A final object as Ollama promises it: done, a reason that agrees with the counts, durations in ns that
    add up (the prompt's and the answer's within the total)."""
    assert r.done is True and r.created_at
    assert r.prompt_eval_count and r.prompt_eval_count > 0
    assert_chat_end(r.done_reason, r.eval_count or 0, max_tokens)
    assert r.total_duration and r.total_duration > 0 and r.load_duration is not None and r.load_duration >= 0
    assert r.prompt_eval_duration is not None and r.eval_duration is not None
    assert r.load_duration + r.prompt_eval_duration + r.eval_duration <= r.total_duration


# ---- generation ----------------------------------------------------------------------------------------------
def test_a_chat_and_its_stream_agree(client):
    full = client.chat(model=MODEL, messages=HELLO, options=GREEDY, stream=False)
    assert full.model == MODEL and full.message.role == "assistant"
    assert_final(full, 12)
    parts = list(client.chat(model=MODEL + ":latest", messages=HELLO, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert parts[-1].model == MODEL + ":latest"
    assert_final(parts[-1], 12)
    assert "".join(p.message.content for p in parts) == full.message.content
    assert parts[-1].eval_count == full.eval_count


def test_generate_with_a_system_prompt_raw_and_a_stop(client):
    r = client.generate(model=MODEL, prompt="Say hello.", system="You are terse.", options=GREEDY, stream=False)
    assert_final(r, 12)
    raw = client.generate(model=MODEL, prompt="<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", raw=True,
                          options={"num_predict": 5, "temperature": 0}, stream=False)
    assert_final(raw, 5)
    forced = client.generate(model=MODEL, prompt="Count: 1, 2, 3,", raw=True,
                             options={"num_predict": 4, "temperature": 0, "stop": ["\n"], "seed": 1,
                                      "repeat_penalty": 1.1, "num_ctx": 2048, "mirostat": 2})   # unknown: ignored
    assert forced.done and "\n" not in forced.response
    streamed = list(client.generate(model=MODEL, prompt="Say hello.", system="You are terse.", options=GREEDY,
                                    stream=True))
    assert streamed[-1].done and "".join(p.response for p in streamed) == r.response


def test_stream_is_the_default_on_the_wire(server):
    body = {"model": MODEL, "prompt": "Hi", "options": {"num_predict": 3}}
    with httpx.stream("POST", server.root + "/api/generate", json=body, timeout=120) as s:
        lines = [json.loads(x) for x in s.iter_lines() if x]
    assert s.status_code == 200 and s.headers["content-type"].startswith("application/x-ndjson")
    assert lines[-1]["done"] is True and all(line["done"] is False for line in lines[:-1])
    assert lines[-1]["eval_count"] == len(lines) - 1 or lines[-1]["eval_count"] >= 1


def expires(client: ollama.Client, model: str) -> datetime | None:
    """When /api/ps says `model` unloads (None: not loaded)."""
    running = {m.model: m for m in client.ps().models}
    return running[model].expires_at if model in running else None


def test_nothing_to_generate_loads_the_model_and_keeps_it_for_its_keep_alive(client):
    before = datetime.now(UTC)
    r = client.generate(model=MODEL, keep_alive="10m")
    assert r.done and r.done_reason == "load" and r.response == ""
    until = expires(client, MODEL + ":latest")
    assert until is not None and before + timedelta(minutes=9) < until < datetime.now(UTC) + timedelta(minutes=11)
    c = client.chat(model=MODEL + ":latest", messages=[], keep_alive=-1, stream=False)
    assert c.done and c.done_reason == "load"
    assert expires(client, MODEL + ":latest") > datetime.now(UTC) + timedelta(days=365)     # kept
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="no-such-model")
    assert e.value.status_code == 404


def test_keep_alive_zero_unloads_and_the_next_request_loads_again():
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE}) as s:
        c = ollama.Client(host=s.root, timeout=120)
        assert c.generate(model=MODEL, keep_alive=-1).done_reason == "load"
        assert expires(c, MODEL + ":latest") is not None
        assert c.generate(model=MODEL, keep_alive=0).done_reason == "unload"
        assert expires(c, MODEL + ":latest") is None
        r = c.chat(model=MODEL, messages=HELLO, options=GREEDY, keep_alive="1h", stream=False)
        assert r.done and r.eval_count and r.eval_count > 0
        assert r.load_duration > 0              # it waited for the load, and says so
        assert_final(r, 12)
        assert expires(c, MODEL + ":latest") > datetime.now(UTC) + timedelta(minutes=59)
        r = c.generate(model=MODEL, prompt="Hi", options=GREEDY, keep_alive=0)      # answered, then unloaded
        assert r.done and r.eval_count and r.eval_count > 0
        wait_until(lambda: expires(c, MODEL + ":latest") is None, what="keep_alive 0 to unload after the answer")


def test_format_json_schema_is_enforced(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Invent a person."}], format=schema,
                    options={"temperature": 0, "num_predict": 64}, stream=False)
    assert validate(r.message.content, schema).ok, r.message.content
    j = client.generate(model=MODEL, prompt="A JSON object about a cat.", format="json",
                        options={"temperature": 0, "num_predict": 48}, stream=False)
    if j.done_reason == "stop":         # a grammar-complete answer parses; one cut at the limit may not
        assert isinstance(json.loads(j.response), dict)


def test_a_tool_call_in_ollamas_shape_and_its_round_trip(server, client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"model": MODEL, "messages": ask, "tools": [WEATHER], "tool_choice": "required", "stream": False,
            "options": {"temperature": 0, "num_predict": 48}}
    raw = httpx.post(server.root + "/api/chat", json=body, timeout=120)
    assert raw.status_code == 200, raw.text
    r = ollama.ChatResponse.model_validate(raw.json())          # the client's own type of the answer
    assert r.done_reason == "stop" and len(r.message.tool_calls) == 1
    call = r.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    with httpx.stream("POST", server.root + "/api/chat", json={**body, "stream": True}, timeout=120) as s:
        lines = [json.loads(x) for x in s.iter_lines() if x]
    assert s.headers["content-type"].startswith("application/x-ndjson")
    assert lines[-1]["done"] and lines[-1]["message"]["tool_calls"][0]["function"] == \
        raw.json()["message"]["tool_calls"][0]["function"]
    turn = [*ask, r.message, {"role": "tool", "content": "Sunny, 21 C", "tool_name": "get_weather"}]
    answer = client.chat(model=MODEL, messages=turn, tools=[WEATHER], options=GREEDY, stream=False)
    assert answer.done and answer.message.role == "assistant"


# ---- embeddings ----------------------------------------------------------------------------------------------
def test_embed_and_the_older_embeddings(client):
    e = client.embed(model=EMBEDDER, input=["a cat", "a dog"])
    assert len(e.embeddings) == 2 and all(len(v) == 384 for v in e.embeddings)
    assert e.prompt_eval_count and e.prompt_eval_count > 0 and e.total_duration > 0
    one = client.embed(model=EMBEDDER + ":latest", input="a cat")
    assert one.embeddings[0] == pytest.approx(e.embeddings[0], abs=1e-5)
    old = client.embeddings(model=EMBEDDER, prompt="a cat")
    assert old.embedding == pytest.approx(e.embeddings[0], abs=1e-5)


# ---- models --------------------------------------------------------------------------------------------------
def test_list_show_and_ps_describe_the_served_files(client, server):
    path = resolve_gguf(MODEL)
    listed = {m.model: m for m in client.list().models}
    assert {MODEL + ":latest", EMBEDDER + ":latest"} <= set(listed)
    smol = listed[MODEL + ":latest"]
    assert smol.size == path.stat().st_size
    assert smol.digest == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert (smol.details.format, smol.details.family, smol.details.quantization_level) == ("gguf", "llama", "Q4_1")
    shown = client.show(MODEL + ":latest")
    assert set(shown.capabilities) == {"completion", "tools"}       # no FIM tokens in this GGUF: no insert
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.context_length"] == 8192
    assert shown.modelinfo["llama.embedding_length"] == 576 and shown.modelinfo["general.parameter_count"] > 1e8
    assert "<|im_start|>" in shown.template and shown.details.parameter_size == "135M"
    assert client.show(EMBEDDER).capabilities == ["embedding"]
    running = {m.model: m for m in client.ps().models}
    assert MODEL + ":latest" in running and EMBEDDER + ":latest" not in running
    assert running[MODEL + ":latest"].context_length == server.gateway.window(MODEL) > 0
    assert running[MODEL + ":latest"].size > smol.size and running[MODEL + ":latest"].expires_at is not None


def test_root_version_and_probes(server):
    root = httpx.get(server.root + "/")
    assert root.status_code == 200 and root.text == "Ollama is running"
    assert httpx.head(server.root + "/").status_code == 200
    assert httpx.get(server.root + "/api/version").json()["version"]
    assert httpx.head(server.root + "/api/blobs/sha256:" + "0" * 64).status_code == 404


# ---- errors --------------------------------------------------------------------------------------------------
def test_errors_are_ollamas_shape_with_the_right_status(client, server):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="no-such-model", messages=HELLO, stream=False)
    assert e.value.status_code == 404 and MODEL in e.value.error        # the pipeline's: what exists instead
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=MODEL, prompt="def f(", suffix="return 1", stream=False)
    assert e.value.status_code == 400 and "insert" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "What is this?", "images": ["aGk="]}],
                    stream=False)
    assert e.value.status_code == 400 and "images" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.create(model="mine", from_=MODEL)
    assert e.value.status_code == 501
    for body in ({"model": MODEL, "prompt": "x", "template": "{{ .Prompt }}"},
                 {"model": MODEL, "prompt": "x", "context": [1, 2, 3]},
                 {"model": MODEL, "prompt": "x", "keep_alive": "soon"},
                 {"model": MODEL, "prompt": "x", "options": {"temperature": "hot"}},
                 {"model": MODEL, "prompt": "x", "format": "yaml"}):
        r = httpx.post(server.root + "/api/generate", json=body, timeout=30)
        assert r.status_code == 400 and isinstance(r.json()["error"], str), (body, r.text)
    r = httpx.post(server.root + "/api/chat", content=b"{not json", timeout=30)
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    r = httpx.request("DELETE", server.root + "/api/delete", json={"model": MODEL}, timeout=30)
    assert r.status_code == 400 and "served" in r.json()["error"]


def test_the_ledger_records_the_dialect(server, client):
    client.chat(model=MODEL, messages=HELLO, options={"num_predict": 2}, stream=False)
    client.embed(model=EMBEDDER, input="a cat")
    ledger = server.gateway.ledger
    ledger.flush()
    apis = {r.api for r in ledger.query()}
    assert {"ollama.chat", "ollama.embed"} <= apis


def test_keys_as_a_bearer_token():
    keys = {"keys": [{"key": "sk-ollama", "tenant": "o"}], "engine": SMALL_ENGINE, "cache": NO_CACHE}
    with live_server(keys) as srv:
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=srv.root).list()
        assert e.value.status_code == 401
        keyed = ollama.Client(host=srv.root, headers={"Authorization": "Bearer sk-ollama"}, timeout=120)
        assert MODEL + ":latest" in {m.model for m in keyed.list().models}
        assert keyed.chat(model=MODEL, messages=HELLO, options={"num_predict": 2}, stream=False).done
        with pytest.raises(ollama.ResponseError) as e:
            keyed.pull("hf.co/acme/x:Q4_K_M", stream=False)
        assert e.value.status_code == 403          # pulling takes an admin key


# ---- LangChain -----------------------------------------------------------------------------------------------
def test_langchain_chat_ollama_invoke_and_stream(server):
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model=MODEL, base_url=server.root, temperature=0, num_predict=12)
    full = llm.invoke("Name three colors.")
    assert full.response_metadata["done"] is True and full.response_metadata["model"] == MODEL
    assert full.usage_metadata["output_tokens"] >= 1 and full.usage_metadata["input_tokens"] >= 1
    chunks = list(llm.stream("Name three colors."))
    assert len(chunks) >= 2 and "".join(c.content for c in chunks) == full.content


def test_langchain_ollama_embeddings(server):
    from langchain_ollama import OllamaEmbeddings

    emb = OllamaEmbeddings(model=EMBEDDER, base_url=server.root)
    docs = emb.embed_documents(["a cat", "a dog"])
    assert len(docs) == 2 and len(docs[0]) == 384
    assert emb.embed_query("a cat") == pytest.approx(docs[0], abs=1e-5)
