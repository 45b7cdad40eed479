"""Both KV layouts keep the prefix tree, the slots and the KV memory in agreement whatever the traffic."""

import pytest

from tests.engine.layout_fakes import KVShadow, check_kv, run_plan, seq
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv.tier import KVTiers
from tokenomy.engine.scheduler import Scheduler


@pytest.mark.parametrize("kv_unified", [False, True], ids=["streams", "unified"])
@pytest.mark.parametrize("tiers", [False, True], ids=["no-tiers", "tiers"])
def test_kv_stays_consistent_under_a_random_mix_of_shared_prompts_finishes_and_gaps(tiers, kv_unified):
    import random

    rng = random.Random(7)
    kv = KVShadow()
    s = Scheduler(EngineConfig(max_running=4, max_retired=2, max_batch_tokens=512, kv_unified=kv_unified), kv,
                  n_ctx=8 * 512 if not kv_unified else 400, tiers=KVTiers(1 << 20) if tiers else None)
    heads = [list(range(b, b + 40)) for b in (1000, 2000)]           # two shared "system prompts"
    for _ in range(400):
        if s.waiting or (s.running and rng.random() < 0.5):
            pass
        elif rng.random() < 0.7:
            tail = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
            s.waiting.append(seq(rng.choice(heads) + tail, max_tokens=64))
        plan = s.schedule()
        run_plan(s, plan, kv)
        check_kv(s, kv)
        for q, _ in plan:
            if q.pending == 0:
                q.output.append(rng.randrange(3))                    # same few tokens: identical runs recur
        for q in [q for q in s.running if rng.random() < 0.15]:
            s.finish(q)
        check_kv(s, kv)
    assert s.prefix_hit_tokens > 0
    if tiers:
        assert s.layout.tiers.stats.saved["ram"] > 0 and s.layout.tiers.stats.hits["ram"] > 0
