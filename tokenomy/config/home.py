"""Where tokenomy keeps its state by default: one per-user data directory, never the working directory.

``$TOKENOMY_HOME`` when set, else ``$XDG_DATA_HOME/tokenomy``, else ``~/.local/share/tokenomy`` (the XDG base
directory default). The ledger (``ledger.db``) and the response caches (``cache/``) live there unless the config
names other places (``ledger.url``, ``cache.path``). Downloaded and derived model files are a cache, not state:
they live under ``models.cache_dir()``.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "TOKENOMY_HOME"


def data_dir() -> Path:
    """The per-user data directory (not created here)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "tokenomy"


def ledger_url() -> str:
    """The default ledger: a SQLite file in the data directory."""
    return f"sqlite:///{data_dir() / 'ledger.db'}"


def cache_path() -> Path:
    """The default directory of the response caches' SQLite files and ANN indexes."""
    return data_dir() / "cache"
