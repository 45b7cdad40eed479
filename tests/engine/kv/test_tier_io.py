"""A layout's prefixes saved to the KV tiers and restored from them."""

from tests.engine.layout_fakes import KVShadow, check_kv, seq, serve
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv.tier import KVTiers
from tokenomy.engine.scheduler import Scheduler


def test_a_saved_prefix_dropped_by_the_eviction_that_makes_room_for_it_still_restores():
    kv = KVShadow()
    s = Scheduler(EngineConfig(max_running=1, max_retired=1, max_batch_tokens=512), kv, n_ctx=2 * 256,
                  tiers=KVTiers(600))                          # RAM for one saved prompt only
    a, b = list(range(100, 180)), list(range(500, 580))

    for p in (a, b):
        q = seq(p)
        serve(s, q, kv)
        s.finish(q)
    assert s.layout.tiers.stats.saved["ram"] == 1 and s.layout.tiers.match(a, 0)[0] == 80      # a was saved when b came
    again = seq([*a, 1])
    plan = serve(s, again, kv)                   # making room saves b, which pushes a out of RAM meanwhile
    assert s.layout.tiers.match(a, 0)[1] is None and s.layout.tiers.stats.hits["ram"] == 1
    assert plan == [(again, 1)] and again.cached_tokens == 80
    check_kv(s, kv)
