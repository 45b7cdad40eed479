"""The batch worker: feeds pending batch items through the gateway's pipeline, at batch priority, and ends batches.

Each item runs as a request of the key that created its batch (keys, budgets, caches, routing, structured output
all apply), with `GenRequest.priority = "batch"`, so the embedded engine schedules it only into capacity that
interactive requests leave (engine/scheduler.py). Items for an upstream model are held to
`batch.upstream_concurrency` in flight and while the model's expected queue wait is over `upstream_max_wait_s`.

Exactly once: an item's result is committed (after its ledger row) before it counts as done, and a restart runs
only items still pending. Each start of an item has its own request id (`req_<batch>_<line>`, then `_a<n>` for a
later start), so a start cut short by a crash never shares a ledger row with the start that finishes it. A 429
that is not a spent budget (a full queue, a rate limit, a budget held by requests in flight) or a 503 (an engine
restarting) puts the item back (the batch's completion window bounds how long). Any other failure of a start
(an exception the pipeline did not turn into an APIError) is logged and the item tried again RETRY_S later, at most
`max_attempts` times in this process; then the item fails with an `internal_error` line in the error file and the
batch goes on.

Several gateways on one database: each runner is a worker with its own id that claims an item before it starts it
and a batch before it ends it (database.py's leases, renewed every third of `lease_s` while it works, given up when it
stops), so no item runs twice and each batch's results are written once, whichever gateways are up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tokenomy.batch.database import BatchStore, Item, new_id
from tokenomy.batch.input_lines import error_line
from tokenomy.dialect.chat import gen_request
from tokenomy.dialect.chat_wire import chat_body, completion_body
from tokenomy.errors import APIError
from tokenomy.limits.budget import BudgetExceeded
from tokenomy.pipeline.request import RequestContext

log = logging.getLogger("tokenomy.batch")

RETRY_S = 1.0


def request_id(item: Item, attempt: int) -> str:
    base = f"req_{item.batch_id.removeprefix('batch_')}_{item.line}"
    return base if attempt == 0 else f"{base}_a{attempt}"


def to_context(endpoint: str, body: dict[str, Any], rid: str) -> RequestContext:
    """The RequestContext the API would build for this body, at batch priority (APIError 400 when it does not
    validate)."""
    return RequestContext(gen=gen_request(endpoint, body, priority="batch"), request_id=rid)


class BatchRunner:
    def __init__(self, store: BatchStore, handle: Callable[[RequestContext], Awaitable[Any]], *,
                 concurrency: int = 8, poll_s: float = 0.5, drain_s: float = 10.0,
                 flush: Callable[[], None] | None = None, hold: Callable[[str], bool] | None = None,
                 upstream: Callable[[str], bool] | None = None, upstream_concurrency: int = 2,
                 lease_s: float = 60.0, max_attempts: int = 3) -> None:
        """`handle` runs a RequestContext through the pipeline; `flush` commits the ledger's queued rows;
        `upstream(model)` says whether a model or route serves from an upstream, `hold(model)` whether that
        upstream is too loaded for batch work now; an item whose start fails unexpectedly `max_attempts` times
        fails."""
        self.store = store
        self.handle = handle
        self.concurrency = concurrency
        self.poll_s = poll_s
        self.drain_s = drain_s
        self.flush = flush
        self.hold = hold or (lambda _: False)
        self.upstream = upstream or (lambda _: False)
        self.upstream_concurrency = upstream_concurrency
        self.lease_s = lease_s
        self.worker = new_id("worker_")
        self.ran = 0                     # items this worker started
        self._renewed = time.monotonic()
        self.inflight: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.upstream_inflight: dict[str, int] = {}
        self.retry_at: dict[tuple[str, int], float] = {}
        self.max_attempts = max_attempts
        self.failures: dict[tuple[str, int], int] = {}     # unexpected failures of an item's starts, here
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="batch-runner")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop starting items; let those in flight finish for up to drain_s, then cancel them (they stay
        pending and run again after a restart)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:
                pass
        tasks = list(self.inflight.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.drain_s)
            for t in late:
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        try:
            await asyncio.to_thread(self.store.release, self.worker)
        except Exception:
            log.exception("batch runner could not give up its leases (they run out after %.0f s)", self.lease_s)

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.tick()
            except Exception:
                log.exception("batch runner tick failed")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except TimeoutError:
                pass

    async def tick(self) -> None:
        """One pass over the active batches: start what fits, end what is done."""
        if time.monotonic() - self._renewed > self.lease_s / 3:
            await asyncio.to_thread(self.store.renew, self.worker, self.lease_s)
            self._renewed = time.monotonic()
        active = await asyncio.to_thread(self.store.active)
        ids = {b["id"] for b in active}
        for (batch, _), task in list(self.inflight.items()):
            if batch not in ids:          # another worker ended it (cancelled, expired): its result would be lost
                task.cancel()
        for b in active:
            bid = b["id"]
            if b["status"] == "validating":
                await asyncio.to_thread(self.store.set_status, bid, "in_progress", ("validating",))
            elif b["status"] == "cancelling":
                await self._cancel(bid, b["owner"])
                continue
            if self.store.clock() > b["expires_at"]:   # the clock the store stamped the window with
                await self._end(bid, b["owner"], "expired", ("batch_expired", "The batch expired before this "
                                                             "request ran."))
                continue
            room = self.concurrency - len(self.inflight)
            mine = {line for (batch, line) in self.inflight if batch == bid}
            now = time.monotonic()
            waiting = {line for (batch, line), t in self.retry_at.items() if batch == bid and t > now}
            todo = (await asyncio.to_thread(self.store.pending, bid, room, mine | waiting, self.worker)
                    if room > 0 else [])
            for item in todo:
                model = str(item.body.get("model", ""))
                if self.upstream(model):
                    if self.upstream_inflight.get(model, 0) >= self.upstream_concurrency or self.hold(model):
                        continue
                    self.upstream_inflight[model] = self.upstream_inflight.get(model, 0) + 1
                self.inflight[(bid, item.line)] = asyncio.get_running_loop().create_task(
                    self._run(b, item, model))
            if not mine and not todo and not waiting:
                left = await asyncio.to_thread(self.store.pending, bid, 1, set())
                if not left:
                    await self._end(bid, b["owner"], "completed", None)

    async def _run(self, batch: dict[str, Any], item: Item, model: str) -> None:
        key = (batch["id"], item.line)
        try:
            if not await asyncio.to_thread(self.store.claim, item, self.worker, self.lease_s):
                return                        # another worker took it since we read it
            self.ran += 1
            await self._start(batch, item, key)
        except asyncio.CancelledError:
            raise
        except Exception as e:                # never a task exception nobody reads, never a start for ever
            failures = self.failures[key] = self.failures.get(key, 0) + 1
            log.exception("batch %s line %d: start %d of %d failed", batch["id"], item.line, failures,
                          self.max_attempts)
            if failures < self.max_attempts:
                self.retry_at[key] = time.monotonic() + RETRY_S * failures
                return
            try:
                await asyncio.to_thread(self.store.finish, item, False, error_line(
                    item.custom_id, "internal_error", f"The request failed {failures} times "
                    f"({type(e).__name__}); it is not tried again."))
            except Exception:
                log.exception("batch %s line %d: could not record its failure", batch["id"], item.line)
            self.failures.pop(key, None)
            self.retry_at.pop(key, None)
        finally:
            self.inflight.pop(key, None)
            if self.upstream(model):
                self.upstream_inflight[model] -= 1
            self._wake.set()

    async def _start(self, batch: dict[str, Any], item: Item, key: tuple[str, int]) -> None:
        """One start of a claimed item: its result committed, or the item put back for a later start."""
        rid = request_id(item, item.attempts)
        try:
            ctx = to_context(batch["endpoint"], item.body, rid)
        except APIError as e:
            await asyncio.to_thread(self.store.finish, item, False, _result(item, rid, e.status, e.body()))
            return
        ctx.batch_id, ctx.key_id, ctx.tenant = batch["id"], batch["owner"] or None, batch["tenant"]
        try:
            await self.handle(ctx)
            ok, status, body = True, 200, (chat_body(ctx) if ctx.gen.kind == "chat" else completion_body(ctx))
        except APIError as e:
            spent = isinstance(e, BudgetExceeded) and not e.fits_later    # not only held by items in flight
            if (e.status == 429 and not spent) or e.status == 503:
                self.retry_at[key] = time.monotonic() + RETRY_S     # stays pending; tried again later
                return
            ok, status, body = False, e.status, e.body()
        if self.flush is not None:      # its ledger row is committed before the item counts as done
            await asyncio.to_thread(self.flush)
        await asyncio.to_thread(self.store.finish, item, ok, _result(item, ctx.request_id, status, body))
        self.retry_at.pop(key, None)
        self.failures.pop(key, None)

    async def _cancel(self, bid: str, owner: str) -> None:
        for (batch, _), task in list(self.inflight.items()):
            if batch == bid:
                task.cancel()
        mine = [t for (batch, _), t in self.inflight.items() if batch == bid]
        await asyncio.gather(*mine, return_exceptions=True)
        await self._end(bid, owner, "cancelled", ("batch_cancelled", "The batch was cancelled before this "
                                                  "request finished."))

    async def _end(self, bid: str, owner: str, status: str, fail: tuple[str, str] | None) -> None:
        if not await asyncio.to_thread(self.store.claim_batch, bid, self.worker, self.lease_s):
            return                            # another worker is ending it
        if fail is not None:
            await asyncio.to_thread(self.store.fail_pending, bid, *fail)
        if status == "completed" and not await asyncio.to_thread(self.store.set_status, bid, "finalizing",
                                                                 ("in_progress", "finalizing")):
            return
        await asyncio.to_thread(self.store.write_results, bid, owner)
        await asyncio.to_thread(self.store.set_status, bid, status)


def _result(item: Item, rid: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """A line of the output file (2xx) or error file: OpenAI's batch output shape."""
    return {"id": new_id("batch_req_"), "custom_id": item.custom_id,
            "response": {"status_code": status, "request_id": rid, "body": body}, "error": None}
