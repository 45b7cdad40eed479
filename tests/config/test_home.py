"""State goes to a per-user data directory, never to the directory a server starts in; the config's paths win."""

from __future__ import annotations

import asyncio

from tokenomy.config import Config, home
from tokenomy.ledger.ledger import normalize_url
from tokenomy.server.command import state_line

UPSTREAM = {"name": "up", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}


def test_the_data_directory_is_tokenomy_home_then_xdg_then_local_share(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.delenv("TOKENOMY_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert home.data_dir() == tmp_path / "user" / ".local" / "share" / "tokenomy"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")      # the XDG spec: a relative path is ignored
    assert home.data_dir() == tmp_path / "user" / ".local" / "share" / "tokenomy"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert home.data_dir() == tmp_path / "xdg" / "tokenomy"
    monkeypatch.setenv("TOKENOMY_HOME", str(tmp_path / "mine"))
    assert home.data_dir() == tmp_path / "mine"


def test_defaults_point_into_the_data_directory_and_the_startup_line_names_them(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TOKENOMY_HOME", str(tmp_path / "home"))
    cfg = Config()
    assert cfg.cache.directory() == tmp_path / "home" / "cache"
    assert normalize_url(cfg.ledger.url) == f"sqlite:///{tmp_path / 'home' / 'ledger.db'}"
    line = state_line(cfg)
    assert str(tmp_path / "home" / "cache") in line and str(tmp_path / "home" / "ledger.db") in line


def test_the_configs_paths_win_and_the_startup_line_names_them(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TOKENOMY_HOME", str(tmp_path / "home"))
    cfg = Config.model_validate({"cache": {"path": str(tmp_path / "c")},
                                 "ledger": "postgresql://me:secret@db.example/led"})
    assert cfg.cache.directory() == tmp_path / "c"
    line = state_line(cfg)
    assert str(tmp_path / "c") in line and "://me:***@db.example/led" in line
    assert "secret" not in line and str(tmp_path / "home") not in line
    off = Config.model_validate({"ledger": None, "cache": {"exact": {"enabled": False},
                                                           "semantic": {"enabled": False}}})
    assert state_line(off) == "ledger: off; response cache: off"
    shared = Config.model_validate({"cache": {"store": "redis://:pw@cache.example:6379/0",
                                              "semantic": {"enabled": False}}})
    assert "redis://:***@cache.example:6379/0" in state_line(shared) and "pw" not in state_line(shared)


def test_a_gateway_writes_nothing_where_it_is_started(tmp_path, monkeypatch) -> None:
    from tokenomy.gateway import Gateway

    cwd, data = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TOKENOMY_HOME", str(data))
    gw = Gateway(Config.model_validate({"models": [UPSTREAM], "cache": {"semantic": {"enabled": False}}}))
    try:
        assert gw.ledger is not None and gw.exact_cache is not None
    finally:
        asyncio.run(gw.close())
    assert list(cwd.iterdir()) == []
    assert (data / "ledger.db").exists() and list((data / "cache").glob("exact*"))



def test_report_reads_the_ledger_a_server_writes_by_default(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from tests.helpers.synthetic import Spec, rows_for
    from tokenomy.cli import app
    from tokenomy.ledger.ledger import Ledger

    monkeypatch.setenv("TOKENOMY_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    missing = CliRunner().invoke(app, ["report", "-f", "json"])
    assert missing.exit_code == 1 and str(tmp_path / "home" / "ledger.db") in missing.output
    with Ledger() as led:
        for row in rows_for([Spec("small", 1, 0, 1), Spec("small", 2, 0, 1)]):
            led.write(row)
    r = CliRunner().invoke(app, ["report", "-f", "json"])
    assert r.exit_code == 0 and '"requests": 2' in r.output
