"""Keys and tenants in the ledger's database, managed live (the admin API's one service).

Contract:
- Every change (a tenant or key made, changed, deleted, revoked, rotated) is one transaction that writes the
  record, an audit row (who, what, before, after; never a secret) and bumps `keys_version`. A plain key exists
  only in the answer to create/rotate: the database keeps its SHA-256.
- `snapshot()` reads the version, tenants and keys in one transaction: a snapshot of version v holds every change
  up to v and none after. Gateways build their keyring from a snapshot and swap it whole (Gateway.refresh_keys),
  only for a newer version; nothing on the request path reads or writes these tables, so no request can write a
  key's old state back.
- `version()` is the one cheap read a gateway polls (every 0.5 s) to learn that another gateway changed something.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from tokenomy.config import BudgetLimits, KeySpec, TenantSpec
from tokenomy.errors import APIError
from tokenomy.ledger.tables import admin_audit, api_keys, keys_version, tenants
from tokenomy.limits.keys import KeyInfo, Keyring, hash_key

ROLES = ("user", "tenant_admin", "admin")
KEY_PREFIX = "sk-tk-"


@dataclass(frozen=True)
class StoredTenant:
    name: str
    budget: BudgetLimits | None = None
    models: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d["budget"] = self.budget.model_dump() if self.budget is not None else None
        return {**d, "source": "database"}


@dataclass(frozen=True)
class StoredKey:
    id: str
    key_sha256: str
    name: str
    tenant: str
    role: str = "user"
    budget: BudgetLimits | None = None
    models: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    expires_at: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    revoked_at: float | None = None
    rotated_to: str | None = None

    def public(self) -> dict[str, Any]:
        """What the API shows: everything but the hash."""
        d = asdict(self)
        d.pop("key_sha256")
        d["budget"] = self.budget.model_dump() if self.budget is not None else None
        return {**d, "source": "database"}


@dataclass(frozen=True)
class Snapshot:
    version: int
    tenants: dict[str, StoredTenant]
    keys: list[StoredKey]


EMPTY = Snapshot(0, {}, [])


def keyring_of(keys: list[KeySpec], config_tenants: dict[str, TenantSpec], snap: Snapshot | None) -> Keyring:
    """The keyring of config-file keys and the snapshot's live keys (neither revoked nor rotated past their grace:
    expiry is checked at lookup), with config and stored tenants' allow-lists. Once the database holds a key, live
    or not, keys are required: revoking the last one locks every caller out rather than opening the gateway."""
    snap = snap or EMPTY
    all_tenants = {**{n: TenantSpec(models=t.models, rpm=t.rpm, tpm=t.tpm) for n, t in snap.tenants.items()},
                   **config_tenants}
    stored = []
    for k in snap.keys:
        if k.revoked_at is not None:
            continue
        tenant = all_tenants.get(k.tenant, TenantSpec())
        lists = [set(x) for x in (k.models, tenant.models) if x is not None]
        allowed = frozenset(set.intersection(*lists)) if lists else None
        stored.append((k.key_sha256, KeyInfo(k.id, k.name, k.tenant, k.role == "admin", k.rpm, k.tpm, allowed,
                                             expires_at=k.expires_at, tenant_admin=k.role == "tenant_admin",
                                             source="database", tenant_rpm=tenant.rpm, tenant_tpm=tenant.tpm)))
    return Keyring(keys, all_tenants, stored=stored, closed=bool(snap.keys))


def stored_budgets(snap: Snapshot | None) -> tuple[dict[str, BudgetLimits], dict[str, BudgetLimits]]:
    """(key id -> limits, tenant -> limits) of the snapshot's live keys and tenants."""
    snap = snap or EMPTY
    return ({k.id: k.budget for k in snap.keys if k.budget is not None and k.revoked_at is None},
            {t.name: t.budget for t in snap.tenants.values() if t.budget is not None})


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _load(raw: str | None) -> Any:
    return json.loads(raw) if raw else None


def _budget(raw: str | None) -> BudgetLimits | None:
    data = _load(raw)
    return BudgetLimits(**data) if data is not None else None


def _tenant_row(r: Any) -> StoredTenant:
    return StoredTenant(r.name, _budget(r.budget), _load(r.models), r.rpm, r.tpm, _load(r.metadata) or {},
                        r.created_at, r.updated_at)


def _key_row(r: Any) -> StoredKey:
    return StoredKey(r.id, r.key_sha256, r.name, r.tenant, r.role, _budget(r.budget), _load(r.models), r.rpm,
                     r.tpm, r.expires_at, _load(r.metadata) or {}, r.created_at, r.updated_at, r.revoked_at,
                     r.rotated_to)


def _tenant_values(t: StoredTenant) -> dict[str, Any]:
    return {"name": t.name, "budget": _dump(t.budget.model_dump() if t.budget else None), "models": _dump(t.models),
            "rpm": t.rpm, "tpm": t.tpm, "metadata": _dump(t.metadata), "created_at": t.created_at,
            "updated_at": t.updated_at}


