"""KV tiers: evicted prefixes saved to RAM or disk and restored, on the real SmolLM2 and in the bookkeeping."""

from __future__ import annotations

import os

import httpx
import openai
import pytest

from tests.conftest import NO_CACHE, live_server
from tests.engine.test_engine import ARTICLES, greedy_ids
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.engine import Engine
from tokenomy.engine.kv.tier import KVTiers, engine_dir
from tokenomy.models.catalog import resolve_gguf

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


@pytest.fixture(scope="module")
def path() -> str:
    return str(resolve_gguf("smollm2-135m-instruct"))


def test_match_finds_the_longest_shared_prefix_beyond_what_is_resident():
    t = KVTiers(1 << 20)
    t.put(list(range(100)), b"a" * 10)
    t.put([1000, *range(1, 50)], b"b" * 10)
    length, e = t.match([*range(60), 7, 7], beyond=0)
    assert length == 60 and e is not None and e.blob == b"a" * 10
    assert t.match([*range(60), 7, 7], beyond=60) == (0, None)      # nothing longer than what is resident
    assert t.match([5, 5, 5], beyond=0) == (0, None)
    assert t.covers(list(range(80))) and not t.covers([*range(80), 1])


def test_a_longer_prefix_replaces_the_saved_prefix_it_extends():
    t = KVTiers(1 << 20)
    t.put(list(range(70)), b"x" * 10)
    t.put(list(range(90)), b"y" * 20)
    assert t.stats.entries["ram"] == 1 and t.stats.bytes["ram"] == 20
    assert t.match(list(range(75)), 0)[0] == 75


def test_ram_spills_least_recently_used_to_disk_and_disk_stays_bounded(tmp_path):
    t = KVTiers(250, str(tmp_path / "tier"), disk_bytes=250)
    for k in range(5):
        t.put([k, *range(1, 70)], bytes([k]) * 100)
    st = t.stats
    assert st.entries == {"ram": 2, "disk": 2} and st.bytes == {"ram": 200, "disk": 200}
    assert len(os.listdir(tmp_path / "tier")) == 2
    length, e = t.match([0, *range(1, 70)], 0)
    assert e is None                                   # the oldest was dropped when the disk filled
    length, e = t.match([1, *range(1, 70)], 0)
    assert e is not None and e.tier == "disk" and t.load(e) == bytes([1]) * 100
    t.put([9, *range(1, 70)], b"\x09" * 100)            # the restored one is now recent: another goes first
    assert t.match([1, *range(1, 70)], 0)[1] is not None
    t.close()
    assert not (tmp_path / "tier").exists()


def test_a_restore_slower_than_recomputing_is_not_worth_it():
    t = KVTiers(1 << 30)
    t.put(list(range(100)), b"z" * 10_000_000)
    _, e = t.match(list(range(100)), 0)
    assert e is not None
    t.recompute_s = lambda n: None
    assert t.worth(e, 100)                             # no estimate yet: restore
    t.recompute_s = lambda n: n * 0.005                # 0.5 s of prefill against ~10 ms of copying
    assert t.worth(e, 100)
    t.recompute_s = lambda n: n * 1e-6                 # a prefill far faster than the copy
    assert not t.worth(e, 100)


def test_disk_directories_of_dead_engine_processes_are_removed(tmp_path):
    stale = tmp_path / "m-999999999"
    stale.mkdir()
    mine = engine_dir(str(tmp_path), "m")
    assert not stale.exists() and mine is not None and mine.endswith(f"m-{os.getpid()}")


def prompts(engine: Engine) -> list[list[int]]:
    return [engine.tokenizer.encode_chat([{"role": "user", "content": a}]) for a in ARTICLES]


@pytest.mark.parametrize("kv_unified,ram_mb,disk", [(False, 1024, False), (True, 1024, False), (False, 3, True)],
                         ids=["streams-ram", "unified-ram", "streams-disk"])
