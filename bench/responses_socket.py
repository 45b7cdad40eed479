"""A 20-turn tool loop over the Responses API's WebSocket mode against the same loop over HTTP, in one run.

An agent's tool loop: the first turn asks, every turn the model calls a function (`tool_choice: required`, so the
loop's length does not depend on the model's words), and the next turn feeds the call's output back with
`previous_response_id`. Over the socket (`client.beta.responses.connect()`, `store: false`: the chain lives in
the socket's memory) and over HTTP (`client.responses.create(stream=True)`, `store: true`, which HTTP
continuation needs: each turn reads the stored conversation back from the ledger's database). Both stream every
event and use greedy decoding. Each loop's first question carries its own tag, so that one loop never finds the
other's conversation in the prefix cache (only the shared tools and system text). Rounds alternate which goes
first; the response caches are off. Printed: per loop, its wall time (median over rounds, and each round's) and
the median turn, the prompt and cached tokens it was billed (medians over rounds: work counted,
machine-independent), and the ratio socket / HTTP of the median loop times.

It starts `tokenomy serve` on a free port with the packaged default model, unless `--base-url` names a running
one (whose response caches should be off).

    .venv/bin/python bench/responses_socket.py [--turns 20] [--rounds 3] [--max-tokens 40] [--base-url URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from servers import free_port, wait_up  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "smollm2-135m-instruct"
LOOKUP: Any = {"type": "function", "name": "lookup", "description": "Look a word up in the dictionary",
               "strict": True, "parameters": {"type": "object", "properties": {"word": {"type": "string",
                                                                                        "maxLength": 12}},
                                              "required": ["word"], "additionalProperties": False}}
ASK = "Look up the words of this sentence one by one: the quick brown fox jumps over the lazy dog."


def ask(tag: str) -> str:
    """The first turn's question, tagged per loop: the two loops would otherwise send the same prompts, and the
    second would find the first's whole conversation in the prefix cache. The tools and system text stay shared."""
    return f"[{tag}] {ASK}"
ENDS = ("response.completed", "response.incomplete", "response.failed", "error")


def settings(max_tokens: int) -> dict[str, Any]:
    return dict(model=MODEL, tools=[LOOKUP], tool_choice="required", max_output_tokens=max_tokens, temperature=0)


def next_input(response: Any, turn: int) -> list[dict[str, Any]]:
    calls = [o for o in response.output if o.type == "function_call"]
    if not calls:
        raise RuntimeError(f"turn {turn} made no call: {response.output}")
    return [{"type": "function_call_output", "call_id": c.call_id, "output": f"entry {turn}: a common word"}
            for c in calls]


def socket_loop(client: openai.OpenAI, turns: int, max_tokens: int, tag: str) -> tuple[list[float], int, int]:
    """(seconds per turn, prompt tokens, cached tokens) of one loop over one socket."""
    times, prompt, cached = [], 0, 0
    with client.beta.responses.connect() as conn:
        previous: str | None = None
        data: Any = ask(tag)
        for turn in range(turns):
            t0 = time.perf_counter()
            extra = {"previous_response_id": previous} if previous else {}
            conn.response.create(input=data, store=False, **settings(max_tokens), **extra)
            for event in conn:
                if event.type in ENDS:
                    break
            times.append(time.perf_counter() - t0)
            if event.type == "error" or event.type == "response.failed":
                raise RuntimeError(f"turn {turn} failed: {event}")
            response = event.response
            prompt += response.usage.input_tokens
            cached += response.usage.input_tokens_details.cached_tokens
            previous, data = response.id, next_input(response, turn)
    return times, prompt, cached


def http_loop(client: openai.OpenAI, turns: int, max_tokens: int, tag: str) -> tuple[list[float], int, int]:
    """The same loop over HTTP, streamed, continued by previous_response_id from the store."""
    times, prompt, cached = [], 0, 0
    previous: str | None = None
    data: Any = ask(tag)
    for turn in range(turns):
        t0 = time.perf_counter()
        extra = {"previous_response_id": previous} if previous else {}
        final = None
        for event in client.responses.create(input=data, stream=True, **settings(max_tokens), **extra):
            if event.type in ENDS:
                final = event
        times.append(time.perf_counter() - t0)
        if final is None or final.type in ("error", "response.failed"):
            raise RuntimeError(f"turn {turn} failed: {final}")
        response = final.response
        prompt += response.usage.input_tokens
        cached += response.usage.input_tokens_details.cached_tokens
        previous, data = response.id, next_input(response, turn)
    return times, prompt, cached


def start_server() -> tuple[subprocess.Popen, str]:
    home = tempfile.mkdtemp(prefix="tokenomy-bench-ws-")
    path = os.path.join(home, "tokenomy.yaml")
    with open(path, "w") as f:
        f.write("cache: {exact: {enabled: false}, semantic: {enabled: false}}\n"
                f"ledger: sqlite:///{home}/ledger.db\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port), "--config", path],
                            cwd=ROOT, env=dict(os.environ, TOKENOMY_HOME=home), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_up(f"http://127.0.0.1:{port}/health", [proc])
    return proc, f"http://127.0.0.1:{port}/v1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--base-url", default=None)
    args = ap.parse_args()
    proc, base = (None, args.base_url) if args.base_url else start_server()
    try:
        client = openai.OpenAI(base_url=base, api_key=os.environ.get("OPENAI_API_KEY", "unused"), max_retries=0,
                               timeout=600)
        loops = {"socket": socket_loop, "http": http_loop}
        socket_loop(client, 2, args.max_tokens, "warm-up")   # the model, the grammar, the tools' prefix
        results: dict[str, list[tuple[list[float], int, int]]] = {name: [] for name in loops}
        for r in range(args.rounds):
            order = list(loops) if r % 2 == 0 else list(loops)[::-1]
            for name in order:
                results[name].append(loops[name](client, args.turns, args.max_tokens, f"{name} {r}"))
        print(f"{args.turns}-turn tool loop, max_output_tokens {args.max_tokens}, {args.rounds} rounds, {base}")
        print(f"{'':8} {'loop s (median)':>16} {'turn ms (median)':>17} {'prompt tok':>11} {'cached tok':>11}"
              "   loop s per round")
        medians = {}
        for name, runs in results.items():
            medians[name] = statistics.median(sum(t) for t, _, _ in runs)
            turn = statistics.median(x for t, _, _ in runs for x in t) * 1000
            prompt = int(statistics.median(p for _, p, _ in runs))
            cached = int(statistics.median(c for _, _, c in runs))
            each = " ".join(f"{sum(t):.1f}" for t, _, _ in runs)
            print(f"{name:8} {medians[name]:16.3f} {turn:17.1f} {prompt:11d} {cached:11d}   {each}")
        print(f"socket / http: {medians['socket'] / medians['http']:.3f}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
