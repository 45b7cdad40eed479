"""How long `tokenomy serve` takes from start to its first answer: start -> /health ready -> first chat completion.

    python bench/first_answer.py [--runs 2] [--tokenomy .venv/bin/tokenomy] [--port 8765] [--keep-home] [--json]
        [--trees BEFORE,AFTER]

Each run starts `tokenomy serve` (no config: the packaged SmolLM2) as a subprocess, polls GET /health every 20 ms,
then sends one chat completion (8 tokens at most) and stops the server. The first run is cold, as on a fresh
checkout: empty $TOKENOMY_HOME and $TOKENOMY_CACHE_DIR (so the embedder's ONNX graph is built and the ledger created);
later runs reuse that run's directories (a second start). `--keep-home` uses the user's own directories instead.
Printed per run: wall seconds to ready and to the answer, the CPU seconds (user + system, threads included) of the
server and its engine processes at each, and the server's own log lines with the second each was read at, which
show the phases, and the resident memory (RSS) of the engine process at ready and after the answer.
`--trees` takes source trees (a checkout of another commit, say) put first on PYTHONPATH in turn, run after run
(each gets its own cold directories first), so a before and an after are measured alternating in one run.
The target of issue 36: the first answer at most 8 s after start, cold (docs/install.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]


def cpu_s(proc: psutil.Process) -> float:
    """User + system CPU seconds of the server and of its engine processes, so far."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def engine_rss(proc: psutil.Process) -> int:
    """Resident bytes of the server's engine processes (children running tokenomy.engine.core), together."""
    total = 0
    for p in proc.children(recursive=True):
        try:
            if "tokenomy.engine.core" in " ".join(p.cmdline()):
                total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def one_run(tokenomy: str, port: int, env: dict[str, str], deadline_s: float) -> dict:
    lines: list[tuple[float, str]] = []
    start = time.perf_counter()
    server = subprocess.Popen([tokenomy, "serve", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, bufsize=1)
    proc = psutil.Process(server.pid)

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            lines.append((time.perf_counter() - start, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    out: dict = {}
    try:
        with httpx.Client(timeout=60) as client:
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"server exited with {server.returncode}")
                if time.perf_counter() - start > deadline_s:
                    raise RuntimeError(f"not ready after {deadline_s} s")
                try:
                    if client.get(f"{base}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)
            out["ready_s"] = time.perf_counter() - start
            out["ready_cpu_s"] = cpu_s(proc)
            out["ready_engine_rss"] = engine_rss(proc)
            model = client.get(f"{base}/v1/models").json()["data"][0]["id"]
            r = client.post(f"{base}/v1/chat/completions", json={
                "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]})
            r.raise_for_status()
            out["answer_s"] = time.perf_counter() - start
            out["answer_cpu_s"] = cpu_s(proc)
            out["answer_engine_rss"] = engine_rss(proc)
            out["answer"] = r.json()["choices"][0]["message"]["content"]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        reader.join(timeout=5)
    out["log"] = [f"{t:6.2f}  {line}" for t, line in lines]
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenomy", default=str(ROOT / ".venv" / "bin" / "tokenomy"))
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--runs", type=int, default=2, help="the first cold, the others reusing its directories")
    ap.add_argument("--keep-home", action="store_true", help="use the user's data and cache directories")
    ap.add_argument("--deadline", type=float, default=300.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trees", default="", help="source trees to alternate, each first on PYTHONPATH "
                    "(default: none, the installed tokenomy)")
    args = ap.parse_args(argv)

    trees = [t for t in args.trees.split(",") if t] or [""]
    scratch = None if args.keep_home else Path(tempfile.mkdtemp(prefix="tokenomy-first-answer-"))
    envs = []
    for j, tree in enumerate(trees):
        env = dict(os.environ)
        if tree:
            env["PYTHONPATH"] = os.pathsep.join([str(Path(tree).resolve()), env.get("PYTHONPATH", "")]).rstrip(":")
        if scratch is not None:
            env["TOKENOMY_HOME"] = str(scratch / str(j) / "home")
            env["TOKENOMY_CACHE_DIR"] = str(scratch / str(j) / "cache")
        envs.append(env)
    results = []
    try:
        for i in range(args.runs):
            for tree, env in zip(trees, envs, strict=True):
                result = one_run(args.tokenomy, args.port, env, args.deadline)
                result["run"] = "cold" if i == 0 and not args.keep_home else "warm"
                result["tree"] = tree
                results.append(result)
                if not args.json:
                    where = f", {tree}" if tree else ""
                    print(f"run {i + 1} ({result['run']}{where}): ready {result['ready_s']:.2f} s "
                          f"(CPU {result['ready_cpu_s']:.2f} s, engine RSS {result['ready_engine_rss'] / 1e9:.3f} GB), "
                          f"first answer {result['answer_s']:.2f} s (CPU {result['answer_cpu_s']:.2f} s, engine RSS "
                          f"{result['answer_engine_rss'] / 1e9:.3f} GB): {result['answer']!r}")
                    for line in result["log"]:
                        print("   ", line)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
