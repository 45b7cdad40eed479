"""The HTTP transport every upstream client uses, under httpx's client (its API, timeouts, errors): for plain
HTTP/1.1 (a local vLLM, llama.cpp or any upstream on http://) H1Transport, a keep-alive pool of asyncio
connections whose answers httptools parses; for the rest (https, a proxy, HTTP/2, a streamed request body)
httpx's own pool with h11, its connections on asyncio directly instead of through anyio.

Why: on the gateway's request path httpx's client was the largest cost. At one connection httpx, httpcore and h11
were more than half of the gateway's own CPU a request, and H1Transport cut the gateway's CPU a request by about
two fifths. With many connections httpx's pool asks every pooled connection, at each request and at each answer's
end, whether it has expired, and the stock stream answers through anyio's typed attributes and a poll() of the
socket; with 16 connections that was a tenth of the gateway's CPU a request. Here a connection is an asyncio
protocol that reads as the event loop does, so a server's close is already known without a system call, and a
read or write that need not wait does not set a timer (docs/hardening.md, "Gateway overhead").

Only httpx's and httpcore's public interfaces are used (issue 48): `upstream_client` builds the client with a
transport of its own (`AsyncClient(transport=...)`): H1Transport over CorePool, an httpx transport over httpcore's
AsyncConnectionPool made with `network_backend=AsyncioBackend()` (httpx's own AsyncHTTPTransport passes none), and
an UpstreamClient whose `cookies` property (public, what httpx's client reads an answer's cookies through) is a jar
that skips answers that set no cookie. Where a proxy from the environment applies, httpx's own client is used as
it is: it reads and honours the proxy, which a transport of one's own would bypass.

The contract of httpcore's network streams holds: reads return at most `max_bytes` (b"" at the end), a read or
write past its timeout raises httpcore's ReadTimeout or WriteTimeout, a broken connection ReadError or WriteError,
a refused or timed-out connect ConnectError or ConnectTimeout (httpx maps them to its own). H1Transport raises
httpx's own exceptions for the same cases (its docstring).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpcore
import httpx

try:
    import httptools
except ImportError:                      # pragma: no cover  (a dependency; without it the stock parser serves)
    httptools = None

HIGH_WATER = 256 * 1024          # bytes read ahead of the reader before the socket stops being read


class _Protocol(asyncio.Protocol):
    """What both kinds of connection below keep of asyncio's callbacks: whether the connection ended (and why),
    a reader's waiter woken by every event, and writers' flow control (`drained` resolves when the send buffer
    empties or the connection is lost). Subclasses read the bytes (`data_received`)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.paused = False              # the socket's send buffer is full: writers wait for it to drain
        self.reading = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport       # type: ignore[assignment]  # uvloop's are not asyncio.Transport's subclasses

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False                     # close the transport: HTTP/1.1 does not half-close

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None and self.error is None:      # an error seen in the bytes before stays the reason
            self.error = exc
        self._wake()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _Connection(_Protocol):
    """One connection's bytes as they arrive, and whether it has ended."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > HIGH_WATER and self.reading and self.transport is not None:
            self.transport.pause_reading()
            self.reading = False
        self._wake()


async def _wait(fut: asyncio.Future[None], timeout: float | None, timed_out: Callable[[str], Exception]) -> None:
    """Await `fut`; after `timeout` seconds (None: no limit) it fails with `timed_out`."""
    if timeout is None:
        await fut
        return

    def expire() -> None:
        if not fut.done():
            fut.set_exception(timed_out(f"timed out after {timeout:g} s"))

    handle = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        await fut
    finally:
        handle.cancel()


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _Connection) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        p = self._protocol
        while not p.buffer:
            if p.eof:
                if p.error is not None:
                    raise httpcore.ReadError(str(p.error) or type(p.error).__name__)
                return b""
            p.waiter = asyncio.get_running_loop().create_future()
            try:
                await _wait(p.waiter, timeout, httpcore.ReadTimeout)
            finally:
                p.waiter = None
        if len(p.buffer) <= max_bytes:
            data = bytes(p.buffer)
            p.buffer.clear()
        else:
            data = bytes(p.buffer[:max_bytes])
            del p.buffer[:max_bytes]
        if not p.reading and len(p.buffer) <= HIGH_WATER // 4 and not self._transport.is_closing():
            self._transport.resume_reading()
            p.reading = True
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        p = self._protocol
        if self._transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        try:
            self._transport.write(buffer)
        except (OSError, RuntimeError) as e:
            raise httpcore.WriteError(str(e)) from e
        if p.paused:
            p.drained = asyncio.get_running_loop().create_future()
            try:
                await _wait(p.drained, timeout, httpcore.WriteTimeout)
            finally:
                p.drained = None
            if p.error is not None:
                raise httpcore.WriteError(str(p.error))

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(self._transport, self._protocol, ssl_context,
                                                 server_hostname=server_hostname)
        except TimeoutError:
            self._transport.close()
            raise httpcore.ConnectTimeout("TLS handshake timed out") from None
        except (OSError, ssl.SSLError, ConnectionError) as e:
            self._transport.close()
            raise httpcore.ConnectError(str(e)) from e
        assert transport is not None
        self._protocol.transport = transport     # type: ignore[assignment]
        return AsyncioStream(transport, self._protocol)  # type: ignore[arg-type]

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":        # idle, yet readable: the server closed it (or broke HTTP)
            return bool(self._protocol.buffer) or self._protocol.eof
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address else None
        return await _connect(lambda: loop.create_connection(_Connection, host, port, local_addr=local),
                              timeout, socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
                                  ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        return await _connect(lambda: loop.create_unix_connection(_Connection, path), timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def _connect(open_: Any, timeout: float | None,
                   socket_options: Iterable[httpcore.SOCKET_OPTION] | None) -> AsyncioStream:
    try:
        async with asyncio.timeout(timeout):
            transport, protocol = await open_()
    except TimeoutError:
        raise httpcore.ConnectTimeout("connect timed out") from None
    except OSError as e:
        raise httpcore.ConnectError(str(e)) from e
    sock: socket.socket | None = transport.get_extra_info("socket")
    for option in socket_options or ():
        if sock is not None:
            sock.setsockopt(*option)     # type: ignore[arg-type]
    return AsyncioStream(transport, protocol)


_CORE_ERRORS: list[tuple[type[Exception], type[httpx.HTTPError]]] = [   # httpcore's -> httpx's, most specific first
    (httpcore.ConnectTimeout, httpx.ConnectTimeout), (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout), (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException), (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError), (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError), (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError), (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
]


def _httpx_error(e: Exception) -> Exception:
    """httpcore's exception as the httpx exception httpx's own transport raises for it (else itself)."""
    for core, mapped in _CORE_ERRORS:
        if isinstance(e, core):
            err = mapped(str(e))
            err.__cause__ = e
            return err
    return e


class _CoreBody(httpx.AsyncByteStream):
    """An httpcore answer's body as httpx's stream, its errors as httpx's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except Exception as e:
            raise _httpx_error(e) from None

    async def aclose(self) -> None:
        if hasattr(self._stream, "aclose"):
            await self._stream.aclose()


