"""fleet.discover: the GGUF models in the hub cache and a models folder become available models, each once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenomy.config import load_config
from tokenomy.models.catalog import resolve_gguf
from tokenomy.models.discovery import cached_ggufs, discover, folder_ggufs


def _link(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


@pytest.fixture
def gguf() -> Path:
    return Path(resolve_gguf("smollm2-135m-instruct"))


def test_the_hub_cache_is_read_in_its_layout_and_projectors_and_later_parts_are_left_out(tmp_path: Path,
                                                                                          gguf: Path) -> None:
    snap = tmp_path / "models--org--Tiny-GGUF" / "snapshots" / "abc123"
    _link(snap / "tiny-Q4_K_M.gguf", gguf)
    _link(snap / "mmproj-tiny-f16.gguf", gguf)
    _link(snap / "big-Q8_0-00001-of-00002.gguf", gguf)
    _link(snap / "big-Q8_0-00002-of-00002.gguf", gguf)
    found = cached_ggufs(tmp_path)
    assert sorted(found) == ["org/Tiny-GGUF:Q4_K_M", "org/Tiny-GGUF:Q8_0"]
    assert found["org/Tiny-GGUF:Q8_0"].name == "big-Q8_0-00001-of-00002.gguf"


def test_a_folder_gives_its_files_by_stem(tmp_path: Path, gguf: Path) -> None:
    _link(tmp_path / "mine.gguf", gguf)
    (tmp_path / "notes.txt").write_text("not a model")
    assert folder_ggufs(tmp_path) == {"mine": tmp_path / "mine.gguf"}


def test_discovered_models_join_the_config_unless_configured_and_load_on_demand(
        tmp_path: Path, gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = tmp_path / "models"
    _link(folder / "mine.gguf", gguf)
    _link(folder / "again.gguf", gguf)
    configured = _link(folder / "configured.gguf", gguf)
    assert set(discover(str(folder))) == {"mine", "again", "configured"}
    path = tmp_path / "tokenomy.yaml"
    path.write_text(f"models: [{{name: first, gguf: {configured}}}]\n"
                    f"fleet: {{discover: true, models_dir: {folder}}}\n")
    config = load_config(path)
    names = [m.name for m in config.models]
    assert names == ["first", "again", "mine"]           # configured.gguf is `first` already
    assert all(m.preload is False and m.discovered for m in config.models[1:])
    path.write_text(f"models: [{{name: first, gguf: {configured}}}]\n")
    assert [m.name for m in load_config(path).models] == ["first"]     # discover is off by default
