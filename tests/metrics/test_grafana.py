"""deploy/grafana/tokenomy.json: one row per metric layer, and every query names a metric tokenomy exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tokenomy.hardware.energy import CpuEstimateSource, EnergyMeter
from tokenomy.metrics.prometheus import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tokenomy.json"
LAYERS = ["Hardware", "Communication", "Scheduling", "Engine", "Model", "Token", "Cost", "Business"]


class _Ledger:
    written = dropped = failed = pending = 0


def exported_names() -> set[str]:
    m = Metrics()
    m.watch_engines(lambda: [])
    m.watch_hardware(EnergyMeter(CpuEstimateSource()))
    m.watch_ledger(_Ledger())
    names: set[str] = set()
    for fam in m.registry.collect():
        if fam.type == "histogram":
            names |= {fam.name + s for s in ("_bucket", "_sum", "_count")}
        elif fam.type == "counter":
            names.add(fam.name + "_total")
        else:
            names.add(fam.name)
    return names


def test_dashboard_covers_the_eight_layers_with_exported_metrics():
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    assert [p["title"] for p in panels if p["type"] == "row"] == LAYERS
    exported = exported_names()
    used: set[str] = set()
    layer = None
    per_layer: dict[str, int] = {}
    for p in panels:
        if p["type"] == "row":
            layer = p["title"]
            continue
        assert p["targets"], p["title"]
        per_layer[layer] = per_layer.get(layer, 0) + 1
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            names = set(re.findall(r"tokenomy_[a-z0-9_]+", t["expr"]))
            assert names, t["expr"]
            assert names <= exported, f"{p['title']}: {sorted(names - exported)} are not exported"
            used |= names
    assert set(per_layer) == set(LAYERS)
    for required in ("tokenomy_hw_power_watts", "tokenomy_hw_energy_joules_total", "tokenomy_hw_memory_bytes",
                     "tokenomy_ttft_seconds_bucket", "tokenomy_tpot_seconds_bucket", "tokenomy_cost_usd_total",
                     "tokenomy_saved_usd_total", "tokenomy_feedback_score_sum", "tokenomy_queue_depth"):
        assert required in used, required
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