class CorePool(httpx.AsyncBaseTransport):
    """What httpx's AsyncHTTPTransport does, from public parts: an httpcore AsyncConnectionPool (TLS, keep-alive,
    HTTP/1.1; HTTP/2 where `h2` is installed and asked for) whose connections are on AsyncioBackend, requests and
    answers translated between httpx and httpcore, httpcore's errors raised as httpx's."""

    def __init__(self, limits: httpx.Limits, *, http2: bool = False, verify: ssl.SSLContext | bool = True) -> None:
        self.pool = httpcore.AsyncConnectionPool(
            ssl_context=verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify=verify),
            max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, http1=True, http2=http2, network_backend=AsyncioBackend())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        core = httpcore.Request(method=request.method,
                                url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                                                 target=url.raw_path),
                                headers=request.headers.raw, content=request.stream, extensions=request.extensions)
        try:
            answer = await self.pool.handle_async_request(core)
        except Exception as e:
            raise _httpx_error(e) from None
        return httpx.Response(status_code=answer.status, headers=answer.headers, stream=_CoreBody(answer.stream),
                              extensions=answer.extensions)

    async def aclose(self) -> None:
        await self.pool.aclose()


class Cookies(httpx.Cookies):
    """httpx's cookie jar, which skips the jar for an answer that sets no cookie (an upstream's, as a rule): for
    every answer httpx builds a urllib request to ask the jar, 7% of the gateway's CPU a request at one connection."""

    def extract_cookies(self, response: httpx.Response) -> None:
        if "set-cookie" in response.headers:
            super().extract_cookies(response)