def _key_values(k: StoredKey) -> dict[str, Any]:
    return {"id": k.id, "key_sha256": k.key_sha256, "name": k.name, "tenant": k.tenant, "role": k.role,
            "budget": _dump(k.budget.model_dump() if k.budget else None), "models": _dump(k.models), "rpm": k.rpm,
            "tpm": k.tpm, "expires_at": k.expires_at, "metadata": _dump(k.metadata), "created_at": k.created_at,
            "updated_at": k.updated_at, "revoked_at": k.revoked_at, "rotated_to": k.rotated_to}


@dataclass(frozen=True)
class Actor:
    """Who acts: an admin key's id and, for a tenant admin, the one tenant it may touch (None: a global admin)."""

    key_id: str | None
    tenant: str | None = None

    def may(self, tenant: str) -> None:
        if self.tenant is not None and tenant != self.tenant:
            raise APIError(404, f"No tenant or key {tenant!r} in your tenant.", code="not_found")


class KeyStore:
    def __init__(self, engine: Engine, clock: Any = time.time) -> None:
        self.engine = engine
        self.clock = clock

    # ---- reading -----------------------------------------------------------------------------------------
    def version(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(keys_version.c.version)).scalar() or 0)

    def snapshot(self) -> Snapshot:
        with self.engine.connect() as conn, conn.begin():
            version = int(conn.execute(sa.select(keys_version.c.version)).scalar() or 0)
            ts = {r.name: _tenant_row(r) for r in conn.execute(sa.select(tenants)
                                                             .where(tenants.c.deleted_at.is_(None)))}
            ks = [_key_row(r) for r in conn.execute(sa.select(api_keys).order_by(api_keys.c.created_at))]
        return Snapshot(version, ts, ks)

    def audit(self, tenant: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        q = sa.select(admin_audit).order_by(admin_audit.c.id.desc()).limit(limit)
        if tenant is not None:
            q = q.where(admin_audit.c.tenant == tenant)
        with self.engine.connect() as conn:
            return [{"id": r.id, "ts": r.ts, "actor": r.actor, "action": r.action, "kind": r.kind,
                     "target": r.target, "tenant": r.tenant, "before": _load(r.before), "after": _load(r.after)}
                    for r in conn.execute(q)]

    # ---- changing ----------------------------------------------------------------------------------------
    @contextmanager
    def _change(self) -> Iterator[Connection]:
        """One change: a write transaction (BEGIN IMMEDIATE on SQLite) that bumps keys_version."""
        with self.engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                conn = conn.execution_options(immediate=True)
            with conn.begin():
                yield conn
                conn.execute(keys_version.update().values(version=keys_version.c.version + 1))

    def _audit(self, conn: Connection, actor: Actor, action: str, kind: str, target: str, tenant: str,
               before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        conn.execute(admin_audit.insert().values(ts=self.clock(), actor=actor.key_id, actor_tenant=actor.tenant,
                                                 action=action, kind=kind, target=target, tenant=tenant,
                                                 before=_dump(before), after=_dump(after)))

    def note(self, actor: Actor, action: str, kind: str, target: str, after: dict[str, Any] | None) -> None:
        """An audit row for an admin action that changes no key or tenant here (a config reload)."""
        with self.engine.begin() as conn:
            self._audit(conn, actor, action, kind, target, actor.tenant or "", None, after)

    def _tenant(self, conn: Connection, name: str) -> StoredTenant | None:
        r = conn.execute(sa.select(tenants).where(tenants.c.name == name, tenants.c.deleted_at.is_(None))).first()
        return _tenant_row(r) if r is not None else None

    def _key(self, conn: Connection, key_id: str) -> StoredKey | None:
        r = conn.execute(sa.select(api_keys).where(api_keys.c.id == key_id)).first()
        return _key_row(r) if r is not None else None

    def create_tenant(self, actor: Actor, tenant: StoredTenant) -> StoredTenant:
        now = self.clock()
        tenant = replace(tenant, created_at=now, updated_at=now)
        with self._change() as conn:
            if self._tenant(conn, tenant.name) is not None:
                raise APIError(409, f"Tenant {tenant.name!r} already exists.", code="conflict")
            conn.execute(tenants.delete().where(tenants.c.name == tenant.name))     # a deleted one of that name
            conn.execute(tenants.insert().values(**_tenant_values(tenant)))
            self._audit(conn, actor, "create", "tenant", tenant.name, tenant.name, None, tenant.public())
        return tenant

    def update_tenant(self, actor: Actor, name: str, changes: dict[str, Any]) -> StoredTenant:
        with self._change() as conn:
            before = self._tenant(conn, name)
            if before is None:
                raise APIError(404, f"No tenant {name!r}.", code="not_found")
            after = replace(before, **changes, updated_at=self.clock())
            conn.execute(tenants.update().where(tenants.c.name == name).values(**_tenant_values(after)))
            self._audit(conn, actor, "update", "tenant", name, name, before.public(), after.public())
        return after

    def delete_tenant(self, actor: Actor, name: str) -> StoredTenant:
        with self._change() as conn:
            before = self._tenant(conn, name)
            if before is None:
                raise APIError(404, f"No tenant {name!r}.", code="not_found")
            live = conn.execute(sa.select(sa.func.count()).select_from(api_keys).where(
                api_keys.c.tenant == name, api_keys.c.revoked_at.is_(None))).scalar()
            if live:
                raise APIError(409, f"Tenant {name!r} still has {live} live key(s): revoke them first.",
                               code="conflict")
            conn.execute(tenants.update().where(tenants.c.name == name).values(deleted_at=self.clock()))
            self._audit(conn, actor, "delete", "tenant", name, name, before.public(), None)
        return before

    def create_key(self, actor: Actor, key: StoredKey) -> tuple[StoredKey, str]:
        """The stored key (id, hash) and the plain key, which is not kept."""
        plain = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = hash_key(plain)
        now = self.clock()
        key = replace(key, id=digest[:12], key_sha256=digest, created_at=now, updated_at=now)
        with self._change() as conn:
            conn.execute(api_keys.insert().values(**_key_values(key)))
            self._audit(conn, actor, "create", "key", key.id, key.tenant, None, key.public())
        return key, plain

    def get_key(self, key_id: str) -> StoredKey | None:
        with self.engine.connect() as conn:
            return self._key(conn, key_id)

    def update_key(self, actor: Actor, key_id: str, changes: dict[str, Any], *,
                   admins_left: int | None = None) -> StoredKey:
        """Change a key's settings; demoting the last admin key (another role) is refused as revoking it is."""
        with self._change() as conn:
            before = self._live_key(conn, actor, key_id)
            if changes.get("role", before.role) != "admin":
                self._keep_an_admin(conn, before, admins_left)
            after = replace(before, **changes, updated_at=self.clock())
            conn.execute(api_keys.update().where(api_keys.c.id == key_id).values(**_key_values(after)))
            self._audit(conn, actor, "update", "key", key_id, after.tenant, before.public(), after.public())
        return after

    def revoke_key(self, actor: Actor, key_id: str, *, admins_left: int | None = None) -> StoredKey:
        """Revoke a key; `admins_left`: how many admin keys the caller counts besides the database's (config's),
        so that revoking the last admin key is refused (409) unless the caller passes None (forced)."""
        with self._change() as conn:
            before = self._live_key(conn, actor, key_id)
            self._keep_an_admin(conn, before, admins_left)
            after = replace(before, revoked_at=self.clock(), updated_at=self.clock())
            conn.execute(api_keys.update().where(api_keys.c.id == key_id).values(**_key_values(after)))
            self._audit(conn, actor, "revoke", "key", key_id, after.tenant, before.public(), after.public())
        return after

    def rotate_key(self, actor: Actor, key_id: str, grace_s: float = 0.0) -> tuple[StoredKey, str]:
        """A new key with the old one's settings; the old one expires after `grace_s` (0: at once)."""
        plain = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = hash_key(plain)
        now = self.clock()
        with self._change() as conn:
            before = self._live_key(conn, actor, key_id)
            new = replace(before, id=digest[:12], key_sha256=digest, created_at=now, updated_at=now,
                          expires_at=before.expires_at, rotated_to=None)
            end = now + grace_s
            old = replace(before, rotated_to=new.id, updated_at=now,
                          expires_at=end if before.expires_at is None else min(before.expires_at, end))
            if grace_s <= 0:
                old = replace(old, revoked_at=now)
            conn.execute(api_keys.update().where(api_keys.c.id == key_id).values(**_key_values(old)))
            conn.execute(api_keys.insert().values(**_key_values(new)))
            self._audit(conn, actor, "rotate", "key", key_id, before.tenant, before.public(),
                        {"old": old.public(), "new": new.public()})
        return new, plain

    @staticmethod
    def _keep_an_admin(conn: Connection, key: StoredKey, admins_left: int | None) -> None:
        """409 when `key` is the last live admin key (none stored beside it, `admins_left` in the config) and the
        caller did not force (admins_left None)."""
        if admins_left is None or key.role != "admin" or admins_left:
            return
        others = conn.execute(sa.select(sa.func.count()).select_from(api_keys).where(
            api_keys.c.role == "admin", api_keys.c.revoked_at.is_(None), api_keys.c.id != key.id)).scalar()
        if not others:
            raise APIError(409, "This is the last admin key: without it every admin is locked out. "
                           "Repeat with ?force=true to do it anyway.", code="last_admin_key")

    def _live_key(self, conn: Connection, actor: Actor, key_id: str) -> StoredKey:
        key = self._key(conn, key_id)
        if key is None or key.revoked_at is not None or (actor.tenant is not None and key.tenant != actor.tenant):
            raise APIError(404, f"No live key {key_id!r}.", code="not_found")
        return key
