"""The upstream client: what every HTTP backend (OpenAI-compatible, Anthropic Messages, and each replica of a
pool) does the same way, so that a client sees the same thing whatever kind of server failed. A backend module
keeps only its translation: the request body it sends and how it reads the answer's events.

Sending (`Upstream.send`): one POST, retried under `RetryPolicy`, all within the model's `deadline_s`; it returns
the open response of a 200, or raises what the status means (`refusal`):

    400, 413, 422               the client's request is refused: InvalidRequest with that status and the upstream's
                                message. Never retried; no other model is asked (it would refuse it too).
    401, 403, 404, 405, any     this deployment is misconfigured (its key, model name or URL): BackendError(502,
    other 4xx not below         lasting=True), never retried, the message naming the fault. Another model (or
                                replica) may serve, so the pipeline falls back.
    429, 503, 529               busy: retried; when the retries are spent, or the upstream's Retry-After is longer
                                than the policy waits, BackendError(503, retry_after=the upstream's Retry-After).
    408, 409, 500, 502, 504     a transient fault: retried; then BackendError(502).
    other 5xx (501, 505 ...)    the upstream cannot do this: BackendError(502), not retried, another model may serve.
    connection errors           retried when the request cannot have reached the upstream (refused connect, connect
                                or pool timeout); one that may have (a read timeout, a dropped connection) only with
                                `retry_after_send`, since a second send could generate, and bill, the answer twice.

Once a 200's status line is in, nothing is retried here: the answer's bytes may already be on their way to the
client. A failure while reading it is the backend's BackendError (the pipeline makes it an error event).

Reading (`sse_data`): an event stream's events (their `data`, the fields both APIs put everything in).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from tokenomy.backends.base import BackendError, InvalidRequest
from tokenomy.backends.transport import upstream_client

CLIENT_FAULT = frozenset({400, 413, 422})
BUSY = frozenset({429, 503, 529})
RETRY = BUSY | {408, 409, 500, 502, 504}
# a connection error that proves the request never reached the upstream: safe to send again
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_CONNECTION_ERRORS = (*_UNSENT, httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
                      httpx.WriteTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """How many times and how long apart a failed send is tried again.

    Before retry k (k = 0, 1, ...; at most `retries`) the wait is
        max(retry_after, backoff_s * 2**k * U(0.5, 1))      capped at max_wait_s
    where retry_after is the upstream's Retry-After (0 when it sent none) and U a uniform draw (jitter, so that
    clients failed together do not come back together). A Retry-After longer than `max_wait_s` is not waited out:
    the failure goes up at once with it, so a fallback model can serve now and the client learns the wait."""

    retries: int = 2
    backoff_s: float = 0.2
    max_wait_s: float = 5.0

    def wait(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number `attempt` (0-based), or None: give up now."""
        if attempt >= self.retries or (retry_after is not None and retry_after > self.max_wait_s):
            return None
        backoff = min(self.backoff_s * 2 ** attempt, self.max_wait_s) * random.uniform(0.5, 1.0)
        return max(retry_after or 0.0, backoff)


