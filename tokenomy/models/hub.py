"""Models on the Hugging Face hub: `hf:ORG/REPO[:QUANT|:FILE.gguf]` -> a local GGUF file (docs/models.md).

Everything goes through `huggingface_hub`, so its cache (HF_HOME / HF_HUB_CACHE), HF_TOKEN, HF_ENDPOINT and
offline mode (HF_HUB_OFFLINE=1) hold as they do for every other tool that uses it; its own progress bars show
each file, and a download cut off resumes from its `.incomplete` file, within a run and on the next (download).

Which file: a spec ending in `.gguf` names a file (a path in the repo, or a file name found anywhere in it); any
other spec is a quantization (Q4_K_M, q8_0, IQ4_XS, F16 ...), matched case-insensitively against the quantization
named in each file's name; no spec picks the repo's only model. A model split into `NAME-00001-of-0000N.gguf` files
is downloaded whole and loaded from its first part (llama.cpp finds the rest beside it). Projector files
(`mmproj*.gguf`) are never a model.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PREFIX = "hf:"
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")
_QUANT = re.compile(r"^(I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|F16|F32|MXFP4(?:_MOE)?)$", re.IGNORECASE)


class HubError(ValueError):
    """A hub reference that cannot be resolved; the message is one line that says what exists instead."""


@dataclass(frozen=True)
class HubRef:
    repo: str             # ORG/REPO
    spec: str | None      # a quantization, a .gguf file, or None
    revision: str = "main"

    def __str__(self) -> str:
        return f"{PREFIX}{self.repo}" + (f":{self.spec}" if self.spec else "")


def is_hub_ref(name: str) -> bool:
    return name.startswith(PREFIX)


def parse(ref: str) -> HubRef:
    """`hf:ORG/REPO`, `hf:ORG/REPO:Q4_K_M`, `hf:ORG/REPO:path/in/repo.gguf`; `@REV` after REPO picks a revision."""
    body = ref[len(PREFIX):] if is_hub_ref(ref) else ref
    repo, _, spec = body.partition(":")
    repo, _, revision = repo.partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise HubError(f"{ref!r}: a hub model is hf:ORG/REPO[:QUANT or :FILE.gguf], e.g. "
                       "hf:bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M")
    return HubRef(repo, spec or None, revision or "main")


def quantization(filename: str) -> str | None:
    """The quantization a GGUF file's name (or its folder's) says, upper-cased: `...-Q4_K_M-00001-of-00002.gguf`
    -> Q4_K_M; None when the name says none."""
    path = PurePosixPath(filename)
    m = _SPLIT.match(path.name)
    stem = m["stem"] if m else path.name.removesuffix(".gguf")
    for part in reversed([*path.parent.parts, *re.split(r"[-.]", stem)]):
        if _QUANT.match(part):
            return part.upper()
    return None


def models_in(files: list[str]) -> dict[str, list[str]]:
    """The models among a repo's files: first file -> all of its files (one, or every part of a split model, in
    order). Files that are not GGUF, projectors, and split models missing a part are left out."""
    ggufs = sorted(f for f in files if f.endswith(".gguf") and not PurePosixPath(f).name.startswith("mmproj"))
    models: dict[str, list[str]] = {}
    for f in ggufs:
        m = _SPLIT.match(f)
        if m is None:
            models[f] = [f]
        elif m["part"] == "00001":
            count = int(m["count"])
            parts = [f"{m['stem']}-{i:05d}-of-{m['count']}.gguf" for i in range(1, count + 1)]
            if all(p in ggufs for p in parts):
                models[f] = parts
    return models


def choose(ref: HubRef, files: list[str]) -> list[str]:
    """The files of the one model `ref` names among the repo's `files` (first part first), or a HubError that
    lists the repo's GGUF files and the quantizations they hold."""
    models = models_in(files)
    spec = ref.spec
    if spec is None:
        picked = list(models)
    elif spec.endswith(".gguf"):
        picked = [first for first, parts in models.items()
                  if spec in parts or any(PurePosixPath(p).name == spec for p in parts)]
    else:
        picked = [first for first in models if quantization(first) == spec.upper()]
    if len(picked) == 1:
        return models[picked[0]]
    what = ("no GGUF model" if not models else
            f"{len(picked)} models match" if picked else
            f"no file {spec!r}" if spec and spec.endswith(".gguf") else f"no quantization {spec!r}")
    raise HubError(f"{ref}: {what}; {describe(models)}")


