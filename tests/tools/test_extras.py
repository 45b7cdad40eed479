"""What the runtime install leaves out (tokenomy/tools/extras.py) fails with one message naming the extra to install."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tokenomy.models import catalog as models
from tokenomy.tools.extras import MissingExtra


class _NotInstalled:
    """A meta-path finder that finds `top` nowhere, raising what Python raises for a package not installed."""

    def __init__(self, top: str) -> None:
        self.top = top

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.top:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _without(monkeypatch: pytest.MonkeyPatch, top: str) -> None:
    """Make `top` unimportable, as where it is not installed."""
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NotInstalled(top), *sys.meta_path])


def test_fitting_the_verifier_without_scikit_learn_names_the_train_extra(monkeypatch) -> None:
    from tokenomy.tools.cache_calibration.calibrate import fit_model

    _without(monkeypatch, "sklearn")
    x, y = np.zeros((4, 2)), np.array([0, 1, 0, 1])
    for kind in ("trees", "logistic"):
        with pytest.raises(MissingExtra, match=r"needs scikit-learn.*bash install.sh train.*tokenomy\[train\]"):
            fit_model(x, y, kind)


def test_a_packaged_model_outside_the_install_names_its_extra(monkeypatch) -> None:
    missing = models.PackagedModel("extra-model", "tokenomy_test_no_such_package", "test", extra="gemma")
    monkeypatch.setitem(models.PACKAGED, "extra-model", missing)
    with pytest.raises(FileNotFoundError, match=r"tokenomy_test_no_such_package.*bash install.sh gemma"):
        models.resolve_gguf("extra-model")


def test_a_broken_optional_package_is_not_reported_as_missing(monkeypatch) -> None:
    from tokenomy.tools.extras import require

    # matplotlib present but a module it imports missing: the real error, not "install the extra"
    monkeypatch.setitem(sys.modules, "matplotlib.tokenomy_test_missing", None)
    with pytest.raises(ImportError) as info:
        require("matplotlib.tokenomy_test_missing", "a chart")
    assert not isinstance(info.value, MissingExtra)
