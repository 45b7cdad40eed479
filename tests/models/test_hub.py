"""Hub models (tokenomy/models/hub.py) downloaded by huggingface_hub's real code from a hub on loopback
(tests/helpers/hub_server.py, reached through HF_ENDPOINT), then served: `tokenomy serve hf:ORG/REPO:QUANT` answers,
works offline from the cache, resumes a download cut off mid-file, and names what a repo holds when asked for what it
does not."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import free_port
from tests.helpers.gguf_split import split
from tests.helpers.hub_server import HubServer
from tests.helpers.wait import wait_until
from tokenomy.models import hub
from tokenomy.models.catalog import resolve_gguf
from tokenomy.models.gguf import read_gguf

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
REPO = "acme/SmolLM2-135M-Instruct-GGUF"
GGUF = "SmolLM2-135M-Instruct-Q4_1.gguf"
SPLIT = [f"sub/SmolLM2-135M-Instruct-Q8_0-0000{i}-of-00002.gguf" for i in (1, 2)]
# a small engine: the window stays the GGUF's (no n_ctx or max_model_len), few KV streams
CONFIG = {"engine": {"max_running": 2, "max_retired": 0, "kv_tier_ram_mb": 0, "n_threads": 1},
          "cache": {"exact": {"enabled": False}, "semantic": {"enabled": False}}, "ledger": None}


# ---- which file a reference names ------------------------------------------------------------------------------
def test_a_reference_parses_into_repo_spec_and_revision() -> None:
    assert hub.parse("hf:bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M") == hub.HubRef(
        "bartowski/Qwen2.5-7B-Instruct-GGUF", "Q4_K_M")
    assert hub.parse("hf:org/repo@v2:dir/f.gguf") == hub.HubRef("org/repo", "dir/f.gguf", "v2")
    assert hub.parse("hf:org/repo").spec is None
    with pytest.raises(hub.HubError, match="hf:ORG/REPO"):
        hub.parse("hf:just-a-name")


@pytest.mark.parametrize(("name", "quant"), [
    ("Qwen2.5-7B-Instruct-Q4_K_M.gguf", "Q4_K_M"), ("qwen2.5-7b-instruct-q8_0.gguf", "Q8_0"),
    ("Model-UD-Q4_K_XL-00001-of-00003.gguf", "Q4_K_XL"), ("Q5_K_S/Model-00001-of-00002.gguf", "Q5_K_S"),
    ("Model-IQ4_XS.gguf", "IQ4_XS"), ("model-bf16.gguf", "BF16"), ("model.gguf", None)])
def test_the_quantization_is_read_from_the_file_name(name: str, quant: str | None) -> None:
    assert hub.quantization(name) == quant


def test_a_split_model_is_all_its_parts_and_projectors_are_not_models() -> None:
    files = ["README.md", "m-Q4_K_M.gguf", "mmproj-m-f16.gguf", *SPLIT, "broken-Q2_K-00001-of-00002.gguf"]
    assert hub.models_in(files) == {"m-Q4_K_M.gguf": ["m-Q4_K_M.gguf"], SPLIT[0]: SPLIT}
    assert hub.choose(hub.parse("hf:o/r:q8_0"), files) == SPLIT
    assert hub.choose(hub.parse("hf:o/r:m-Q4_K_M.gguf"), files) == ["m-Q4_K_M.gguf"]
    with pytest.raises(hub.HubError) as e:
        hub.choose(hub.parse("hf:o/r"), files)
    assert str(e.value) == ("hf:o/r: 2 models match; its .gguf files: m-Q4_K_M.gguf, "
                            f"{SPLIT[0]} (+1 parts); quantizations: Q4_K_M, Q8_0")


# ---- the real download code against a hub on loopback ----------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2() -> Path:
    return resolve_gguf("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def hub_home() -> str:
    return tempfile.mkdtemp(prefix="tokenomy-hf-home-")


@pytest.fixture(scope="module")
def hub_server(smollm2: Path) -> Iterator[HubServer]:
    repos: dict[str, dict[str, Path | bytes]] = {REPO: {GGUF: smollm2, "README.md": b"# a test repo\n",
                                                        SPLIT[0]: b"part one", SPLIT[1]: b"part two"}}
    with HubServer(repos, drop_once={GGUF}) as server:
        yield server


def env_for(home: str, endpoint: str, offline: bool = False, **extra: str) -> dict[str, str]:
    # huggingface_hub's offline switches are HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE (which the torch embedder sets
    # in the process when a test has run it): the test says which it wants
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "TOKENOMY_MEMORY", "TRANSFORMERS_OFFLINE"))}
    env.update(HF_HOME=home, HF_ENDPOINT=endpoint, PYTHONPATH=str(ROOT), **extra)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def pull(ref: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenomy.cli", "pull", ref], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tempfile.mkdtemp(prefix="tokenomy-pull-"))


def serve(ref: str, env: dict[str, str], port: int) -> subprocess.Popen[str]:
    folder = Path(tempfile.mkdtemp(prefix="tokenomy-serve-hub-"))
    (folder / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    return subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", ref, "--config", "config.yaml",
                             "--port", str(port)], env=env, cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def ready(proc: subprocess.Popen[str], port: int) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"tokenomy serve exited {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def assert_answered(chat: dict) -> None:
    """The model answered answer_one's chat: with ignore_eos, exactly its 4 tokens, whatever it said."""
    assert chat["choices"][0]["finish_reason"] == "length" and chat["usage"]["completion_tokens"] == 4, chat


