"""KV tiers: a cached prefix outlives its KV cells.

When a sequence finishes, and again when the scheduler evicts a cached prefix no saved state holds yet, the
prefix's sequence state (the KV of every token it holds, llama.cpp's per-sequence state) is kept here, in host RAM
up to `kv_tier_ram_mb`, then, when RAM is full, in files under `kv_tier_disk_dir` up to `kv_tier_disk_mb`, least
recently used out first. A later prompt that shares a saved prefix (longer than what is still resident) has it
restored into a fresh sequence instead of recomputed, when the measured restore time of that tier is below the
estimated time to prefill those tokens.

Entries are matched by their longest common prefix with the prompt; a saved prefix that another entry extends is
dropped (the longer one restores it as well). The disk tier belongs to one engine process: its directory is
emptied at start (the saved state depends on the model and the KV layout).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenomy.engine import tuning

TIERS = ("ram", "disk")


@dataclass(eq=False)
class Entry:
    tokens: np.ndarray            # int32, the prefix the saved state holds
    nbytes: int
    blob: bytes | bytearray | None = None     # in RAM
    path: Path | None = None      # on disk

    @property
    def tier(self) -> str:
        return "ram" if self.blob is not None else "disk"


@dataclass
class TierStats:
    """Counts since start, per tier: prefixes saved into it, restored from it, the tokens and seconds those
    restores took, and what it holds now."""

    saved: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    restored_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    restore_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIERS, 0.0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    entries: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))


class KVTiers:
    def __init__(self, ram_bytes: int, disk_dir: str | None = None, disk_bytes: int = 0) -> None:
        """`ram_bytes` 0 turns the tiers off; `disk_dir` (emptied now) with `disk_bytes` > 0 adds the disk tier."""
        self.ram_bytes = ram_bytes
        self.disk_bytes = disk_bytes if disk_dir else 0
        self.dir = Path(disk_dir) if disk_dir and disk_bytes > 0 else None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir.mkdir(parents=True, exist_ok=True)
        self.entries: OrderedDict[int, Entry] = OrderedDict()   # id -> entry, least recently used first
        self.stats = TierStats()
        self.bytes_per_s = dict(tuning.PRIOR_BYTES_PER_S)
        self.recompute_s: Callable[[int], float | None] = lambda n: None   # set by the engine: prefill estimate

    @property
    def enabled(self) -> bool:
        return self.ram_bytes > 0

    # ---- lookup -------------------------------------------------------------------------------------
    def match(self, tokens: list[int], beyond: int) -> tuple[int, Entry | None]:
        """The entry sharing the longest prefix with `tokens`, if longer than `beyond` tokens: (length, entry),
        else (0, None)."""
        if not self.entries or len(tokens) <= beyond:
            return 0, None
        want = np.asarray(tokens, dtype=np.int32)
        best, best_len = None, beyond
        for e in self.entries.values():
            n = min(len(e.tokens), len(want))
            if n <= best_len:
                continue
            diff = np.flatnonzero(e.tokens[:n] != want[:n])
            common = int(diff[0]) if diff.size else n
            if common > best_len:
                best, best_len = e, common
        return (best_len, best) if best is not None else (0, None)

    def covers(self, tokens: list[int]) -> bool:
        """Whether an entry already holds all of `tokens` (a prefix of it or the same)."""
        return self.match(tokens, len(tokens) - 1)[0] == len(tokens)

    def worth(self, entry: Entry, gain: int) -> bool:
        """Restoring `entry` to skip prefilling `gain` tokens: whether its tier's measured restore time is below
        the engine's estimate of that prefill (restored when there is no estimate yet)."""
        recompute = self.recompute_s(gain)
        if recompute is None:
            return True
        return entry.nbytes / self.bytes_per_s[entry.tier] < recompute

    def load(self, entry: Entry) -> bytes | bytearray | None:
        """The saved state, read from its tier (None if its file is gone); counts as a use. An entry dropped since
        it was matched (the eviction that made room for its restore saved another prefix) still gives its blob
        if it was in RAM."""
        if id(entry) in self.entries:
            self.entries.move_to_end(id(entry))
        if entry.blob is not None:
            return entry.blob
        try:
            assert entry.path is not None
            return entry.path.read_bytes()
        except OSError:
            self._drop(entry)
            return None

    def restored(self, entry: Entry, tokens: int, seconds: float, tier: str) -> None:
        """A restore of `entry` from `tier` (read, and written into llama.cpp) took `seconds` and saved `tokens`
        of prefill."""
        st = self.stats
        st.hits[tier] += 1
        st.restored_tokens[tier] += tokens
        st.restore_s[tier] += seconds
        if seconds > 0:
            rate = entry.nbytes / seconds
            decay = tuning.BANDWIDTH_DECAY
            self.bytes_per_s[tier] = decay * self.bytes_per_s[tier] + (1 - decay) * rate

    # ---- storing ------------------------------------------------------------------------------------
    def put(self, tokens: list[int], blob: bytes | bytearray) -> None:
        """Keep `blob`, the saved state of a sequence holding `tokens`, in RAM, then spill the least recently used
        entries (this one too, when RAM cannot hold it) to disk, or drop them, to stay within bounds. Entries that
        `tokens` extends are dropped."""
        if not self.enabled:
            return
        arr = np.asarray(tokens, dtype=np.int32)
        for e in list(self.entries.values()):
            if len(e.tokens) <= len(arr) and np.array_equal(e.tokens, arr[:len(e.tokens)]):
                self._drop(e)
        e = Entry(tokens=arr, nbytes=len(blob), blob=blob)
        self.entries[id(e)] = e
        self._count(e, +1)
        self.stats.saved["ram"] += 1
        self._bound()

    # ---- across engine processes (backends/fleet.py: a model unloaded and loaded again) --------------------
    def persist(self, directory: str) -> int:
        """Write every entry to `directory` (created; what it held is replaced), least recently used first, as
        NNNNNN.tokens.npy and NNNNNN.kv; returns how many. Only an engine of the same model and KV layout may
        adopt them."""
        out = Path(directory)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        n = 0
        for e in list(self.entries.values()):
            blob = self.load(e)
            if blob is None:
                continue
            np.save(out / f"{n:06d}.tokens.npy", e.tokens)
            (out / f"{n:06d}.kv").write_bytes(blob)
            n += 1
        return n

    def adopt(self, directory: str) -> int:
        """Take the entries `persist` wrote to `directory` (in their order of use, within this tier's bounds) and
        remove the directory; returns how many were read."""
        src = Path(directory)
        n = 0
        for tokens_file in sorted(src.glob("*.tokens.npy")):
            try:
                tokens = np.load(tokens_file)
                blob = tokens_file.with_name(tokens_file.name.removesuffix(".tokens.npy") + ".kv").read_bytes()
            except (OSError, ValueError):
                continue
            self.put(tokens.tolist(), blob)
            n += 1
        shutil.rmtree(src, ignore_errors=True)
        return n

    def clear(self) -> None:
        for e in list(self.entries.values()):
            self._drop(e)

    def close(self) -> None:
        """Drop everything and remove the disk tier's directory."""
        self.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _bound(self) -> None:
        st = self.stats
        for e in list(self.entries.values()):         # least recently used first
            if st.bytes["ram"] <= self.ram_bytes:
                break
            if e.blob is None:
                continue
            self._count(e, -1)
            if self.dir is not None and e.nbytes <= self.disk_bytes:
                path = self.dir / f"{uuid.uuid4().hex}.kv"
                try:
                    path.write_bytes(e.blob)
                except OSError:
                    path.unlink(missing_ok=True)
                    del self.entries[id(e)]
                    continue
                e.blob, e.path = None, path
                self._count(e, +1)
                st.saved["disk"] += 1
            else:
                del self.entries[id(e)]
        for e in list(self.entries.values()):
            if st.bytes["disk"] <= self.disk_bytes:
                break
            if e.path is not None:
                self._drop(e)

    def _drop(self, e: Entry) -> None:
        if self.entries.pop(id(e), None) is None:
            return
        self._count(e, -1)
        if e.path is not None:
            e.path.unlink(missing_ok=True)

    def _count(self, e: Entry, sign: int) -> None:
        self.stats.bytes[e.tier] += sign * e.nbytes
        self.stats.entries[e.tier] += sign


def engine_dir(root: str | None, name: str) -> str | None:
    """The disk tier's directory for this engine process (model `name`) under the configured root; directories
    that engine processes now gone left there are removed."""
    if not root:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    base = Path(root)
    if base.is_dir():
        for d in base.glob(f"{safe}-*"):
            pid = d.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)
    return str(base / f"{safe}-{os.getpid()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