class UpstreamClient(httpx.AsyncClient):
    """httpx's client whose cookie jar is a Cookies (through the public `cookies` property, which the client reads
    every answer's cookies through and whose setter would copy into a plain httpx.Cookies)."""

    def __init__(self, **kwargs: Any) -> None:
        cookies = kwargs.pop("cookies", None)
        super().__init__(**kwargs)
        self.transport: httpx.AsyncBaseTransport | None = kwargs.get("transport")   # what it sends through
        self.cookies = cookies

    @property
    def cookies(self) -> httpx.Cookies:
        return self._jar

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        self._jar = Cookies(cookies)


def _proxied(url: httpx.URL) -> bool:
    """Whether a proxy from the environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, less NO_PROXY) applies to `url`."""
    proxies = urllib.request.getproxies_environment()
    if url.scheme not in proxies and "all" not in proxies:
        return False
    return not urllib.request.proxy_bypass_environment(url.host, proxies)


def upstream_client(base_url: str, *, headers: dict[str, str], timeout: httpx.Timeout,
                    limits: httpx.Limits) -> httpx.AsyncClient:
    """The httpx client an upstream backend sends with: H1Transport (plain HTTP/1.1, httptools) in front of a
    CorePool (https, a streamed body; connections on AsyncioBackend), and a cookie jar that skips answers without
    cookies; httpx's own client where a proxy from the environment applies to `base_url`, or without httptools
    the CorePool alone."""
    if _proxied(httpx.URL(base_url)):
        return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout, limits=limits)
    pool = CorePool(limits)
    transport: httpx.AsyncBaseTransport = pool if httptools is None else H1Transport(
        pool, limits.max_connections, limits.max_keepalive_connections, limits.keepalive_expiry)
    return UpstreamClient(base_url=base_url, headers=headers, timeout=timeout, transport=transport)


# ---- the lean path: plain HTTP/1.1 to an upstream, parsed by httptools ------------------------------------------
class _H1(_Protocol):
    """One HTTP/1.1 connection to an upstream; each answer parsed by httptools (llhttp, C) as its bytes arrive:
    its status and headers, then its body's pieces, until the message is complete."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()
        self.parser: Any = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head = False                # the answer's head is in
        self.complete = False            # ... and its whole body
        self.keep_alive = False          # ... and it leaves the connection open for the next request
        self.interim = False             # an interim (1xx) answer is being read
        self.body: list[bytes] = []
        self.buffered = 0
        self.idle_since = 0.0

    def expect(self) -> None:
        """Ready for the next answer on this connection."""
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.headers, self.head, self.complete, self.keep_alive = 0, [], False, False, False
        self.interim = False
        self.body, self.buffered = [], 0

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:          # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self.interim = True
            self.headers = []
            return
        self.status = status
        self.head = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()    # llhttp forgets it once the message is done

    # asyncio's
    def data_received(self, data: bytes) -> None:
        if self.parser is None or self.complete:
            self.error = httpx.RemoteProtocolError("the upstream sent bytes no request asked for")
            self.eof = True
            self.transport.close()       # type: ignore[union-attr]
        else:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as e:
                self.error = httpx.RemoteProtocolError(f"malformed HTTP answer: {e}")
                self.eof = True
                self.transport.close()   # type: ignore[union-attr]
            if self.buffered > HIGH_WATER and self.reading:
                self.transport.pause_reading()   # type: ignore[union-attr]
                self.reading = False
        self._wake()

    async def wait(self, timeout: float | None, timed_out: Callable[[str], Exception]) -> None:
        self.waiter = self.loop.create_future()
        try:
            await _wait(self.waiter, timeout, timed_out)
        finally:
            self.waiter = None

    def reusable(self) -> bool:
        return (self.complete and not self.eof and self.error is None and self.keep_alive
                and self.transport is not None and not self.transport.is_closing())


def _close(conn: _H1) -> None:
    """Close a connection, from its own event loop or (an idle one a client kept across loops) another's."""
    if conn.transport is None or conn.loop.is_closed():
        return                           # its loop is gone: the socket closes when the transport is collected
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is conn.loop:
        conn.transport.close()
    else:
        conn.loop.call_soon_threadsafe(conn.transport.close)


