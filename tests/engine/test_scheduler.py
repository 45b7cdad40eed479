"""The scheduler's plan: chunked prefill within the token budget, the interactive and batch lanes, and
preemption when cells or running places run out (on the unified buffer, whose cells can run out)."""

import pytest

from tests.engine.layout_fakes import KVLog, KVShadow, bseq, check_kv, run_plan, seq, unified
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.scheduler import Scheduler
from tokenomy.engine.sequence import Status


def test_chunked_prefill_respects_token_budget_and_decodes_first():
    s = Scheduler(unified(max_running=4, max_retired=0, max_batch_tokens=8), KVLog(), n_ctx=1000)
    a, b = seq(range(20)), seq(range(100, 105))
    s.waiting.extend([a, b])
    plan = s.schedule()
    assert [(q is a, n) for q, n in plan] == [(True, 8)]
    run_plan(s, plan)
    plan = s.schedule()
    assert [(q is a, n) for q, n in plan] == [(True, 8)]
    run_plan(s, plan)
    plan = s.schedule()                            # a finishes its prompt (4), b gets the remaining 4
    assert [(q is a, n) for q, n in plan] == [(True, 4), (False, 4)]


def test_kv_exhaustion_evicts_retired_then_preempts_newest_and_requeues_it():
    kv = KVLog()
    s = Scheduler(unified(max_running=4, max_retired=0, max_batch_tokens=64, prefix_caching=False), kv, n_ctx=10)
    a, b = seq([1, 2, 3, 4]), seq([5, 6, 7, 8])
    s.waiting.extend([a, b])
    run_plan(s, s.schedule())
    a.output.append(10)
    b.output.append(11)
    run_plan(s, s.schedule())                      # 10 cells used now
    a.output.append(12)
    b.output.append(13)
    plan = s.schedule()                            # a needs a cell: b (newest) is preempted
    assert plan == [(a, 1)]
    assert b.status is Status.WAITING and s.waiting[0] is b and b.n_kv == 0 and s.preemptions == 1
    assert ("rm", 1) in kv.ops or ("rm", 0) in kv.ops


def test_batch_sequences_sit_out_steps_with_interactive_work_and_keep_their_kv():
    s = Scheduler(unified(max_running=4, max_retired=0, max_batch_tokens=64, batch_step_tokens=64), KVLog(),
                  n_ctx=1000)
    b = bseq([1, 2, 3])
    s.waiting.append(b)
    run_plan(s, s.schedule())                      # alone: the batch sequence runs
    b.output.append(9)
    i = seq([5, 6, 7])
    s.waiting.extend([i])
    plan = s.schedule()                            # an interactive arrival: only it is in the step
    assert plan == [(i, 3)] and b.status is Status.RUNNING and b.n_kv == 3
    run_plan(s, plan)
    i.output.append(8)
    assert s.schedule() == [(i, 1)]
    s.finish(i)
    assert s.schedule() == [(b, 1)]                # the interactive work is done: the batch one goes on


def test_interactive_arrivals_are_admitted_before_older_batch_ones():
    s = Scheduler(unified(max_running=4, max_retired=0, max_batch_tokens=64), KVLog(), n_ctx=1000)
    b, i = bseq([1, 2]), seq([3, 4])
    s.waiting.extend([b, i])
    assert s.schedule() == [(i, 2)] and list(s.waiting) == [b]


def test_batch_lane_is_capped_in_sequences_and_tokens_per_step():
    s = Scheduler(unified(max_running=8, max_retired=0, max_batch_tokens=256, batch_max_running=2,
                               batch_step_tokens=10), KVLog(), n_ctx=1000)
    a, b, c = bseq(range(8)), bseq(range(10, 18)), bseq(range(20, 28))
    s.waiting.extend([a, b, c])
    plan = s.schedule()
    assert plan == [(a, 8), (b, 2)] and list(s.waiting) == [c]


