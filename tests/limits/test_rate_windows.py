"""Per-key rate windows in one process (tokenomy/limits/rate_windows.py); across gateways through Redis:
test_shared_counters.py."""

from __future__ import annotations

import pytest

from tokenomy.config import KeySpec, TenantSpec
from tokenomy.errors import APIError
from tokenomy.limits.keys import Keyring
from tokenomy.limits.rate_windows import RateWindows


def ring(**limits: int) -> Keyring:
    return Keyring([KeySpec(key="sk-a", name="a", **limits)])


def key(r: Keyring):
    return r.lookup("Bearer sk-a")


def test_requests_per_minute() -> None:
    w, info = RateWindows(), key(ring(rpm=2))
    w.admit(info, "r1")
    w.admit(info, "r2")
    with pytest.raises(APIError) as e:
        w.admit(info, "r3")
    assert e.value.status == 429 and "2 requests per minute" in e.value.message
    assert int(e.value.headers["retry-after"]) >= 1


def test_tokens_per_minute_hold_then_settle() -> None:
    w, info = RateWindows(), key(ring(tpm=100))
    w.reserve_tokens(info, "r1", 60)
    with pytest.raises(APIError) as e:            # 60 held + 50 > 100
        w.reserve_tokens(info, "r2", 50)
    assert "tokens per minute" in e.value.message and "r2" not in w.holding
    w.settle(info, "r1", 30)                      # the hold becomes the 30 tokens it used
    assert "r1" not in w.holding
    w.reserve_tokens(info, "r2", 50)              # 30 used + 50 fit
    w.settle(info, "r2", 80)
    with pytest.raises(APIError):                 # 110 used in the last minute: admission refuses
        w.admit(info, "r3")


def test_a_hold_nobody_renews_lapses() -> None:
    w, info = RateWindows(lease_s=0.0), key(ring(tpm=100))
    w.reserve_tokens(info, "lost", 90)            # its request ended without settling: the lease ends at once
    w.reserve_tokens(info, "r2", 90)


def test_a_tenants_limits_hold_for_all_its_keys_together() -> None:
    tenants = {"acme": TenantSpec(rpm=3, tpm=100)}
    r = Keyring([KeySpec(key="sk-a", name="a", tenant="acme"), KeySpec(key="sk-b", name="b", tenant="acme", rpm=1),
                 KeySpec(key="sk-c", name="c", tenant="other")], tenants)
    a, b, c = (r.lookup(f"Bearer sk-{x}") for x in "abc")
    w = RateWindows()
    w.admit(a, "r1")
    with pytest.raises(APIError) as e:
        w.admit(b, "r2")                 # b's own rpm is free, the tenant's has room: admitted
        w.admit(b, "r3")                 # b's own rpm of 1 is full
    assert "key b" in e.value.message
    w.admit(a, "r4")                     # the tenant's third request
    with pytest.raises(APIError) as e:
        w.admit(a, "r5")
    assert e.value.status == 429 and "tenant acme: 3 requests per minute" in e.value.message
    w.admit(c, "r6")                     # another tenant's key counts apart
    w.windows["tenant:acme"].requests.clear()          # a minute later, as far as rpm goes
    w.settle(a, "r1", 60)
    w.settle(b, "r2", 50)                # 110 tokens used by the tenant's keys in the last minute
    with pytest.raises(APIError) as e:
        w.admit(a, "r7")
    assert "tenant acme: 100 tokens per minute (110 used)" in e.value.message


def test_keys_without_limits_leave_no_window() -> None:
    w, info = RateWindows(), key(ring())
    w.admit(info, "r1")
    w.settle(info, "r1", 50)
    assert w.windows == {} and w.holding == {}


def test_windows_and_holds_outlive_a_keyring_swapped_on_reload() -> None:
    w = RateWindows()
    old = key(ring(rpm=2, tpm=100))
    w.admit(old, "r1")
    w.reserve_tokens(old, "r1", 80)
    new = key(ring(rpm=3, tpm=100))               # the reload's keyring: new KeyInfo, same key id
    assert new is not old and new.key_id == old.key_id
    with pytest.raises(APIError):                 # r1's hold, taken before the reload, still counts
        w.reserve_tokens(new, "r2", 30)
    w.admit(new, "r2")
    w.admit(new, "r3")                            # the new rpm (3) over the requests before and after the reload
    with pytest.raises(APIError):
        w.admit(new, "r4")
    w.settle(old, "r1", 10)                       # the request in flight settles with the key it was admitted with
    w.reserve_tokens(new, "r2", 30)
