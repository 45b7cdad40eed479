"""`tokenomy router train | calibrate | eval` end to end through the CLI, and its answers to bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tokenomy.router.classifier import TrainedRouter
from tokenomy.tools.router_training.command import app
from tokenomy.tools.router_training.dataset import load_routing_data

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def router_file(train_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("router") / "router.json"
    result = run("train", "--data", train_file, "--out", out)
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and out.is_file()
    return out


def test_train_writes_both_heads_by_default(router_file) -> None:
    router = TrainedRouter.load(router_file)
    assert router.embeddings == ["minilm-static", "minilm"]
    assert all(h.meta["target"]["strong_share"] == 0.5 for h in router.heads)


def test_train_one_head_with_embedding(tmp_path) -> None:
    from tests.helpers.routing_fixtures import synthetic_rows

    data = write(tmp_path / "tiny.jsonl", "".join(json.dumps(r) + "\n" for r in synthetic_rows(40)))
    result = run("train", "--data", data, "--out", tmp_path / "r.json", "--embedding", "minilm-static")
    assert result.exit_code == 0, result.output
    assert "minilm-static head" in result.output and "minilm head" not in result.output
    assert TrainedRouter.load(tmp_path / "r.json").embeddings == ["minilm-static"]


def test_calibrate_hits_the_requested_strong_share(router_file, test_file, tmp_path) -> None:
    out = tmp_path / "calibrated.json"
    result = run("calibrate", "--router", router_file, "--data", test_file, "--strong-share", "0.3", "--out", out)
    assert result.exit_code == 0, result.output
    assert "minilm-static head: threshold" in result.output and "minilm head: threshold" in result.output
    router, data = TrainedRouter.load(out), load_routing_data(test_file)
    before = TrainedRouter.load(router_file)
    for head in router.heads:  # each head calibrated to the same target
        share = (head.p_weak_ok_many(data.prompts) < head.threshold).mean()
        assert share == pytest.approx(0.3, abs=0.005)
        assert head.meta["target"]["strong_share"] == 0.3
        assert before.head(head.embedding).threshold != head.threshold


def test_calibrate_quality_floor_keeps_the_quality(router_file, test_file, tmp_path) -> None:
    out = tmp_path / "floor.json"
    result = run("calibrate", "--router", router_file, "--data", test_file, "--quality-floor", "0.95", "--out", out)
    assert result.exit_code == 0, result.output
    router, data = TrainedRouter.load(out), load_routing_data(test_file)
    for head in router.heads:
        strong = head.p_weak_ok_many(data.prompts) < head.threshold
        quality = np.where(strong, data.strong_ok, data.weak_ok).mean()
        assert quality >= 0.95 * data.strong_ok.mean() and strong.mean() < 1.0


def test_eval_json_against_random_and_oracle(router_file, test_file) -> None:
    result = run("eval", "--router", router_file, "--data", test_file, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [h["embedding"] for h in report["heads"]] == ["minilm-static", "minilm"]
    assert report["rows"] == len(load_routing_data(test_file))
    for head in report["heads"]:
        names = [s["name"] for s in head["slices"]]
        assert names == ["all", "gsm8k", "mmlu"]
        overall = head["slices"][0]
        routers = overall["routers"]
        assert routers["random"]["apgr"] == pytest.approx(0.5, abs=0.05)
        assert routers["oracle"]["apgr"] > 1.0 and routers["oracle"]["cpt50"] < 0.15
        assert routers["learned"]["apgr"] > routers["random"]["apgr"]
        assert len(routers["learned"]["curve"]) == 11
        assert 0 <= overall["operating_point"]["strong_share"] <= 1
        assert set(head["calibration"]) == {"p_weak_ok", "p_weak_correct", "p_strong_correct"}


def test_eval_tables_and_plots(router_file, test_file, tmp_path) -> None:
    png, html = tmp_path / "curve.png", tmp_path / "curve.html"
    result = run("eval", "--router", router_file, "--data", test_file, "--plot", png)
    assert result.exit_code == 0, result.output
    assert "APGR" in result.output and "oracle" in result.output and "quality-cost curve" in result.output
    assert "minilm-static head" in result.output and "minilm head" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = run("eval", "--router", router_file, "--data", test_file, "--plot", html, "--json")
    assert result.exit_code == 0 and "plotly" in html.read_text()[:100_000].lower()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--data", "{tmp}/absent.jsonl", "--out", "{tmp}/r.json"], "absent.jsonl: no such file"),
        (["train", "--data", "{bad_json}", "--out", "{tmp}/r.json"], "bad.jsonl:2: not valid JSON"),
        (["train", "--data", "{no_columns}", "--out", "{tmp}/r.json"], "missing weak_correct, strong_correct"),
        (["train", "--data", "{train}", "--out", "{tmp}/no/such/dir/r.json"], "no such directory"),
        (["train", "--data", "{train}", "--out", "{tmp}/r.json", "--embedding", "bert"], "--embedding must be"),
        (["eval", "--router", "{tmp}/absent.json", "--data", "{train}"], "no such router file"),
        (["eval", "--router", "{bad_json}", "--data", "{train}"], "not a tokenomy router file"),
        (["eval", "--router", "{router}", "--data", "{train}", "--plot", "{tmp}/x.svg"], "must end in .png or .html"),
        (["calibrate", "--router", "{router}", "--data", "{train}"], "exactly one of --strong-share"),
        (["calibrate", "--router", "{router}", "--data", "{train}", "--strong-share", "0.3", "--quality-floor", "0.9"],
         "exactly one of --strong-share"),
        (["calibrate", "--router", "{router}", "--data", "{train}", "--strong-share", "1.5"], "between 0 and 1"),
        (["calibrate", "--router", "{router}", "--data", "{train}", "--quality-floor", "1.5"], "out of reach"),
        (["eval", "--router", "{router}", "--data", "{no_gap}"], "no gap to recover"),
    ],
)
def test_bad_input_exits_non_zero_with_one_clear_line(args, message, router_file, train_file, tmp_path) -> None:
    paths = {
        "tmp": tmp_path, "router": router_file, "train": train_file,
        "bad_json": write(tmp_path / "bad.jsonl", '{"prompt": "a", "weak_correct": 1, "strong_correct": 0}\n{oops\n'),
        "no_columns": write(tmp_path / "cols.jsonl", '{"prompt": "a"}\n'),
        "no_gap": write(tmp_path / "tie.jsonl", '{"prompt": "a?", "weak_correct": 1, "strong_correct": 1}\n' * 3),
    }
    result = run(*[a.format(**paths) for a in args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
