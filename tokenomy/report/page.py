"""The report page (page.html): one self-contained HTML file for the static HTML report and the live dashboard.

plotly.js is embedded inline (plotly.offline.get_plotlyjs()), so the page loads nothing from the network. The
page's script renders the figures and charts from report JSON: embedded in the page (`data`), or fetched from
`data_url` every `refresh_s` seconds (the dashboard), whose operations view polls `live_url` every `live_s`.
"""

from __future__ import annotations

import html
import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from tokenomy.report.figure_rows import ROWS

_MARKER = re.compile(r"__(TITLE|RAW|CONFIG|PLOTLY_JS)__")


@lru_cache(maxsize=1)
def _template() -> str:
    return resources.files("tokenomy.report").joinpath("page.html").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _script_json(value: Any) -> str:
    # Inside <script>, "</" could end the element early; "<\/" is the same string to JavaScript.
    return json.dumps(value).replace("</", "<\\/")


def render_page(data: dict[str, Any] | None = None, data_url: str | None = None, refresh_s: float = 5.0,
                title: str = "tokenomy", live_url: str | None = None, live_s: float = 2.0) -> str:
    """The page with `data` (report JSON) embedded, and/or a `data_url` to refresh from every refresh_s; with a
    `live_url` (metrics/live.py's series), an operations view above the report, refreshed every live_s."""
    if data is None and data_url is None:
        raise ValueError("render_page needs data, a data_url, or both")
    config = {"data": data, "dataUrl": data_url, "refreshMs": int(refresh_s * 1000), "rows": ROWS,
              "liveUrl": live_url, "liveMs": int(live_s * 1000)}
    values = {"TITLE": html.escape(title), "CONFIG": _script_json(config), "PLOTLY_JS": plotly_js(),
              "RAW": html.escape(json.dumps(data, indent=1)) if data is not None else ""}
    # One pass over the template only: inserted text (plotly.js, model names) is never scanned for markers.
    return _MARKER.sub(lambda m: values[m.group(1)], _template())
