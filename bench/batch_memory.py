"""What creating a batch allocates per input line, counted (tracemalloc), not timed.

    PYTHONPATH=. .venv/bin/python bench/batch_memory.py [--small 2000] [--large 8000]

Creates a batch of --small and then of --large one-message chat lines on a fresh SQLite store and prints Python's
peak traced allocation for each, and (large - small - the extra file bytes) / (large - small): the bytes a line
costs beyond its own text. Run it on two checkouts to compare (docs/hardening.md, issue 50).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import tracemalloc

from tokenomy.batch.database import BatchStore
from tokenomy.ledger.ledger import Ledger


def line(cid: str) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}]}})


def peak(store: BatchStore, n: int) -> tuple[int, int]:
    content = "\n".join(line(f"k{i}") for i in range(n)).encode()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    store.create_batch("k", "t", "file-x", "/v1/chat/completions", "24h", None, content)
    top = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return top, len(content)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--large", type=int, default=8000)
    a = ap.parse_args()
    with Ledger(f"sqlite:///{tempfile.mkdtemp()}/l.db") as led:
        store = BatchStore(led.engine)
        (s, sb), (lg, lb) = peak(store, a.small), peak(store, a.large)
    print(f"{a.small} lines: peak {s:,} B ({sb:,} B of file); {a.large} lines: peak {lg:,} B ({lb:,} B of file)")
    print(f"bytes a line beyond its text: {(lg - s - (lb - sb)) / (a.large - a.small):,.0f}")


if __name__ == "__main__":
    main()
