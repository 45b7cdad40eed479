"""Load signals that model servers publish, read from their Prometheus `/metrics` (or llama.cpp server's
`/slots`), at an interval by the pool's checker, never per request.

    waiting   requests queued at the server:  vllm:num_requests_waiting, sglang:num_queue_reqs,
              llamacpp:requests_deferred
    running   requests being generated:       vllm:num_requests_running, sglang:num_running_reqs,
              llamacpp:requests_processing
    kv_usage  share of KV cache in use (0-1): vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before v0.10),
              sglang:token_usage, llamacpp:kv_cache_usage_ratio
A tokenomy server's engines publish vLLM's names (metrics/vllm.py) and are read through them.
Series of one name are summed over their labels (several models or engines on one server), KV usage is their max.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WAITING = {"vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"}
RUNNING = {"vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"}
KV = {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio"}


@dataclass
class LoadSignal:
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None

    @property
    def known(self) -> bool:
        return self.waiting is not None or self.running is not None or self.kv_usage is not None


def parse_prometheus(text: str) -> LoadSignal:
    """The load signal in a Prometheus text exposition (names not listed above are ignored)."""
    out = LoadSignal()
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        if name not in WAITING and name not in RUNNING and name not in KV:
            continue
        try:
            rest = line.rsplit("}", 1)[1] if line[name_end] == "{" else line[name_end:]
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        if name in WAITING:
            out.waiting = (out.waiting or 0.0) + value
        elif name in RUNNING:
            out.running = (out.running or 0.0) + value
        else:
            out.kv_usage = max(out.kv_usage or 0.0, value)
    return out


def parse_slots(slots: Any) -> LoadSignal:
    """llama.cpp server's `/slots` (a list of slots, each with `is_processing`)."""
    if not isinstance(slots, list):
        return LoadSignal()
    return LoadSignal(running=float(sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))))
