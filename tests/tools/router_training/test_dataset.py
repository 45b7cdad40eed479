"""Routing JSONL: valid files load; every kind of bad input is named with its file and line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokenomy.tools.router_training.dataset import RoutingDataError, load_routing_data


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


def test_dev_file_loads(dev_rows, train_file) -> None:
    data = load_routing_data(train_file)
    assert len(data) == len(dev_rows[0::10])
    assert data.weak_ok.mean() == pytest.approx(np.mean([r["weak_correct"] for r in dev_rows[0::10]]))
    assert {"mmlu", "gsm8k"} == set(data.benchmarks) and data.labelled


def test_named_models_and_blank_lines(tmp_path) -> None:
    path = write(tmp_path, '{"prompt": "a", "small_correct": 1, "large_correct": true}\n\n'
                           '{"prompt": "b", "small_correct": false, "large_correct": 0}\n')
    data = load_routing_data(path, weak="small", strong="large")
    assert data.prompts == ["a", "b"] and data.weak_ok.tolist() == [1.0, 0.0] and data.strong_ok.tolist() == [1, 0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "a", "weak_correct": true, "strong_correct": true}\n{"prompt": "b", ',
         r"data.jsonl:2: not valid JSON"),
        ('["prompt"]\n', r":1: expected a JSON object"),
        ('{"prompt": "a", "weak_correct": true}\n', r":1: missing strong_correct"),
        ('{"prompt": "a", "x_correct": true, "y_correct": false}\n', r"this row has x, y: pass --weak and --strong"),
        ('{"prompt": "", "weak_correct": true, "strong_correct": true}\n', r"'prompt' must be a non-empty string"),
        ('{"prompt": "a", "weak_correct": "yes", "strong_correct": true}\n', r"'weak_correct' must be true/false"),
        ("\n\n", r"no rows"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, text: str, message: str) -> None:
    with pytest.raises(RoutingDataError, match=message):
        load_routing_data(write(tmp_path, text))


def test_missing_file_and_same_model(tmp_path) -> None:
    with pytest.raises(RoutingDataError, match="no such file"):
        load_routing_data(tmp_path / "absent.jsonl")
    with pytest.raises(RoutingDataError, match="must differ"):
        load_routing_data(write(tmp_path, '{"prompt": "a"}\n'), weak="m", strong="m")


def test_prompts_without_labels_when_allowed(tmp_path) -> None:
    data = load_routing_data(write(tmp_path, '{"prompt": "a"}\n{"prompt": "b"}\n'), require_labels=False)
    assert len(data) == 2 and not data.labelled
