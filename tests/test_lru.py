import threading

from tokenomy.lru import LRU


def test_least_recently_used_goes_first() -> None:
    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert "b" not in lru and "a" in lru and "c" in lru and len(lru) == 2


def test_get_or_compute_computes_once_and_keeps_none() -> None:
    lru: LRU[str, int | None] = LRU(4, thread_safe=True)
    calls = []

    def compute() -> None:
        calls.append(1)

    assert lru.get_or_compute("k", compute) is None
    assert lru.get_or_compute("k", compute) is None
    assert calls == [1] and "k" in lru and lru.get("missing", 7) == 7


def test_thread_safe_puts_stay_bounded() -> None:
    lru: LRU[int, int] = LRU(16, thread_safe=True)
    threads = [threading.Thread(target=lambda o=o: [lru.put(o * 1000 + i, i) for i in range(500)]) for o in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lru) == 16


def test_peek_and_items_leave_the_order_and_pop_removes() -> None:
    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.peek("a") == 1 and lru.peek("zz", 9) == 9
    assert lru.items() == [("a", 1), ("b", 2)]       # peeking at a did not make it the most recent
    lru.put("c", 3)
    assert "a" not in lru and lru.items() == [("b", 2), ("c", 3)]
    assert lru.pop("b") == 2 and lru.pop("b") is None and len(lru) == 1
