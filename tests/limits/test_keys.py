"""API keys and tenants (tokenomy/limits/keys.py): stored hashed, looked up once, with their allow-lists."""

from __future__ import annotations

import hashlib

import pytest

from tokenomy.config import KeySpec, TenantSpec
from tokenomy.errors import APIError
from tokenomy.limits.keys import Keyring, key_id_of

KEYS = [KeySpec(key="sk-alice", name="alice", tenant="acme", rpm=2, models=["small", "large"]),
        KeySpec(key_sha256=hashlib.sha256(b"sk-bob").hexdigest().upper(), name="bob", tenant="globex", tpm=40),
        KeySpec(key="sk-admin", name="ops", tenant="ops", admin=True)]


def test_keys_are_stored_hashed() -> None:
    ring = Keyring(KEYS)
    assert "sk-alice" not in repr(ring.by_hash) and hashlib.sha256(b"sk-alice").hexdigest() in ring.by_hash
    bob = ring.lookup("Bearer sk-bob")              # a key_sha256 in capitals is the same digest
    assert (bob.name, bob.tenant, bob.tpm, bob.key_id) == ("bob", "globex", 40, key_id_of(KEYS[1]))
    assert ring.by_key_id(bob.key_id) is bob and ring.names()[bob.key_id] == "bob"


def test_missing_and_wrong_keys_are_refused() -> None:
    ring = Keyring(KEYS)
    refused = ((None, "missing_api_key"), ("Basic x", "missing_api_key"), ("Bearer sk-eve", "invalid_api_key"))
    for header, code in refused:
        with pytest.raises(APIError) as e:
            ring.lookup(header)
        assert (e.value.status, e.value.code) == (401, code)
    with pytest.raises(APIError) as e:
        ring.by_id("0" * 12)                        # a batch's key no longer configured
    assert e.value.status == 401


def test_a_keys_allow_list_is_its_own_and_its_tenants_together() -> None:
    ring = Keyring(KEYS, {"acme": TenantSpec(models=["small", "other"]), "globex": TenantSpec(models=["large"])})
    assert ring.lookup("Bearer sk-alice").allowed == frozenset({"small"})
    assert ring.lookup("Bearer sk-bob").allowed == frozenset({"large"})
    assert ring.lookup("Bearer sk-admin").allowed is None


def test_admin_endpoints_need_an_admin_key_when_keys_are_configured() -> None:
    assert Keyring([]).admin(None) is None and not Keyring([]).enabled
    ring = Keyring(KEYS)
    assert ring.admin("Bearer sk-admin") is not None
    with pytest.raises(APIError) as e:
        ring.admin("Bearer sk-alice")
    assert (e.value.status, e.value.code) == (403, "not_admin")
