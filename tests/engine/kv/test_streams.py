"""KV streams: running sequences kept on adjacent streams (gaps filled, then closed), a cached prefix used in place,
copied or restored, the least recently used one giving way, and the context shift."""

import pytest

from tests.engine.layout_fakes import KVLog, KVShadow, bseq, check_kv, run_plan, seq, serve
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv.tier import KVTiers
from tokenomy.engine.scheduler import Scheduler
from tokenomy.engine.sequence import Status
from tokenomy.engine.tuning import MIN_COPY_TOKENS


def streams(max_running=4, max_retired=4, **cfg):
    """A scheduler on KV streams; finished answers are not kept (placement is what these tests are about) unless
    `retire_outputs` says so."""
    cfg.setdefault("retire_outputs", False)
    kv = KVLog()
    return Scheduler(EngineConfig(max_running=max_running, max_retired=max_retired, max_batch_tokens=512,
                                  kv_unified=False, **cfg), kv, n_ctx=8 * 512), kv


def test_streams_run_side_by_side_and_each_step_lists_them_in_stream_order():
    s, kv = streams()
    qs = [seq(range(b, b + 40), max_tokens=64) for b in (100, 200, 300, 400)]
    s.waiting.extend(qs)
    plan = s.schedule()
    assert [q.slot for q, _ in plan] == [0, 1, 2, 3]
    run_plan(s, plan)
    s.finish(qs[1])                      # a gap at stream 1, holding qs[1]'s prompt, and nobody waits
    for q in qs:
        q.output.append(7)
    kv.ops.clear()
    plan = s.schedule()
    assert [q.slot for q, _ in plan] == [0, 1, 2]          # the top sequence moved down
    out = next(op for op in kv.ops if op[:2] == ("copy", 1))
    assert kv.ops.index(out) < kv.ops.index(("copy", 3, 1))  # the cached prompt left before the sequence came in
    assert s.layout.prefix.match(qs[1].prompt)[0] == 40 and out[2] in s.layout.prefix.retired
    assert 3 in s.layout.free_slots
    check_kv(s)
    run_plan(s, plan)
    s.finish(qs[0], keep_prefix=False)   # a gap at the bottom is no gap: the running are still side by side
    for q in qs:
        q.output.append(7)
    kv.ops.clear()
    assert [q.slot for q, _ in s.schedule()] == [1, 2] and not kv.ops


def block_of(s, n, length=40, kv=None):
    """`n` sequences served one by one onto streams 0..n-1, each with a token to decode next."""
    qs = [seq(range(1000 * (i + 1), 1000 * (i + 1) + length), max_tokens=64) for i in range(n)]
    for q in qs:
        serve(s, q, kv)
    for q in qs:
        q.output.append(7)
    assert [q.slot for q in qs] == list(range(n))
    return qs


@pytest.mark.parametrize("cached", [False, True], ids=["empty-gap", "saved-prefix-in-gap"])
def test_a_gap_closes_with_one_move_into_it_not_by_shifting_the_block_down(cached):
    """Once moved the top sequence to the lowest stream next to the block: with room below, the gap stayed and
    every step paid one more stream copy (11-25 ms each on the grounded bench) while the block crept down."""
    kv = KVShadow()
    s = Scheduler(EngineConfig(max_running=8, max_retired=8, max_batch_tokens=512, kv_unified=False,
                               retire_outputs=False), kv, n_ctx=16 * 512, tiers=KVTiers(1 << 20))
    qs = block_of(s, 6, length=80, kv=kv)
    s.finish(qs[0], keep_prefix=False)
    s.finish(qs[1], keep_prefix=False)            # the running 2..5 have room below them
    s.finish(qs[3], keep_prefix=cached)           # and a gap at 3
    s.save_finished()
    kv.ops.clear()
    plan = s.schedule()
    assert sorted(q.slot for q, _ in plan) == [2, 3, 4]
    assert ("copy", 5, 3) in kv.ops and not any(op[0] == "copy" and op[2] < 2 for op in kv.ops)
    if cached:                                    # saved already: dropped, not copied to the spare stream first
        assert [op for op in kv.ops if op[0] == "copy"] == [("copy", 5, 3)]
        assert s.layout.tiers.covers(qs[3].prompt)
    run_plan(s, plan, kv)
    for q in s.running:
        q.output.append(7)
    kv.ops.clear()
    assert sorted(q.slot for q, _ in s.schedule()) == [2, 3, 4] and not kv.ops     # one move closed it
    check_kv(s, kv)


