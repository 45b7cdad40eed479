"""A tiny Hugging Face hub on loopback: what `huggingface_hub` asks of HF_ENDPOINT to list a repo and download its
files, answered from files held here, so tests run the library's real download code (tokenomy/models/hub.py).

Endpoints (as huggingface_hub 2.x calls them):
- GET /api/models/{org}/{repo}[/revision/{rev}]: the repo's info, `siblings` listing its files (HfApi.model_info);
  an unknown repo is a 404 with `X-Error-Code: RepoNotFound`, as the hub answers.
- HEAD and GET /{org}/{repo}/resolve/{rev}/{path}: the file, with the headers hf_hub_download needs
  (`X-Repo-Commit`, `ETag`, Content-Length) and byte ranges (206 + Content-Range) for resumed downloads; an unknown
  file is a 404 with `X-Error-Code: EntryNotFound`.

`drop_once` names files whose first full GET is cut off after half its bytes (the connection closes mid-body), as
a failing network would; `stall_once` files send half and then nothing until the server stops (for a client to
be killed mid-download); `requests` records (method, path, Range header) for assertions.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubServer:
    def __init__(self, repos: dict[str, dict[str, Path | bytes]], drop_once: set[str] | None = None,
                 stall_once: set[str] | None = None) -> None:
        self.repos = repos
        self.drop_once = set(drop_once or ())
        self.stall_once = set(stall_once or ())
        self._stop = threading.Event()
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                hub._handle(self, body=True)

            def do_HEAD(self) -> None:
                hub._handle(self, body=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _content(self, repo: str, name: str) -> bytes | None:
        data = self.repos.get(repo, {}).get(name)
        return data.read_bytes() if isinstance(data, Path) else data

    def _handle(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._info("/".join(parts[2:4]), h, body)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file("/".join(parts[:2]), "/".join(parts[4:]), h, body)
        self._error(h, 404, "Not found", None)

    def _error(self, h: BaseHTTPRequestHandler, status: int, message: str, code: str | None) -> None:
        data = json.dumps({"error": message}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
            h.send_header("X-Error-Message", message)
            h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _info(self, repo: str, h: BaseHTTPRequestHandler, body: bool) -> None:
        if repo not in self.repos:
            return self._error(h, 404, "Repository not found", "RepoNotFound")
        data = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                           "siblings": [{"rfilename": f} for f in sorted(self.repos[repo])]}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _file(self, repo: str, name: str, h: BaseHTTPRequestHandler, body: bool) -> None:
        if repo not in self.repos:
            return self._error(h, 404, "Repository not found", "RepoNotFound")
        content = self._content(repo, name)
        if content is None:
            return self._error(h, 404, "Entry not found", "EntryNotFound")
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[len("bytes="):].split("-")[0])
        chunk = content[start:]
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", f'"{hashlib.sha256(content).hexdigest()}"')
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(chunk)))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
        h.end_headers()
        if not body:
            return
        if name in self.stall_once and not start:
            self.stall_once.discard(name)
            h.wfile.write(chunk[:len(chunk) // 2])
            h.wfile.flush()
            self._stop.wait()
            h.close_connection = True
            return
        if name in self.drop_once and not start:
            self.drop_once.discard(name)
            h.wfile.write(chunk[:len(chunk) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)       # the rest never comes: the client sees the body cut short
            return
        h.wfile.write(chunk)
