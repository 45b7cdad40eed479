"""What tracing costs the event loop, in instructions: deterministic where CPU time on a shared machine is not
(docs/telemetry.md, "What it costs"). One gateway in this process, tracing off or on (spans to an OTLP/HTTP sink
that drops them), in front of the stub upstream (tests/helpers/upstream_stub.py, its own process), driven through
httpx's ASGI transport: `--warm` streamed chat requests, then `--requests` more counted by valgrind's callgrind on the
event loop's thread (instrumentation on only for them), off and on one after the other. Needs valgrind (Debian:
`apt-get install valgrind`); a run takes minutes, as everything runs some 50 times slower under it.

    .venv/bin/python bench/tracing_instructions.py [--requests 200] [--warm 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import free_port, wait_up  # noqa: E402  (bench/servers.py, beside this script)


def counted(mode: str, n: int, warm: int) -> None:
    """Under callgrind: the gateway (tracing `mode`) and its requests; instrumentation on for the last `n`."""
    import httpx

    from tokenomy.api.app import create_app
    from tokenomy.config import Config
    from tokenomy.gateway import Gateway

    stub, sink = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LD_PRELOAD")) and "VALGRIND" not in k}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.helpers.upstream_stub", "--port", str(stub)], cwd=ROOT,
                              env=env),
             subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "gateway_overhead.py"), "--otlp-sink",
                               str(sink)], env=env)]
    for k in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[k]
    data: dict = {"models": [{"name": "up", "backend": "openai", "base_url": f"http://127.0.0.1:{stub}/v1",
                              "model": "stub", "tokenizer": "cl100k_base"}],
                  "cache": {"path": tempfile.mkdtemp(prefix="tokenomy-bench-")},
                  "ledger": "sqlite:///" + tempfile.mkdtemp(prefix="tokenomy-bench-") + "/ledger.db"}
    if mode == "on":
        data["telemetry"] = {"traces": True, "endpoint": f"http://127.0.0.1:{sink}/v1/traces"}
    body = {"model": "up", "messages": [{"role": "user", "content": "hi"}], "stream": True}

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(os.getpid())], stdout=subprocess.DEVNULL, env=env, check=True)

    async def run() -> None:
        app = create_app(Gateway(Config.model_validate(data)))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway",
                                     timeout=None) as client:
            async def one() -> None:
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        raise RuntimeError(f"{r.status_code} {(await r.aread())[:300]!r}")
                    async for _ in r.aiter_bytes():
                        pass
            for _ in range(warm):
                await one()
            control("-i", "on")
            for _ in range(n):
                await one()
            control("-i", "off")

    try:
        wait_up(f"http://127.0.0.1:{stub}/v1/models", procs, timeout_s=600)
        asyncio.run(run())
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def main_thread_instructions(out: str) -> int:
    """The event loop's (the main thread's, callgrind's file `-01`) instruction count."""
    with open(out + "-01") as f:
        for line in f:
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"{out}-01 has no totals")


def process_instructions(out: str) -> int:
    """Every thread's instruction count together (callgrind's files `-01`, `-02` ...): the event loop's and the
    threads that share its interpreter lock (an export thread, the ledger writer)."""
    total = 0
    for path in glob.glob(out + "-*"):
        with open(path) as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("totals:"))
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--counted", choices=["off", "on"], help=argparse.SUPPRESS)    # the process under callgrind
    args = ap.parse_args()
    if args.counted:
        return counted(args.counted, args.requests, args.warm)
    if shutil.which("valgrind") is None:
        sys.exit("needs valgrind on PATH (Debian/Ubuntu: apt-get install valgrind)")
    work = tempfile.mkdtemp(prefix="tokenomy-callgrind-")
    per: dict[str, float] = {}
    every: dict[str, float] = {}
    for mode in ("off", "on"):
        out = os.path.join(work, mode)
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                        f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__), "--counted", mode,
                        "--requests", str(args.requests), "--warm", str(args.warm)],
                       cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": ROOT},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        per[mode] = main_thread_instructions(out) / args.requests
        every[mode] = process_instructions(out) / args.requests
    for path in glob.glob(os.path.join(work, "*")):
        os.unlink(path)
    os.rmdir(work)
    row = {"requests": args.requests, "off": per["off"], "on": per["on"], "added": per["on"] - per["off"],
           "added_pct": (per["on"] / per["off"] - 1) * 100, "process_off": every["off"], "process_on": every["on"],
           "process_added": every["on"] - every["off"]}
    if args.json:
        print(json.dumps(row, indent=2))
        return
    print(f"event loop instructions a streamed chat request ({args.requests} counted): off {per['off']:,.0f}, "
          f"on {per['on']:,.0f}, tracing adds {row['added']:+,.0f} ({row['added_pct']:+.2f} %); the gateway "
          f"process's threads together: off {every['off']:,.0f}, on {every['on']:,.0f}, "
          f"{row['process_added']:+,.0f}")


if __name__ == "__main__":
    main()