def test_an_arrival_fills_a_gap_in_the_block_before_a_stream_at_its_edge():
    kv = KVShadow()
    s = Scheduler(EngineConfig(max_running=8, max_retired=8, max_batch_tokens=512, kv_unified=False,
                               retire_outputs=False), kv, n_ctx=16 * 512, tiers=KVTiers(1 << 20))
    qs = block_of(s, 6, length=80, kv=kv)
    s.finish(qs[0], keep_prefix=False)            # empty below the block: 0
    s.finish(qs[4], keep_prefix=False)            # an empty gap: 4
    a = seq(range(50_000, 50_030))
    serve(s, a, kv)
    assert a.slot == 4
    s.finish(qs[2])                               # a gap holding a prompt that a saved state holds too
    s.save_finished()
    b = seq(range(60_000, 60_030))
    serve(s, b, kv)
    assert b.slot == 2 and s.layout.tiers.covers(qs[2].prompt)
    s.finish(qs[3], keep_prefix=True)             # a gap whose prompt is saved nowhere: kept, c goes to an edge
    c = seq(range(70_000, 70_030))
    serve(s, c, kv)
    assert c.slot in (0, 6) and s.layout.prefix.tokens(3) == qs[3].prompt
    check_kv(s, kv)


@pytest.mark.parametrize("tiers", [False, True], ids=["no-tiers", "tiers"])
def test_a_prefix_apart_from_the_block_is_restored_from_ram_rather_than_copied_when_saved(tiers):
    kv = KVShadow()
    s = Scheduler(EngineConfig(max_running=4, max_retired=4, max_batch_tokens=512, kv_unified=False), kv,
                  n_ctx=8 * 512, tiers=KVTiers(1 << 20) if tiers else None)
    a = seq(range(100, 180))
    serve(s, a, kv)
    s.finish(a)                                   # stream 0 keeps a's prompt; saved between steps
    s.save_finished()
    b, c = seq(range(500, 540), max_tokens=64), seq(range(600, 640), max_tokens=64)
    serve(s, b, kv)
    serve(s, c, kv)
    s.finish(b, keep_prefix=False)                # only c runs, on stream 2: stream 0 is apart from it
    c.output.append(7)
    again = seq([*a.prompt, 1])
    kv.ops.clear()
    serve(s, again, kv)
    assert again.cached_tokens == 80 and again.slot != 0 and 0 in s.layout.prefix.retired
    if tiers:
        assert ("restore", again.slot) in kv.ops and not any(op[0] == "copy" for op in kv.ops)
    else:
        assert ("copy", 0, again.slot) in kv.ops
    check_kv(s, kv)


@pytest.mark.parametrize("in_place", [None, 128])
def test_a_cached_prefix_is_used_in_place_next_to_the_running_else_copied_next_to_them(in_place):
    s, kv = streams(in_place_tokens=in_place)
    a = seq(range(100, 160))             # 60 tokens: above MIN_COPY_TOKENS
    serve(s, a)
    s.finish(a)
    again = seq(list(range(100, 160)) + [1, 2])
    kv.ops.clear()
    serve(s, again)
    assert again.slot == 0 and again.cached_tokens == 60 and not any(op[0] == "copy" for op in kv.ops)
    s.finish(again)
    bs = [seq(range(b, b + 40), max_tokens=64) for b in (500, 600, 700)]
    for b in bs:
        serve(s, b)
    assert [b.slot for b in bs] == [1, 2, 3]
    s.finish(bs[0], keep_prefix=False)   # stream 1 empties; stream 0 (a's prompt) is no longer next to the running
    c = seq(list(range(100, 160)) + [9])
    kv.ops.clear()
    serve(s, c)
    assert c.slot == 1 and c.cached_tokens == 60
    assert kv.ops[-2:] == [("copy", 0, 1), ("rm", 1, 60)] and 0 in s.layout.prefix.retired
    long = seq(range(2000, 2200))
    serve(s, long)
    assert long.slot == 4
    s.finish(long)
    s.finish(bs[2])                      # now stream 4 stands apart from the running 1 and 2
    again = seq(list(range(2000, 2200)) + [3])
    kv.ops.clear()
    serve(s, again)                      # however long, it is copied next to them rather than run apart
    if in_place is None:
        assert again.slot in (0, 3) and again.cached_tokens == 200 and ("copy", 4, again.slot) in kv.ops
        assert 4 in s.layout.prefix.retired     # and stays cached where it was
    else:                                # unless a prefix that long is to run where it lies
        assert again.slot == 4 and again.cached_tokens == 200 and not any(op[0] == "copy" for op in kv.ops)
    check_kv(s)