def answer_one(ref: str, env: dict[str, str]) -> tuple[dict, dict, str]:
    """Start `tokenomy serve ref`, ask one short chat and /v1/models; stop it; its output too."""
    port = free_port()
    proc = serve(ref, env, port)
    try:
        wait_until(lambda: ready(proc, port), timeout=240, what="tokenomy serve to answer /health")
        chat = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "model": hub.default_name(ref), "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Say hi."}]})
        assert chat.status_code == 200, chat.text
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    return chat.json(), models, out


def test_serve_downloads_a_hub_model_resuming_a_cut_download_and_answers(
        hub_server: HubServer, hub_home: str, smollm2: Path) -> None:
    ref = f"hf:{REPO}:Q4_1"
    # TQDM_POSITION=-1: huggingface_hub draws its bar on a pipe too, not only on a terminal
    chat, models, out = answer_one(ref, env_for(hub_home, hub_server.url, TQDM_POSITION="-1"))
    assert_answered(chat)
    card = next(m for m in models["data"] if m["id"] == f"{REPO}:Q4_1")
    assert (card["context_window"], card["context_window_source"], card["trained_context"]) == (8192, "gguf", 8192)
    assert card["object"] == "model" and card["owned_by"] == "tokenomy"
    # the server cut the first GET off halfway; huggingface_hub asked for the rest, from where its file ended
    gets = [rng for method, path, rng in hub_server.requests if method == "GET" and path.endswith(GGUF)]
    assert gets[0] is None and len(gets) == 2 and int(gets[1].removeprefix("bytes=").rstrip("-")) > 0
    assert "resume" in out.lower()          # huggingface_hub says so, and draws its progress bar
    assert GGUF in out and "100%" in out
    cached = Path(hub_home) / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots"
    files = list(cached.glob(f"*/{GGUF}"))
    assert len(files) == 1
    assert hashlib.sha256(files[0].read_bytes()).digest() == hashlib.sha256(smollm2.read_bytes()).digest()


def test_offline_the_cached_model_serves_without_the_hub(hub_server: HubServer, hub_home: str) -> None:
    ref = f"hf:{REPO}:Q4_1"
    assert pull(ref, env_for(hub_home, hub_server.url)).returncode == 0          # in the cache (if not yet)
    before = len(hub_server.requests)
    nowhere = f"http://127.0.0.1:{free_port()}"                 # nothing listens there
    chat, _, _ = answer_one(ref, env_for(hub_home, nowhere, offline=True))
    assert_answered(chat)
    assert len(hub_server.requests) == before
    # offline, a model the cache does not hold is one line that says so
    missing = pull("hf:acme/Other-GGUF:Q4_1", env_for(hub_home, nowhere, offline=True))
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        f"tokenomy: hf:acme/Other-GGUF:Q4_1: offline mode (HF_HUB_OFFLINE) is on and the cache "
        f"({hub_home}/hub) has no copy of acme/Other-GGUF"]


