"""The roofline chart: attainable FLOP/s = min(peak, intensity x bandwidth) per machine, and the workload on it.

PNG/SVG/PDF through matplotlib (Agg, no display needed) or a self-contained HTML page through plotly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenomy.tools.plan.planner import Plan

FORMATS = {".png": "matplotlib", ".svg": "matplotlib", ".pdf": "matplotlib", ".html": "plotly"}


@dataclass(frozen=True)
class RooflinePoint:
    label: str
    intensity: float  # FLOP/byte
    flops: float  # attainable FLOP/s at that intensity


@dataclass(frozen=True)
class Roof:
    label: str
    bandwidth: float
    peak: float

    def at(self, intensity: float) -> float:
        return min(self.peak, intensity * self.bandwidth)

    @property
    def ridge(self) -> float:
        return self.peak / self.bandwidth


@dataclass(frozen=True)
class Chart:
    roofs: list[Roof]
    points: list[RooflinePoint]
    sweeps: list[tuple[str, list[RooflinePoint]]]  # one line per plan: its decode point as the batch grows
    title: str


def chart_for(plans: list[Plan], sweeps: list[list[Plan]]) -> Chart:
    """Roofs for each distinct machine/math dtype; a decode and a prefill point per plan; batch sweeps."""
    roofs: dict[tuple[float, float], Roof] = {}
    points: list[RooflinePoint] = []
    for p in plans:
        roof = roofs.setdefault((p.bandwidth, p.peak_flops),
                                Roof(f"{p.hardware} {p.math_dtype}", p.bandwidth, p.peak_flops))
        points.append(RooflinePoint(f"{p.label}: decode B={p.batch}", p.arithmetic_intensity,
                            roof.at(p.arithmetic_intensity)))
        if p.prompt:
            points.append(RooflinePoint(f"{p.label}: prefill {p.batch}x{p.prompt}", p.prefill_arithmetic_intensity,
                                roof.at(p.prefill_arithmetic_intensity)))
    lines = []
    for plan, sweep in zip(plans, sweeps, strict=True):
        roof = roofs[(plan.bandwidth, plan.peak_flops)]
        lines.append((f"{plan.label}: decode, batch {sweep[0].batch}..{sweep[-1].batch}",
                      [RooflinePoint(f"B={s.batch}", s.arithmetic_intensity, roof.at(s.arithmetic_intensity))
                       for s in sweep]))
    title = f"Roofline: {plans[0].model} on {plans[0].hardware}" + (" (and compared)" if len(plans) > 1 else "")
    return Chart(list(roofs.values()), points, lines, title)


def _x_range(chart: Chart) -> tuple[float, float]:
    xs = [p.intensity for p in chart.points] + [r.ridge for r in chart.roofs]
    xs += [p.intensity for _, line in chart.sweeps for p in line]
    return min(xs) / 4, max(xs) * 4


def _geomspace(lo: float, hi: float, n: int = 200) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def write_matplotlib(chart: Chart, path: Path) -> None:
    from tokenomy.tools.extras import require

    require("matplotlib", f"a {path.suffix} chart").use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    xs = _geomspace(*_x_range(chart))
    for roof in chart.roofs:
        ax.plot(xs, [roof.at(x) for x in xs], linewidth=2,
                label=f"{roof.label} roof (ridge {roof.ridge:.1f} FLOP/B)")
        ax.axvline(roof.ridge, linestyle=":", linewidth=1, color="grey")
    for label, line in chart.sweeps:
        ax.plot([p.intensity for p in line], [p.flops for p in line], "--", marker=".", alpha=0.6, label=label)
        for p in (line[0], line[-1]):
            ax.annotate(p.label, (p.intensity, p.flops), fontsize=7, textcoords="offset points", xytext=(3, -10))
    for p in chart.points:
        ax.scatter([p.intensity], [p.flops], s=60, zorder=3, label=p.label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(chart.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_plotly(chart: Chart, path: Path) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    xs = _geomspace(*_x_range(chart))
    for roof in chart.roofs:
        fig.add_trace(go.Scatter(x=xs, y=[roof.at(x) for x in xs], mode="lines",
                                 name=f"{roof.label} roof (ridge {roof.ridge:.1f} FLOP/B)"))
    for label, line in chart.sweeps:
        fig.add_trace(go.Scatter(x=[p.intensity for p in line], y=[p.flops for p in line], mode="lines+markers",
                                 line={"dash": "dash"}, name=label, text=[p.label for p in line]))
    for p in chart.points:
        fig.add_trace(go.Scatter(x=[p.intensity], y=[p.flops], mode="markers", marker={"size": 12}, name=p.label))
    fig.update_layout(title=chart.title, xaxis={"type": "log", "title": "arithmetic intensity (FLOP / byte moved)"},
                      yaxis={"type": "log", "title": "attainable FLOP/s"})
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)


def write_roofline(plans: list[Plan], sweeps: list[list[Plan]], path: str | Path) -> Path:
    """Write the chart; the file's suffix picks the format (see FORMATS)."""
    out = Path(path)
    kind = FORMATS.get(out.suffix.lower())
    if kind is None:
        raise ValueError(f"cannot write a chart as {out.suffix or 'a file without suffix'}; "
                         f"use one of {', '.join(FORMATS)}")
    chart = chart_for(plans, sweeps)
    if kind == "plotly":
        write_plotly(chart, out)
    else:
        write_matplotlib(chart, out)
    return out
