"""CPU time a non-streamed request costs each server process, arm against arm (issue 37; docs/hardening.md,
"Gateway overhead"): work done, which a busy machine's clock does not show. One instant stub upstream
(tests/helpers/upstream_stub.py); each arm its own server process in front of it: `bare` (bench/gateway_overhead.py's
bare proxy, stock httpx), `tokenomy` (one upstream model, no keys) or `keyed` (a key and a budget), served by
uvicorn with the parser and event loop named (`h11` or `httptools`, `asyncio` or `uvloop`); a `stock-` prefix runs
tokenomy with its upstream clients as before issue 37's third pass: httpx's pool with h11 for every upstream, and
httpx's cookie jar asked at every answer (backends/transport.py). `hey -n N -c C` (the Debian package) sends the
requests, after a warm-up, in rounds whose arm order alternates; each figure is one round's CPU (user + system,
all threads) of the server process over its requests.

    .venv/bin/python bench/gateway_cpu.py [-c 1] [-n 2000] [--rounds 3] [ARM ...]
    .venv/bin/python bench/gateway_cpu.py bare:h11:asyncio stock-tokenomy:h11:asyncio \\
        bare:httptools:uvloop tokenomy:httptools:uvloop keyed:httptools:uvloop

An arm written `base/KIND:HTTP:LOOP` runs the tokenomy source tree given by --baseline (e.g. an older commit:
`git archive COMMIT | tar -x -C /tmp/base`), so a change and its baseline are measured side by side in one run:

    .venv/bin/python bench/gateway_cpu.py --baseline /tmp/base base/keyed:h11:asyncio keyed:h11:asyncio
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
from servers import free_port, wait_up  # noqa: E402  (bench/servers.py, beside this script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = json.dumps({"model": "up", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
KEY = "sk-bench-cpu"
KINDS = ("bare", "tokenomy", "keyed", "stock-tokenomy", "stock-keyed")


def server(kind: str, http: str, loop: str, port: int, upstream: str, root: str = ROOT) -> list[str]:
    """The command line of one arm's server process (tokenomy imported from `root`)."""
    if kind == "bare":
        code = (f"import sys; sys.path[:0] = [{ROOT!r}, {os.path.join(ROOT, 'bench')!r}]\n"
                f"import tokenomy.server.process as s; "
                f"s.uvicorn_options = lambda: {{'http': {http!r}, 'loop': {loop!r}}}\n"
                f"import gateway_overhead; gateway_overhead.bare_proxy({port}, {upstream!r})")
        return [sys.executable, "-c", code]
    config = (f"models:\n  - {{name: up, backend: openai, base_url: '{upstream}', model: stub, "
              f"tokenizer: cl100k_base}}\n")
    if kind.endswith("keyed"):
        config += (f"keys: [{{key: {KEY}, name: bench, budget: {{tokens_per_day: 1000000000000, "
                   f"usd_per_day: 1000000}}}}]\n")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config)
    stock = ("import httpx, tokenomy.backends.transport as t; t.httptools = None; t.Cookies = httpx.Cookies\n"
             if kind.startswith("stock-") else "")
    code = (f"import sys; sys.path.insert(0, {root!r})\n{stock}"
            f"import tokenomy.server.process as s; s.uvicorn_options = lambda: {{'http': {http!r}, 'loop': {loop!r}}}\n"
            f"import tokenomy.server.command as c\n"
            f"c.run(port={port}, config_path=__import__('pathlib').Path({f.name!r}))")
    return [sys.executable, "-c", code]


def hey(port: int, n: int, c: int, keyed: bool) -> None:
    cmd = ["hey", "-n", str(n), "-c", str(c), "-m", "POST", "-T", "application/json", "-d", BODY]
    if keyed:
        cmd += ["-H", f"Authorization: Bearer {KEY}"]
    out = subprocess.run([*cmd, f"http://127.0.0.1:{port}/v1/chat/completions"], capture_output=True, text=True,
                         check=True).stdout
    if f"[200]\t{n} responses" not in out:
        raise RuntimeError(f"not every answer was 200:\n{out[-600:]}")


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arms", nargs="*", metavar="KIND:HTTP:LOOP",
                    default=["bare:httptools:uvloop", "tokenomy:httptools:uvloop", "keyed:httptools:uvloop"])
    ap.add_argument("-c", type=int, default=1, help="concurrent connections")
    ap.add_argument("-n", type=int, default=2000, help="requests a round (a multiple of -c)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="a tokenomy source tree the base/ arms run")
    args = ap.parse_args()
    if shutil.which("hey") is None:
        sys.exit("needs hey on PATH (Debian/Ubuntu: apt-get install hey; `bash install.sh test` does it)")
    n = max(args.n // args.c, 1) * args.c
    def spec(arm: str) -> tuple[list[str], str]:
        if arm.startswith("base/"):
            if args.baseline is None:
                sys.exit(f"{arm}: base/ arms need --baseline DIR")
            return arm[5:].split(":"), os.path.abspath(args.baseline)
        return arm.split(":"), ROOT

    for arm in args.arms:
        kind = spec(arm)[0][0]
        if kind not in KINDS:
            sys.exit(f"{arm}: the kind is one of {', '.join(KINDS)}")
    stub_port = free_port()
    upstream = f"http://127.0.0.1:{stub_port}/v1"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.helpers.upstream_stub", "--port", str(stub_port)],
                              cwd=ROOT)]
    ports = {}
    try:
        for arm in args.arms:
            ports[arm] = free_port()
            (kind, http, loop), root = spec(arm)
            procs.append(subprocess.Popen(server(kind, http, loop, ports[arm], upstream, root), cwd=ROOT,
                                          stderr=subprocess.DEVNULL,
                                          env={**os.environ, "TOKENOMY_HOME": tempfile.mkdtemp(prefix="gw-cpu-")}))
        wait_up(f"{upstream}/models", procs)
        for arm in args.arms:
            wait_up(f"http://127.0.0.1:{ports[arm]}/health", procs)
        pids = dict(zip(args.arms, (p.pid for p in procs[1:]), strict=True))
        for arm in args.arms:       # warm-up: connections, first-request imports, the tokenizer
            hey(ports[arm], 300 // args.c * args.c or args.c, args.c, "keyed" in arm)
        ms: dict[str, list[float]] = {arm: [] for arm in args.arms}
        for r in range(args.rounds):
            for arm in args.arms if r % 2 == 0 else args.arms[::-1]:
                before = cpu_s(pids[arm])
                hey(ports[arm], n, args.c, "keyed" in arm)
                time.sleep(0.3)     # the ledger's last commit
                ms[arm].append((cpu_s(pids[arm]) - before) / n * 1e3)
        print(f"CPU ms a request of each server process, hey -n {n} -c {args.c}, {args.rounds} rounds:")
        for arm, xs in ms.items():
            print(f"  {arm:32s} " + "  ".join(f"{x:.3f}" for x in xs) + f"   median {sorted(xs)[len(xs) // 2]:.3f}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