def describe(models: dict[str, list[str]]) -> str:
    """One phrase: the repo's GGUF files and quantizations (what a user can ask for instead)."""
    if not models:
        return "the repo has no .gguf files"
    names = [first if len(parts) == 1 else f"{first} (+{len(parts) - 1} parts)" for first, parts in models.items()]
    quants = sorted({q for q in map(quantization, models) if q})
    return f"its .gguf files: {', '.join(names)}" + (f"; quantizations: {', '.join(quants)}" if quants else "")


def _cached_files(ref: HubRef) -> list[str] | None:
    """The files of `ref`'s revision in the local hub cache (what offline mode can use), or None when the cache has
    no snapshot of it."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=ref.repo, repo_type="model")
    ref_file = folder / "refs" / ref.revision
    commit = ref_file.read_text().strip() if ref_file.is_file() else ref.revision
    snapshot = folder / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    return sorted(str(p.relative_to(snapshot).as_posix()) for p in snapshot.rglob("*") if p.is_file())


def repo_files(ref: HubRef) -> list[str]:
    """The repo's files: asked of the hub (HF_ENDPOINT), or read from the cache offline or when the hub cannot be
    reached. Raises HubError for a repo that does not exist (or is gated or private without a token)."""
    import httpx2
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import (
        GatedRepoError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = constants.HF_HUB_OFFLINE
    if not offline:
        try:
            info = HfApi().model_info(ref.repo, revision=ref.revision)
            return [s.rfilename for s in info.siblings or []]
        except GatedRepoError:
            raise HubError(f"{ref}: the repo is gated: accept its terms on the hub and set HF_TOKEN") from None
        except RepositoryNotFoundError:
            raise HubError(f"{ref}: no repo {ref.repo!r} on {constants.ENDPOINT} (a private one needs HF_TOKEN)") \
                from None
        except RevisionNotFoundError:
            raise HubError(f"{ref}: the repo has no revision {ref.revision!r}") from None
        except (httpx2.TransportError, OfflineModeIsEnabled):
            pass            # no network: what the cache holds, as hf_hub_download itself would
    cached = _cached_files(ref)
    if cached is None:
        why = "offline mode (HF_HUB_OFFLINE) is on" if offline else f"{constants.ENDPOINT} cannot be reached"
        raise HubError(f"{ref}: {why} and the cache ({constants.HF_HUB_CACHE}) has no copy of {ref.repo}")
    return cached


def download(ref: HubRef, filename: str) -> str:
    """One file of the repo into the hub cache, as hf_hub_download lays it out (blobs/ETAG, snapshots/COMMIT/FILE
    linking to it, refs/REVISION), returning its snapshot path; what is cached already is not fetched again.

    huggingface_hub 2.x downloads each try into a file of its own and deletes it on failure (its PR #4228), so a
    download killed at 90% starts again from zero. GGUF files run to many GB, so the bytes are written here to one
    `blobs/ETAG.incomplete` per file, under the library's own lock for that blob, and a later run asks for the rest
    with a Range request through the library's http_get (its progress bar, its retries, its size check). The
    metadata, URL, token and endpoint are the library's; offline, without a network, or for a file the hub serves
    through Xet with hf_xet installed, hf_hub_download does it all."""
    from urllib.parse import urlparse

    import httpx2
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import OfflineModeIsEnabled
    from huggingface_hub.file_download import http_get, repo_folder_name
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    def library() -> str:
        return hf_hub_download(ref.repo, filename, revision=ref.revision)

    if constants.HF_HUB_OFFLINE:
        return library()
    url = hf_hub_url(ref.repo, filename, revision=ref.revision)
    try:
        meta = get_hf_file_metadata(url)
    except (httpx2.TransportError, OfflineModeIsEnabled):
        return library()          # it serves the cached copy, or says none is there
    if meta.commit_hash is None or meta.etag is None or (meta.xet_file_data is not None and _xet_available()):
        return library()
    folder = repo_folder_name(repo_id=ref.repo, repo_type="model")
    storage = Path(constants.HF_HUB_CACHE) / folder
    blob = storage / "blobs" / meta.etag
    pointer = storage / "snapshots" / meta.commit_hash / filename
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        headers = build_hf_headers()
        if urlparse(meta.location).netloc != urlparse(url).netloc:
            headers.pop("authorization", None)      # a signed CDN URL: the token stays with the hub
        with WeakFileLock(Path(constants.HF_HUB_CACHE) / ".locks" / folder / f"{meta.etag}.lock"):
            if not blob.exists():
                part = blob.with_name(blob.name + ".incomplete")
                with open(part, "ab") as f:
                    http_get(meta.location, f, resume_size=f.tell(), headers=headers, expected_size=meta.size,
                             displayed_filename=PurePosixPath(filename).name)
                os.replace(part, blob)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if not pointer.exists():
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    if ref.revision != meta.commit_hash:
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref.revision).write_text(meta.commit_hash)
    return str(pointer)


def file_size(ref: HubRef, filename: str) -> int | None:
    """The bytes the hub declares for one file of the repo; None offline or when the hub cannot say."""
    import httpx2
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if constants.HF_HUB_OFFLINE:
        return None
    try:
        return get_hf_file_metadata(hf_hub_url(ref.repo, filename, revision=ref.revision)).size
    except (httpx2.TransportError, OfflineModeIsEnabled, HfHubHTTPError):
        return None


def cached_paths(ref: HubRef) -> list[Path]:
    """The snapshot paths in the hub cache of the one model `ref` names (every part; first part first); [] when
    the cache holds none of it. A HubError when the cached files hold several models `ref` could mean."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    files = _cached_files(ref)
    if not files:
        return []
    try:
        parts = choose(ref, files)
    except HubError:
        if not any(f.endswith(".gguf") for f in files) or not models_in(files):
            return []
        raise
    folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=ref.repo, repo_type="model")
    ref_file = folder / "refs" / ref.revision
    commit = ref_file.read_text().strip() if ref_file.is_file() else ref.revision
    return [folder / "snapshots" / commit / part for part in parts]


