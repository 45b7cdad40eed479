"""Routing fixtures for tests/router and tests/offline/router (each conftest imports them): small, stratified
slices of RouteLLM's dev file (every 10th row, so all domains and GSM8K appear) written to temporary JSONL files,
and one route classifier trained on the first slice."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.shared_data import shared_data

ROOT = Path(__file__).resolve().parents[1]
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
    from tokenomy.offline.router.dataset import load_routing_data
    from tokenomy.offline.router.train import train_classifier

    return train_classifier(load_routing_data(train_file))
