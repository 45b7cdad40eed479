"""The upstream clients' transport (backends/transport.py: plain HTTP/1.1 on H1Transport, https on httpx's pool
with its connections on asyncio) keeps httpx's contract: answers arrive whole, a connection the server closed is
not reused, and timeouts and broken connections are httpx's errors.
Each test runs a real HTTP/1.1 server on loopback (asyncio streams) that misbehaves as told, on asyncio's event
loop and on uvloop's (the one `tokenomy serve` runs on where it is installed: server/command.py)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path

import httpx
import pytest

from tests.helpers.wait import wait_until_async
from tokenomy.backends.transport import AsyncioBackend, Cookies, CorePool, H1Transport, upstream_client

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Run = Callable[[Coroutine[object, object, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Run a test's coroutine to its end on the event loop named by the parameter."""
    factory = None
    if request.param == "uvloop":
        factory = pytest.importorskip("uvloop").new_event_loop

    def go(main: Coroutine[object, object, None]) -> None:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(main)
    return go


async def _request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (Content-Length), b"" when the client closed."""
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + (await reader.readexactly(length) if length else b"")


def _answer(body: bytes, close: bool = False) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n%s\r\n"
            % (len(body), b"connection: close\r\n" if close else b"")) + body


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def _client(base: str, timeout: httpx.Timeout | None = None, limits: httpx.Limits | None = None,
            verify: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    client = upstream_client(base, headers={}, timeout=timeout or httpx.Timeout(5.0),
                             limits=limits or httpx.Limits(max_connections=100, max_keepalive_connections=20))
    transport = client.transport         # type: ignore[attr-defined]
    assert isinstance(transport, H1Transport)  # plain HTTP/1.1 on httptools; the rest on the pool under it
    if verify is not None:               # a test's own trust roots for https, on the same pool
        transport._fallback = CorePool(httpx.Limits(), verify=verify)
    assert isinstance(transport._fallback, CorePool)
    assert isinstance(transport._fallback.pool._network_backend, AsyncioBackend)
    return client


def _idle_closed(client: httpx.AsyncClient) -> bool:
    """Every idle connection of the client's plain-HTTP pool is known to be closed by its server."""
    return all(c.eof for idle in client.transport._idle.values() for c in idle)  # type: ignore[attr-defined]


def test_answers_arrive_whole_on_one_kept_alive_connection_large_ones_too(run: Run) -> None:
    big = bytes(range(256)) * 16384           # 4 MiB: more than the read-ahead, so reading pauses and resumes
    accepted = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        while await _request(reader):
            writer.write(_answer(big))
            await writer.drain()
        writer.close()

    async def main() -> None:
        server, base = await _serve(handler)
        async with server, _client(base) as client:
            for _ in range(3):
                r = await client.post("/x", content=b"hello")
                assert r.status_code == 200 and r.content == big
            async with client.stream("POST", "/x", content=b"hi") as r:
                got = b"".join([chunk async for chunk in r.aiter_bytes()])
            assert got == big
        assert len(accepted) == 1             # kept alive: one connection for all four

    run(main())


def test_a_connection_the_server_closed_while_idle_is_not_reused(run: Run) -> None:
    closed = asyncio.Event()
    accepted = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await _request(reader)
        writer.write(_answer(b"one"))         # no "connection: close": the client keeps it for the next request
        await writer.drain()
        writer.close()                        # ... and the server closes it (its keep-alive ran out)
        closed.set()

    async def main() -> None:
        server, base = await _serve(handler)
        async with server, _client(base) as client:
            assert (await client.post("/x", content=b"a")).content == b"one"
            await closed.wait()
            # the close reaches the connection as the event loop reads it: the pool knows it, no read needed
            await wait_until_async(lambda: _idle_closed(client), timeout=30)
            assert (await client.post("/x", content=b"b")).content == b"one"
        assert len(accepted) == 2

    run(main())


