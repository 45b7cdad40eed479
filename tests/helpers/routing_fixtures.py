"""Routing fixtures for tests/router and tests/offline/router (each conftest imports them): small, stratified
slices of RouteLLM's dev file (every 10th row, so all domains and GSM8K appear) written to temporary JSONL files,
and one route classifier trained on the first slice."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.shared_data import shared_data

ROOT = Path(__file__).resolve().parents[2]
DEV = Path(os.environ.get("TOKENOMY_ROUTING_DATA", ROOT.parent / "shared/data/routing/routellm-dev.jsonl"))


@pytest.fixture(scope="session")
def dev_rows() -> list[dict]:
    dev = shared_data("routing/routellm-dev.jsonl", "TOKENOMY_ROUTING_DATA")
    return [json.loads(line) for line in dev.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def train_file(dev_rows, tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("routing") / "train.jsonl", dev_rows[0::10])


@pytest.fixture(scope="session")
def test_file(dev_rows, tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("routing") / "test.jsonl", dev_rows[5::10])


@pytest.fixture(scope="session")
def trained(train_file):
    from tokenomy.tools.router_training.dataset import load_routing_data
    from tokenomy.tools.router_training.train import train_classifier

    return train_classifier(load_routing_data(train_file))


def synthetic_rows(n: int = 48, seed: int = 0) -> list[dict]:
    """`n` made-up routing rows in the dev file's format, half arithmetic word problems ("gsm8k", domain "math"),
    half multiple-choice trivia ("mmlu", domain "trivia"): the weak model tends to fail the word problems with big
    numbers and the strong one to get most right, so a router has something to learn from a few dozen rows."""
    import random

    rng = random.Random(seed)
    names, things = ["Ann", "Bo", "Cy", "Dee", "Eli", "Fay"], ["apples", "marbles", "books", "coins", "shells"]
    places = ["France", "Peru", "Japan", "Kenya", "Chile", "Norway", "Egypt", "Laos"]
    rows = []
    for i in range(n):
        if i % 2 == 0:
            a, b, c = rng.randint(2, 9), rng.choice([3, 7, 45, 120, 1250]), rng.randint(2, 12)
            prompt = (f"{rng.choice(names)} has {a} {rng.choice(things)} and buys {b} more each day for {c} days, "
                      f"then gives away half. How many are left?")
            hard = b > 40
            row = {"benchmark": "gsm8k", "domain": "math", "prompt": prompt}
        else:
            place = rng.choice(places)
            prompt = (f"Question {i}: what is the capital of {place}?\nA. {rng.choice(places)}\nB. Lima\n"
                      f"C. Tokyo\nD. Paris\nAnswer:")
            hard = rng.random() < 0.3
            row = {"benchmark": "mmlu", "domain": "trivia", "prompt": prompt}
        row["weak_correct"] = (not hard) if rng.random() < 0.85 else hard
        row["strong_correct"] = rng.random() < 0.9
        rows.append(row)
    return rows
