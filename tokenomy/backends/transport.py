"""The HTTP transport every upstream client uses: httpx's own (its pool, h11, its errors and timeouts), with the
connections under the pool on asyncio directly instead of through anyio.

Why: on the gateway's request path httpx's connection pool asks every pooled connection, at each request and at
each answer's end, whether it has expired, and the stock stream answers through anyio's typed attributes and a
poll() of the socket; with 16 connections that was a tenth of the gateway's CPU a request (docs/hardening.md,
"Gateway overhead"). Here a connection is an asyncio protocol that reads as the event loop does, so a server's
close is already known without a system call, and a read or write that need not wait does not set a timer.

The contract of httpcore's network streams holds: reads return at most `max_bytes` (b"" at the end), a read or
write past its timeout raises httpcore's ReadTimeout or WriteTimeout, a broken connection ReadError or WriteError,
a refused or timed-out connect ConnectError or ConnectTimeout (httpx maps them to its own).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

HIGH_WATER = 256 * 1024          # bytes read ahead of the reader before the socket stops being read


class _Connection(asyncio.Protocol):
    """One connection's bytes as they arrive, and whether it has ended."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.paused = False              # the socket's send buffer is full: writers wait for it to drain
        self.reading = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport       # type: ignore[assignment]  # uvloop's are not asyncio.Transport's subclasses

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > HIGH_WATER and self.reading and self.transport is not None:
            self.transport.pause_reading()
            self.reading = False
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False                     # close the transport: HTTP/1.1 does not half-close

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
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


async def _wait(fut: asyncio.Future[None], timeout: float | None, timed_out: type[Exception]) -> None:
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


class Pool(httpcore.AsyncConnectionPool):
    """httpcore's pool with its assignment of requests to connections in one pass over the connections: the stock
    one lists every connection again for each idle one (n^2 calls at each request and each answer's end). The
    decisions are the stock ones (httpcore 1.0): closed connections go, expired or surplus idle ones close, each
    queued request takes the first available connection, else a new one, else replaces the first idle one."""

    def _assign_requests_to_connections(self) -> list[httpcore.AsyncConnectionInterface]:
        closing = []
        connections = self._connections
        for connection in list(connections):
            if connection.is_closed():
                connections.remove(connection)
            elif connection.has_expired() or (connection.is_idle()
                                              and len(connections) > self._max_keepalive_connections):
                connections.remove(connection)
                closing.append(connection)
        for pool_request in self._requests:
            if not pool_request.is_queued():
                continue
            origin = pool_request.request.url.origin
            available = next((c for c in connections if c.can_handle_request(origin) and c.is_available()), None)
            if available is not None:
                pool_request.assign_to_connection(available)
                continue
            if len(connections) >= self._max_connections:
                idle = next((c for c in connections if c.is_idle()), None)
                if idle is None:
                    continue
                connections.remove(idle)
                closing.append(idle)
            connection = self.create_connection(origin)
            connections.append(connection)
            pool_request.assign_to_connection(connection)
        return closing


def on_asyncio(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """`client` with its own pool (a proxy's from the environment stays as httpx makes it) a Pool whose
    connections are on AsyncioBackend; as it was when httpx's internals are not the ones this was written for."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    if (type(pool) is httpcore.AsyncConnectionPool and hasattr(pool, "_network_backend")
            and hasattr(pool, "_max_keepalive_connections") and httpcore.__version__.startswith("1.")):
        pool.__class__ = Pool
        pool._network_backend = AsyncioBackend()
    return client