def test_a_server_that_does_not_answer_is_a_read_timeout_and_one_that_refuses_a_connect_error(run: Run) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        await reader.read()                   # never answers; returns when the client gives up

    async def main() -> None:
        server, base = await _serve(silent)
        async with server, _client(base, timeout=httpx.Timeout(5, read=0.2)) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/x", content=b"a")
        server2, base2 = await _serve(silent)
        server2.close()
        await server2.wait_closed()           # nothing listens on that port now
        async with _client(base2) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get("/x")

    run(main())


def test_a_connection_cut_mid_answer_is_an_httpx_error(run: Run) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(_answer(b"x" * 1000)[:-500])     # half the body, then the connection goes
        await writer.drain()
        writer.transport.abort()

    async def main() -> None:
        server, base = await _serve(cut)
        async with server, _client(base) as client:
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                await client.post("/x", content=b"a")

    run(main())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="makes its certificate with the openssl command")
def test_an_https_upstream_is_verified_and_kept_alive(tmp_path: Path, run: Run) -> None:
    """TLS starts on the asyncio connection (an https upstream: OpenAI's, Anthropic's): a certificate the client
    trusts serves every request on one connection; one it does not is httpx's ConnectError."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    accepted = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        try:
            while await _request(reader):
                writer.write(_answer(b"secret"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass                              # the untrusting client hung up in the handshake
        writer.close()

    async def main() -> None:
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
        base = f"https://localhost:{server.sockets[0].getsockname()[1]}"
        async with server:
            async with _client(base, verify=ssl.create_default_context(cafile=str(cert))) as client:
                for _ in range(3):
                    r = await client.post("/x", content=b"a")
                    assert r.content == b"secret"
                    assert r.extensions["network_stream"].get_extra_info("ssl_object") is not None
            assert len(accepted) == 1
            async with _client(base) as client:      # the system's roots: a self-signed certificate is refused
                with pytest.raises(httpx.ConnectError):
                    await client.get("/x")

    run(main())


def test_chunked_and_close_delimited_answers_arrive_whole_and_only_a_reusable_connection_is_reused(run: Run) -> None:
    """A chunked answer keeps its connection; one that says `connection: close`, one whose end is the connection's
    (no length), and one the client stopped reading each cost their connection; an interim (1xx) answer is passed
    over; a server that hangs up without answering is httpx's RemoteProtocolError; a cookie an answer sets goes
    with the next requests."""
    accepted = []
    heads = []
    answers = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nset-cookie: session=s1; Path=/\r\n\r\n"
        b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",   # same connection
        b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nreal",  # same
        _answer(b"bye", close=True),
        b"HTTP/1.1 200 OK\r\n\r\nuntil the end",                                      # new connection
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",             # new: its end never comes
        b"",                                                                          # new: no answer
        _answer(b"last"),                                                             # new
    ]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        try:
            while answers and (head := await _request(reader)):
                heads.append(head)
                answer = answers.pop(0)
                writer.write(answer)
                await writer.drain()
                if not answer.startswith((b"HTTP/1.1 200 OK\r\ntransfer-encoding", b"HTTP/1.1 103")):
                    break
        except asyncio.IncompleteReadError:
            pass                                  # the client closed the connection
        writer.close()

    async def main() -> None:
        server, base = await _serve(handler)
        async with server, _client(base) as client:
            client.cookies.set("jar", "kept", domain="127.0.0.1")
            assert (await client.post("/x", content=b"a")).content == b"abcdefg"
            assert (await client.post("/x", content=b"b")).content == b"hi"
            r = await client.post("/x", content=b"b2")        # an interim answer first: the real one is the answer
            assert (r.status_code, r.content, "link" in r.headers) == (200, b"real", False)
            assert len(accepted) == 1
            assert (await client.post("/x", content=b"c")).content == b"bye"
            assert (await client.post("/x", content=b"d")).content == b"until the end"
            assert len(accepted) == 2
            async with client.stream("POST", "/x", content=b"e") as r:
                async for _ in r.aiter_bytes():
                    break                         # stop reading: the answer's end would come on the connection
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post("/x", content=b"f")
            assert (await client.post("/x", content=b"g")).content == b"last"
        assert len(accepted) == 5
        # the cookie one answer set goes with the next requests, beside the client's own (httpx's jar)
        assert b"session=s1" not in heads[0] and all(b"session=s1" in h and b"jar=kept" in h for h in heads[1:])

    run(main())


def test_at_most_max_connections_at_once_and_a_request_past_them_waits_for_one(run: Run) -> None:
    release = asyncio.Event()
    accepted = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        while await _request(reader):
            await release.wait()
            writer.write(_answer(b"ok"))
            await writer.drain()
        writer.close()

    async def main() -> None:
        server, base = await _serve(handler)
        limits = httpx.Limits(max_connections=1)
        async with server, _client(base, limits=limits, timeout=httpx.Timeout(5, pool=0.2)) as client:
            first = asyncio.create_task(client.post("/x", content=b"a"))
            await wait_until_async(lambda: len(accepted) == 1, timeout=30)
            with pytest.raises(httpx.PoolTimeout):
                await client.post("/x", content=b"b")
            second = asyncio.create_task(client.post("/x", content=b"c"))
            release.set()
            assert (await first).content == b"ok" and (await second).content == b"ok"
        assert len(accepted) == 1

    run(main())


def test_a_header_with_a_line_break_is_refused_not_sent(run: Run) -> None:
    """A value that would end the header line early (one a client's own header could carry) never reaches the
    upstream: httpx's LocalProtocolError, as h11 refuses it."""
    heads = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await _request(reader):
            heads.append(head)
            writer.write(_answer(b"ok"))
            await writer.drain()
        writer.close()

    async def main() -> None:
        server, base = await _serve(handler)
        async with server, _client(base) as client:
            for bad in ("a\r\nx-injected: 1", "a\nb", "a\rb"):
                with pytest.raises(httpx.LocalProtocolError):
                    await client.post("/x", content=b"a", headers={"x-client": bad})
            assert (await client.post("/x", content=b"a", headers={"x-client": "fine"})).content == b"ok"
        assert len(heads) == 1 and b"x-client: fine" in heads[0]

    run(main())


def test_a_streamed_body_goes_to_the_fallback_and_a_proxy_leaves_the_client_as_httpx_makes_it(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    # H1Transport takes only what it parses itself; a request whose body streams goes to the transport under it
    async def main() -> None:
        mock = httpx.MockTransport(lambda r: httpx.Response(200, content=r.method.encode()))
        h1 = H1Transport(mock, 1, 1, None)

        async def body():
            yield b"x"

        got = await h1.handle_async_request(httpx.Request("POST", "http://upstream/", content=body()))
        assert got.status_code == 200 and await got.aread() == b"POST"
    run(main())
    # a proxy from the environment applies: httpx's own client, which reads and honours it
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    proxied = upstream_client("http://upstream.example", headers={}, timeout=httpx.Timeout(1.0),
                              limits=httpx.Limits())
    assert type(proxied) is httpx.AsyncClient
    monkeypatch.setenv("NO_PROXY", "upstream.example")
    direct = upstream_client("http://upstream.example", headers={}, timeout=httpx.Timeout(1.0),
                             limits=httpx.Limits())
    assert isinstance(direct.transport, H1Transport)          # type: ignore[attr-defined]


def test_an_answer_without_cookies_leaves_the_jar_alone_and_one_with_cookies_fills_it(run: Run) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await _request(reader):
            extra = b"set-cookie: a=1; Path=/\r\n" if b"/cookie" in head.split(b"\r\n")[0] else b""
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n" + extra + b"\r\nok")
            await writer.drain()
        writer.close()

    async def main() -> None:
        server, base = await _serve(handler)
        async with server, _client(base) as client:
            assert isinstance(client.cookies, Cookies)
            await client.get("/plain")
            assert dict(client.cookies) == {}
            await client.get("/cookie")
            assert dict(client.cookies) == {"a": "1"}
    run(main())
