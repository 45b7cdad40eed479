from tokenomy.engine.kv.prefix_cache import PrefixCache


def test_shared_prefix_counts_cells_once_and_frees_only_exclusive_cells():
    pc = PrefixCache()
    a = [1, 2, 3, 4, 5, 6]
    pc.extend(0, a)
    assert pc.used_cells == 6
    length, holder = pc.match([1, 2, 3, 4, 9, 9])
    assert (length, holder) == (4, 0)
    pc.attach(1, [1, 2, 3, 4, 9, 9], 4)
    pc.extend(1, [9, 9])
    assert pc.used_cells == 8                      # 4 shared + 2 + 2
    assert pc.exclusive_cells(0) == 2 and pc.exclusive_cells(1) == 2
    pc.release(0)
    assert pc.used_cells == 6                      # the shared run stays for slot 1
    assert pc.match([1, 2, 3, 4, 9, 9, 7]) == (6, 1)
    pc.release(1)
    assert pc.used_cells == 0 and pc.match([1, 2]) == (0, None)


def test_decode_extends_a_private_leaf_in_place_and_branches_when_shared():
    pc = PrefixCache()
    pc.extend(0, [1, 2])
    pc.extend(0, [3])
    assert len(pc.paths[0]) == 1 and pc.paths[0][0].tokens == [1, 2, 3]
    pc.attach(1, [1, 2, 3], 3)
    pc.extend(0, [4])                               # leaf now shared: slot 0 gets a new node
    assert [n.tokens for n in pc.paths[0]] == [[1, 2, 3], [4]]
    assert pc.used_cells == 4
    assert pc.match([1, 2, 3, 4]) == (4, 0)


def test_identical_continuations_in_two_slots_are_different_cells():
    pc = PrefixCache()
    pc.extend(0, [1, 2])
    pc.attach(1, [1, 2], 2)
    pc.extend(0, [5, 6])
    pc.extend(1, [5, 6])
    assert pc.used_cells == 6
    length, holder = pc.match([1, 2, 5, 6])
    assert length == 4 and holder in (0, 1)


def test_lru_retired_slot():
    pc = PrefixCache()
    pc.extend(0, [1])
    pc.extend(1, [2])
    pc.retire(0)
    pc.retire(1)
    pc.touch(0)
    assert pc.lru_retired() == 1
    pc.release(1)
    assert pc.lru_retired() == 0


def test_a_pin_holds_until_its_deadline_and_orders_eviction_before_protection(monkeypatch):
    import tokenomy.engine.kv.prefix_cache as module

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    pc = PrefixCache()
    for slot, tokens in enumerate(([1, 2], [3, 4], [5, 6])):
        pc.extend(slot, tokens)
    pc.retire(0, pin_until=now[0] + 30)
    now[0] += 1
    pc.retire(1, protected=True)
    now[0] += 1
    pc.retire(2)
    assert pc.pinned(0) and not pc.pinned(1)
    assert [pc.lru_retired(exclude=x) for x in (None, 2)] == [2, 1]       # unprotected, protected, pinned last
    assert pc.lru_retired(exclude=2, protected=True) == 1
    now[0] += 60                                                          # the pin lapsed: oldest goes first
    assert not pc.pinned(0) and pc.lru_retired() == 0
    pc.release(0)
    assert 0 not in pc.pins
