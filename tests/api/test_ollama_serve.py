"""`tokenomy serve --ollama-port`: every API on a second port (Ollama's 11434 in use, a free one here), and
`/api/pull` through the official `ollama` client downloading a hub model with the hub code `tokenomy pull` uses,
from a hub on loopback (tests/helpers/hub_server.py), with Ollama's status lines."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest
import yaml

from tests.conftest import free_port
from tests.helpers.hub_server import HubServer
from tests.helpers.wait import wait_until
from tests.models.test_hub import CONFIG, GGUF, REPO, env_for, ready
from tokenomy.models.catalog import resolve_gguf

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hub_home() -> str:
    return tempfile.mkdtemp(prefix="tokenomy-ollama-hf-home-")


@pytest.fixture(scope="module")
def served(hub_home: str) -> Iterator[tuple[int, int]]:
    """(port, ollama port) of a `tokenomy serve` whose hub is a HubServer holding REPO."""
    with HubServer({REPO: {GGUF: resolve_gguf(MODEL), "README.md": b"# a test repo\n"}}) as hub:
        port, second = free_port(), free_port()
        folder = Path(tempfile.mkdtemp(prefix="tokenomy-serve-ollama-"))
        (folder / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        env = {**env_for(hub_home, hub.url), "PYTHONPATH": str(ROOT)}      # this checkout's tokenomy
        proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--config", "config.yaml", "--port",
                                 str(port), "--ollama-port", str(second)], env=env, cwd=folder,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_until(lambda: ready(proc, port), timeout=240, what="tokenomy serve to answer /health")
            yield port, second
        finally:
            proc.terminate()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def test_every_api_answers_on_the_second_port(served):
    port, second = served
    for p in (port, second):
        client = ollama.Client(host=f"http://127.0.0.1:{p}", timeout=120)
        assert MODEL + ":latest" in {m.model for m in client.list().models}
        assert client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2},
                           stream=False).done


def test_pull_downloads_a_hub_model_with_ollamas_status_lines(served, hub_home):
    client = ollama.Client(host=f"http://127.0.0.1:{served[1]}", timeout=300)
    statuses = list(client.pull(f"hf.co/{REPO}:Q4_1", stream=True))
    names = [s.status for s in statuses]
    assert names[0] == "pulling manifest" and names[-1] == "success"
    size = resolve_gguf(MODEL).stat().st_size
    progress = [s for s in statuses if s.status == f"pulling {GGUF}"]     # while it downloads, then done
    assert all(s.total == size and 0 <= s.completed <= size for s in progress)
    assert progress[-1].completed == size
    cached = list(Path(hub_home).rglob(GGUF))
    assert cached and cached[0].stat().st_size == size        # in the hub cache, as `tokenomy pull` leaves it
    pulled = f"hf.co/{REPO}:Q4_1"                             # served from now on, loaded on its first request
    assert pulled in {m.model for m in client.list().models}
    r = client.chat(model=pulled, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2},
                    stream=False)
    assert r.done and r.eval_count and r.load_duration > 0
    assert pulled in {m.model for m in client.ps().models}
    assert client.pull(pulled).status == "success"            # served already: no second download
    assert client.pull(MODEL + ":latest").status == "success"        # served already
    with pytest.raises(ollama.ResponseError) as e:
        client.pull(f"hf.co/{REPO}:Q8_0")
    assert e.value.status_code == 404 and "Q4_1" in e.value.error         # what the repo holds instead
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.2")
    assert e.value.status_code == 404 and "hf.co/" in e.value.error


def test_delete_removes_a_pulled_model_from_the_hub_cache_and_never_a_served_one(served, hub_home):
    client = ollama.Client(host=f"http://127.0.0.1:{served[0]}", timeout=300)
    assert client.pull(f"hf.co/{REPO}:Q4_1").status == "success"
    blob = next(Path(hub_home).rglob(GGUF)).resolve()       # the snapshot's link -> blobs/ETAG
    assert blob.exists() and blob.name != GGUF
    assert client.delete(f"hf.co/{REPO}:Q4_1").status == "success"      # served no longer, and gone
    assert not list(Path(hub_home).rglob(GGUF)) and not blob.exists()
    assert f"hf.co/{REPO}:Q4_1" not in {m.model for m in client.list().models}
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=f"hf.co/{REPO}:Q4_1", messages=[{"role": "user", "content": "Hi"}])
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.delete(f"hf.co/{REPO}:Q4_1")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.delete(MODEL)
    assert e.value.status_code == 400 and "served" in e.value.error
    assert MODEL + ":latest" in {m.model for m in client.list().models}
