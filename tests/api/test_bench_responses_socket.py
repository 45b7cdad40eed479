"""bench/responses_socket.py works as its docstring says: the same tool loop over the socket and over HTTP, both
billed, each continuing its own prefix, and the ratio printed."""

from __future__ import annotations

import re
import sys

import pytest

from tests.helpers.bench_module import load_bench

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


def test_the_tool_loop_runs_over_both_and_prints_the_ratio(server, monkeypatch, capsys):
    bench = load_bench("responses_socket.py")
    monkeypatch.setattr(sys, "argv", ["responses_socket.py", "--base-url", server.base_url, "--turns", "2",
                                      "--rounds", "1"])
    bench.main()
    out = capsys.readouterr().out
    rows = {m[1]: (float(m[2]), int(m[4]), int(m[5]))
            for m in re.finditer(r"^(socket|http)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+[\d.]+$", out, re.M)}
    assert set(rows) == {"socket", "http"}, out
    assert all(0 < cached < prompt for _, prompt, cached in rows.values())  # each turn past the first continues
    assert re.search(r"^socket / http: [\d.]+$", out, re.M)
