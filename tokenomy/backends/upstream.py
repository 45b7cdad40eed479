"""What every HTTP upstream backend (OpenAI-compatible, Anthropic Messages) shares: its health probe, its
metrics and closing its client. A subclass sets `name`, `metrics`, `client` and HEALTH_PATH."""

from __future__ import annotations

from typing import Any

import httpx


class Upstream:
    name: str
    metrics: Any
    client: httpx.AsyncClient
    HEALTH_PATH = "/models"     # relative to the client's base_url

    def expected_wait_s(self) -> float:
        """Unknown for an upstream (it queues on its side); treated as no wait."""
        return 0.0

    def queued(self) -> float | None:
        """Unknown: a single upstream publishes no queue (a pool of them reads its replicas': pool.py)."""
        return None

    async def health(self) -> bool:
        try:
            r = await self.client.get(self.HEALTH_PATH, timeout=2.0)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def close(self) -> None:
        await self.client.aclose()

    def _observe(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.upstream_latency.labels(self.name).observe(seconds)

    def _count_error(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(self.name, kind).inc()
