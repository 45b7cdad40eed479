"""A pool of replicas of one model: several OpenAI-compatible servers (vLLM, SGLang, llama.cpp server, tokenomy
engines, mixed), one backend to the pipeline.

Choosing (`balance.policy`); load = requests this gateway has outstanding at the replica + the requests the
replica says are waiting (scraped, see load_signals.py):
    least_outstanding  the least-loaded replica
    prefix             the replica holding the longest prefix of the rendered prompt (prefix_index.py), unless its
                       load exceeds the least-loaded one's by more than `margin`; no match: the least-loaded
    session            one replica per session (the `affinity_header`, else the request's `user`), by rendezvous
                       hashing, so sessions move only off a replica that leaves; no session: the least-loaded
    round_robin        in turn
Failover: a replica that fails before the first delta of its answer (unreachable, busy, 5xx, misconfigured: a
401, 403 or 404, dropped connection, a stream that ends before any text) is left for the next one, least-loaded
first, so the client never sees the failure; after the first delta a failure ends the stream with an error, as for
any backend. The client's own fault (an upstream's 400, 413, 422) is not tried on another replica. Each replica is
an upstream client (upstream.py): its statuses mean what they mean for any upstream. The dead replica's
partial work is lost with it, so a request may be generated twice (never sent twice to a live replica).
Health: `eject_after` consecutive failures eject a replica for `eject_s`, doubling with each ejection in a row
up to `max_eject_s`; a success clears both. Every `check_interval_s` each replica's `/models` is asked (a replica
that does not answer is down until it does) and its load signal is read. When every replica is out, all are
tried anyway: an ejection is a guess, a 503 is certain.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from tokenomy.backends.base import BackendError, Embeddings
from tokenomy.backends.load_signals import LoadSignal, parse_prometheus, parse_slots
from tokenomy.backends.openai import OpenAIBackend
from tokenomy.backends.prefix_index import PrefixIndex, render
from tokenomy.config import OpenAIModelSpec
from tokenomy.context.tokens import TokenCount
from tokenomy.generation import Delta, GenRequest
from tokenomy.metrics.prometheus import Metrics

log = logging.getLogger("tokenomy.pool")


@dataclass
class Replica:
    name: str                     # label in metrics and ledger rows: host:port
    url: str
    backend: OpenAIBackend
    outstanding: int = 0          # this gateway's requests at the replica now
    failures: int = 0             # in a row
    ejections: int = 0            # in a row
    ejected_until: float = 0.0
    up: bool = True               # the last active check answered
    signal: LoadSignal = field(default_factory=LoadSignal)
    served: int = 0
    failed: int = 0

    @property
    def load(self) -> float:
        return self.outstanding + (self.signal.waiting or 0.0)

    def eligible(self, now: float) -> bool:
        return self.up and now >= self.ejected_until


def replica_names(urls: list[str]) -> list[str]:
    """host:port for each URL, or the whole URL where two replicas share a host and port."""
    short = [urlsplit(u).netloc or u for u in urls]
    return [s if short.count(s) == 1 else u for s, u in zip(short, urls, strict=True)]


class Pool:
    def __init__(self, spec: OpenAIModelSpec, metrics: Metrics | None = None) -> None:
        assert spec.replicas, "a pool needs replicas"
        self.name, self.spec, self.balance = spec.name, spec, spec.balance
        self.metrics = metrics
        # Another replica is the retry: a dead one should cost one refused connection, not backed-off retries.
        retries = spec.max_retries if len(spec.replicas) == 1 else 0
        self.replicas = [
            Replica(n, u, OpenAIBackend(spec.model_copy(update={"base_url": u, "replicas": None,
                                                                "max_retries": retries}), metrics))
            for n, u in zip(replica_names(spec.replicas), spec.replicas, strict=True)]
        self.index = PrefixIndex(spec.balance.block_chars, spec.balance.max_blocks)
        self._turn = itertools.count()
        self._checker: asyncio.Task[None] | None = None
        self.routed: dict[tuple[str, str], int] = {}     # (replica, by) -> requests (metrics)

    def __repr__(self) -> str:
        return f"Pool({self.name!r}, {[r.url for r in self.replicas]!r})"

    # --- the Backend protocol -----------------------------------------------------------------------------------

    def count_tokens(self, req: GenRequest) -> TokenCount:
        return self.replicas[0].backend.count_tokens(req)

    def expected_wait_s(self) -> float:
        return 0.0

    def queued(self) -> float | None:
        """Requests waiting at the least-queued replica that can take one, as the replicas publish it (scraped
        load signals); None while some such replica publishes none."""
        now = time.monotonic()
        waits = [r.signal.waiting for r in self.replicas if r.eligible(now)]
        if not waits or any(w is None for w in waits):
            return None
        return min(w for w in waits if w is not None)

    async def health(self) -> bool:
        return any(await asyncio.gather(*(r.backend.health() for r in self.replicas)))

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            self._checker = None
        for r in self.replicas:
            await r.backend.close()

    async def stream(self, req: GenRequest) -> AsyncIterator[Delta]:
        self._start_checker()
        hashes = self.index.blocks(render(req.kind, req.messages, req.prompt)) if self._wants_prefix else []
        order, by = self.order(req, hashes)
        errors: list[tuple[str, BackendError]] = []
        for i, r in enumerate(order):
            r.outstanding += 1
            inner = r.backend.stream(req)
            try:
                first = await anext(inner)
            except StopAsyncIteration:
                first = None
                err: BackendError | None = BackendError(f"{r.name} ended its answer before it began")
            except BackendError as e:
                first, err = None, e
            except BaseException:
                r.outstanding -= 1
                await inner.aclose()
                raise
            if first is None:
                r.outstanding -= 1
                await inner.aclose()
                assert err is not None
                if not err.retryable:
                    raise err
                self._failed(r, str(err))
                errors.append((r.name, err))
                continue
            self._succeeded(r, "failover" if i else by)
            if hashes:
                self.index.insert(hashes, r.name)
            try:
                yield self._mark(first, r)
                if not first.last:
                    async for d in inner:
                        yield self._mark(d, r)
            finally:
                r.outstanding -= 1
                await inner.aclose()
            return
        raise self._none_served(errors)

    async def embed(self, req: GenRequest) -> Embeddings:
        """An embeddings request, on the replica `balance` picks (by load or session: a prefix means nothing
        here), failed over to the next on a failure that another replica may not have."""
        self._start_checker()
        order, by = self.order(req)
        errors: list[tuple[str, BackendError]] = []
        for i, r in enumerate(order):
            r.outstanding += 1
            try:
                out = await r.backend.embed(req)
            except BackendError as e:
                if not e.retryable:
                    raise
                self._failed(r, str(e))
                errors.append((r.name, e))
                continue
            finally:
                r.outstanding -= 1
            self._succeeded(r, "failover" if i else by)
            out.usage.replica = r.name
            return out
        raise self._none_served(errors)

    def _none_served(self, failures: list[tuple[str, BackendError]]) -> BackendError:
        """The pool's failure when every replica failed: what a client should see of them together (the same
        rule as the generate stage's over models): busy (503) with the soonest Retry-After any replica sent;
        `lasting` only when every replica is misconfigured; else a bad gateway (502)."""
        errors = [e for _, e in failures]
        waits = [e.retry_after for e in errors if e.retry_after is not None]
        lasting = bool(errors) and all(e.lasting for e in errors)
        busy = any(e.status == 503 for e in errors)
        detail = "; ".join(f"{r}: {e}" for r, e in failures)
        return BackendError(f"no replica of {self.name} could serve ({detail})",
                            status=503 if busy else 502, retry_after=min(waits) if waits else None,
                            lasting=lasting)

    # --- choosing -----------------------------------------------------------------------------------------------

    @property
    def _wants_prefix(self) -> bool:
        return self.balance.policy == "prefix"

    def order(self, req: GenRequest, hashes: list[int] | None = None) -> tuple[list[Replica], str]:
        """The replicas to try, first choice first, and what chose the first (prefix | load | session | turn)."""
        now = time.monotonic()
        live = [r for r in self.replicas if r.eligible(now)] or sorted(self.replicas, key=lambda r: r.ejected_until)
        turn = next(self._turn)
        # least load first; ties go round in turn, so an idle pool spreads its requests
        by_load = sorted(live, key=lambda r: (r.load, (self.replicas.index(r) - turn) % len(self.replicas)))
        policy, first, by = self.balance.policy, by_load[0], "load"
        if policy == "round_robin":
            first, by = live[turn % len(live)], "turn"
        elif policy == "prefix" and hashes:
            runs = self.index.match(hashes)
            held = [r for r in by_load if runs.get(r.name)]
            if held:
                best = max(held, key=lambda r: runs[r.name])     # max keeps the least loaded of equal matches
                if best.load - by_load[0].load <= self.balance.margin:
                    first, by = best, "prefix"
        elif policy == "session":
            session = req.headers.get(self.balance.affinity_header.lower()) or req.user
            if session:
                first, by = max(live, key=lambda r: _weight(session, r.name)), "session"
        return [first] + [r for r in by_load if r is not first], by

    # --- health -------------------------------------------------------------------------------------------------

    def _succeeded(self, r: Replica, by: str) -> None:
        r.failures = r.ejections = 0
        r.ejected_until = 0.0
        r.served += 1
        self.routed[(r.name, by)] = self.routed.get((r.name, by), 0) + 1

    def _failed(self, r: Replica, why: str) -> None:
        r.failures += 1
        r.failed += 1
        if r.failures >= self.balance.eject_after:
            wait = min(self.balance.eject_s * 2 ** r.ejections, self.balance.max_eject_s)
            r.ejected_until = time.monotonic() + wait
            r.ejections += 1
            r.failures = 0
            self.index.forget(r.name)       # if it comes back it was probably restarted, with an empty cache
            log.warning("replica %s of %s ejected for %.0f s after %d failures in a row: %s", r.name, self.name,
                        wait, self.balance.eject_after, why)

    def _mark(self, d: Delta, r: Replica) -> Delta:
        if d.usage is not None:
            d.usage.replica = r.name
        return d

    def _start_checker(self) -> None:
        if self._checker is None and self.balance.check_interval_s > 0:
            self._checker = asyncio.get_running_loop().create_task(self._check_loop())

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.balance.check_interval_s)
            await self.check()

    async def check(self) -> None:
        """One round of active checks and load scrapes, all replicas at once."""
        await asyncio.gather(*(self._check_one(r) for r in self.replicas))

    async def _check_one(self, r: Replica) -> None:
        up = await r.backend.health()
        if up != r.up:
            log.warning("replica %s of %s is %s", r.name, self.name, "back" if up else "down (health check)")
            if not up:
                self.index.forget(r.name)
        r.up = up
        if up:
            r.signal = await scrape(r.backend.client, r.url)


async def scrape(client: httpx.AsyncClient, url: str) -> LoadSignal:
    """The replica's load signal from its server's /metrics, else llama.cpp's /slots; unknown if neither."""
    root = url[:-3] if url.endswith("/v1") else url
    try:
        resp = await client.get(root + "/metrics", timeout=2.0)
        if resp.status_code == 200:
            signal = parse_prometheus(resp.text)
            if signal.known:
                return signal
        resp = await client.get(root + "/slots", timeout=2.0)
        if resp.status_code == 200:
            return parse_slots(resp.json())
    except (httpx.HTTPError, ValueError):
        pass
    return LoadSignal()


def _weight(session: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{session}\x00{replica}".encode(), digest_size=8).digest(), "big")
