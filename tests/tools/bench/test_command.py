"""`tokenomy bench` end to end through the CLI: against a live tokenomy, two stub endpoints compared, and bad
input answered with one line and exit code 2 (or 1 for what the network or disk refuses), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import LiveServer, free_port
from tests.tools.bench.stub import BenchStub, Served
from tokenomy.cli import app

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

runner = CliRunner()
VLLM_KEYS = {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
             "output_throughput", "total_token_throughput", "request_goodput", "max_concurrency", "request_rate",
             *(f"{stat}_{m}_ms" for stat in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl", "e2el"))}


def bench(*args: str):
    return runner.invoke(app, ["bench", *args])


def flat(text: str) -> str:
    """Output with typer's error box drawn away, so a message wrapped over box lines reads as one line."""
    return " ".join(text.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


def test_against_live_tokenomy(server: LiveServer, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    r = bench("--base-url", server.base_url, "--model", "smollm2-135m-instruct", "--concurrency", "1,2", "-n", "2",
              "--max-tokens", "8", "--ignore-eos", "--slo", "ttft=30s,tpot=10s", "--json", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert [(s["max_concurrency"], s["completed"], s["failed"]) for s in doc["runs"]] == [(1, 2, 0), (2, 2, 0)]
    for s in doc["runs"]:
        assert VLLM_KEYS <= set(s)
        assert s["token_counts"] == "usage" and s["total_output_tokens"] == 16     # ignore_eos: 8 tokens each
        assert s["total_input_tokens"] > 0 and s["request_goodput"] == pytest.approx(s["request_throughput"])
        assert 0 < s["median_ttft_ms"] <= s["median_e2el_ms"]
    assert doc["slo_ms"] == {"ttft": 30000.0, "tpot": 10000.0}
    assert "tokenomy bench" in r.output


def test_compare_two_endpoints(tmp_path: Path) -> None:
    out, page, log = tmp_path / "cmp.json", tmp_path / "cmp.html", []
    with Served(BenchStub("a", tokens=6, log=log)) as a, Served(BenchStub("b", tokens=3, usage=False, log=log)) as b:
        r = bench("--base-url", a.base_url, "--model", "m", "--compare", b.base_url, "--compare-model", "n",
                  "--rounds", "2", "--concurrency", "1", "-n", "3", "--json", str(out), "--html", str(page))
        assert b.app.bodies[0]["model"] == "n" and a.app.bodies[0]["model"] == "m"
    assert r.exit_code == 0, r.output
    assert log == ["a", "b"] + ["a"] * 3 + ["b"] * 6 + ["a"] * 3     # one unrecorded warm-up request each first
    doc = json.loads(out.read_text())
    base, other = doc["runs"]
    assert (base["endpoint"], other["endpoint"]) == ("base", "compare") and base["rounds"] == 2
    assert other["token_counts"] == "chunks" and "sent no usage" in r.output
    ratio = doc["comparisons"][0]["ratios"]
    assert ratio["output_throughput"] == pytest.approx(base["output_throughput"] / other["output_throughput"])
    assert "base / compare" in r.output
    assert page.exists() and "Plotly.newPlot" in page.read_text()


def test_failures_shown_not_dropped(tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    with Served(BenchStub(fail_every=2)) as s:
        r = bench("--base-url", s.base_url, "--model", "m", "-n", "4", "--warmup", "0", "--json", str(out))
    assert r.exit_code == 0
    run = json.loads(out.read_text())["runs"][0]
    assert (run["completed"], run["failed"]) == (2, 2)
    assert "planted failure 2" in r.output and "planted failure 4" in r.output


def test_nothing_completed_exits_1() -> None:
    with Served(BenchStub(fail_every=1)) as s:
        r = bench("--base-url", s.base_url, "--model", "m", "-n", "2")
    assert r.exit_code == 1 and "no request completed" in r.output


def test_base_url_without_v1_and_workload_file_replay(tmp_path: Path) -> None:
    work = tmp_path / "w.jsonl"
    work.write_text('{"body": {"messages": [{"role": "user", "content": "a"}]}, "arrival_s": 0}\n'
                    '{"body": {"prompt": "b"}, "arrival_s": 0.1}\n')
    out = tmp_path / "t.json"
    with Served(BenchStub()) as s:
        r = bench("--base-url", f"http://127.0.0.1:{s.port}", "--model", "m", "-w", str(work), "--warmup", "0",
                  "--json", str(out))
        assert r.exit_code == 0, r.output
        run = json.loads(out.read_text())["runs"][0]
        assert run["load"] == "trace" and run["completed"] == 2
        assert len(s.app.bodies) == 2 and s.app.bodies[1]["prompt"] == "b"


@pytest.mark.parametrize("args, words", [
    (["-w", "nonesuch"], "unknown workload 'nonesuch'"),
    (["--slo", "ttft=abc"], "not a duration"),
    (["--slo", "foo=1s"], "unknown SLO metric 'foo'"),
    (["--concurrency", "1", "--rate", "2"], "not both"),
    (["--requests", "3", "--duration", "2"], "not both"),
    (["--concurrency", "0"], "whole number"),
    (["--rate", "fast"], "not a number"),
    (["--api-key-env", "TOKENOMY_BENCH_NO_SUCH_VAR"], "TOKENOMY_BENCH_NO_SUCH_VAR is not set"),
    (["-w", "random:input=9-3"], "LO-HI"),
])
def test_bad_input_exits_2(args: list[str], words: str) -> None:
    r = bench("--base-url", "http://127.0.0.1:9/v1", "--model", "m", *args)
    assert r.exit_code == 2, r.output
    assert words in flat(r.output) and "Traceback" not in r.output


def test_bad_base_url_and_unreadable_workload_file(tmp_path: Path) -> None:
    r = bench("--base-url", "localhost:8000", "--model", "m")
    assert r.exit_code == 2 and "not an http(s) URL" in r.output
    r = bench("--base-url", "http://127.0.0.1:9/v1", "--model", "m", "-w", str(tmp_path))   # a directory
    assert r.exit_code == 2 and "cannot read workload file" in flat(r.output)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    r = bench("--base-url", "http://127.0.0.1:9/v1", "--model", "m", "-w", str(bad))
    assert r.exit_code == 2 and "not JSON" in flat(r.output)


def test_unreachable_base_url_exits_1() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    r = bench("--base-url", url, "--model", "m")
    assert r.exit_code == 1 and f"cannot reach {url}" in r.output and "Traceback" not in r.output