class _ResponseBody(httpx.AsyncByteStream):
    """An answer's body as its pieces arrive; at its end (or when closed) the connection goes back to the pool
    when it can carry the next request, else it closes."""

    def __init__(self, pool: H1Transport, key: tuple[str, int], conn: _H1, request: httpx.Request,
                 read_timeout: float | None, delimited: bool) -> None:
        self._pool, self._key, self._conn, self._request = pool, key, conn, request
        self._timeout = read_timeout
        self._delimited = delimited      # Content-Length or chunked: else the body ends when the connection does
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        c = self._conn
        while True:
            if c.body:
                data = c.body[0] if len(c.body) == 1 else b"".join(c.body)
                c.body.clear()
                c.buffered = 0
                if not c.reading and not c.eof:
                    c.transport.resume_reading()     # type: ignore[union-attr]
                    c.reading = True
                yield data
            elif c.complete:
                break
            elif c.eof:
                if c.error is None and not self._delimited:
                    break
                self._release(keep=False)
                if isinstance(c.error, httpx.HTTPError):
                    raise c.error
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body",
                                                request=self._request)
            else:
                await c.wait(self._timeout, lambda m: httpx.ReadTimeout(m, request=self._request))
        self._release(keep=True)

    async def aclose(self) -> None:
        self._release(keep=True)

    def _release(self, keep: bool) -> None:
        if not self._done:
            self._done = True
            self._pool._release(self._key, self._conn, keep and self._conn.reusable())


