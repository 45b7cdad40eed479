"""What a ledger write costs the request that makes it, against the least a hand-off to another thread costs.

    .venv/bin/python bench/ledger_write.py [--rows 20000] [--json]

Three timings of --rows calls each, in one process: the baseline, a bare `queue.Queue.put_nowait` of the same row
(what `Ledger.write` did at heart before it became a deque append); `Ledger.write` to a SQLite ledger whose
writer thread commits as rows come; and `Ledger.write` to a ledger whose database has stalled (its commit waits
until the bench ends), so the queue is full and every row is dropped and counted. Reported: microseconds per call
and the ratio to the baseline. That a write returns while the database is stalled is a test
(tests/ledger/test_ledger.py); this is what it costs.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tokenomy.ledger.ledger import Ledger  # noqa: E402
from tokenomy.ledger.row import LedgerRow  # noqa: E402


def per_call_us(call: Callable[[LedgerRow], None], rows: list[LedgerRow]) -> float:
    t0 = time.perf_counter()
    for r in rows:
        call(r)
    return (time.perf_counter() - t0) / len(rows) * 1e6


def stalled(url: str, rows: list[LedgerRow], gate: threading.Event) -> tuple[float, int]:
    """us per write once the writer is stuck on a commit and the queue (2 rows) is full; rows dropped."""
    led = Ledger(url, max_queue=2)
    commit = led._commit

    def stuck(*args: object) -> None:
        gate.wait()
        commit(*args)

    led._commit = stuck                                  # type: ignore[method-assign]
    led.write(rows[0])
    while led.pending:                                   # the writer has taken it and waits at the gate
        time.sleep(0.001)
    led.write(rows[1])
    led.write(rows[2])                                   # full now
    us = per_call_us(led.write, rows)
    return us, led.dropped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    now = time.time()
    rows = [LedgerRow(request_id=f"bench_{i:07d}", ts=now + i * 1e-3, model="small", prompt_tokens=100,
                      completion_tokens=20) for i in range(args.rows)]
    tmp = tempfile.mkdtemp(prefix="tokenomy-ledger-bench-")
    base = per_call_us(queue.Queue(maxsize=2 * args.rows).put_nowait, rows)
    with Ledger(f"sqlite:///{tmp}/flowing.db", max_queue=2 * args.rows) as led:
        flowing = per_call_us(led.write, rows)
        led.flush(timeout=600)
    gate = threading.Event()
    try:
        stuck, dropped = stalled(f"sqlite:///{tmp}/stalled.db", rows, gate)
    finally:
        gate.set()
    result = {"rows": args.rows, "queue_put_us": base, "write_us": flowing, "write_stalled_us": stuck,
              "stalled_dropped": dropped, "write_ratio": flowing / base, "write_stalled_ratio": stuck / base}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.rows} calls each; baseline: a bare queue put of the same row")
    print(f"{'':36}{'us/call':>10}{'vs baseline':>13}")
    for label, us in (("queue.put_nowait (baseline)", base), ("Ledger.write, database committing", flowing),
                      ("Ledger.write, database stalled", stuck)):
        print(f"{label:36}{us:>10.2f}{us / base:>12.1f}x")
    print(f"stalled: {dropped} rows dropped and counted, none waited for the database")


if __name__ == "__main__":
    main()