def test_a_short_prefix_in_another_stream_is_recomputed_not_copied():
    s, kv = streams()
    a = seq(range(100, 100 + MIN_COPY_TOKENS - 1))
    serve(s, a)
    b = seq(range(500, 540))
    serve(s, b)
    s.finish(a)
    c = seq(list(range(100, 100 + MIN_COPY_TOKENS - 1)) + [5])
    kv.ops.clear()
    s.waiting.append(c)
    s.schedule()
    assert c.cached_tokens == 0 and not any(op[0] == "copy" for op in kv.ops)


def test_with_every_stream_full_the_least_recently_used_prefix_gives_way():
    s, kv = streams(max_running=2, max_retired=1)          # three streams
    prompts = [list(range(b, b + 50)) for b in (100, 200, 300, 400)]
    for p in prompts:
        q = seq(p)
        serve(s, q)
        s.finish(q)
    held = {tuple(s.layout.prefix.paths[slot][0].tokens[:1]) for slot in s.layout.prefix.paths}
    assert held == {(300,), (400,)}                        # the oldest prompts went, newest first kept
    assert len(s.layout.prefix.retired) == 2 and len(s.layout.free_slots) == 1   # one stream stays spare for moves


def test_an_arrival_takes_the_cached_stream_next_to_the_running_rather_than_one_apart():
    s, kv = streams(max_running=2, max_retired=3)          # five streams
    slots = []
    for b in (100, 200, 300, 400):
        q = seq(range(b, b + 40))
        serve(s, q)
        slots.append(q.slot)
        s.finish(q)
    assert slots == [0, 1, 2, 3]                           # stream 0 holds the oldest prompt, stream 4 is empty
    c = seq(list(range(300, 340)) + [1])
    serve(s, c)
    assert c.slot == 2                                     # runs in place, between cached streams 1 and 3
    f = seq(range(900, 940))
    serve(s, f)
    assert f.slot == 1                                     # next to the running one, not on 0 or the spare 4
    assert 0 in s.layout.prefix.retired and 4 in s.layout.free_slots and 1 not in s.layout.prefix.retired
    check_kv(s)


def test_a_context_shift_keeps_the_sinks_and_the_recent_half_and_leaves_only_the_sinks_cached():
    kv = KVShadow()
    s = Scheduler(EngineConfig(max_running=2, max_retired=2, max_batch_tokens=512), kv, n_ctx=4 * 256)
    q = seq(range(100, 140), max_tokens=500)
    s.waiting.append(q)

    def step():
        run_plan(s, s.schedule(), kv)
        q.output.append(len(q.output) % 5)

    for _ in range(11):
        step()
    assert q.n_kv == 50
    s.shift(q, 4)                                  # 46 past the sinks: the oldest 23 go
    assert kv.ops[-1] == ("shift", q.slot, 4, 23) and q.n_kv == 27 and q.dropped == 23
    assert kv.content[q.slot] == q.kv_tokens(0, q.n_kv) == q.tokens[:4] + q.tokens[27:50]
    assert s.layout.prefix.resident(q.slot) == 4          # only the sinks are a prefix anyone may reuse
    for _ in range(5):
        step()
    s.shift(q, 4)                                  # a second shift drops the next oldest, the sinks stay
    assert q.sink == 4 and q.dropped == 23 + 14 and kv.content[q.slot] == q.kv_tokens(0, q.n_kv)
    step()
    assert kv.content[q.slot] == q.kv_tokens(0, q.n_kv)
    slot = q.slot
    s.finish(q)
    assert kv.content[slot] == q.tokens[:4] and s.layout.prefix.tokens(slot) == q.tokens[:4]
    check_kv(s, kv)


@pytest.mark.parametrize("max_retired", [0, 1])
def test_an_arrival_finds_a_stream_when_every_idle_one_holds_its_system_prompt(max_retired):
    """Every prompt shares a system prompt, so every cached stream holds part of every arrival; with a saved
    state to restore (the tiers) or none adjacent, the arrival still needs a stream, and one of those gives way.
    Once failed the whole step with an IndexError in _place (every idle stream was kept as a holder)."""
    import random

    rng = random.Random(0)
    kv = KVShadow()
    s = Scheduler(EngineConfig(max_running=8, max_retired=max_retired, max_batch_tokens=512), kv,
                  n_ctx=(8 + max_retired) * 1024, tiers=KVTiers(1 << 30))
    head = list(range(1000, 1024))
    prompts = [head + [5000 + i] * 200 for i in range(8)]
    order: list[int] = []
    served = 0
    for _ in range(600):
        while len(s.running) + len(s.waiting) < 3:
            if not order:
                order = list(range(8))
                rng.shuffle(order)
            s.waiting.append(seq(prompts[order.pop()], max_tokens=16))
        plan = s.schedule()
        run_plan(s, plan, kv)
        for q, _ in plan:
            if q.pending == 0:
                q.output.append(7)
        for q in [q for q in s.running if len(q.output) >= 16]:
            s.finish(q)
            served += 1
        check_kv(s, kv)
    assert served > 50 and s.prefix_hit_tokens > 0


