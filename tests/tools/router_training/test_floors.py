"""`tokenomy router calibrate --cascade`: SmolLM2-135M answers real prompts once; the floors it prints must
produce the escalations they claim when cascade.judge applies them, and break-even must be the edge of saving."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from tokenomy.config import CascadeSettings, Config, Price
from tokenomy.router.cascade import judge
from tokenomy.tools.router_training.command import app
from tokenomy.tools.router_training.floors import FloorError, answers_from_json, choose_floors, load_prompts

runner = CliRunner()
QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "What is 12 times 12?",
             "Who wrote Romeo and Juliet?", "How many days are in a week?", "What is the largest ocean?",
             "Name a programming language.", "What color is a ripe banana?"]
CONFIG = {
    "engine": {"n_ctx": 4096, "max_model_len": 512, "max_running": 8, "max_retired": 0, "n_threads": 2},
    "models": [{"name": "small", "gguf": "smollm2-135m-instruct"}, {"name": "big", "gguf": "gemma3-270m"}],
    # Answers are cut at max_tokens here, and a truncated answer would escalate whatever the floors say.
    "routes": {"cheap_first": {"strategy": "cascade", "models": ["small", "big"],
                               "cascade": {"escalate_on_truncated": False}},
               "solo": {"strategy": "fixed", "models": ["small"]}},
    "ledger": None,
}


def run(*args: object):
    return runner.invoke(app, ["calibrate", *[str(a) for a in args]])


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("floors")
    config, prompts = d / "tokenomy.yaml", d / "prompts.jsonl"
    config.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    lines = [json.dumps(q) for q in QUESTIONS[:-1]]
    lines.append(json.dumps({"messages": [{"role": "user", "content": QUESTIONS[-1]}], "max_tokens": 2}))
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"config": config, "prompts": prompts, "dir": d}


@pytest.fixture(scope="module")
def share_run(files) -> dict:
    """One real run of the first model: target 50% escalations; the YAML also goes to a file."""
    before = files["config"].read_bytes()
    out = files["dir"] / "cascade.yaml"
    result = run("--cascade", "--config", files["config"], "--route", "cheap_first", "--prompts", files["prompts"],
                 "--escalation-share", "0.5", "--max-tokens", "24", "--json", "--out", out)
    assert result.exit_code == 0, result.output
    assert files["config"].read_bytes() == before      # the user's config is never edited
    return {"json": json.loads(result.stdout), "snippet": out.read_text(encoding="utf-8")}


def test_the_printed_floors_escalate_the_share_they_claim(share_run) -> None:
    body, answers = share_run["json"], answers_from_json(share_run["json"]["answers"])
    assert len(answers) == len(QUESTIONS) and all(a.logprobs for a in answers)
    # Pasted into the route's cascade block, the snippet gives a valid config whose settings make judge()
    # escalate what the report says.
    floors = yaml.safe_load(share_run["snippet"])["routes"]["cheap_first"]["cascade"]
    route = CONFIG["routes"]["cheap_first"]
    config = Config.model_validate({**CONFIG, "routes": {"cheap_first": {
        **route, "cascade": {**route["cascade"], **floors}}}})
    settings = config.routes["cheap_first"].cascade
    escalated = sum(judge(a.text, a.logprobs, a.finish_reason, None, settings).escalate for a in answers)
    assert escalated == body["escalated"]
    assert abs(escalated / len(answers) - 0.5) <= 1 / len(answers) + 1e-9
    assert settings.min_mean_logprob != CascadeSettings().min_mean_logprob


def test_break_even_is_the_largest_share_that_still_saves(share_run) -> None:
    answers = answers_from_json(share_run["json"]["answers"])
    base = CascadeSettings(escalate_on_truncated=False)
    cheap, capable = Price(input=0.02, output=0.08), Price(input=0.04, output=0.16)
    choice = choose_floors(answers, base, cheap, capable, min_saving=0.0)
    assert choice.cost_ratio < 1.0
    # Prices twice the cheap ones: the break-even share of the formula is 1 - 1/2.
    assert choice.target["break_even_share"] == pytest.approx(0.5)
    more = [choose_floors(answers, base, cheap, capable, escalation_share=s / len(answers))
            for s in range(choice.escalated + 1, len(answers) + 1)]
    assert all(m.cost_ratio >= 1.0 for m in more if m.escalated > choice.escalated)
    # Requiring a 20% saving escalates no more than break-even does.
    assert choose_floors(answers, base, cheap, capable, min_saving=0.2).escalated <= choice.escalated


def test_other_signals_count_and_an_unreachable_share_says_why(share_run) -> None:
    answers = answers_from_json(share_run["json"]["answers"])
    assert answers[-1].finish_reason == "length"          # the 2-token answer is truncated
    price = Price(input=0.02, output=0.08)
    with pytest.raises(FloorError, match="truncated"):
        choose_floors(answers, CascadeSettings(), price, price, escalation_share=0.0)
    # Calibrating only the mean floor keeps the configured token floor, whose escalations count as forced.
    token_floor = float(np.median([a.low for a in answers]))
    base = CascadeSettings(min_token_logprob=token_floor, escalate_on_truncated=False)
    only_mean = choose_floors(answers, base, price, price, escalation_share=0.75, signals=("mean",))
    assert only_mean.settings.min_token_logprob == token_floor
    assert only_mean.forced == sum(a.low < token_floor for a in answers) >= 1
    assert only_mean.forced <= only_mean.escalated


def test_bad_input_is_one_clear_line(files, tmp_path) -> None:
    base = ("--cascade", "--config", files["config"], "--prompts", files["prompts"])
    cases = [
        ((*base, "--route", "cheap_first"), "exactly one of --escalation-share and --break-even"),
        ((*base, "--route", "cheap_first", "--break-even", "--escalation-share", "0.2"), "exactly one"),
        ((*base, "--route", "nope", "--break-even"), "route 'nope' is not in"),
        ((*base, "--route", "solo", "--break-even"), "has one model"),
        (("--cascade", "--route", "cheap_first", "--break-even"), "needs --config, --route and --prompts"),
        ((*base, "--route", "cheap_first", "--break-even", "--router", "x.json"), "not --router"),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 2 and message in result.output, (args, result.output)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"fine"\n{"prompt": ""}\n', encoding="utf-8")
    with pytest.raises(FloorError, match=r"bad.jsonl:2: needs a non-empty prompt"):
        load_prompts(bad)
    result = run("--cascade", "--config", files["config"], "--route", "cheap_first", "--prompts", bad, "--break-even")
    assert result.exit_code == 2 and "bad.jsonl:2" in result.output
