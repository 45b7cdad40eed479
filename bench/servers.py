"""What the benchmarks that start servers share: a free loopback port, and waiting until a URL answers 200."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Sequence

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, procs: Sequence[subprocess.Popen] = (), timeout_s: float = 300.0) -> None:
    """Return once `url` answers 200; RuntimeError when one of `procs` exits first or time runs out (the
    processes are then killed)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    for p in procs:
        p.kill()
    raise RuntimeError(f"{url} did not come up")
