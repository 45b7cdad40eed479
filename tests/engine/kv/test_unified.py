"""The unified KV buffer: a shared prefix shares cells, a finished sequence keeps its prompt cached, and cached
cells are capped (least recently used out first, prompts seen before protected)."""

from tests.engine.layout_fakes import KVLog, run_plan, seq, unified
from tokenomy.engine.scheduler import Scheduler


def test_prefix_hit_copies_kv_and_skips_prefill():
    kv = KVLog()
    s = Scheduler(unified(max_running=4, max_retired=0, max_batch_tokens=64), kv, n_ctx=1000)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8])
    s.waiting.append(a)
    run_plan(s, s.schedule())
    s.finish(a)                                    # retired: its KV stays as a prefix
    b = seq([1, 2, 3, 4, 5, 6, 9, 9])
    s.waiting.append(b)
    plan = s.schedule()
    assert plan == [(b, 2)] and b.cached_tokens == 6 and b.n_kv == 6
    assert ("cp", a_slot := kv.ops[-1][1], b.slot, 6) == kv.ops[-1] and a_slot != b.slot


def test_a_finished_sequence_keeps_only_its_prompt_as_a_prefix():
    kv = KVLog()
    s = Scheduler(unified(max_running=4, max_retired=0, max_batch_tokens=64), kv, n_ctx=1000)
    a = seq([1, 2, 3, 4, 5])
    s.waiting.append(a)
    run_plan(s, s.schedule())
    run_plan(s, s.schedule())
    a.output += [7, 8, 9]
    s.committed(a, [7, 8])                         # the last sampled token never got KV
    slot = a.slot
    s.finish(a)
    assert ("rm", slot, 5) in kv.ops               # the answer's cells go back, the prompt's stay
    assert s.layout.prefix.used_cells == 5 and s.layout.retired_cells() == 5
    assert s.layout.prefix.match([1, 2, 3, 4, 5, 7, 8]) == (5, slot)
    kept = Scheduler(unified(max_running=4, max_retired=0, max_batch_tokens=64, retire_outputs=True), KVLog(),
                     n_ctx=1000)
    b = seq([1, 2, 3, 4, 5])
    kept.waiting.append(b)
    run_plan(kept, kept.schedule())
    run_plan(kept, kept.schedule())
    b.output += [7, 8]
    kept.committed(b, [7])
    kept.finish(b)
    assert kept.layout.prefix.used_cells == 6 and kept.layout.prefix.match([1, 2, 3, 4, 5, 7, 9]) == (6, 0)


def test_retired_cells_are_capped_least_recently_used_first():
    kv = KVLog()
    s = Scheduler(unified(max_running=8, max_retired=0, max_batch_tokens=64, max_retired_cells=10), kv, n_ctx=1000)
    done = []
    for base in (10, 20, 30):                     # three unrelated 5-token prompts, finished in turn
        q = seq(range(base, base + 5))
        s.waiting.append(q)
        run_plan(s, s.schedule())
        run_plan(s, s.schedule())
        done.append(q.slot)
        s.finish(q)
    assert s.layout.retired_cells() == 10 and len(s.layout.prefix.retired) == 2
    assert done[0] not in s.layout.prefix.retired and ("rm", done[0]) in kv.ops


def test_shared_cells_do_not_count_against_the_retired_cap():
    s = Scheduler(unified(max_running=8, max_retired=0, max_batch_tokens=64, max_retired_cells=3), KVLog(),
                  n_ctx=1000)
    a, b = seq([1, 2, 3, 4, 5, 6]), seq([1, 2, 3, 4, 5, 9])
    s.waiting.append(a)
    run_plan(s, s.schedule())
    run_plan(s, s.schedule())
    s.finish(a)                                    # 6 cells only it holds: over the cap, evicted
    assert not s.layout.prefix.retired and s.layout.prefix.used_cells == 0
    s.waiting.append(a2 := seq([1, 2, 3, 4, 5, 6]))
    run_plan(s, s.schedule())
    run_plan(s, s.schedule())
    s.waiting.append(b)
    run_plan(s, s.schedule())                      # b shares a2's first 5 cells
    s.finish(a2)                                   # a2's own cell is 1 (the 6th), under the cap
    assert len(s.layout.prefix.retired) == 1 and s.layout.retired_cells() == 1


def test_prompts_coming_back_in_a_cycle_longer_than_the_cap_end_up_cached():
    # three 150-token prompts in a cycle: 450 cells, over the 250-cell cap (n_ctx // 4), under n_ctx // 2.
    # Plain LRU evicts each one just before it comes back and never hits; a prompt seen before (evicted
    # recently, or served from the cache) is kept as protected, so from the third cycle on every one hits.
    s = Scheduler(unified(max_running=4, max_retired=8, max_batch_tokens=512), KVLog(), n_ctx=1000)
    prompts = [list(range(b, b + 150)) for b in (1000, 2000, 3000)]
    hits = []
    for _cycle in range(4):
        for p in prompts:
            q = seq(p)
            s.waiting.append(q)
            run_plan(s, s.schedule())
            hits.append(q.cached_tokens)
            s.finish(q)
    assert hits[:3] == [0, 0, 0]
    assert all(h == 149 for h in hits[6:])           # everything but the last token, which is always computed
    assert s.layout.retired_cells() <= 500


def test_prompts_never_seen_again_stay_under_the_unprotected_cap():
    s = Scheduler(unified(max_running=4, max_retired=8, max_batch_tokens=512), KVLog(), n_ctx=1000)
    for b in range(10):
        q = seq(range(10_000 * (b + 1), 10_000 * (b + 1) + 150))
        s.waiting.append(q)
        run_plan(s, s.schedule())
        s.finish(q)
        assert s.layout.retired_cells() <= 250 and not s.layout.prefix.protected


def test_a_pinned_prefix_stays_under_the_unprotected_cap_and_goes_only_when_live_work_needs_its_cells():
    s = Scheduler(unified(max_running=8, max_retired=0, max_batch_tokens=64, max_retired_cells=5), KVLog(),
                  n_ctx=16)
    a = seq(range(10, 15), pin_s=60)
    s.waiting.append(a)
    run_plan(s, s.schedule())
    s.finish(a)
    for base in (20, 30):                          # unpinned prompts fill and overflow the unprotected cap
        q = seq(range(base, base + 5))
        s.waiting.append(q)
        run_plan(s, s.schedule())
        s.finish(q)
    assert s.layout.prefix.match(list(range(10, 15)) + [1])[0] == 5          # the pinned one is still there
    big = seq(range(40, 52))                       # needs 12 of the 16 cells: the pin must go too
    s.waiting.append(big)
    plan = s.schedule()
    assert plan and plan[0][0] is big
    assert s.layout.prefix.match(list(range(10, 15)) + [1])[0] == 0