def retry_after(value: str | None) -> float | None:
    """A Retry-After header's wait in seconds (delay-seconds, or an HTTP date: the time until it, 0 when past);
    None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def error_message(text: str) -> str:
    """The message of an upstream's error body: OpenAI's {"error": {"message"}}, Anthropic's
    {"type": "error", "error": {"type", "message"}}, a bare {"error": "..."}; else the text itself, shortened."""
    try:
        obj = json.loads(text)
        err = obj.get("error", obj)
        return str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except (json.JSONDecodeError, AttributeError):
        return text.strip()[:300]


def refusal(name: str, status: int, message: str, wait: float | None = None, tries: int = 1,
            key_env: str | None = None) -> Exception:
    """What a non-200 answer of upstream `name` means to the pipeline (the module's table), after `tries` sends;
    `wait` is its Retry-After in seconds, `key_env` the variable its key comes from (named for a 401 or 403)."""
    after = f" after {tries} tries" if tries > 1 else ""
    if status in CLIENT_FAULT:
        return InvalidRequest(f"upstream {name} refused the request: {message}", status=status)
    if status in BUSY:
        return BackendError(f"upstream {name} is overloaded (it answered {status}{after}): {message}", status=503,
                            retry_after=wait)
    if 400 <= status < 500 and status not in RETRY:
        hint = f"; check ${key_env}" if status in (401, 403) and key_env else ""
        what = {401: "its key was refused", 403: "its key may not use this model",
                404: "its model or URL is wrong", 405: "its URL is wrong"}.get(status, "it is misconfigured")
        return BackendError(f"deployment {name} is misconfigured: {what} (the upstream answered {status}{hint}): "
                            f"{message}", status=502, lasting=True)
    return BackendError(f"upstream {name} answered {status}{after}: {message}", status=502, retry_after=wait)


class Upstream:
    """An HTTP upstream: its client (pooled connections, timeouts, its key), the retry policy, health probe and
    metrics. A subclass calls `__init__` with its base URL and headers, sets HEALTH_PATH, and sends with `send`."""

    name: str
    metrics: Any
    client: httpx.AsyncClient
    HEALTH_PATH = "/models"     # relative to the client's base_url

    def __init__(self, name: str, spec: Any, metrics: Any, base_url: str, headers: dict[str, str]) -> None:
        """`spec`: the model's settings (config/model_specs.py's _Upstream: timeouts, retries, deadline, key)."""
        self.name, self.spec, self.metrics = name, spec, metrics
        self.client = upstream_client(
            base_url, headers=headers, timeout=httpx.Timeout(spec.timeout_s, connect=spec.connect_timeout_s),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))
        self.policy = RetryPolicy(spec.max_retries, spec.retry_backoff_s, spec.max_retry_wait_s)
        self._urls: dict[str, httpx.URL] = {}

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

    async def send(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        """POST `body` to `path` as the module says; the open (streaming) response of a 200, which the caller
        closes. `headers` go with every try (a trace's traceparent). The whole, retries and waits included, runs
        within the model's deadline (`deadline_s`, else `timeout_s`): past it, BackendError(504)."""
        deadline = self.spec.deadline_s or self.spec.timeout_s
        try:
            async with asyncio.timeout(deadline):
                return await self._send_with_retries(path, body, headers)
        except TimeoutError:
            self._count_error("deadline")
            raise BackendError(f"upstream {self.name} did not answer within its {deadline:g} s deadline",
                               status=504) from None

    async def _send_with_retries(self, path: str, body: dict[str, Any],
                                 headers: dict[str, str] | None) -> httpx.Response:
        attempt = 0
        while True:
            t0 = time.perf_counter()
            try:
                resp = await self.client.send(self.client.build_request("POST", self._url(path), json=body,
                                                                        headers=headers), stream=True)
            except _CONNECTION_ERRORS as e:
                self._count_error(type(e).__name__)
                sent = not isinstance(e, _UNSENT)
                failure: Exception = BackendError(
                    f"upstream {self.name} {'did not answer' if sent else 'is unreachable'}: "
                    f"{type(e).__name__}: {e}", status=502)
                wait = None if sent and not self.spec.retry_after_send else self.policy.wait(attempt, None)
                if wait is None:
                    raise failure from e
            else:
                self._observe(time.perf_counter() - t0)
                status = resp.status_code
                if status == 200:
                    return resp
                try:
                    text = (await resp.aread()).decode("utf-8", errors="replace")[:2000]
                except httpx.HTTPError:
                    text = ""
                finally:
                    await resp.aclose()
                self._count_error(str(status))
                after = retry_after(resp.headers.get("retry-after"))
                wait = self.policy.wait(attempt, after) if status in RETRY else None
                if wait is None:
                    raise refusal(self.name, status, error_message(text), after, attempt + 1,
                                  getattr(self.spec, "api_key_env", None))
            attempt += 1
            await asyncio.sleep(wait)

    def _url(self, path: str) -> httpx.URL:
        """`path` on the base URL, as the client joins them, joined once (a join parses the URL again)."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = self.client.build_request("POST", path).url
        return url

    def _observe(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.upstream_latency.labels(self.name).observe(seconds)

    def _count_error(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(self.name, kind).inc()

    def lost(self, e: httpx.HTTPError) -> BackendError:
        """The error of an answer whose connection failed after its 200 (never retried: see the module)."""
        self._count_error(type(e).__name__)
        return BackendError(f"upstream {self.name} connection lost mid-answer: {type(e).__name__}")


def bearer(key_env: str | None) -> dict[str, str]:
    """An Authorization header with the key in $`key_env`; none without a variable or a key in it."""
    key = os.environ.get(key_env, "") if key_env else ""
    return {"authorization": f"Bearer {key}"} if key else {}


async def sse_data(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The `data` of each event of an event stream (its data lines joined by LF, stripped), in order; events
    without data (pings, comments) are skipped. Other fields (`event:`, `id:`) are not read: both APIs repeat an
    event's type in its data. Lines end in LF, CRLF or CR, as the standard allows, also when a CRLF is split
    between two reads. The body is read to its end, so that a connection whose answer was read whole goes back to
    the pool (closing one early drops it)."""
    rest, pending_lf = b"", False
    data: list[bytes] = []
    async for chunk in resp.aiter_bytes():
        if pending_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        if not chunk:
            continue
        pending_lf = chunk[-1:] == b"\r"
        rest += chunk
        lines = rest.splitlines()
        rest = b"" if rest[-1:] in (b"\n", b"\r") else lines.pop() if lines else b""
        for line in lines:
            if not line:
                if data:
                    yield (data[0] if len(data) == 1 else b"\n".join(data)).strip()
                    data.clear()
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])   # one space after the colon is not data
    if rest.startswith(b"data:"):
        data.append(rest[6:] if rest[5:6] == b" " else rest[5:])
    if data:                     # a stream that ends without the blank line after its last event
        yield b"\n".join(data).strip()
