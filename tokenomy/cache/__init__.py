"""Response caches: exact (canonical request hash) and semantic (MiniLM + ANN + calibrated verifier)."""

from tokenomy.cache.entry import CacheEntry, CacheHit
from tokenomy.cache.exact import ExactCache
from tokenomy.cache.key import context_key, exact_key, is_deterministic
from tokenomy.cache.semantic import Lookup, SemanticCache
from tokenomy.cache.store import RedisStore, SQLiteStore, Store, open_store

__all__ = ["CacheEntry", "CacheHit", "ExactCache", "Lookup", "RedisStore", "SQLiteStore", "SemanticCache",
           "Store", "context_key", "exact_key", "is_deterministic", "open_store"]