def test_a_split_model_downloads_every_part_and_loads_from_the_first(hub_server: HubServer, hub_home: str) -> None:
    done = pull(f"hf:{REPO}:Q8_0", env_for(hub_home, hub_server.url))
    assert done.returncode == 0, done.stderr
    first = Path(done.stdout.strip().splitlines()[-1])
    assert first.name == Path(SPLIT[0]).name
    assert (first.parent / Path(SPLIT[1]).name).read_bytes() == b"part two"   # beside it, where llama.cpp looks


def test_a_real_split_model_is_served_from_its_first_part(smollm2: Path, tmp_path: Path) -> None:
    parts = split(smollm2, tmp_path, "SmolLM2-135M-Instruct-Q4_1")        # as llama.cpp's gguf-split names them
    # the memory check counts every part's tensors (models/gguf.py), as for the whole file
    assert read_gguf(parts[0]).file == replace(read_gguf(smollm2).file, path=str(parts[0]))
    repo = "acme/SmolLM2-split-GGUF"
    with HubServer({repo: {f"Q4_1/{p.name}": p for p in parts}}) as server:
        chat, models, _ = answer_one(f"hf:{repo}", env_for(tempfile.mkdtemp(prefix="tokenomy-hf-home-"), server.url))
    assert_answered(chat)
    assert models["data"][0]["id"] == repo and models["data"][0]["context_window"] == 8192
    gets = sorted(path for method, path, _ in server.requests if method == "GET" and path.endswith(".gguf"))
    assert gets == [f"/{repo}/resolve/main/Q4_1/{p.name}" for p in parts]


@pytest.mark.parametrize(("ref", "line"), [
    ("hf:acme/Nothing-GGUF:Q4_K_M", "hf:acme/Nothing-GGUF:Q4_K_M: no repo 'acme/Nothing-GGUF' on {url} "
                                    "(a private one needs HF_TOKEN)"),
    (f"hf:{REPO}:Q5_K_M", f"hf:{REPO}:Q5_K_M: no quantization 'Q5_K_M'; its .gguf files: {GGUF}, {SPLIT[0]} "
                          "(+1 parts); quantizations: Q4_1, Q8_0"),
    (f"hf:{REPO}:other.gguf", f"hf:{REPO}:other.gguf: no file 'other.gguf'; its .gguf files: {GGUF}, {SPLIT[0]} "
                              "(+1 parts); quantizations: Q4_1, Q8_0"),
])
def test_what_is_missing_is_one_line_that_names_what_exists(hub_server: HubServer, ref: str, line: str) -> None:
    done = pull(ref, env_for(tempfile.mkdtemp(prefix="tokenomy-hf-home-"), hub_server.url))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["tokenomy: " + line.format(url=hub_server.url)]


def test_a_download_killed_midway_resumes_from_its_incomplete_file_on_the_next_run() -> None:
    data = bytes(range(256)) * (24 * 4096)                      # 24 MiB: huggingface_hub writes 10 MiB chunks
    name = "Big-Q4_0.gguf"
    home = tempfile.mkdtemp(prefix="tokenomy-hf-home-")
    with HubServer({"acme/Big-GGUF": {name: data}}, stall_once={name}) as server:
        env = env_for(home, server.url)
        first = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "pull", "hf:acme/Big-GGUF:Q4_0"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        blobs = Path(home) / "hub" / "models--acme--Big-GGUF" / "blobs"

        def partial() -> int:
            return sum(p.stat().st_size for p in blobs.glob("*.incomplete")) if blobs.is_dir() else 0

        try:
            wait_until(lambda: partial() >= 10 << 20, timeout=120, what="the first 10 MiB on disk")
        finally:
            first.kill()
            first.wait()
        kept = partial()
        second = pull("hf:acme/Big-GGUF:Q4_0", env)
        assert second.returncode == 0, second.stderr
        assert Path(second.stdout.strip().splitlines()[-1]).read_bytes() == data
    ranges = [rng for method, path, rng in server.requests if method == "GET" and path.endswith(name)]
    assert ranges == [None, f"bytes={kept}-"]       # the second run asked only for what the first had not written
