"""Stand-ins for llama.cpp's KV memory and helpers that drive a Scheduler step by step, shared by the tests of the
scheduler and of the KV layouts."""

import json

from tokenomy.engine.config import EngineConfig
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.sequence import Sequence


class KVLog:
    """Records the memory operations the scheduler asks llama.cpp for."""

    def __init__(self):
        self.ops = []

    def copy_prefix(self, src, dst, length):
        self.ops.append(("cp", src, dst, length))

    def copy_stream(self, src, dst):
        self.ops.append(("copy", src, dst))

    def remove(self, slot, start=0):
        self.ops.append(("rm", slot) if start == 0 else ("rm", slot, start))


class KVShadow(KVLog):
    """A stand-in for llama.cpp's KV memory that holds each slot's tokens, so a test can check that what the
    scheduler's operations leave in a slot is what the scheduler believes is there."""

    def __init__(self):
        super().__init__()
        self.content = {}

    def copy_stream(self, src, dst):
        super().copy_stream(src, dst)
        self.content[dst] = list(self.content.get(src, []))

    def copy_prefix(self, src, dst, length):
        super().copy_prefix(src, dst, length)
        self.content[dst] = self.content.get(src, [])[:length]

    def remove(self, slot, start=0):
        super().remove(slot, start)
        self.content[slot] = self.content.get(slot, [])[:start]

    def save(self, slot):
        return json.dumps(self.content.get(slot, [])).encode()

    def restore(self, slot, blob):
        self.ops.append(("restore", slot))
        self.content[slot] = json.loads(blob)
        return True

    def shift(self, slot, keep, discard):
        self.ops.append(("shift", slot, keep, discard))
        c = self.content[slot]
        self.content[slot] = c[:keep] + c[keep + discard:]


def unified(**kw):
    return EngineConfig(kv_unified=True, **kw)


def seq(tokens, max_tokens=8, pin_s=0.0):
    return Sequence(prompt=list(tokens), params=SamplingParams(max_tokens=max_tokens, pin_s=pin_s),
                    on_event=lambda e: None)


def bseq(tokens, max_tokens=8):
    return Sequence(prompt=list(tokens), params=SamplingParams(max_tokens=max_tokens, priority="batch"),
                    on_event=lambda e: None)


def run_plan(s, plan, kv=None):
    """Commit a step's plan as if llama.cpp had run it; with a KVShadow, write its tokens there too."""
    for q, n in plan:
        fed = q.kv_tokens(q.n_kv, q.n_kv + n)     # what the engine feeds: the tokens at those KV positions
        if kv is not None:
            kv.content.setdefault(q.slot, []).extend(fed)
        s.committed(q, fed)


def serve(s, q, kv=None):
    s.waiting.append(q)
    plan = s.schedule()
    run_plan(s, plan, kv)
    return plan


def check_kv(s, kv=None):
    """The prefix tree and the slots agree: every path hangs from the root, every running sequence's KV is its
    slot's path, and no stream is both free and holding KV, or both running and cached; with a KVShadow, each
    slot holds the tokens its path says."""
    running = [q.slot for q in s.running]
    assert len(set(running)) == len(running)
    for slot, path in s.layout.prefix.paths.items():
        parent = s.layout.prefix.root
        for node in path:
            assert node.parent is parent and node in parent.children and slot in node.slots
            parent = node
    for q in s.running:
        assert s.layout.prefix.resident(q.slot) == q.n_kv
    assert not set(s.layout.free_slots) & (set(s.layout.prefix.paths) | set(running))
    assert not set(s.layout.prefix.retired) & set(running)
    if kv is not None:
        for slot in set(kv.content) | set(s.layout.prefix.paths):
            assert kv.content.get(slot, []) == s.layout.prefix.tokens(slot), slot
        for q in s.running:
            assert kv.content.get(q.slot, []) == q.tokens[:q.n_kv]
