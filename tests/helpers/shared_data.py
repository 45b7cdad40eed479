"""The evaluation data beside the repository (../shared/data, described by its README.md): where a test finds a
file, and a failure that says where it looked and what to set when the file is missing (never a silent skip)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA_ENV = "TOKENOMY_SHARED_DATA"


def shared_data_path(relpath: str, env: str) -> Path:
    """$ENV when set, else $TOKENOMY_SHARED_DATA/RELPATH, else ../shared/data/RELPATH beside the repository."""
    if os.environ.get(env):
        return Path(os.environ[env])
    return Path(os.environ.get(SHARED_DATA_ENV) or ROOT.parent / "shared" / "data") / relpath


def shared_data(relpath: str, env: str) -> Path:
    """The file, or a test failure naming the path looked at and the variables that point elsewhere."""
    path = shared_data_path(relpath, env)
    if not path.is_file():
        pytest.fail(f"evaluation data not found at {path}: set {env} to the file, or {SHARED_DATA_ENV} to a "
                    f"directory holding {relpath} (by default ../shared/data beside the repository)", pytrace=False)
    return path
