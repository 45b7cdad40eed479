"""bench/routing.py end to end on a small slice of the dev file: JSON shape, baselines, calibration transfer."""

from __future__ import annotations

import json

import pytest

from tests.helpers.bench_module import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("routing.py")


def test_bench_json(bench, dev_rows, tmp_path, capsys) -> None:
    path = tmp_path / "small.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in dev_rows[0::25]))
    assert bench.main(["--data", str(path), "--folds", "3", "--latency-samples", "3", "--head-salts", "1",
                       "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == len(dev_rows[0::25]) and out["folds"] == 3
    assert set(out["cv"]["variants"]) == set(bench.VARIANTS)
    learned = out["cv"]["variants"]["learned"]
    assert [s["name"] for s in learned] == ["all", "gsm8k", "mmlu"]
    for entry in learned:
        routers = entry["routers"]
        assert routers["oracle"]["apgr"] > routers["random"]["apgr"]
        assert 0 <= routers["learned"]["cpt50"] <= 1
    assert len(out["cv"]["per_fold_apgr"]["all"]["folds"]) == 3
    assert out["head_study"]["salts"] == 1 and set(out["head_study"]["summary"]) == {"minilm-static", "minilm"}
    transfer = out["cv"]["calibration_transfer"]["strong_share_0.3"]["strong_share"]
    assert 0.1 < transfer < 0.5  # a 30% target set on training folds lands near 30% on held-out ones
    assert [lat["embedding"] for lat in out["latency"]] == ["minilm", "minilm-static"]
    assert all(lat["p50_ms"] > lat["router_only_p50_ms"] > 0 for lat in out["latency"])


def test_gsm8k_study_reports_each_fold_assignment(bench, dev_rows, tmp_path) -> None:
    import numpy as np

    from tokenomy.router.features import embed_prompts
    from tokenomy.tools.router_training.dataset import load_routing_data

    rows = [r for r in dev_rows if r["benchmark"] == "gsm8k"][:60]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_routing_data(path)
    study = bench.gsm8k_study(data, embed_prompts(data.prompts, "minilm-static"), folds=3, salts=2)
    assert study["rows"] == len(rows) and [r["salt"] for r in study["runs"]] == [0, 1]
    assert all(np.isfinite(r["apgr"]) and 0 <= r["cpt50"] <= 1 for r in study["runs"])
    assert study["apgr_sd"] >= 0


def test_head_study_scores_both_heads_over_each_fold_assignment(bench, tmp_path) -> None:
    from tests.helpers.routing_fixtures import synthetic_rows
    from tokenomy.router.features import embed_prompts
    from tokenomy.tools.router_training.dataset import load_routing_data

    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(48)))
    data = load_routing_data(path)
    x = {kind: embed_prompts(data.prompts, kind) for kind in ("minilm", "minilm-static")}
    study = bench.head_study(data, x, folds=3, salts=2)
    assert set(study["summary"]) == {"minilm-static", "minilm"}
    for head, runs in study["runs"].items():
        assert [r["salt"] for r in runs] == [0, 1]
        slices = study["summary"][head]
        assert set(slices) == {"all", "gsm8k", "mmlu"}
        apgrs = [r["gsm8k"]["apgr"] for r in runs]
        assert slices["gsm8k"]["apgr_mean"] == pytest.approx(sum(apgrs) / 2)
        assert slices["gsm8k"]["apgr_sd"] == pytest.approx(abs(apgrs[0] - apgrs[1]) / 2)
        assert all(0 <= r["all"]["cpt50"] <= 1 for r in runs)


def test_bench_refuses_a_missing_file(bench, tmp_path, capsys) -> None:
    assert bench.main(["--data", str(tmp_path / "absent.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
