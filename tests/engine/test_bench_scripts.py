"""The engine's bench scripts work as their docs say: the plain-client latency bench against a live server, the
requantized draft pair that bench/engine_techniques.py builds, the stream placement bench's two rules and the KV tier
save bench's two rules, and the predicted outputs bench's three modes."""

from __future__ import annotations

import re
import sys

import pytest

from tests.helpers.bench_module import load_bench
from tests.helpers.shared_data import shared_data
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.spec.draft import DraftModel
from tokenomy.engine.vocab import Vocab

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


def test_stream_latency_reads_one_stream_and_compares_two_servers(server, monkeypatch, capsys):
    bench = load_bench("stream_latency.py")
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 4, "temperature": 0, "stream": True, "ignore_eos": True}
    ttft, tpot = bench.one(server.base_url, body)
    assert 0 < ttft < 60 and 0 < tpot < 10
    path = shared_data("grounded/dev.jsonl", "TOKENOMY_GROUNDED")
    monkeypatch.setattr(sys, "argv", ["stream_latency.py", "--base-url", server.base_url, "--compare",
                                      server.base_url, "--prompts", "1", "--rounds", "1", "--max-tokens", "3",
                                      "--grounded", str(path)])
    bench.main()
    out = capsys.readouterr().out
    for name in ("base", "compare"):              # TTFT and TPOT medians, both measured
        row = re.search(rf"^{name}\s+([\d.]+)\s+([\d.]+)$", out, re.M)
        assert row and float(row[1]) > 0 and float(row[2]) > 0, out
    assert re.search(r"base / compare: TTFT [\d.]+x, TPOT [\d.]+x", out)


def test_the_requantized_target_shares_the_draft_models_vocabulary(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENOMY_CACHE_DIR", str(tmp_path))
    bench = load_bench("engine_techniques.py")
    target = bench.model_path("smollm2-f16")
    assert target.startswith(str(tmp_path)) and bench.model_path("smollm2-f16") == target   # made once
    draft = bench.model_path("smollm2-135m-instruct")
    v = Vocab(target, vocab_only=True)
    try:
        d = DraftModel(draft, EngineConfig(n_ctx=1024, max_running=1, max_retired=0), v)
        d.close()
    finally:
        v.close()
    with pytest.raises(FileNotFoundError):
        bench.model_path(str(tmp_path / "missing.gguf"))


def test_stream_placement_compares_the_two_rules_on_one_engine(monkeypatch, capsys):
    bench = load_bench("stream_placement.py")
    path = shared_data("grounded/dev.jsonl", "TOKENOMY_GROUNDED")
    monkeypatch.setattr(sys, "argv", ["stream_placement.py", "--prompts", "3", "--concurrency", "2", "--rounds", "1",
                                      "--max-tokens", "3", "--delay-ms", "0", "--streams", "4", "--n-ctx", "8192",
                                      "--grounded", str(path)])
    bench.main()
    out = capsys.readouterr().out
    rows = {m[1]: m for m in re.finditer(r"^\s*(128|None)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", out, re.M)}
    assert set(rows) == {"128", "None"}, out
    assert float(rows["128"][3]) == 1.0 and all(float(r[2]) > 0 and float(r[4]) > 0 for r in rows.values())


def test_tier_save_compares_saving_at_eviction_with_saving_after_finish(monkeypatch, capsys):
    bench = load_bench("tier_save.py")
    path = shared_data("grounded/dev.jsonl", "TOKENOMY_GROUNDED")
    monkeypatch.setattr(sys, "argv", ["tier_save.py", "--prompts", "4", "--streams", "3", "--concurrency", "1",
                                      "--rounds", "1", "--max-tokens", "2", "--delay-ms", "0",
                                      "--grounded", str(path)])
    bench.main()
    out = capsys.readouterr().out
    rows = {m[1]: m for m in re.finditer(r"^\s*(at eviction|after finish)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                                         r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)}
    assert set(rows) == {"at eviction", "after finish"}, out
    assert float(rows["at eviction"][3]) == 1.0 and all(float(r[2]) > 0 and float(r[4]) > 0 for r in rows.values())


def test_predicted_outputs_compares_no_right_and_wrong_prediction_in_one_run(monkeypatch, capsys):
    bench = load_bench("predicted_outputs.py")
    path = shared_data("grounded/dev.jsonl", "TOKENOMY_GROUNDED")
    monkeypatch.setattr(sys, "argv", ["predicted_outputs.py", "--quick", "--threads", "1", "--grounded", str(path)])
    bench.main()
    out = capsys.readouterr().out
    rows = {(m[1], m[2]): m for m in re.finditer(r"^\s*(1|2)\s+(none|right|wrong)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+"
                                                r"(\S+)\s+(\d+)/(\d+)$", out, re.M)}
    assert set(rows) == {(c, m) for c in ("1", "2") for m in ("none", "right", "wrong")}, out
    assert all(float(r[3]) > 0 and r[8] == "2" for r in rows.values())
    assert all(float(rows[(c, "none")][4]) == 1.0 and rows[(c, "none")][5] == "0" for c in ("1", "2"))
    # whether drafting pays is the measured step cost's call (tests/engine/spec/test_speculate.py fixes it); what was
    # drafted from the right prediction was mostly accepted
    assert all(r[6] == "-" or float(r[6]) > 0.5 for r in (rows[("1", "right")], rows[("2", "right")]))
