"""Prompt-layout lint: planted breaks are found, named and located; memory stays bounded."""

from __future__ import annotations

from tokenomy.context.lint import PrefixTracker, header, segments, volatile_lines

RULES = "You are the support assistant of Acme. Answer briefly and cite the manual. Never promise refunds."
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("lookup_order", "refund", "escalate")]


def chat(system: str, user: str, tools: list | None = None) -> list:
    return segments([{"role": "system", "content": system}, {"role": "user", "content": user}], tools)


def test_date_early_in_the_system_prompt_is_a_volatile_break() -> None:
    t = PrefixTracker()
    t.observe("a", "r", chat(f"Today is 2026-11-30 10:02. {RULES}", "Where is my order?"))
    f = t.observe("a", "r", chat(f"Today is 2026-12-01 09:15. {RULES}", "Can I get a refund?"))
    assert [b.reason for b in f.breaks] == ["volatile"]
    assert "2026-12-01 09:15" in f.breaks[0].span and f.breaks[0].segment == "system[0]"
    assert f.potential > f.prefix + 20          # moving the date out would share the whole rules text
    assert "break=volatile" in header(f)


def test_reordered_tools_and_a_user_name_are_named() -> None:
    t = PrefixTracker()
    t.observe("a", "r", chat(RULES, "hi", TOOLS))
    f = t.observe("a", "r", chat(RULES, "hello", TOOLS[::-1]))
    assert [b.reason for b in f.breaks] == ["tools_reordered"]
    t.observe("b", "r", chat(f"You help Alice. {RULES}", "hi"))
    f = t.observe("b", "r", chat(f"You help Bob. {RULES}", "hi"))
    assert f.breaks[0].reason == "per_request" and f.breaks[0].span == "Bob"


def test_a_new_user_turn_is_not_a_break_and_tenants_are_apart() -> None:
    t = PrefixTracker()
    t.observe("a", "r", chat(RULES, "Where is my order?"))
    f = t.observe("a", "r", chat(RULES, "Can I get a refund?"))
    assert f.breaks == [] and f.prefix > 15
    assert t.observe("b", "r", chat(RULES, "x")).prefix == 0       # another tenant's prompts are not compared


def test_memory_is_bounded() -> None:
    t = PrefixTracker(history=2, max_keys=3, max_units=50)
    for i in range(10):
        t.observe(f"t{i}", "r", chat(RULES * 20, "q"))
    assert len(t) == 3 and all(len(d) <= 2 and len(d[0].units) <= 50 for _, d in t._recent.items())


def test_volatile_lines_takes_date_lines_only() -> None:
    text, moved = volatile_lines("You are helpful.\nCurrent date: 2026-12-01\nBe brief.")
    assert moved == ["Current date: 2026-12-01"] and text == "You are helpful.\nBe brief."


def test_reordered_few_shot_examples_are_named() -> None:
    shots = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
             {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]
    t = PrefixTracker()
    t.observe("a", "r", segments([{"role": "system", "content": RULES}, *shots, {"role": "user", "content": "5+5?"}]))
    swapped = shots[2:] + shots[:2]
    f = t.observe("a", "r", segments([{"role": "system", "content": RULES}, *swapped,
                                      {"role": "user", "content": "5+5?"}]))
    assert [b.reason for b in f.breaks] == ["examples_reordered"]