class H1Transport(httpx.AsyncBaseTransport):
    """httpx's transport for the common case, plain HTTP/1.1 to an upstream: per origin a keep-alive pool of
    asyncio connections whose answers httptools parses, and an httpx.Response whose body streams; httpx's client
    above it (its API, timeouts, redirects, errors) is unchanged. A request it does not take (https, a body that
    streams, HEAD or CONNECT) goes to `fallback`, httpx's own transport (TLS, HTTP/2 and proxies stay there).
    Why: on the gateway's request path at one connection, httpx's client with httpcore and h11 under it was more
    than half of the gateway's own CPU (docs/hardening.md, "Gateway overhead").

    The contract is httpx's: an idle connection the server closed is not reused; one whose answer was not read to
    its end, or that said `connection: close`, is closed; an idle one older than `keepalive_expiry` is closed; at
    most `max_connections` at once (a request past them waits up to the pool timeout: PoolTimeout); a refused or
    timed-out connect is ConnectError or ConnectTimeout, a read or write past its timeout ReadTimeout or
    WriteTimeout, a connection that ends before its answer does RemoteProtocolError (or ReadError)."""

    def __init__(self, fallback: httpx.AsyncBaseTransport, max_connections: int | None,
                 max_keepalive_connections: int | None, keepalive_expiry: float | None) -> None:
        self._fallback = fallback
        self._max = max_connections
        self._max_idle = max_keepalive_connections if max_keepalive_connections is not None else 1 << 30
        self._expiry = keepalive_expiry
        self._idle: dict[tuple[str, int], list[_H1]] = {}
        self._open = 0                   # connections a request holds now
        self._waiters: list[asyncio.Future[None]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        try:
            body = request.content       # a body in memory; one that streams is httpx's to send
        except httpx.RequestNotRead:
            return await self._fallback.handle_async_request(request)
        if url.scheme != "http" or request.method in ("HEAD", "CONNECT"):
            return await self._fallback.handle_async_request(request)
        raw = request.headers.raw
        head = b"".join([b"%s %s HTTP/1.1\r\n" % (request.method.encode(), url.raw_path),
                         *[b"%s: %s\r\n" % kv for kv in raw]])
        if not (head.count(b"\n") == head.count(b"\r") == len(raw) + 1 and b"\0" not in head):
            # a line break or NUL inside a header (or the path): h11 refuses it with httpx's LocalProtocolError
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        key = (url.host, url.port or 80)
        conn = await self._take(key, timeouts.get("connect"), timeouts.get("pool"), request)
        try:
            conn.expect()
            conn.transport.write(head + b"\r\n" + body)      # type: ignore[union-attr]
            if conn.paused:
                conn.drained = conn.loop.create_future()
                try:
                    await _wait(conn.drained, timeouts.get("write"),
                                lambda m: httpx.WriteTimeout(m, request=request))
                finally:
                    conn.drained = None
            read = timeouts.get("read")
            while not conn.head:
                if conn.eof:
                    if isinstance(conn.error, httpx.HTTPError):
                        raise conn.error
                    raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                                    request=request)
                await conn.wait(read, lambda m: httpx.ReadTimeout(m, request=request))
        except BaseException:
            self._release(key, conn, False)
            raise
        delimited = any(n.lower() in (b"content-length", b"transfer-encoding") for n, _ in conn.headers)
        return httpx.Response(conn.status, headers=conn.headers,
                              stream=_ResponseBody(self, key, conn, request, read, delimited or conn.complete),
                              extensions={"http_version": b"HTTP/1.1"})

    async def _take(self, key: tuple[str, int], connect: float | None, pool_timeout: float | None,
                    request: httpx.Request) -> _H1:
        loop = asyncio.get_running_loop()
        while True:
            idle = self._idle.get(key)
            while idle:                  # the most recently used first: the likeliest to be still open
                conn = idle.pop()
                fresh = self._expiry is None or loop.time() - conn.idle_since < self._expiry
                closing = conn.transport is None or conn.transport.is_closing()
                if conn.loop is loop and fresh and not conn.eof and not closing:
                    self._open += 1
                    return conn
                _close(conn)
            if self._max is None or self._open + self._idle_count() < self._max:
                break
            if self._close_one_idle():   # another origin's: room for a new connection
                continue
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await _wait(waiter, pool_timeout, lambda m: httpx.PoolTimeout(m, request=request))
            except BaseException:
                self._wake_one()         # a wake this request got as it gave up goes to the next one
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._open += 1
        try:
            async with asyncio.timeout(connect):
                _, conn = await loop.create_connection(_H1, key[0], key[1])
        except TimeoutError:
            self._give_up()
            raise httpx.ConnectTimeout("connect timed out", request=request) from None
        except OSError as e:
            self._give_up()
            raise httpx.ConnectError(str(e) or type(e).__name__, request=request) from e
        except BaseException:
            self._give_up()
            raise
        return conn

    def _give_up(self) -> None:
        self._open -= 1
        self._wake_one()

    def _release(self, key: tuple[str, int], conn: _H1, keep: bool) -> None:
        self._open -= 1
        idle = self._idle.setdefault(key, [])
        if keep and len(idle) < self._max_idle:
            conn.idle_since = conn.loop.time()
            conn.parser = None
            idle.append(conn)
        else:
            _close(conn)
        self._wake_one()

    def _idle_count(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def _close_one_idle(self) -> bool:
        for idle in self._idle.values():
            if idle:
                _close(idle.pop(0))
                return True
        return False

    def _wake_one(self) -> None:
        while self._waiters:
            w = self._waiters.pop(0)
            if not w.done():
                w.set_result(None)
                return

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                _close(conn)
        self._idle.clear()
        await self._fallback.aclose()
