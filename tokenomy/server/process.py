"""A server process's own settings, the same in `tokenomy serve` (serve.py) and in each API worker (workers.py): its
log and how uvicorn serves."""

from __future__ import annotations

import importlib.util
import logging


def configure_logging() -> None:
    """The server's log: INFO and up, timestamped; httpx's line for every upstream request ("HTTP Request: POST
    ...", INFO) is left out: on the request path it cost 2-3% of the gateway's CPU, and the ledger has each call."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def uvicorn_options() -> dict[str, str]:
    """How uvicorn serves the gateway, in `tokenomy serve` and in each API worker alike: httptools' C parser and
    uvloop's event loop (uvicorn[standard]'s, what vLLM serves on) where they import, else h11 and asyncio. On the
    request path at one connection they cut the gateway's own CPU a request by about a fifth (docs/hardening.md,
    "Gateway overhead"); what a client sees is the same HTTP/1.1 either way."""
    def importable(name: str) -> bool:
        return importlib.util.find_spec(name) is not None

    return {"http": "httptools" if importable("httptools") else "h11",
            "loop": "uvloop" if importable("uvloop") else "asyncio"}
