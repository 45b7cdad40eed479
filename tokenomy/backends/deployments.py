"""The deployments tokenomy can send to, by model name, with failure cool-downs."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from tokenomy.backends.base import Backend


@dataclass
class Health:
    failures: deque[float] = field(default_factory=deque)
    cooling_until: float = 0.0


class Registry:
    def __init__(self, failures: int = 3, window_s: float = 60.0, cooldown_s: float = 30.0) -> None:
        self.backends: dict[str, Backend] = {}
        self.health: dict[str, Health] = {}
        self.failures, self.window_s, self.cooldown_s = failures, window_s, cooldown_s

    def add(self, backend: Backend) -> None:
        self.backends[backend.name] = backend
        self.health[backend.name] = Health()

    def remove(self, name: str) -> Backend | None:
        """Stop routing to `name` (its backend returned, for the caller to close)."""
        self.health.pop(name, None)
        return self.backends.pop(name, None)

    def get(self, name: str) -> Backend:
        return self.backends[name]

    def __contains__(self, name: object) -> bool:
        return name in self.backends

    def cooling(self, name: str) -> bool:
        return time.monotonic() < self.health[name].cooling_until

    def failed(self, name: str) -> None:
        """Count a failure; N failures within the window cool the deployment down."""
        h, now = self.health[name], time.monotonic()
        h.failures.append(now)
        while h.failures and now - h.failures[0] > self.window_s:
            h.failures.popleft()
        if len(h.failures) >= self.failures:
            h.cooling_until = now + self.cooldown_s
            h.failures.clear()

    def succeeded(self, name: str) -> None:
        self.health[name].failures.clear()

    async def close(self) -> None:
        for b in self.backends.values():
            await b.close()
