"""`tokenomy router calibrate --token`: what it refuses before any model is loaded. Each mistake is exit code 2 and
one line on stderr naming it, never a traceback. (The calibration itself runs models:
tools/router_training/token_threshold.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tokenomy.tools.router_training.command import app

runner = CliRunner()
CONFIG = {
    "engine": {"n_ctx": 4096, "max_model_len": 512, "max_running": 8, "max_retired": 0, "n_threads": 2},
    "models": [{"name": "small", "gguf": "smollm2-135m-instruct"}, {"name": "big", "gguf": "gemma3-270m"}],
    "routes": {"tok": {"strategy": "token", "models": ["small", "big"]},
               "ladder": {"strategy": "cascade", "models": ["small", "big"]}},
    "ledger": None,
}


@pytest.fixture
def files(tmp_path, monkeypatch) -> dict[str, Path]:
    import tokenomy.gateway

    def no_models(*_, **__):
        raise AssertionError("a refused calibration must not build a backend")

    monkeypatch.setattr(tokenomy.gateway, "build_backend", no_models)
    config, prompts = tmp_path / "tokenomy.yaml", tmp_path / "prompts.jsonl"
    config.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    prompts.write_text("".join(json.dumps(q) + "\n" for q in ["What is 2 + 2?", "Name a colour."]),
                       encoding="utf-8")
    return {"config": config, "prompts": prompts, "dir": tmp_path}


def run(*args: object):
    return runner.invoke(app, ["calibrate", "--token", *[str(a) for a in args]])


def refused(result, message: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit)             # typer.Exit, not an escaped error
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.output and result.stdout == ""


def test_a_missing_or_impossible_target_is_refused(files) -> None:
    base = ("--config", files["config"], "--route", "tok", "--prompts", files["prompts"])
    refused(run(*base), "--token needs --config, --route, --prompts and --large-share")
    for share in ("1.5", "1", "0", "-0.2", "nan"):
        refused(run(*base, "--large-share", share), f"--large-share must be between 0 and 1, got {float(share)}")
    refused(run(*base, "--large-share", "0.2", "--rounds", "0"), "--rounds and --max-tokens must be at least 1")
    for missing in ("--config", "--route", "--prompts"):
        i = base.index(missing)
        refused(run(*base[:i], *base[i + 2:], "--large-share", "0.2"), "--token needs --config, --route")


def test_a_route_that_is_not_a_token_route_is_refused_naming_the_token_routes(files) -> None:
    base = ("--config", files["config"], "--prompts", files["prompts"], "--large-share", "0.2")
    refused(run(*base, "--route", "ladder"), f"route 'ladder' is not a token route in {files['config']}; "
                                             "routes: tok")
    refused(run(*base, "--route", "nope"), "route 'nope' is not a token route")
    plain = files["dir"] / "plain.yaml"
    plain.write_text(yaml.safe_dump({**CONFIG, "routes": {"ladder": CONFIG["routes"]["ladder"]}}), encoding="utf-8")
    refused(run("--config", plain, "--prompts", files["prompts"], "--large-share", "0.2", "--route", "ladder"),
            "routes: none")


def test_other_modes_and_bad_files_are_refused(files) -> None:
    base = ("--config", files["config"], "--route", "tok", "--prompts", files["prompts"], "--large-share", "0.2")
    refused(run(*base, "--cascade"), "--token takes --config, --route, --prompts and --large-share")
    refused(run(*base, "--router", "r.json"), "--token takes")
    for other in (("--strong-share", "0.3"), ("--quality-floor", "0.9"), ("--escalation-share", "0.2"),
                  ("--break-even",)):
        refused(run(*base, *other), "--token takes")        # another mode's target is not silently ignored
    cascade = runner.invoke(app, ["calibrate", "--cascade", "--config", str(files["config"]), "--route", "tok",
                                  "--prompts", str(files["prompts"]), "--large-share", "0.2", "--break-even"])
    refused(cascade, "--large-share goes with --token")
    bad = files["dir"] / "bad.jsonl"
    bad.write_text('"fine"\n{"prompt": ""}\n', encoding="utf-8")
    refused(run("--config", files["config"], "--route", "tok", "--prompts", bad, "--large-share", "0.2"),
            "bad.jsonl:2: needs a non-empty prompt")
    refused(run(*base[:4], "--prompts", files["dir"] / "absent.jsonl", "--large-share", "0.2"), "absent.jsonl")
