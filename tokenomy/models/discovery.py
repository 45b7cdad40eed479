"""The GGUF models on this machine that no one named: in the Hugging Face hub cache, and in a models folder
(fleet.discover). Each is served under the name a user would give it: a hub model as `ORG/REPO:QUANT` (as
hub.default_name names `hf:ORG/REPO:QUANT`), a folder's file by its stem. A split model counts once, by its first
part; projector files (`mmproj*.gguf`) are never a model."""

from __future__ import annotations

from pathlib import Path

from tokenomy.models.hub import _SPLIT, quantization


def _is_model(path: Path) -> bool:
    name = path.name
    if name.lower().startswith("mmproj"):
        return False
    split = _SPLIT.match(name)
    return split is None or split["part"] == "00001"


def cached_ggufs(hub_cache: Path) -> dict[str, Path]:
    """Hub models in the cache at `hub_cache` (huggingface_hub's layout: models--ORG--REPO/snapshots/COMMIT/...),
    by name; the newest snapshot's file where several revisions hold one."""
    found: dict[str, tuple[float, Path]] = {}
    for repo_dir in sorted(hub_cache.glob("models--*--*")):
        repo = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        for path in repo_dir.glob("snapshots/*/**/*.gguf"):
            if not _is_model(path) or not path.exists():
                continue
            quant = quantization(path.name) or path.stem
            name = f"{repo}:{quant}"
            when = path.parent.stat().st_mtime
            if name not in found or when > found[name][0]:
                found[name] = (when, path)
    return {name: path for name, (_, path) in found.items()}


def folder_ggufs(folder: Path) -> dict[str, Path]:
    """The models in `folder` (not its subfolders), by file stem."""
    return {p.stem: p for p in sorted(folder.glob("*.gguf")) if _is_model(p)}


def discover(models_dir: str | None) -> dict[str, Path]:
    """Every GGUF model in the hub cache (HF_HUB_CACHE) and in `models_dir`, by the name it is served as."""
    from huggingface_hub import constants

    found = cached_ggufs(Path(constants.HF_HUB_CACHE))
    if models_dir:
        found.update(folder_ggufs(Path(models_dir).expanduser()))
    return found
