"""The file's `cache:` section: exact and semantic response caches."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from tokenomy.config import home
from tokenomy.config.section import Section


class ExactCacheSettings(Section):
    """Answers to byte-identical requests (tokenomy/cache/exact.py)."""

    enabled: bool = Field(True, description="serve repeated requests from the cache")
    ttl_s: float = Field(86400.0, gt=0, description="seconds an answer stays servable")
    max_entries: int = Field(10000, ge=1, description="answers kept; the least recently used go first")
    deterministic_only: bool = Field(True, description="only cache temperature 0 or seeded requests (the others "
                                     "asked for randomness); the semantic cache follows it too")


class SemanticCacheSettings(Section):
    """Answers to paraphrased questions, by embedding similarity with a learned verifier (docs/cache.md)."""

    enabled: bool = Field(True, description="serve near-duplicate questions from the cache")
    threshold: float = Field(0.9, gt=0, le=1, description="the least cosine similarity of a question to a stored "
                             "one to be a candidate hit")
    error_budget: float | None = Field(0.02, gt=0, lt=1, description="tolerated share of wrong hits: the verifier "
                                       "serves a candidate only above the score that keeps wrong hits under it; "
                                       "null: the threshold alone")
    ttl_s: float = Field(86400.0, gt=0, description="seconds an answer stays servable")
    max_entries: int = Field(100000, ge=1, description="answers kept; the least recently used go first")
    routes: list[str] | None = Field(None, description="models and routes allowed to use it; null: all")
    embed_threads: int = Field(1, ge=1, le=64, description="threads for the MiniLM embedding of a lookup")
    min_margin: float = Field(0.02, ge=0, lt=1, description="serve only when the best stored question beats the "
                              "next one by this much cosine (an ambiguous pair of candidates is a miss)")
    explore: float = Field(0.0, ge=0, le=1, description="online error control (docs/cache.md): the least share of "
                           "would-be hits sent to the model anyway and compared, to keep error_budget on live "
                           "traffic (all of them until the cache has evidence); 0: the calibration alone")
    explore_window: int = Field(100, ge=5, description="memory of online error control: an explore outcome weighs "
                                "e^(-age / explore_window), age in outcomes observed since")

    @model_validator(mode="after")
    def _explore(self) -> SemanticCacheSettings:
        if self.explore > 0 and self.error_budget is None:
            raise ValueError("cache.semantic.explore keeps an error budget online: set error_budget too")
        return self


class CacheSettings(Section):
    """The response caches, in front of every model."""

    path: str | None = Field(None, description="directory of the caches' SQLite files and ANN index; null: cache/ "
                             "in the data directory ($TOKENOMY_HOME, else $XDG_DATA_HOME/tokenomy, else "
                             "~/.local/share/tokenomy)")
    store: str = Field("local", description="where cached answers live: local (SQLite under `path`) or "
                       "redis://host:port/db (shared by gateway replicas)")
    exact: ExactCacheSettings = Field(ExactCacheSettings(), description="the exact-match cache")
    semantic: SemanticCacheSettings = Field(SemanticCacheSettings(), description="the semantic cache")

    @model_validator(mode="after")
    def _store(self) -> CacheSettings:
        if self.store != "local" and not self.store.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("cache.store must be 'local' or a redis:// URL")
        return self

    def directory(self) -> Path:
        """Where the caches' local files go: `path`, or the data directory's cache/."""
        return Path(self.path).expanduser() if self.path else home.cache_path()
