"""Keys and tenants in the ledger's database (tokenomy/limits/key_store.py), on SQLite and PostgreSQL: the migration
keeps an older ledger's rows, each change bumps the version in its own transaction and is audited without a secret,
and the keyring built from a snapshot refuses revoked and expired keys."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from tests.helpers.synthetic import Spec, rows_for
from tokenomy.config import BudgetLimits, KeySpec
from tokenomy.errors import APIError
from tokenomy.ledger import tables as schema
from tokenomy.ledger.ledger import Ledger, normalize_url
from tokenomy.limits.key_store import Actor, KeyStore, StoredKey, StoredTenant, keyring_of, stored_budgets

ROOT = Actor("root0000000")


def test_the_admin_plane_arrives_by_migration_and_an_older_ledger_keeps_its_rows(ledger_url):
    engine = sa.create_engine(normalize_url(ledger_url))
    step = schema.MIGRATIONS.index(schema._m14_admin_plane)
    with engine.begin() as conn:
        schema.migrate(conn, upto=step)
        before = sa.Table("ledger", sa.MetaData(), autoload_with=conn)
        assert "user" not in before.c and not sa.inspect(conn).has_table("api_keys")
        for row in rows_for([Spec("small", 10, 0, 2), Spec("small", 5, 1, 3)]):
            conn.execute(before.insert().values({k: v for k, v in row.to_db().items() if k in before.c}))
    engine.dispose()
    with Ledger(ledger_url) as led:
        got = led.query()
        assert len(got) == 2 and {r.user for r in got} == {None}
        store = KeyStore(led.engine)
        assert store.version() == 0 and store.snapshot().keys == []
        written = rows_for([Spec("small", 10, 0, 2)])[0]
        written.request_id, written.user = "req_u", "end-user-7"
        led.write(written)
        assert led.flush() and led.get("req_u").user == "end-user-7"


def test_changes_bump_the_version_and_are_audited_without_a_secret(ledger_url):
    with Ledger(ledger_url) as led:
        store = KeyStore(led.engine)
        store.create_tenant(ROOT, StoredTenant("acme", budget=BudgetLimits(usd_per_day=5), models=["a"]))
        key, plain = store.create_key(ROOT, StoredKey("", "", "dev", "acme", rpm=10))
        assert store.version() == 2 and key.id == key.key_sha256[:12] and plain.startswith("sk-")
        snap = store.snapshot()
        assert snap.version == 2 and snap.tenants["acme"].budget.usd_per_day == 5
        ring = keyring_of([], {}, snap)
        info = ring.lookup(f"Bearer {plain}")
        assert (info.key_id, info.tenant, info.rpm, info.allowed, info.source) == (key.id, "acme", 10,
                                                                                     frozenset({"a"}), "database")
        assert stored_budgets(snap)[1] == {"acme": BudgetLimits(usd_per_day=5)}
        store.update_key(ROOT, key.id, {"rpm": 20})
        store.revoke_key(ROOT, key.id)
        with pytest.raises(APIError) as e:
            keyring_of([], {}, store.snapshot()).lookup(f"Bearer {plain}")
        assert e.value.status == 401
        audit = store.audit()
        assert [a["action"] for a in audit] == ["revoke", "update", "create", "create"]
        assert audit[1]["before"]["rpm"] == 10 and audit[1]["after"]["rpm"] == 20 and audit[1]["actor"] == ROOT.key_id
        text = repr(audit)
        assert plain not in text and key.key_sha256 not in text
        with pytest.raises(APIError) as e:
            store.revoke_key(ROOT, key.id)            # revoked already
        assert e.value.status == 404
        assert store.version() == 4                   # a refused change bumps nothing


def test_a_rotated_key_lives_out_its_grace_and_an_expired_key_is_refused(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        store = KeyStore(led.engine)
        key, old = store.create_key(ROOT, StoredKey("", "", "dev", "default"))
        new_key, new = store.rotate_key(ROOT, key.id, grace_s=3600)
        ring = keyring_of([], {}, store.snapshot())
        assert ring.lookup(f"Bearer {old}").key_id == key.id           # within its grace
        assert ring.lookup(f"Bearer {new}").key_id == new_key.id
        store.update_key(ROOT, key.id, {"expires_at": time.time() - 1})  # the grace is over
        ring = keyring_of([], {}, store.snapshot())
        with pytest.raises(APIError) as e:
            ring.lookup(f"Bearer {old}")
        assert e.value.status == 401
        _, gone = store.create_key(ROOT, StoredKey("", "", "b", "default"))
        rotated, _ = store.rotate_key(ROOT, store.snapshot().keys[-1].id)   # no grace: refused at once
        with pytest.raises(APIError):
            keyring_of([], {}, store.snapshot()).lookup(f"Bearer {gone}")
        assert rotated.id != key.id


def test_a_tenant_admin_touches_only_its_tenants_keys(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        store = KeyStore(led.engine)
        theirs, _ = store.create_key(ROOT, StoredKey("", "", "x", "globex"))
        with pytest.raises(APIError) as e:
            store.revoke_key(Actor("acmeadmin00", "acme"), theirs.id)
        assert e.value.status == 404
        assert store.audit(tenant="acme") == [] and len(store.audit(tenant="globex")) == 1


def test_the_last_admin_key_is_kept_unless_forced(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        store = KeyStore(led.engine)
        admin, _ = store.create_key(ROOT, StoredKey("", "", "ops", "default", role="admin"))
        with pytest.raises(APIError) as e:
            store.revoke_key(ROOT, admin.id, admins_left=0)
        assert (e.value.status, e.value.code) == (409, "last_admin_key")
        store.revoke_key(ROOT, admin.id, admins_left=1)       # a config-file admin key remains
        assert store.get_key(admin.id).revoked_at is not None
        again, _ = store.create_key(ROOT, StoredKey("", "", "ops", "default", role="admin"))
        store.revoke_key(ROOT, again.id, admins_left=None)    # forced


def test_a_config_key_wins_over_a_stored_key_of_the_same_digest(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        store = KeyStore(led.engine)
        _, plain = store.create_key(ROOT, StoredKey("", "", "db", "default"))
        ring = keyring_of([KeySpec(key=plain, name="file", tenant="ops")], {}, store.snapshot())
        assert (ring.lookup(f"Bearer {plain}").name, ring.lookup(f"Bearer {plain}").source) == ("file", "config")