def test_an_evicted_prefix_comes_back_from_its_tier_with_the_same_answer(path, tmp_path, kv_unified, ram_mb, disk):
    """Two streams (or a buffer that holds one retired prompt): asking the three articles in turn evicts the
    first two (with 3 MiB of RAM, the first goes on to disk); asked again, the first prompt is restored from its
    tier (counted as cached tokens) and the greedy answer is the cold one."""
    cfg = EngineConfig(n_ctx=2 * 1024 if not kv_unified else 1024, max_running=1, max_retired=1,
                       max_batch_tokens=256, kv_unified=kv_unified, max_retired_cells=200, kv_tier_ram_mb=ram_mb,
                       kv_tier_disk_dir=str(tmp_path) if disk else None, kv_tier_disk_mb=64)
    engine = Engine(path, cfg).start()
    try:
        ids = prompts(engine)
        cold = [greedy_ids(engine, p, max_tokens=16) for p in ids]
        assert all(c < 64 for _, c in cold)                  # only the chat template was cached
        st = engine.tiers.stats
        assert st.saved["ram"] >= 1
        again, cached = greedy_ids(engine, ids[0], max_tokens=16)
        tier = "disk" if disk else "ram"
        assert st.hits[tier] == 1 and st.restored_tokens[tier] == len(ids[0]) - 1
        assert cached == len(ids[0]) - 1
        assert again == cold[0][0]
        if disk:
            assert st.saved["disk"] >= 1 and any(os.scandir(engine.tiers.dir))
    finally:
        engine.stop()
    if disk:
        assert not any(tmp_path.iterdir())


def test_a_finished_prompt_is_saved_once_between_steps_after_its_answer_is_sent(path):
    """Four streams and one prompt: nothing is evicted, yet the finished prompt is saved, after the step that ended
    it has run its after-step hooks (where the engine process sends the step's events); asked again, it is found
    resident and not saved a second time."""
    cfg = EngineConfig(n_ctx=4 * 1024, max_running=2, max_retired=2, max_batch_tokens=256, kv_unified=False)
    engine = Engine(path, cfg)
    hooks: list[tuple[bool, int]] = []       # (a prefix is retired, saved entries) at each step's after-step hooks
    engine.after_step.append(lambda: hooks.append((bool(engine.scheduler.layout.prefix.retired),
                                                   engine.tiers.stats.entries["ram"])))
    engine.start()
    try:
        prompt = prompts(engine)[0]
        first, _ = greedy_ids(engine, prompt, max_tokens=4)
        engine.run_in_loop(lambda: None)              # the loop has finished the iteration that ended the answer
        st = engine.tiers.stats
        ended = next(entries for retired, entries in hooks if retired)   # the step that ended the answer
        assert ended == 0 and hooks[-1] == (True, 1)    # saved after its hooks, before the next iteration's
        assert st.saved["ram"] == 1 and engine.tiers.covers(prompt)
        assert engine.scheduler.used_cells >= len(prompt)      # still resident too: nothing was evicted
        again, cached = greedy_ids(engine, prompt, max_tokens=4)
        engine.run_in_loop(lambda: None)
        assert again == first and cached == len(prompt) - 1 and st.hits["ram"] == 0
        assert st.saved["ram"] == 1
    finally:
        engine.stop()


def test_a_restore_over_http_counts_as_cached_tokens_and_shows_in_metrics():
    engine = {"n_ctx": 2048, "max_running": 1, "max_retired": 1, "max_batch_tokens": 256}
    with live_server({"engine": engine, "cache": NO_CACHE}) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")

        def ask(text: str):
            return client.chat.completions.create(model="smollm2-135m-instruct", max_tokens=8, temperature=0,
                                                  messages=[{"role": "user", "content": text}])

        first = [ask(a) for a in ARTICLES]
        again = ask(ARTICLES[0])
        assert again.choices[0].message.content == first[0].choices[0].message.content
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
        text = httpx.get(srv.root + "/metrics").text
        assert 'tokenomy_engine_kv_tier_hits_total{model="smollm2-135m-instruct",tier="ram"} 1.0' in text
        assert 'tokenomy_engine_kv_tier_restored_tokens_total{model="smollm2-135m-instruct",tier="ram"}' in text
        assert 'tokenomy_engine_kv_tier_bytes{model="smollm2-135m-instruct",tier="ram"}' in text


def test_persisted_entries_are_adopted_by_another_tier_in_their_order_of_use(tmp_path):
    old = KVTiers(1 << 20)
    old.put(list(range(10)), b"a" * 10)
    old.put([7, *range(20)], b"b" * 20)
    old.load(next(iter(old.entries.values())))      # the first one is now the most recently used
    assert old.persist(str(tmp_path / "kv")) == 2
    new = KVTiers(1 << 20)
    assert new.adopt(str(tmp_path / "kv")) == 2
    assert not (tmp_path / "kv").exists()
    assert [e.tokens.tolist() for e in new.entries.values()] == [[7, *range(20)], list(range(10))]
    assert new.match(list(range(12)), beyond=0)[0] == 10
    assert new.load(new.match(list(range(12)), beyond=0)[1]) == b"a" * 10