def test_a_shifted_sequence_preempted_and_readmitted_recomputes_what_it_kept():
    kv = KVShadow()
    s = Scheduler(EngineConfig(max_running=1, max_retired=1, max_batch_tokens=512, batch_max_running=1), kv,
                  n_ctx=2 * 256)
    b = bseq(range(100, 140), max_tokens=500)
    s.waiting.append(b)

    def step():
        plan = s.schedule()
        run_plan(s, plan, kv)
        for r, _ in plan:
            if r.pending == 0:
                r.output.append(len(r.output) % 7)
        return plan

    for _ in range(21):
        step()
    s.shift(b, 4)
    kept = b.kv_tokens()
    i = seq(range(900, 910))
    s.waiting.append(i)
    step()                                       # the interactive arrival takes the one running place
    assert b.status is Status.WAITING and b.n_kv == 0 and b.dropped > 0
    s.finish(i)
    plan = step()                                # b comes back: the kept view is recomputed, not the dropped tokens
    assert plan[0][0] is b and b.kv_tokens(0, b.n_kv) == kept[:b.n_kv]
    assert kv.content[b.slot] == b.kv_tokens(0, b.n_kv)


def test_a_pinned_prefix_outlives_newer_unpinned_ones_and_keeps_its_answer():
    s, kv = streams(max_running=2, max_retired=1)          # three streams
    pinned = seq(range(100, 150), pin_s=60)
    serve(s, pinned)
    pinned.output += [7, 8]
    s.committed(pinned, [7])                               # its first answer token was fed back
    slot = pinned.slot
    s.finish(pinned)
    for b in (200, 300, 400):
        q = seq(range(b, b + 50))
        serve(s, q)
        s.finish(q)
    held = {tuple(s.layout.prefix.paths[slot][0].tokens[:1]) for slot in s.layout.prefix.paths}
    assert held == {(100,), (400,)}                        # unpinned 200 and 300 went first, though newer
    assert s.layout.prefix.match(list(range(100, 150)) + [7, 9]) == (51, slot)   # prompt and answer kept
    check_kv(s)


def test_another_conversation_sharing_only_its_start_copies_a_pinned_prefix_and_its_own_continues_in_place():
    s, kv = streams(max_running=2, max_retired=3)          # five streams
    chain = list(range(100, 100 + 2 * MIN_COPY_TOKENS))
    pinned = seq(chain, pin_s=60)
    serve(s, pinned)
    slot = pinned.slot
    s.finish(pinned)
    other = seq(chain[:MIN_COPY_TOKENS] + [1, 2, 3])
    serve(s, other)
    assert other.slot != slot and other.n_kv >= MIN_COPY_TOKENS          # copied from it, not cut
    assert s.layout.prefix.match(chain + [5]) == (len(chain), slot)
    s.finish(other)
    nxt = seq(chain + [5, 6])
    serve(s, nxt)
    assert nxt.slot == slot and nxt.cached_tokens == len(chain)
    check_kv(s)


def test_a_pin_gives_way_when_every_stream_is_pinned_and_one_is_needed():
    s, kv = streams(max_running=1, max_retired=1)          # two streams
    for b in (100, 200):
        q = seq(range(b, b + 50), pin_s=60)
        serve(s, q)
        s.finish(q)
    late = seq(range(300, 350))
    plan = serve(s, late)
    assert plan and plan[0][0] is late                     # admitted: a pin never refuses live work
    held = {tuple(s.layout.prefix.paths[slot][0].tokens[:1]) for slot in s.layout.prefix.retired}
    assert held == {(200,)}                                # the older pin went
    check_kv(s)


def test_with_kv_streams_a_finished_answer_stays_cached_with_its_prompt_by_default():
    kv = KVLog()
    s = Scheduler(EngineConfig(max_running=2, max_retired=2, max_batch_tokens=512, kv_unified=False), kv,
                  n_ctx=4 * 512)
    q = seq(range(100, 140))
    serve(s, q)
    q.output += [7, 8, 9]
    s.committed(q, [7])
    s.committed(q, [8])                                    # the last token (9) was sampled, never fed back
    s.finish(q)
    assert s.layout.prefix.match(list(range(100, 140)) + [7, 8, 5])[0] == 42    # the next turn reuses the answer
    assert EngineConfig(kv_unified=True).keeps_outputs is False and EngineConfig().keeps_outputs is True
