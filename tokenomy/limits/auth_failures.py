"""Failed authentication, counted per source address: past `limit` failures within `window_s`, that source is
refused (429 with Retry-After) before its key is even looked at, until the window has room again. In memory, per
gateway process; a success does not reset the count (a guesser holding one valid key gains nothing)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from tokenomy.errors import APIError


class AuthFailures:
    def __init__(self, limit: int = 10, window_s: float = 60.0, max_sources: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window_s, self.max_sources, self.clock = limit, window_s, max_sources, clock
        self._by_source: dict[str, deque[float]] = {}

    def _recent(self, source: str, now: float) -> deque[float] | None:
        times = self._by_source.get(source)
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if times is not None and not times:
            del self._by_source[source]
            return None
        return times

    def check(self, source: str) -> None:
        """A 429 when `source` has failed `limit` times within the window."""
        now = self.clock()
        times = self._recent(source, now)
        if times is not None and len(times) >= self.limit:
            wait = max(1, math.ceil(times[0] + self.window_s - now))
            raise APIError(429, f"Too many failed authentications from this address; retry in {wait} s.",
                           code="too_many_auth_failures", headers={"Retry-After": str(wait)})

    def failed(self, source: str) -> None:
        now = self.clock()
        if source not in self._by_source and len(self._by_source) >= self.max_sources:
            for s in list(self._by_source)[: self.max_sources // 10]:     # the oldest sources make room
                del self._by_source[s]
        self._by_source.setdefault(source, deque()).append(now)
