"""The roofline chart files."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from tokenomy.tools.plan.inputs import Workload
from tokenomy.tools.plan.planner import make_plan
from tokenomy.tools.plan.presets import preset_hardware, preset_model
from tokenomy.tools.plan.roofline import chart_for, write_roofline


@pytest.fixture(scope="module")
def plans():
    model, hw = preset_model("llama-3-8b"), preset_hardware("h100-sxm")
    w = Workload(batch=8)
    plan = make_plan(model, hw, w, label="8b")
    sweep = [make_plan(model, hw, replace(w, batch=b)) for b in (1, 8, 64, 512)]
    return [plan], [sweep]


def test_points_sit_on_the_roof(plans):
    chart = chart_for(*plans)
    (roof,) = chart.roofs
    decode = chart.points[0]
    assert decode.label.startswith("8b: decode B=8")
    assert decode.flops == pytest.approx(decode.intensity * roof.bandwidth)  # memory bound: on the slope
    assert roof.ridge == pytest.approx(989.4e12 / 3.35e12)
    intensities = [p.intensity for p in chart.sweeps[0][1]]
    assert intensities == sorted(intensities)  # batching moves decode right, toward the ridge


def test_png_and_html_are_written(plans, tmp_path):
    png = write_roofline(*plans, tmp_path / "roof.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = write_roofline(*plans, tmp_path / "roof.html").read_text()
    assert "plotly" in html.lower() and "8b: decode B=8" in html


def test_unknown_chart_format_is_refused(plans, tmp_path):
    with pytest.raises(ValueError, match=".png"):
        write_roofline(*plans, tmp_path / "roof.bmp")


def test_a_png_without_matplotlib_names_the_extra_and_html_needs_none(plans, tmp_path, monkeypatch):
    # the runtime install leaves matplotlib out (the plots extra): its absence, as Python sees it
    from tokenomy.tools.extras import MissingExtra

    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra, match=r"a \.png chart needs matplotlib.*bash install.sh plots"):
        write_roofline(*plans, tmp_path / "roof.png")
    assert not (tmp_path / "roof.png").exists()
    assert "8b: decode B=8" in write_roofline(*plans, tmp_path / "roof.html").read_text()