def remove(ref: HubRef) -> list[Path]:
    """Delete the model `ref` names from the hub cache: each part's snapshot link and the blob it points to (the
    repo's other files stay). Returns the snapshot paths removed ([] when the cache held none)."""
    removed = []
    for link in cached_paths(ref):
        blob = link.resolve()
        link.unlink(missing_ok=True)
        if blob != link:
            blob.unlink(missing_ok=True)
        removed.append(link)
    return removed


def partial_bytes(ref: HubRef) -> int:
    """Bytes written so far to the repo's unfinished downloads in the hub cache (its `blobs/*.incomplete` files,
    which download writes): the progress of a download running in another thread."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    blobs = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=ref.repo, repo_type="model") / "blobs"
    total = 0
    for part in blobs.glob("*.incomplete"):
        try:
            total += part.stat().st_size
        except FileNotFoundError:        # finished (renamed) meanwhile
            pass
    return total


@functools.lru_cache(maxsize=32)
def resolve(ref_text: str) -> Path:
    """The local path of the model `ref_text` names (its first part when split), downloading what the cache lacks:
    every part, each with huggingface_hub's progress bar, resuming a partial download (download)."""
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    ref = parse(ref_text)
    parts = choose(ref, repo_files(ref))
    try:
        paths = [download(ref, part) for part in parts]
    except EntryNotFoundError:
        raise HubError(f"{ref}: the hub lists {parts[0]} but does not serve it") from None
    except LocalEntryNotFoundError as e:
        raise HubError(f"{ref}: {parts[0]} is not in the cache and cannot be downloaded ({e})") from None
    return Path(paths[0])


def default_name(ref_text: str) -> str:
    """The name a hub model is served as when none is given: ORG/REPO, with the quantization or file after a colon
    as written (`bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M`), as vLLM serves a repo under its id."""
    ref = parse(ref_text)
    return ref.repo + (f":{ref.spec}" if ref.spec else "")


def _xet_available() -> bool:
    """Whether hf_hub_download goes through Xet: hf_xet installed and not turned off (HF_HUB_DISABLE_XET), the test
    huggingface_hub makes (its own is_xet_available is in a private module)."""
    import importlib.util

    from huggingface_hub import constants

    return not constants.HF_HUB_DISABLE_XET and importlib.util.find_spec("hf_xet") is not None
