"""Optional features whose packages the runtime install leaves out, and the one error that says how to add them.

`bash install.sh` installs what serving needs; the extras below install with `bash install.sh EXTRA` (or
`pip install 'tokenomy[EXTRA]'`); `bash install.sh test` installs them all (docs/install.md).

    plots   matplotlib: charts as PNG, SVG or PDF (`tokenomy plan --plot`, `tokenomy router evaluate --plot`;
            their .html charts need only plotly, which serving installs for the dashboard)
    train   scikit-learn: fitting routers and the semantic cache's verifier (`tokenomy router train`,
            `python -m tokenomy.tools.cache_calibration.calibrate`); serving the fitted ones needs neither
    gemma   the packaged Gemma 3 270M GGUF (240 MB; `tokenomy serve gemma3-270m`, models.PACKAGED), which
            tokenomy.models.catalog.resolve_gguf names when it is missing
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = {"matplotlib": "plots", "sklearn": "train"}
PACKAGES = {"sklearn": "scikit-learn"}


class MissingExtra(ImportError):
    """A feature's optional package is not installed; the message names the feature, the package and the fix."""


def require(module: str, feature: str) -> ModuleType:
    """Import `module` (a dotted name whose top package is in EXTRAS), or raise MissingExtra naming `feature`."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name != top:
            raise        # the package is there but a module of it, or one it imports, is not: not ours to reword
        extra = EXTRAS[top]
        raise MissingExtra(f"{feature} needs {PACKAGES.get(top, top)}, which the runtime install leaves out: "
                           f"bash install.sh {extra} (or pip install 'tokenomy[{extra}]')", name=top) from None
