"""`tokenomy report --verify`: the report's figures against a second computation from the raw rows."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from tests.helpers.synthetic import mixed, rows_for
from tokenomy.cli import app
from tokenomy.ledger.ledger import Ledger
from tokenomy.ledger.tables import ledger as table
from tokenomy.report import figures as report

runner = CliRunner()


def _ledger(url: str) -> list:
    rows = rows_for(mixed())
    with Ledger(url) as led:
        for r in rows:
            led.write(r)
        led.flush()
        led.feedback(rows[0].request_id, 0.5)
    return rows


@pytest.mark.parametrize("by", [None, "tenant", "model", "key", "route"])
def test_verify_agrees_on_a_real_ledger(ledger_url, by):
    _ledger(ledger_url)
    args = ["report", "--ledger", ledger_url, "--verify", "-f", "json"] + (["--by", by] if by else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert "figures recomputed from the raw rows agree" in result.stderr


def test_verify_fails_loudly_when_the_report_miscounts(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _ledger(url)
    real = report.figures

    def off_by_one(rows):                                   # a report bug: one request too many
        figs = real(rows)
        figs["requests"] += 1
        figs["cost_usd"]["total"] *= 1.001
        return figs

    monkeypatch.setattr(report, "figures", off_by_one)
    result = runner.invoke(app, ["report", "--ledger", url, "--verify", "--by", "model"])
    assert result.exit_code == 1
    assert "total.requests: report 13 != recomputed 12" in result.stderr
    assert "groups.large.cost_usd.total" in result.stderr and "verify FAILED" in result.stderr
    assert "Traceback" not in result.output


def test_verify_notices_a_cost_edited_in_the_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    rows = _ledger(url)
    with Ledger(url) as led, led.engine.begin() as conn:       # both paths read the same edited row; the row's
        conn.execute(sa.update(table).where(table.c.request_id == rows[1].request_id)   # parts no longer add up
                     .values(cost_usd=table.c.cost_usd + 1.0))
    result = runner.invoke(app, ["report", "--ledger", url, "--verify"])
    assert result.exit_code == 1
    assert f"row {rows[1].request_id}: cost_usd" in result.stderr
    assert "!= input + cached input + cache write + output" in result.stderr
