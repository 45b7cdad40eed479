"""How long `tokenomy serve` takes from start to its first answer: start -> /health ready -> first chat completion.

    python bench/first_answer.py [--runs 2] [--tokenomy .venv/bin/tokenomy] [--port 8765] [--keep-home] [--json]

Each run starts `tokenomy serve` (no config: the packaged SmolLM2) as a subprocess, polls GET /health every 20 ms,
then sends one chat completion (8 tokens at most) and stops the server. The first run is cold, as on a fresh
checkout: empty $TOKENOMY_HOME and $TOKENOMY_CACHE_DIR (so the embedder's ONNX graph is built and the ledger created);
later runs reuse that run's directories (a second start). `--keep-home` uses the user's own directories instead.
Printed per run: wall seconds to ready and to the answer, the CPU seconds (user + system, threads included) of the
server and its engine processes at each, and the server's own log lines with the second each was read at, which
show the phases.
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
            model = client.get(f"{base}/v1/models").json()["data"][0]["id"]
            r = client.post(f"{base}/v1/chat/completions", json={
                "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]})
            r.raise_for_status()
            out["answer_s"] = time.perf_counter() - start
            out["answer_cpu_s"] = cpu_s(proc)
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
    args = ap.parse_args(argv)

    env = dict(os.environ)
    scratch = None
    if not args.keep_home:
        scratch = Path(tempfile.mkdtemp(prefix="tokenomy-first-answer-"))
        env["TOKENOMY_HOME"] = str(scratch / "home")
        env["TOKENOMY_CACHE_DIR"] = str(scratch / "cache")
    results = []
    try:
        for i in range(args.runs):
            result = one_run(args.tokenomy, args.port, env, args.deadline)
            result["run"] = "cold" if i == 0 and not args.keep_home else "warm"
            results.append(result)
            if not args.json:
                print(f"run {i + 1} ({result['run']}): ready {result['ready_s']:.2f} s (CPU "
                      f"{result['ready_cpu_s']:.2f} s), first answer {result['answer_s']:.2f} s (CPU "
                      f"{result['answer_cpu_s']:.2f} s): {result['answer']!r}")
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
