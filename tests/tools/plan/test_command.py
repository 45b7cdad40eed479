"""`tokenomy plan` end to end through the CLI."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import typer
from typer.testing import CliRunner

from tokenomy.tools.plan.command import plan
from tokenomy.tools.plan.presets import hardware_names, model_names

REQUIRED_KEYS = {"weight_bytes", "kv_bytes_per_token", "kv_bytes_per_sequence", "max_sequences", "tpot_floor_ms",
                 "tpot_compute_ms", "bound", "arithmetic_intensity", "ridge_point", "tokens_per_s_ceiling",
                 "joules_per_token_estimate", "usd_per_million_tokens"}


def _app() -> typer.Typer:
    """The real `tokenomy` app when all of cli.py's imports exist; else the same command on its own app."""
    if importlib.util.find_spec("tokenomy.tools.router_training.command") is not None:
        from tokenomy.cli import app

        return app
    app = typer.Typer()
    app.command("plan")(plan)
    app.command("noop")(lambda: None)  # two commands, so `plan` is addressed by name as in the real CLI
    return app


runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(_app(), ["plan", *args])


def run_json(*args: str) -> dict:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_has_the_issue_keys_and_the_seed_floor():
    out = run_json("--model", "llama-3-70b", "--hardware", "h100-sxm", "--weights", "fp16",
                   "--price-per-hour", "3")
    assert REQUIRED_KEYS <= out.keys()
    assert 41 <= out["tpot_floor_ms"] <= 43
    assert out["bound"] == "memory" and out["arithmetic_intensity"] < out["ridge_point"]
    assert out["usd_per_million_tokens"] > 0 and out["joules_per_token_estimate"] > 0


def test_table_output_names_the_figures():
    result = invoke("--model", "qwen3-next-80b-a3b", "--hardware", "h200", "--context", "131072")
    assert result.exit_code == 0, result.output
    for text in ("KV bytes per token", "max concurrent sequences", "binding limit", "tokens/s ceiling"):
        assert text in result.output
    assert "incl." in result.output  # the linear-attention state shows up in the per-sequence cache


def test_compare_puts_settings_side_by_side():
    out = run_json("--model", "llama-3-8b", "--hardware", "h100-sxm", "--weights", "fp16",
                   "--compare", "weights=int4", "--compare", "kv=fp8,batch=8")
    int4, fp8 = out["compare"]
    assert int4["weights"] == "int4" and int4["tpot_floor_ms"] < out["tpot_floor_ms"] / 3
    assert fp8["kv_bytes_per_token"] == out["kv_bytes_per_token"] / 2 and fp8["batch"] == 8
    result = invoke("--model", "llama-3-8b", "--hardware", "h100-sxm", "--compare", "hardware=mi300x")
    assert result.exit_code == 0 and "mi300x" in result.output and "base" in result.output


def test_gguf_path_and_local_hardware_with_measured_rate(smollm2_gguf):
    out = run_json("--model", str(smollm2_gguf), "--hardware", "local", "--measured-tps", "79",
                   "--context", "64")
    assert out["weights"] == "gguf Q4_1" and out["hardware_measured"]
    assert out["achieved_ratio"] == pytest.approx(79 / out["tokens_per_s_ceiling"])
    result = invoke("--model", "smollm2-135m-instruct", "--hardware", "local", "--measured-tps", "79")
    assert result.exit_code == 0 and "achieved / predicted" in result.output


def test_plot_file_is_written(tmp_path):
    target = tmp_path / "roofline.png"
    result = invoke("--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--batch", "16", "--plot", str(target))
    assert result.exit_code == 0, result.output
    assert target.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, names", [
    (["--model", "gpt-7", "--hardware", "h100-sxm"], model_names()),
    (["--model", "llama-3-8b", "--hardware", "tpu"], hardware_names()),
])
def test_unknown_names_exit_nonzero_listing_valid_names(args, names):
    result = invoke(*args)
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)  # a usage error, not a traceback
    words = set(re.split(r"[\s,;│']+", result.output))
    assert set(names) <= words


@pytest.mark.parametrize("args, message", [
    (["--weights", "int3"], "unknown weights format"),
    (["--compare", "color=red"], "unknown setting"),
    (["--compare", "batch=lots"], "not a number"),
    (["--plot", "chart.bmp"], ".png"),
    (["--batch", "0"], "batch"),
])
def test_bad_options_exit_nonzero_with_a_message(args, message):
    result = invoke("--model", "llama-3-8b", "--hardware", "h100-sxm", *args)
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit)
    assert message in " ".join(result.output.split())
