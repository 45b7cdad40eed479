"""API keys and tenants: each key stored as its SHA-256 only, with its tenant, its rate limits and the models it may
use. A Keyring is built from the config's keys and swapped whole on a reload; the keys' rate windows are kept apart
(limits/rate_windows.py, by key id) so that they outlive the swap."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass

from tokenomy.config import KeySpec, TenantSpec
from tokenomy.errors import APIError


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id_of(spec: KeySpec) -> str:
    """A configured key's id: the first 12 hex characters of its hash, safe to log and store."""
    return (spec.key_sha256.lower() if spec.key_sha256 else hash_key(spec.key or ""))[:12]


@dataclass(frozen=True)
class KeyInfo:
    key_id: str                 # first 12 hex chars of the hash: safe to log and store
    name: str
    tenant: str
    admin: bool
    rpm: int | None
    tpm: int | None
    allowed: frozenset[str] | None = None    # model and route names it may ask for (key's and tenant's); None: all
    expires_at: float | None = None          # UNIX seconds from which it is refused (a rotated key's grace end)
    tenant_admin: bool = False               # may use the admin API for its own tenant only
    source: str = "config"                   # config (the file) | database (limits/key_store.py)
    tenant_rpm: int | None = None            # the tenant's limits, all its keys together
    tenant_tpm: int | None = None


class Keyring:
    def __init__(self, keys: list[KeySpec], tenants: dict[str, TenantSpec] | None = None,
                 stored: Iterable[tuple[str, KeyInfo]] = (), closed: bool = False) -> None:
        """Config-file `keys` with their `tenants`' allow-lists, and `stored` (digest, KeyInfo) pairs of the
        database's keys (limits/key_store.py: keyring_of); a config key wins over a stored one of the same digest.
        `closed`: keys are required even when none is live (the database has had keys: revoking the last one
        must not open the gateway)."""
        self.closed = closed
        self.by_hash: dict[str, KeyInfo] = dict(stored)
        for k in keys:
            h = k.key_sha256.lower() if k.key_sha256 else hash_key(k.key or "")
            tenant = (tenants or {}).get(k.tenant, TenantSpec())
            lists = [set(x) for x in (k.models, tenant.models) if x is not None]
            allowed = frozenset(set.intersection(*lists)) if lists else None
            self.by_hash[h] = KeyInfo(h[:12], k.name, k.tenant, k.admin, k.rpm, k.tpm, allowed,
                                      tenant_rpm=tenant.rpm, tenant_tpm=tenant.tpm)
        self._by_id = {i.key_id: i for i in self.by_hash.values()}

    @property
    def enabled(self) -> bool:
        return self.closed or bool(self.by_hash)

    def by_key_id(self, key_id: str | None) -> KeyInfo | None:
        return self._by_id.get(key_id) if key_id else None

    def names(self) -> dict[str, str]:
        """key id -> the key's name (what messages call it)."""
        return {i.key_id: i.name for i in self.by_hash.values()}

    def lookup(self, authorization: str | None) -> KeyInfo:
        """The key a request's Authorization header presents, or a 401. Only the key's SHA-256 is kept and looked
        up (in a table: the time a lookup takes tells nothing of a stored digest's preimage)."""
        if not authorization or not authorization.lower().startswith("bearer "):
            raise APIError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                           code="missing_api_key")
        info = self.by_hash.get(hash_key(authorization[7:].strip()))
        if info is not None and (info.expires_at is None or time.time() < info.expires_at):
            return info
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")

    def by_id(self, key_id: str | None) -> KeyInfo:
        """The key behind a batch (authenticated when the batch was created): 401 once it is no longer configured."""
        info = self.by_key_id(key_id)
        if info is None or (info.expires_at is not None and time.time() >= info.expires_at):
            raise APIError(401, "The API key that created this batch is no longer configured.",
                           code="invalid_api_key")
        return info

    def admin(self, authorization: str | None) -> KeyInfo | None:
        """Admin endpoints: refuse unless an admin key is presented (or no keys are configured at all)."""
        if not self.enabled:
            return None
        info = self.lookup(authorization)
        if not info.admin:
            raise APIError(403, "This endpoint needs an admin key.", code="not_admin")
        return info