def test_with_a_step_of_one_batch_token_the_running_batch_sequences_take_turns():
    s = Scheduler(unified(max_running=8, max_retired=0, max_batch_tokens=256, batch_max_running=3), KVLog(),
                  n_ctx=1000)
    qs = [bseq(range(b, b + 4)) for b in (0, 10, 20)]
    s.waiting.extend(qs)
    run_plan(s, s.schedule())                       # all three prefilled in one step
    for q in qs:
        q.output.append(1)
    s.batch_tokens = 1                              # the engine measured that one token fits batch_step_ms
    served = []
    for _ in range(6):
        plan = s.schedule()
        assert len(plan) == 1 and plan[0][1] == 1
        served.append(qs.index(plan[0][0]))
        run_plan(s, plan)
        plan[0][0].output.append(1)
    assert served == [0, 1, 2, 0, 1, 2]


def test_an_interactive_arrival_preempts_batch_first_for_a_running_place():
    s = Scheduler(unified(max_running=2, max_retired=0, max_batch_tokens=64, batch_max_running=2), KVLog(),
                  n_ctx=1000)
    a, b = bseq([1, 2]), bseq([3, 4])
    s.waiting.extend([a, b])
    run_plan(s, s.schedule())
    i = seq([5, 6])
    s.waiting.append(i)
    plan = s.schedule()
    assert plan == [(i, 2)] and b.status is Status.WAITING and b.preemptions == 1 and a.status is Status.RUNNING


def test_kv_pressure_preempts_batch_before_interactive():
    s = Scheduler(unified(max_running=4, max_retired=0, max_batch_tokens=64, prefix_caching=False), KVLog(),
                  n_ctx=10)
    i, b = seq([1, 2, 3, 4]), bseq([5, 6, 7, 8])
    s.waiting.append(b)
    run_plan(s, s.schedule())
    s.waiting.append(i)
    run_plan(s, s.schedule())                      # 8 cells used
    i.output += [9]
    run_plan(s, s.schedule())                      # 9
    i.output += [10]
    run_plan(s, s.schedule())                      # 10: full
    i.output += [11]
    plan = s.schedule()                            # i needs a cell: the older batch sequence goes, not i
    assert plan == [(i, 1)] and b.status is Status.WAITING and b.preemptions == 1


def forked(prompt, n):
    """The n sequences of one request, as Engine.submit_n makes them."""
    seqs = [seq(prompt) for _ in range(n)]
    for q in seqs[1:]:
        q.fork_of = seqs[0]
    seqs[0].forks = seqs[1:]
    return seqs


@pytest.mark.parametrize("kv_unified", [True, False], ids=["unified", "streams"])
def test_the_choices_of_one_request_wait_for_its_prefill_and_are_forked_from_it(kv_unified):
    """n > 1: the other choices are not admitted while the first prefills its prompt (in chunks); then each is
    forked onto a slot holding a copy of that prompt's KV (the unified buffer shares the cells: no cell more is
    used), and where no running place is left the last waits, to be admitted as usual with the prompt from the
    prefix cache."""
    kv = KVShadow()
    s = Scheduler(EngineConfig(max_running=3, max_retired=2, max_batch_tokens=8, kv_unified=kv_unified), kv,
                  n_ctx=1000)
    first, b, c, d = forked(list(range(20)), 4)
    s.waiting.extend([first, b, c, d])
    for _ in range(2):                                 # 8 + 8 of its 20 tokens: the others wait
        plan = s.schedule()
        assert [q for q, _ in plan] == [first]
        run_plan(s, plan, kv)
    plan = s.schedule()
    assert plan == [(first, 4)]
    run_plan(s, plan, kv)
    used = s.used_cells
    assert s.fork(first, b) and s.fork(first, c)
    assert not s.fork(first, d) and d.status is Status.WAITING      # max_running 3
    for q in (b, c):
        assert q.status is Status.RUNNING and q.n_kv == 20 and q.cached_tokens == 20 and q not in s.waiting
        assert kv.content[q.slot] == list(range(20))
    assert s.used_cells == (used if kv_unified else 3 * used)
    check_kv(s, kv)
    s.finish(b, keep_prefix=False)
    plan = s.schedule()                                # a place: d is admitted, its prompt from the cache
    assert (d, 1) in plan and d.cached_tokens == 19
