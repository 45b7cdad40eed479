"""Starting an engine process: a fresh interpreter running core.main on one end of a socket pair, sent the model to
load. Apart from client.py, and light to import, so that `tokenomy serve` starts its engine processes before it
imports the rest of the gateway: each child loads its model while the parent builds everything else
(docs/install.md has the phases of a start)."""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenomy.engine.config import EngineConfig

ENTRY = "import sys; from tokenomy.engine.core import main; main(int(sys.argv[1]), *sys.argv[2:])"

Launch = tuple[subprocess.Popen, Connection]     # a child loading its model, and our end of its socket pair


def launch(path: str, cfg: EngineConfig, name: str) -> Launch:
    """Start the engine process and send it the model to load; EngineClient waits for its self-check. The child
    exits when our end of the socket closes."""
    # a fresh interpreter, not multiprocessing's spawn, which re-imports the caller's __main__
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, str(theirs.fileno())], pass_fds=[theirs.fileno()])
    theirs.close()
    conn = Connection(ours.detach())
    try:
        conn.send((path, cfg, name))
    except OSError:
        pass                  # the child died at once: the wait for its self-check reads why
    return proc, conn


@dataclass(frozen=True)
class Launched:
    """An embedded model's engine process started before its backend is built (`tokenomy serve`): the GGUF,
    engine config and sizing it was started with, and the process."""

    path: str
    cfg: EngineConfig
    fit: Any              # engine.fit.Fit
    launch: Launch
